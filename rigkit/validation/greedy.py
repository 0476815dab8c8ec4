"""The served-but-wrong oracle: a warm request's greedy output against references that served the same prompt.

Two runs of one prompt at temperature 0 may still part: a prompt computed with cached KV rounds differently from a
full prefill (one bf16 step moved logprobs on an H200), and where the model's top two candidates were that close,
the chosen token flips. That is numerics. Wrong KV moves logits by far more. So at the first token where the warm
output parts from a reference (before it, both saw the very same text), the oracle reads the reference's top
logprobs: the reference's logprob of its own token minus its logprob of the warm token is the margin. Below the
near-tie threshold (one figure, validate_near_tie_nats) the difference is numerics; at or above it, or when the
warm token is not even in the reference's top-k, or when the reply is shorter, longer or empty, it is
served-but-wrong. Without logprobs nothing can be told apart: any difference is served-but-wrong.

A connector tier is compared with cold and with warm-gpu, which takes the same cached-prefix path (the H200's
native CPU tier was bit-identical to the GPU prefix cache where both differed from cold): identical to either is
"same"; otherwise it is judged against the reference it follows longest (warm-gpu on a tie).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from rigkit.validation.card import GreedyCheck

SAME, NUMERICS, SERVED_BUT_WRONG = "same", "numerics", "served-but-wrong"


@dataclass(frozen=True)
class TokenChoice:
    """One generated token as the server reported it: `token` is "token_id:<n>" when asked for ids (texts collide:
    many tokens decode to ""), its logprob, and the server's top-k of that position (the chosen one included)."""

    token: str
    logprob: float
    top: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Completion:
    """What the oracle reads of one greedy request: its text and, when the server gave them, its tokens."""

    text: str
    tokens: Sequence[TokenChoice] = ()


def first_difference(a: Sequence, b: Sequence) -> Optional[int]:
    """Index of the first element that differs; a length difference parts at the shorter one's end; None: equal."""
    index = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if index is None and len(a) != len(b):
        return min(len(a), len(b))
    return index


def margin_at(
    reference: Sequence[TokenChoice], warm: Sequence[TokenChoice], index: int
) -> tuple[Optional[float], bool]:
    """(the reference's logprob of its own token minus its logprob of the warm token at `index`, is a lower bound):
    a bound when the warm token is outside the reference's top-k (at least the gap to its k-th); None: no figure
    (one reply has no token there, or no top-k was returned)."""
    if index >= len(reference) or index >= len(warm):
        return None, False
    chosen, other = reference[index], warm[index].token
    if other in chosen.top:
        return chosen.logprob - chosen.top[other], False
    if not chosen.top:
        return None, False
    return chosen.logprob - min(chosen.top.values()), True


def logprob_drift(reference: Sequence[TokenChoice], warm: Sequence[TokenChoice], upto: int) -> Optional[float]:
    """The largest difference in the chosen token's logprob over the tokens both runs share (before `upto`): how far
    numerics moved this run where the tokens agreed."""
    pairs = list(zip(reference[:upto], warm[:upto]))
    return max((abs(a.logprob - b.logprob) for a, b in pairs), default=None) if pairs else None


def compare_greedy(
    session_id: str,
    reference_text: str,
    text: str,
    *,
    reference_tokens: Sequence[TokenChoice] = (),
    tokens: Sequence[TokenChoice] = (),
    near_tie_nats: Optional[float] = None,
    reference: str = "cold",
) -> GreedyCheck:
    """One warm request's greedy output against one reference's for the same session.

    Tokens (with their top-k) from both runs make a first difference classifiable; without them, any difference is
    served-but-wrong. A reply shorter, longer or empty against the reference's is served-but-wrong whatever the
    logprobs say (a cut reply is never numerics)."""
    char_difference = first_difference(reference_text, text)
    with_tokens = bool(reference_tokens) and bool(tokens)
    token_difference = (
        first_difference([t.token for t in reference_tokens], [t.token for t in tokens]) if with_tokens else None
    )
    same = char_difference is None and token_difference is None
    margin, bound = (None, False)
    if token_difference is not None:
        margin, bound = margin_at(reference_tokens, tokens, token_difference)
    if same:
        verdict = SAME
    elif (
        margin is not None
        and not bound
        and near_tie_nats is not None
        and margin < near_tie_nats
        and len(tokens) == len(reference_tokens)
        and len(text) > 0
    ):
        verdict = NUMERICS
    else:
        verdict = SERVED_BUT_WRONG
    drift = (
        logprob_drift(reference_tokens, tokens, len(tokens) if token_difference is None else token_difference)
        if with_tokens
        else None
    )
    return GreedyCheck(
        session=session_id[:8],
        same=same,
        verdict=verdict,
        reference=reference,
        reference_text=reference_text,
        text=text,
        first_difference=char_difference,
        first_difference_token=token_difference,
        margin_nats=margin,
        margin_is_bound=bound,
        near_tie_nats=near_tie_nats,
        logprob_drift=drift,
        tokens_compared=min(len(reference_tokens), len(tokens)) if with_tokens else None,
    )


def judge(
    session_id: str, references: Sequence[tuple[str, Completion]], warm: Completion, near_tie_nats: Optional[float]
) -> GreedyCheck:
    """The warm output against each reference (in order, the preferred last): identical to one is "same" (that
    reference named); else the comparison with the reference it follows longest."""
    checks = [
        compare_greedy(
            session_id,
            ref.text,
            warm.text,
            reference_tokens=ref.tokens,
            tokens=warm.tokens,
            near_tie_nats=near_tie_nats,
            reference=name,
        )
        for name, ref in references
    ]
    identical = [check for check in checks if check.same]
    if identical:
        return identical[-1].model_copy(update={"compared_with": [name for name, _ in references]})

    def agreement(item: tuple[int, GreedyCheck]) -> tuple[int, int, int]:
        order, check = item
        return (
            check.first_difference_token if check.first_difference_token is not None else -1,
            check.first_difference if check.first_difference is not None else -1,
            order,
        )

    _, closest = max(enumerate(checks), key=agreement)
    return closest.model_copy(update={"compared_with": [name for name, _ in references]})
