"""Salted prompts for measurements: a random session id first, then a body generated from a recorded seed.

Every measured prompt starts with a random session id (the salt), so no earlier run and no
other rig's run can have cached it; the body after the salt is generated from a recorded
seed, so a run can be replayed elsewhere with the same sizes and content.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from typing import Iterator, Optional

# The kinds of prompt body (PromptSpec.kind): prose and code.
PROMPT_KINDS = ("narrative", "code")
# Rough size of one token in characters, to draft a prompt before /tokenize refines it.
CHARS_PER_TOKEN_GUESS = 4.0
# Appended to a drafted prompt to move its size off a block boundary (on_a_block_edge).
NUDGE = "\n"

_NARRATIVE_WORDS = (
    "the old lighthouse keeper walked along harbour wall while gulls circled above grey water "
    "she remembered winter storm that broke northern pier and ships waited outside reef for "
    "three days until wind turned river carried timber from hills village baker opened shutters "
    "before dawn children ran past market square with letters for captain who never returned "
    "evening lamps burned across valley and travellers spoke quietly about roads bridges rain"
).split()
_CODE_NAMES = (
    "buffer",
    "index",
    "total",
    "window",
    "offset",
    "record",
    "queue",
    "cache",
    "limit",
    "node",
    "parser",
    "result",
    "config",
    "stream",
    "batch",
    "retry",
    "token",
    "value",
    "count",
    "entry",
)


@dataclass(frozen=True)
class PromptSpec:
    """What is needed to rebuild a prompt elsewhere: its kind, target size and body seed."""

    kind: str  # "narrative" or "code"
    target_tokens: int
    seed: int


@dataclass(frozen=True)
class Prompt:
    spec: PromptSpec
    session_id: str
    text: str
    # exact count from the server's tokenizer when /tokenize answered, else the estimate
    tokens: int
    tokens_exact: bool


def _body_units(kind: str, rng: random.Random) -> Iterator[str]:
    if kind == "code":
        while True:
            a, b, c = rng.sample(_CODE_NAMES, 3)
            n = rng.randint(2, 97)
            yield (
                f"def update_{a}_{b}({a}, {b}):\n    {c} = {a} * {n} + {b}\n"
                f"    if {c} > {n * 3}:\n        return {c} - {b}\n    return {c}\n\n"
            )
    while True:
        words = [rng.choice(_NARRATIVE_WORDS) for _ in range(rng.randint(8, 16))]
        yield " ".join(words).capitalize() + ". "


def _header(kind: str, session_id: str) -> str:
    task = "Continue this code" if kind == "code" else "Continue this story"
    return f"Session {session_id}. {task}.\n\n"


def draft_text(spec: PromptSpec, session_id: str, chars: int) -> str:
    rng = random.Random(spec.seed)
    parts = [_header(spec.kind, session_id)]
    size = len(parts[0])
    for unit in _body_units(spec.kind, rng):
        if size >= chars:
            break
        parts.append(unit)
        size += len(unit)
    return "".join(parts)


def on_a_block_edge(tokens: int, block_size: Optional[int]) -> bool:
    """A prompt size a warm tier cannot be read at. k x block_size: vLLM recomputes a prompt's last token, so its GPU
    prefix hits stop a whole block short and a connector holding that block serves it (a warm-GPU repeat reads
    `mixed`: vLLM 0.26 on an H200, native-offload, 3,536 = 221 x 16 tokens). 1 + k x block_size: vLLM's
    ExampleConnector stores a prompt's first (n-1)//b*b tokens but looks up (n-2)//b*b (align_to_block_size in
    example_connector.py, vLLM 0.32), so no rig ever hits what it stored."""
    return bool(block_size) and tokens > 1 and tokens % block_size in (0, 1)


def new_session_id() -> str:
    return uuid.uuid4().hex
