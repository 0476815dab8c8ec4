"""The lab's served model: a tiny Qwen3 with real weights, trained here on the CPU and cached by its inputs.

`ensure_lab_model()` returns a model directory vLLM serves without `--load-format dummy` (config.json,
tokenizer.json, tokenizer_config.json, model.safetensors in bf16, training.json with the loss and the measured
greedy margins). The serving image holds no model: `rigkit lab up` pins this directory as the lab's
`model_source` and `rigkit stage` (`stage_on_lab_rigs()`) copies it onto each rig, as on a real fleet.

Its inputs, and so its cache key: the sources in lab_model/ (config.json, train_tokenizer.py, train_model.py),
the training venv's pins and the corpus, generated here by rigkit.prompts (the very text the validation's salted
prompts are made of) from fixed seeds. Training runs in its own venv (MODEL_ROOT/venv-<key>, made once with
pip from TRAIN_REQUIREMENTS) so rigkit's own venv needs no torch.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

from rigkit.fleet.pyinfra_args import rigkit_executable
from rigkit.lab.proc import LabStepError, Progress, directory_digest, input_hash, streamed
from rigkit.paths import CACHE_DIR
from rigkit.prompts import PromptSpec, draft_text

SOURCES = Path(__file__).with_name("lab_model")
TRAIN_SCRIPT = SOURCES / "train_model.py"
MODEL_ROOT = CACHE_DIR / "lab-model"
# The training venv: torch is the serving image's (REQUIREMENTS there); the rest are pinned so that the same
# inputs give the same weights.
TRAIN_REQUIREMENTS = (
    "torch==2.13.0",
    "transformers==4.57.6",
    "tokenizers==0.22.2",
    "safetensors==0.8.0",
    "numpy==2.4.6",
    "huggingface_hub==0.36.2",
)
# What a complete model directory holds (a directory without all of them is a broken, partial one).
MODEL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors", "training.json")

CORPUS_SEED = 20261203
CORPUS_DOCUMENTS = 1200
CORPUS_DOCUMENT_CHARS = (600, 4000)
EVAL_SEED = 777
EVAL_PROMPTS = 6
EVAL_PROMPT_CHARS = (
    3500 * 4
)  # 7,300-9,200 tokens of this tokenizer: longer than the lab validation's 3,500-token sessions

VENV_TIMEOUT_S = 1200.0
TRAIN_TIMEOUT_S = 1800.0


def _documents(seed: int, count: int, chars: tuple[int, int]) -> list[dict]:
    """Salted prompt texts of both kinds, as rigkit.prompts writes them (session id, task line, body)."""
    rng = random.Random(seed)
    documents = []
    for index in range(count):
        kind = ("narrative", "code")[index % 2]
        session = f"{rng.getrandbits(128):032x}"
        text = draft_text(PromptSpec(kind, 0, rng.randrange(2**31)), session, rng.randint(*chars))
        documents.append({"kind": kind, "text": text})
    return documents


def training_corpus() -> list[dict]:
    return _documents(CORPUS_SEED, CORPUS_DOCUMENTS, CORPUS_DOCUMENT_CHARS)


def eval_prompts() -> list[dict]:
    """Held-out prompts (another seed) the size of a lab validation session: the margins are measured on them."""
    return _documents(EVAL_SEED, EVAL_PROMPTS, (EVAL_PROMPT_CHARS, EVAL_PROMPT_CHARS))


def _jsonl(records: list[dict]) -> str:
    return "".join(json.dumps(record, sort_keys=True) + "\n" for record in records)


def venv_key() -> str:
    return input_hash("lab-model-venv", list(TRAIN_REQUIREMENTS), sys.version_info[:2])


def model_key() -> str:
    """The model's inputs: its sources, the training pins, and the text it learns from and is measured on, hashed as
    generated (0.6 s): rigkit.prompts may be moved or reformatted without a retraining while its text
    stays the same, and any change to that text retrains."""
    texts = [hashlib.sha256(_jsonl(records).encode()).hexdigest() for records in (training_corpus(), eval_prompts())]
    return input_hash("lab-model", directory_digest(SOURCES), list(TRAIN_REQUIREMENTS), texts)


def model_dir(key: str | None = None) -> Path:
    return MODEL_ROOT / (key or model_key())


def is_complete(directory: Path) -> bool:
    return all((directory / name).is_file() for name in MODEL_FILES)


def training_record(directory: Path) -> dict:
    """training.json of a trained model: steps, seconds, loss, and the greedy margins on held-out prompts."""
    return json.loads((directory / "training.json").read_text())


def ensure_training_venv(progress: Progress = print) -> Path:
    """The venv that trains the model (made once per pin set); returns its python."""
    venv = MODEL_ROOT / f"venv-{venv_key()}"
    python = venv / "bin" / "python"
    if (venv / ".complete").exists():
        return python
    shutil.rmtree(venv, ignore_errors=True)
    progress(f"lab model: training venv {venv} ({' '.join(TRAIN_REQUIREMENTS)}, ~2 min once)")
    streamed(
        [sys.executable, "-m", "venv", str(venv)],
        "lab model venv",
        "check python3-venv is installed",
        progress,
        VENV_TIMEOUT_S,
        re.compile("$^"),
    )
    streamed(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *TRAIN_REQUIREMENTS],
        "lab model venv",
        "pip must find these pins (torch 2.13.0 CPU is the serving image's own)",
        progress,
        VENV_TIMEOUT_S,
        re.compile(r"^(ERROR|Successfully)"),
    )
    (venv / ".complete").write_text(" ".join(TRAIN_REQUIREMENTS) + "\n")
    return python


def ensure_lab_model(progress: Progress = print) -> Path:
    """The trained model's directory (MODEL_ROOT/<key>): reused when its inputs are unchanged, else trained
    (a few minutes on 2 cores) into a partial directory that becomes the model only when complete."""
    key = model_key()
    target = model_dir(key)
    if is_complete(target):
        progress(f"lab model: cached {target}")
        return target
    python = ensure_training_venv(progress)
    partial = MODEL_ROOT / f"{key}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    (partial.parent / f"{key}.corpus.jsonl").write_text(_jsonl(training_corpus()))
    (partial.parent / f"{key}.eval.jsonl").write_text(_jsonl(eval_prompts()))
    progress(f"lab model: training the tiny Qwen3 into {target} (a few minutes on the CPU)")
    streamed(
        [
            str(python),
            str(TRAIN_SCRIPT),
            str(partial),
            str(partial.parent / f"{key}.corpus.jsonl"),
            str(partial.parent / f"{key}.eval.jsonl"),
        ],
        "lab model training",
        f"read the output above; rerun to retry (the partial directory {partial} is discarded)",
        progress,
        TRAIN_TIMEOUT_S,
        re.compile(r"^(model|tokenizer):"),
    )
    if not is_complete(partial):
        raise LabStepError(
            "lab model training",
            str(partial),
            "the training wrote no complete model directory",
            f"expected {', '.join(MODEL_FILES)}",
        )
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target


if __name__ == "__main__":
    print(ensure_lab_model())


def stage_on_lab_rigs(inventory: Path, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    """`rigkit stage INVENTORY` in its own process: a plain `pyinfra deploy.py` refuses a model not staged on the rig
    (staging is `rigkit deploy`'s or `rigkit stage`'s, and never runs in a process that imported pyinfra's CLI)."""
    return subprocess.run(
        [rigkit_executable(), "stage", str(inventory)], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
