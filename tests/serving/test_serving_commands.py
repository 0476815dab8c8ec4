"""rigkit.serving.commands: the URL the rig polls after up -d is valid for every bind address the knob accepts."""

import pytest

from rigkit.serving.commands import ready_url, rendering_for
from rigkit.settings.hostdata import settings_for_host

CPU_LAB = {
    "serving_profile": "cpu-lab",
    "serving_image": "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "1" * 64,
    "serving_port": 8104,
}


@pytest.mark.parametrize(
    "bind, url",
    [
        ("127.0.0.1", "http://127.0.0.1:8104/v1/models"),
        ("::1", "http://[::1]:8104/v1/models"),
        ("0.0.0.0", "http://127.0.0.1:8104/v1/models"),
        ("::", "http://127.0.0.1:8104/v1/models"),
    ],
)
def test_ready_url_from_the_rendering(bind, url):
    rendering = rendering_for(settings_for_host({**CPU_LAB, "bind_address": bind}, variables=[]))
    assert ready_url(rendering) == url
