"""Keep what a GPU check captured as fixtures the ordinary suite replays (CI has no GPU), absolute paths scrubbed.

    .venv/bin/python bench/gpu/collect.py gpu-check.tar.gz [gpu-health*.tar.gz] NAME[+RUN]

-> tests/fixtures/gpu-<GPU>-vllm<X.Y>/NAME/ (the GPU its cards name, the vLLM of its versions.txt): per case
record.jsonl.gz (every /metrics scrape and completion), result.json, run-script.sh, run-env.json, the tail of each
engine log; cards/ (rigkit's cards, markdown + JSON); run.log, summary.json, stacks.json, versions.txt, training.json,
config.json (the model's shape). The nvidia-smi captures (issue 27) go, raw, to tests/fixtures/nvidia-smi/NAME/
(without +RUN: a second check of the same day adds its files beside the first's, never replacing one).
"""

from __future__ import annotations

import gzip
import io
import json
import re
import shutil
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
LOG_TAIL_LINES = 120
# device paths -> placeholders (the harness's own layout: bench/gpu/go.sh, run.py)
SCRUB = [
    (re.compile(r"/tmp/gpu-check-kv"), "<kv>"),
    (re.compile(r"/tmp/gpu-check-model"), "<model>"),
    (re.compile(r"/tmp/site-lm"), "<site-lm>"),
    (re.compile(r"/tmp/site"), "<site>"),
    (re.compile(r"/tmp/gpu-check"), "<results>"),
    (re.compile(r"/[\w./-]*/\.gpucheck/repo"), "<repo>"),
    (re.compile(r"/[\w./-]*/\.gpucheck"), "<carry>"),
]


def scrub(text: str) -> str:
    for pattern, placeholder in SCRUB:
        text = pattern.sub(placeholder, text)
    return text


def keep(member: str) -> bool:
    name = Path(member).name
    return (
        name
        in {
            "record.jsonl.gz",
            "result.json",
            "run-script.sh",
            "run-env.json",
            "run.log",
            "summary.json",
            "stacks.json",
            "versions.txt",
            "training.json",
            "config.json",
            "l2-files.txt",
        }
        or (Path(member).parent.name == "cards" and name.endswith((".md", ".card.json")))
        or re.fullmatch(r"server-\d+\.log", name) is not None
    )


def write(dest: Path, name: str, data: bytes) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    if name.endswith(".gz"):
        text = scrub(gzip.decompress(data).decode())
        buffer = io.BytesIO()
        with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as f:
            f.write(text.encode())
        dest.write_bytes(buffer.getvalue())
        return
    text = scrub(data.decode(errors="replace"))
    if re.fullmatch(r"server-\d+\.log", name):
        lines = text.splitlines()
        text = (
            "\n".join(
                [f"[first {len(lines) - LOG_TAIL_LINES} lines left out]"] * (len(lines) > LOG_TAIL_LINES)
                + lines[-LOG_TAIL_LINES:]
            )
            + "\n"
        )
    dest.write_text(text)


def collect(archive: Path, dest: Path) -> int:
    count = 0
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if not member.isfile() or not keep(member.name):
                continue
            relative = Path(*Path(member.name).parts[1:])  # drop the results folder's own name
            write(dest / relative, member.name, tar.extractfile(member).read())
            count += 1
    return count


def capture_folder(archive: Path) -> str:
    """gpu-<gpu>-vllm<major.minor> of a capture: the first card's GPU model (e.g. "NVIDIA H100 80GB HBM3" -> h100)
    and versions.txt's vLLM; a capture naming neither is refused (it would be filed under the wrong machine)."""
    gpu = vllm = None
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            if member.name.endswith("versions.txt"):
                found = re.search(r"vllm (\d+\.\d+)", tar.extractfile(member).read().decode())
                vllm = found.group(1) if found else vllm
            elif member.name.endswith(".card.json") and gpu is None:
                models = json.loads(tar.extractfile(member).read()).get("repro", {}).get("gpu_models") or []
                found = re.search(r"\b([A-Z]\d{2,4}[A-Za-z]?)\b", models[0]) if models else None
                gpu = found.group(1).lower() if found else None
    if gpu is None or vllm is None:
        raise SystemExit(f"{archive}: no GPU model in its cards or no vLLM version in versions.txt: not filed")
    return f"gpu-{gpu}-vllm{vllm}"


def main() -> None:
    *archives, name = sys.argv[1:]
    checks = [a for a in map(Path, archives) if not a.name.startswith("gpu-health")]
    folder = capture_folder(checks[0]) if checks else "gpu-h200-vllm0.26"
    dest = FIXTURES / folder / name.replace("+", "-")  # NAME+RUN: a second check of the day
    shutil.rmtree(dest, ignore_errors=True)
    for archive in map(Path, archives):
        if archive.name.startswith("gpu-health"):
            # added beside the captures already there (another check of the same day): a file is never replaced
            health = FIXTURES / "nvidia-smi" / name.split("+")[0]
            with tarfile.open(archive) as tar:
                for member in tar.getmembers():
                    target = health / Path(member.name).name
                    if member.isfile() and not target.exists():
                        write(target, member.name, tar.extractfile(member).read())
                        print(f"nvidia-smi capture -> {target.relative_to(REPO)}")
        else:
            print(f"{collect(archive, dest)} files -> {dest.relative_to(REPO)}")


if __name__ == "__main__":
    main()
