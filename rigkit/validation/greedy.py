"""The served-but-wrong oracle: a warm request's greedy output and logprobs against runs that served the same prompt.

Wrong KV moves the next-token distribution; numerics moves it too, by an amount that depends on the rig, the model
and the path (a cached prefix rounds differently from a full prefill; LMCache recomputes the tail past its last whole
chunk). So the oracle never reads one token's margin (a model unsure of the prompt makes every difference a near
tie, and a store damaged in every block passed on an H100 that way). It reads the *shift*: at every position where
both runs saw the same text (up to and including the first token where they part), the largest move of any top-k
logprob between them, the largest over those positions. Each path's tolerance is measured in the same run
(rigkit.validation.procedure; calibration_bands reads them): the GPU prefix cache asked twice (the repeat band: 0 on
every GPU seen) and the GPU prefix cache against the fresh prefill (the cached-vs-fresh band). A path declared
bit-exact to the GPU prefix cache (profiles.yaml `bit_exact_tiers`: the native CPU and fs tiers load whole blocks as
stored) is held to the repeat band; any other to BAND_FACTOR times the larger band. A shift above the tolerance is
served-but-wrong whether or not the tokens changed; an output that differs with no calibrated band to explain it is
"inconclusive", which does not pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence

from rigkit.remote.client import TokenChoice
from rigkit.validation.card import GreedyCheck

SAME, NUMERICS, SERVED_BUT_WRONG, INCONCLUSIVE = "same", "numerics", "served-but-wrong", "inconclusive"
# A path that is not bit-exact may move logprobs this many times the largest band calibrated in the same run: a
# handful of sessions see less than the band's true maximum (an H100's LMCache path drifted 0.03-0.06 nats where
# three sessions of cached-vs-fresh showed 0.03) and shifts come in bf16 steps of the logprob: an H200's LMCache path moved
# 0.125 where its cached-vs-fresh band was one step, 0.062.
BAND_FACTOR = 3.0


@dataclass(frozen=True)
class Completion:
    """What the oracle reads of one greedy request: its text and, when the server gave them, its tokens."""

    text: str
    tokens: Sequence[TokenChoice] = ()


@dataclass(frozen=True)
class Tolerance:
    """How far a path's logprobs may move from its reference and still be numerics (nats); None: nothing measured
    can say (an output that differs is then inconclusive). `source` says where the figure came from."""

    nats: Optional[float]
    exact: bool = False
    source: str = ""


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
    (one reply has no token there, or no top-k was returned). Shown on the card; the verdict reads the shift."""
    if index >= len(reference) or index >= len(warm):
        return None, False
    chosen, other = reference[index], warm[index].token
    if other in chosen.top:
        return chosen.logprob - chosen.top[other], False
    if not chosen.top:
        return None, False
    return chosen.logprob - min(chosen.top.values()), True


def position_shift(a: TokenChoice, b: TokenChoice) -> Optional[float]:
    """The largest move of a top-k logprob between two runs at one position that saw the same text: tokens in both
    top-k compared directly; a token in one top-k only is at or below the other's k-th, a lower bound on its move.
    None: neither run gave a top-k."""
    top_a = dict(a.top) or {a.token: a.logprob}
    top_b = dict(b.top) or {b.token: b.logprob}
    if not a.top and not b.top and a.token != b.token:
        return None
    moves = [abs(top_a[t] - top_b[t]) for t in top_a.keys() & top_b.keys()]
    for mine, other in ((top_a, top_b), (top_b, top_a)):
        floor = min(other.values())
        moves += [max(0.0, lp - floor) for t, lp in mine.items() if t not in other]
    return max(moves, default=None)


def shift(reference: Sequence[TokenChoice], warm: Sequence[TokenChoice]) -> tuple[Optional[float], int]:
    """(the largest position_shift over the positions where both runs saw the same text, how many positions): up
    to and including the first differing token, whose distribution was computed on the same text in both."""
    parted = first_difference([t.token for t in reference], [t.token for t in warm])
    upto = min(len(reference), len(warm)) if parted is None else min(parted + 1, len(reference), len(warm))
    shifts = [position_shift(a, b) for a, b in zip(reference[:upto], warm[:upto])]
    measured = [s for s in shifts if s is not None]
    return (max(measured) if measured else None), len(measured)


def logprob_drift(reference: Sequence[TokenChoice], warm: Sequence[TokenChoice], upto: int) -> Optional[float]:
    """The largest difference in the chosen token's logprob over the tokens both runs share (before `upto`)."""
    pairs = list(zip(reference[:upto], warm[:upto]))
    return max((abs(a.logprob - b.logprob) for a, b in pairs), default=None) if pairs else None


def band(pairs: Iterable[tuple[Completion, Completion]]) -> Optional[float]:
    """The largest shift between the two runs of each pair (a calibration: the same path twice, or cached against
    fresh); None: no pair carried logprobs."""
    shifts = [shift(a.tokens, b.tokens)[0] for a, b in pairs if a.tokens and b.tokens]
    measured = [s for s in shifts if s is not None]
    return max(measured) if measured else None


def calibration_bands(
    fresh: Mapping[str, Completion], cached: Mapping[str, Completion], repeats: Mapping[str, Completion]
) -> tuple[Optional[float], Optional[float]]:
    """(repeat band, cached-vs-fresh band) of one run, each argument session -> output: the GPU prefix cache's
    (`cached`) against the same request asked once more (`repeats`), and against the fresh prefill's (`fresh`)."""
    repeat = band((cached[s], repeats[s]) for s in cached if s in repeats)
    cached_vs_fresh = band((fresh[s], cached[s]) for s in cached if s in fresh)
    return repeat, cached_vs_fresh


def calibrated(repeat: Optional[float], cached_vs_fresh: Optional[float], exact: bool, ceiling: float) -> Tolerance:
    """A connector path's tolerance from the bands measured in the same run (module docstring). A cached-vs-fresh
    band above `ceiling` (validate_numerics_ceiling_nats) is not trusted as numerics: the tolerance is then unknown."""
    if exact:
        nats = repeat if repeat is not None else 0.0
        seen = f"{repeat:.4f} nats" if repeat is not None else "not measured"
        return Tolerance(nats, True, f"bit-exact path: the GPU prefix cache's repeat band ({seen})")
    if cached_vs_fresh is None:
        return Tolerance(None, False, "no cached-vs-fresh band was measured (no logprobs)")
    if cached_vs_fresh > ceiling:
        return Tolerance(
            None,
            False,
            f"the cached-vs-fresh band {cached_vs_fresh:.4f} nats is above validate_numerics_ceiling_nats {ceiling:g}",
        )
    widest = max(cached_vs_fresh, repeat or 0.0)
    return Tolerance(
        widest * BAND_FACTOR,
        False,
        f"{BAND_FACTOR:g} x the widest band measured (cached-vs-fresh {cached_vs_fresh:.4f}, repeat "
        f"{repeat if repeat is not None else 0.0:.4f} nats)",
    )


def compare_greedy(
    session_id: str,
    reference_text: str,
    text: str,
    *,
    reference_tokens: Sequence[TokenChoice] = (),
    tokens: Sequence[TokenChoice] = (),
    tolerance: Tolerance = Tolerance(None),
    reference: str = "cold",
) -> GreedyCheck:
    """One warm request's output against one reference's for the same session.

    With tokens and top-k from both runs: the shift against the tolerance decides (module docstring). Without them,
    any difference is served-but-wrong; so is a reply without logprobs where the reference has them. An empty reply
    against a non-empty reference is served-but-wrong."""
    char_difference = first_difference(reference_text, text)
    with_tokens = bool(reference_tokens) and bool(tokens)
    token_difference = (
        first_difference([t.token for t in reference_tokens], [t.token for t in tokens]) if with_tokens else None
    )
    same_output = char_difference is None and token_difference is None
    margin, bound = (
        margin_at(reference_tokens, tokens, token_difference) if token_difference is not None else (None, False)
    )
    moved, positions = shift(reference_tokens, tokens) if with_tokens else (None, 0)
    within = moved is not None and tolerance.nats is not None and moved <= tolerance.nats
    if not text and reference_text:
        verdict = SERVED_BUT_WRONG
    elif reference_tokens and not tokens:
        # logprobs were asked (the reference has them) and the reply has none: a null logprob at its first token, as
        # NaN logits from damaged KV give (an H100's fs tier with 256 bytes per block overwritten)
        verdict = SERVED_BUT_WRONG
    elif moved is None:
        verdict = SAME if same_output else SERVED_BUT_WRONG
    elif tolerance.nats is None:
        verdict = SAME if same_output and moved == 0 else INCONCLUSIVE
    elif not within:
        verdict = SERVED_BUT_WRONG
    else:
        verdict = SAME if same_output else NUMERICS
    drift = (
        logprob_drift(reference_tokens, tokens, len(tokens) if token_difference is None else token_difference)
        if with_tokens
        else None
    )
    return GreedyCheck(
        session=session_id[:8],
        same=same_output,
        verdict=verdict,
        reference=reference,
        reference_text=reference_text,
        text=text,
        first_difference=char_difference,
        first_difference_token=token_difference,
        margin_nats=margin,
        margin_is_bound=bound,
        logprob_drift=drift,
        tokens_compared=min(len(reference_tokens), len(tokens)) if with_tokens else None,
        shift_nats=moved,
        positions_compared=positions,
        tolerance_nats=tolerance.nats,
        tolerance_exact=tolerance.exact,
        tolerance_source=tolerance.source,
    )


# Worst first: the check a tier keeps when several references disagree about it.
_RANK = {SAME: 0, NUMERICS: 1, INCONCLUSIVE: 2, SERVED_BUT_WRONG: 3}


def judge(
    session_id: str, references: Sequence[tuple[str, Completion]], warm: Completion, tolerance: Tolerance
) -> GreedyCheck:
    """The warm output against each reference (in order, the preferred last: the same cached-prefix path). A
    bit-exact path is judged against the preferred reference alone; any other by the reference it is closest to
    (the best verdict, then the smallest shift, then the later reference)."""
    chosen = references[-1:] if tolerance.exact else references
    checks = [
        compare_greedy(
            session_id,
            ref.text,
            warm.text,
            reference_tokens=ref.tokens,
            tokens=warm.tokens,
            tolerance=tolerance,
            reference=name,
        )
        for name, ref in chosen
    ]

    def closeness(item: tuple[int, GreedyCheck]) -> tuple[int, float, int]:
        order, check = item
        moved = check.shift_nats if check.shift_nats is not None else float("inf")
        return (_RANK[check.verdict], moved, -order)

    _, best = min(enumerate(checks), key=closeness)
    return best.model_copy(update={"compared_with": [name for name, _ in references]})
