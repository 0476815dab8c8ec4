"""ExecStart= quoting (systemd.syntax(7), systemd.service(5) "Command lines"), checked two ways: a decoder
written from those pages reads every argument back exactly, and systemd-analyze verify accepts the unit
without a warning (an unknown escape or specifier would be reported)."""

import re
import shlex
import shutil
import subprocess

import pytest

from rigkit.systemd import exec_argument, exec_command_line

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
C_UNESCAPES = {"\\": "\\", '"': '"', "n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}
ARGUMENTS = [
    "/mnt/l2 disk/lmcache",
    "100%",
    "%h",
    "$HOME",
    "${HOME}",
    "$$",
    'say "hi"',
    "back\\slash",
    "trailing\\",
    "new\nline",
    "tab\there",
    "bell\a",
    "esc\x1b",
    "del\x7f",
    "caf\u00e9 \U0001f600",
    "",
    "'single'",
    ";",
    "a b  c",
]


def decode(command_line: str) -> list[str]:
    """What systemd makes of a command line of quoted words (the subset rigkit writes)."""
    words = []
    for quoted in re.findall(r'"((?:[^"\\]|\\.)*)"', command_line):
        unescaped = re.sub(
            r"\\x([0-9a-f]{2})|\\(.)",
            lambda m: chr(int(m.group(1), 16)) if m.group(1) else C_UNESCAPES[m.group(2)],
            quoted,
        )
        words.append(unescaped.replace("%%", "%").replace("$$", "$"))
    assert " ".join(f'"{w}"' for w in re.findall(r'"((?:[^"\\]|\\.)*)"', command_line)) == command_line
    return words


@pytest.mark.parametrize("argument", ARGUMENTS)
def test_every_argument_reads_back_exactly(argument):
    quoted = exec_argument(argument)
    assert "\n" not in quoted and "\t" not in quoted
    assert re.fullmatch(r'"([^"%$\\]|\\.|%%|\$\$)*"', quoted, re.S), quoted  # no lone % or $ left to expand
    assert decode(quoted) == [argument]


def test_command_line_keeps_arguments_apart():
    argv = ["/usr/bin/python3", "/usr/local/lib/rigkit/l2_janitor.py", "/mnt/l2 disk/lmcache", "1000", "50%"]
    assert decode(exec_command_line(argv)) == argv


def test_nul_and_relative_executable_refused():
    with pytest.raises(ValueError, match="^a command-line argument cannot contain a NUL byte$"):
        exec_argument("a\x00b")
    with pytest.raises(ValueError, match="^ExecStart= needs an absolute executable path first$"):
        exec_command_line(["python3", "x"])


@pytest.mark.parametrize("char, escaped", [("\x01", "\\x01"), ("\x1f", "\\x1f"), ("\x7f", "\\x7f"), ("\x80", "\x80")])
def test_control_characters_and_del_are_escaped_and_nothing_else(char, escaped):
    """systemd decodes \\xNN inside quotes; a raw DEL or control byte in a unit file is one no reader shows."""
    assert exec_argument(f"a{char}b") == f'"a{escaped}b"'


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze not installed")
def test_systemd_accepts_the_quoted_unit_without_a_warning(tmp_path):
    unit = tmp_path / "rigkit-quoting-test.service"
    unit.write_text(
        "[Unit]\nDescription=quoting test\n\n[Service]\nType=oneshot\n"
        f"ExecStart={exec_command_line(['/bin/true', *ARGUMENTS])}\n"
    )
    result = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and "rigkit-quoting-test" not in result.stderr, result.stderr
    # the check can fail: an unknown escape is reported
    unit.write_text(unit.read_text().replace('"$$HOME"', '"\\q"'))
    bad = subprocess.run([SYSTEMD_ANALYZE, "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60)
    assert "escape" in bad.stderr


def test_the_l2_janitor_unit_passes_a_path_with_a_space_as_one_argument():
    from rigkit.settings.hostdata import settings_for_host
    from roles.serving import janitor_unit

    settings = settings_for_host(
        {
            "serving_profile": "cpu-lab",
            "l2_path": "/mnt/rig kit/lmcache",
            "serving_image": "127.0.0.1:5000/rigkit/vllm-cpu-tiny@sha256:" + "1" * 64,
        }
    )
    (line,) = [line for line in janitor_unit(settings).splitlines() if line.startswith("ExecStart=")]
    argv = shlex.split(line.removeprefix("ExecStart="))  # systemd's double quotes split like the shell's here
    assert argv[:3] == ["/usr/bin/python3", "/usr/local/lib/rigkit/l2_janitor.py", "/mnt/rig kit/lmcache"]


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze not installed")
def test_the_power_limit_unit_passes_systemd_analyze_and_runs_nvidia_smi_pl(tmp_path):
    from rigkit.nvidia_smi import NVIDIA_SMI_PATH
    from roles.nvidia_driver import power_limit_unit_text

    text = power_limit_unit_text(262.5)
    exec_start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    assert decode(exec_start[len("ExecStart=") :]) == [NVIDIA_SMI_PATH, "-pl", "262.5"]
    assert "After=nvidia-persistenced.service" in text
    unit = tmp_path / "rigkit-gpu-power-limit.service"
    # no nvidia-smi here: an executable that exists in its place, so only the unit's syntax is judged
    unit.write_text(text.replace(NVIDIA_SMI_PATH, "/bin/echo"))
    result = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and "rigkit-gpu-power-limit" not in result.stderr, result.stderr
