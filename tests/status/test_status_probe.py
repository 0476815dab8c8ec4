"""The status script's sections cut out and read back: files exactly as they were, nvidia-smi's versions."""

from __future__ import annotations

import subprocess

from status_sandbox import NVIDIA_SMI

from rigkit.status.probe import SECTION_MARK, _file_section, decoded_file, parse_nvidia, parse_sections


def test_sections_are_cut_at_their_marks_and_files_read_back_exactly(tmp_path):
    text = "tricky\nno newline at the end, and a line @@rigkit-status inside"
    (tmp_path / "f").write_text(text)
    script = "\n".join(
        [
            f"echo '{SECTION_MARK}one'",
            _file_section(str(tmp_path / "f")),
            f"echo '{SECTION_MARK}two'",
            _file_section(str(tmp_path / "missing")),
        ]
    )
    sections = parse_sections(subprocess.run(["sh", "-c", script], capture_output=True, text=True).stdout)
    assert decoded_file(sections["one"]) == text
    assert decoded_file(sections["two"]) is None
    assert decoded_file(None) is None


def test_nvidia_smi_versions_and_lab_rigs_without_it():
    parsed = parse_nvidia(NVIDIA_SMI.read_text() + "exit=0")
    assert (parsed["driver"], parsed["cuda"], parsed["error"]) == ("580.159.04", "13.0", None)
    assert parse_nvidia("none") == {"driver": "none", "cuda": "none", "error": None}
    failed = parse_nvidia("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\nexit=9")
    assert failed["driver"] is None and "couldn't communicate" in failed["error"]
