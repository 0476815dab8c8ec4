"""`rigkit resolve` against the lab's real registry: each release tag resolves to the digest the push reported."""

import json
import urllib.request

import pytest

from rigkit.remote.registry import parse_reference, resolve

pytestmark = pytest.mark.lab


def test_release_tags_resolve_to_the_pushed_digests(serving_image):
    repository = serving_image["repository"]
    reference = parse_reference(repository + ":x")
    with urllib.request.urlopen(
        f"http://{reference.registry}/v2/{reference.repository}/tags/list", timeout=10
    ) as reply:
        tags = json.load(reply)["tags"]
    resolved = {tag: resolve(f"{repository}:{tag}") for tag in tags}
    for release, pinned in serving_image["releases"].items():
        from_tags = {value for tag, value in resolved.items() if tag.startswith(f"release-{release}-")}
        assert pinned in from_tags, (release, resolved)
    assert serving_image["releases"]["1"] != serving_image["releases"]["2"]
