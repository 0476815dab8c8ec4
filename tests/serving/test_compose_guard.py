"""The env-passthrough guard on rendered stacks and on the real rig's shipped bug."""

import pytest

from rigkit.cli import main as rigkit_main
from rigkit.serving import compose_guard
from rigkit.serving.compose_guard import runtime_reads, undeclared_variables
from rigkit.serving.render import render_compose
from rigkit.settings.hostdata import settings_for_host
from rigkit.settings.profiles import load_profiles

DIGEST = "@sha256:" + "5" * 64

# The real rig's compose as it shipped: the entrypoint reads four LMCACHE_* knobs that environment:
# never declares, so host values never reached the container (field notes, "The bug that shipped").
REAL_RIG_BUG = """
services:
  vllm:
    image: lmcache/vllm-openai@sha256:%s
    network_mode: host
    mem_limit: ${CLUB3090_MEM_LIMIT:-70g}
    entrypoint: ["bash", "-c"]
    command:
      - |
        L2_ARGS=""
        if [ "$${LMCACHE_L2:-0}" = "1" ]; then
          L2_ARGS="--l2-adapter $${LMCACHE_L2_ADAPTER:-{\\"type\\":\\"fs\\",\\"base_path\\":\\"/lmcache-kv\\"}}"
        fi
        lmcache server --chunk-size $${LMCACHE_CHUNK_SIZE:-1584} --l1-size-gb $${LMCACHE_L1_GB:-30} \\
          --eviction-policy LRU $$L2_ARGS &
        exec vllm serve /models/qwen --port 8020 --enable-prefix-caching \\
          --kv-transfer-config '{"kv_connector":"LMCacheMPConnector","kv_role":"kv_both"}'
    environment:
      - NVIDIA_VISIBLE_DEVICES=all
      - HF_TOKEN=${HF_TOKEN:-}
""" % ("6" * 64)
FOUR = ["LMCACHE_CHUNK_SIZE", "LMCACHE_L1_GB", "LMCACHE_L2", "LMCACHE_L2_ADAPTER"]


def rendered(profile: str) -> str:
    data = {
        "serving_profile": profile,
        "allow_incubating": True,
        "model": "m",
        "l2_enabled": True,
        "serving_image": f"example/image{DIGEST}",
    }
    return render_compose(settings_for_host(data, variables=[]))


@pytest.mark.parametrize("profile", sorted(load_profiles()))
def test_every_rendered_profile_declares_what_it_reads(profile):
    text = rendered(profile)
    assert undeclared_variables(text) == {}
    assert runtime_reads(text)  # the check looked at something


def test_removing_a_declaration_from_a_rendered_file_is_caught():
    text = rendered("lmcache-mp")
    broken = "\n".join(line for line in text.splitlines() if "LMCACHE_L1_GB=" not in line)
    assert undeclared_variables(broken) == {"serving": ["LMCACHE_L1_GB"]}


def test_the_real_rig_bug_fails():
    assert undeclared_variables(REAL_RIG_BUG) == {"vllm": FOUR}


def test_cli_fails_on_the_bug_and_passes_the_fix(tmp_path, capsys):
    bad = tmp_path / "bad.yml"
    bad.write_text(REAL_RIG_BUG)
    fixed = tmp_path / "fixed.yml"
    fixed.write_text(
        REAL_RIG_BUG.replace(
            "      - HF_TOKEN=${HF_TOKEN:-}\n",
            "      - HF_TOKEN=${HF_TOKEN:-}\n" + "".join(f"      - {name}=${{{name}:-}}\n" for name in FOUR),
        )
    )
    assert rigkit_main(["check-compose", str(bad), str(fixed)]) == 1
    out = capsys.readouterr().out
    assert f"service vllm reads undeclared: {', '.join(FOUR)}" in out and "NAME=${NAME:-}" in out
    assert f"{fixed}: ok" in out
    assert rigkit_main(["check-compose", str(fixed)]) == 0


def test_unreadable_file_exit_code(tmp_path, capsys):
    assert compose_guard.check_files([str(tmp_path / "missing.yml")]) == 2


@pytest.mark.parametrize(
    "text, said",
    [
        ("RIGKIT_MODEL=tiny\nLMCACHE_L1_GB=30\n", "not a compose file: its top level is str"),  # an .env file
        ("name: stack\n", "declares no services"),
        ("services:\n  a: {image: x}\n  a: {image: y}\n", "'a' is given twice"),
    ],
)
def test_a_file_that_is_not_a_compose_file_is_named_not_passed(tmp_path, capsys, text, said):
    path = tmp_path / "file"
    path.write_text(text)
    assert compose_guard.check_files([str(path)]) == 2
    out = capsys.readouterr().out
    assert said in out and ": ok" not in out


def test_mapping_environment_and_env_file_declare(tmp_path):
    (tmp_path / "extra.env").write_text("# comment\nFROM_FILE=1\n")
    text = """
services:
  a:
    image: x
    command: ["sh", "-c", "echo $$MAPPED $${FROM_FILE} $${MISSING:-d} ${COMPOSE_TIME}"]
    environment: {MAPPED: "1"}
    env_file: extra.env
"""
    assert undeclared_variables(text, tmp_path) == {"a": ["MISSING"]}


def test_shell_locals_and_runtime_variables_are_not_reads():
    assert runtime_reads("args=(-x); for f in 1; do echo $${args[@]} $$f $$HOME; done") == set()
    assert runtime_reads("X=$${X:-30}; echo $$X") == {"X"}
    assert runtime_reads("echo $$Y; Y=1") == {"Y"}
