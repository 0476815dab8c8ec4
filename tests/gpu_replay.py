"""Replay a GPU run's record (bench/gpu: every /metrics scrape and every completion of one stack, in order) through
rigkit's own validation, so the ordinary suite judges what a real H200 served (CI has no GPU).

ReplayClient is rigkit's ServingClient with its transport replaced by the record: each /metrics scrape answers the
next recorded text, each completion the next recorded result. Prompts are built as usual (the texts differ from the
recorded ones; the counters and outputs are the engine's). A restart is a no-op: the record goes on with the scrapes
taken after the real one.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path
from typing import Optional

from rigkit.remote.client import ServingClient, StreamResult, TokenChoice
from rigkit.validation.procedure import LOGPROBS_WARMUP_PROMPT, ValidationSettings, validate_tiers

GPU_FIXTURES = Path(__file__).parent / "fixtures" / "gpu-h200-vllm0.26"


def read_record(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


WARMUP_SHA = hashlib.sha256(LOGPROBS_WARMUP_PROMPT.encode()).hexdigest()[:16]


def _block_size_asked(record: list[dict]) -> list[dict]:
    """The scrape a client made for its engine's block size (ServingClient.block_size, asked once when it first counts
    a prompt's tokens, which validate_tiers does right after its warm-up). The replay counts no tokens, so it never
    asks: that scrape is skipped. Records made before the block size was asked have no scrape there."""
    for i, item in enumerate(record[:-2]):
        if item["kind"] == "request" and item.get("prompt_sha") == WARMUP_SHA:
            after, then = record[i + 1], record[i + 2]
            return [after] if after["kind"] == "scrape" and then["kind"] == "request" else []
    return []


class RecordExhausted(AssertionError):
    """The procedure asked for more than the GPU run recorded: it no longer walks the steps that ran."""


class ReplayClient(ServingClient):
    def __init__(self, record: list[dict], max_model_len: Optional[int] = 8192, model: str = "tiny"):
        super().__init__("http://replay.invalid", model=model)
        self.scrapes = [
            item["text"] for item in record if item["kind"] == "scrape" and item not in _block_size_asked(record)
        ]
        self.requests = [item for item in record if item["kind"] == "request"]
        self._max_model_len = max_model_len
        self.scraped = self.answered = 0
        self.stands_for: dict[str, str] = {}  # an asked prompt's text -> the recorded prompt's sha it replays

    def models(self) -> list[dict]:
        return [{"id": self._model, "max_model_len": self._max_model_len}]

    def wait_ready(self, timeout_s: float = 0, poll_s: float = 0) -> float:
        return 0.0

    def count_tokens(self, text: str) -> Optional[int]:
        return None

    def metrics_text(self) -> str:
        if self.scraped >= len(self.scrapes):
            raise RecordExhausted(f"scrape {self.scraped + 1} asked, {len(self.scrapes)} recorded")
        self.scraped += 1
        return self.scrapes[self.scraped - 1]

    def stream_completion(self, prompt: str, max_tokens: int, *args, **kwargs) -> StreamResult:
        upcoming = self.requests[self.answered] if self.answered < len(self.requests) else None
        if prompt == LOGPROBS_WARMUP_PROMPT and (upcoming is None or upcoming.get("prompt_sha") != WARMUP_SHA):
            # a warm-up the record does not hold (one from before the warm-up existed, or the one after a restart,
            # rigkit.validation.procedure): it measures nothing, answer it here with one token and its logprobs
            return StreamResult(
                tokens=[TokenChoice("token_id:0", -0.1, {"token_id:0": -0.1})],
                ttft_s=0.01,
                total_s=0.01,
                prompt_tokens=8,
                completion_tokens=1,
                cached_tokens=0,
                chunks=1,
                text="",
                decode_tps=None,
            )
        known = self.stands_for.get(prompt)
        if known is not None and (upcoming is None or upcoming.get("prompt_sha") != known):
            # the same prompt again where the record went on to another one: an unmeasured repeat added after the
            # record was made (validation's repeat band, warm-shared's second request on the source). Not answered:
            # nothing is judged on a figure the GPU never gave
            return StreamResult(
                ttft_s=None,
                total_s=0.0,
                prompt_tokens=None,
                completion_tokens=0,
                cached_tokens=None,
                chunks=0,
                text="",
                decode_tps=None,
                aborted=True,
                abort_phase="prefill",
                error="not in the record",
            )
        if upcoming is None:
            raise RecordExhausted(f"completion {self.answered + 1} asked, {len(self.requests)} recorded")
        self.stands_for.setdefault(prompt, upcoming.get("prompt_sha", ""))
        self.answered += 1
        result = dict(upcoming["result"])
        result["tokens"] = [TokenChoice(t["token"], t["logprob"], t.get("top") or {}) for t in result.get("tokens", [])]
        return StreamResult(**result)


class RecordedStore:
    """The store as the record saw it: no file to list (the damage was done on the device), each damage answered
    with what it changed there."""

    def __init__(self, rows: list[dict]):
        self.rows = iter(rows)

    def files(self) -> dict:
        return {}

    def damage(self, names, damage, layers):
        row = next(self.rows)
        assert row["damage"] == damage
        return row["files"], row["bytes_damaged"]

    def remove(self, names):
        return len(names)


def top_margins(records: list[Path]) -> list[float]:
    """Top-1 minus top-2 logprob of every generated token of the recorded requests (the model's sureness)."""
    margins = []
    for path in records:
        with gzip.open(path, "rt") as f:
            for line in f:
                item = json.loads(line)
                if item["kind"] == "request" and item["max_tokens"] > 1:
                    for token in item["result"]["tokens"]:
                        ranked = sorted(token["top"].values(), reverse=True)
                        margins += [ranked[0] - ranked[1]] if len(ranked) > 1 else []
    return margins


def replay_with_power(run_dir: Path, name: str, restart=lambda: None):
    """A recorded `<case>-<length>` of a GPU check run with the power self-test on code prompts, walked through rigkit's
    validate_tiers (each damage answered from the record): (the validation, the recorded result.json)."""
    recorded = json.loads((run_dir / name / "result.json").read_text())
    case, length = name.rsplit("-", 1)
    info = {s["case"]: s for s in json.loads((run_dir / "stacks.json").read_text())["stacks"]}[case]
    settings = ValidationSettings.from_data(
        {"validate_prompt_kind": "code", "validate_power_selftest": True, "validate_prompt_tokens": int(length)}
    )
    validation = validate_tiers(
        ReplayClient(read_record(run_dir / name / "record.jsonl.gz")),
        restart,
        settings,
        not_applicable=info["not_applicable"],
        store_chunk_tokens=info["store_chunk_tokens"],
        bit_exact_tiers=info["bit_exact_tiers"],
        store=RecordedStore(recorded["power"]["rows"]),
    )
    return validation, recorded
