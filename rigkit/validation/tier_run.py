"""One tier's raw measurements, one request per session, and what the card says of them: the counters' labels,
the TTFTs, and each output's served-right verdict against its references (rigkit.validation.greedy)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from rigkit.prompts import Prompt
from rigkit.validation.card import GreedyCheck, StatModel, TierProof, TierResult, TTFTPair
from rigkit.validation.greedy import NUMERICS, SAME, Completion, Tolerance, judge
from rigkit.validation.measure import Measured
from rigkit.validation.tiers import Tier, TierLabel


def completion_of(measured: Measured) -> Completion:
    return Completion(measured.result.text, measured.result.tokens)


@dataclass
class TierRun:
    """Raw measurements of one tier (one entry per session)."""

    expected: Tier
    # the cold run whose greedy output a warm tier must repeat, session by session (None: the cold tier itself)
    reference: Optional["TierRun"] = None
    # a run on the same cached-prefix path (warm-gpu, for a connector tier): an output identical to its is right too
    same_path: Optional["TierRun"] = None
    # how far this path's logprobs may move from its references (rigkit.validation.greedy); set before result()
    tolerance: Tolerance = Tolerance(None)
    measured: list[Measured] = field(default_factory=list)
    labels: list[TierLabel] = field(default_factory=list)
    prompts: list[Prompt] = field(default_factory=list)

    def completions(self) -> dict[str, Completion]:
        """Session -> the output of each request that completed."""
        return {p.session_id: completion_of(m) for p, m in zip(self.prompts, self.measured) if not m.result.aborted}

    def greedy(self) -> list[GreedyCheck]:
        """Each completed request's output against the references' completed ones for the same session."""
        if self.reference is None:
            return []
        references = [
            (run.expected.value, run.completions()) for run in (self.reference, self.same_path) if run is not None
        ]
        checks = []
        for prompt, measured in zip(self.prompts, self.measured):
            found = [(name, outputs[prompt.session_id]) for name, outputs in references if prompt.session_id in outputs]
            if measured.result.aborted or not found or found[0][0] != references[0][0]:
                continue
            checks.append(judge(prompt.session_id, found, completion_of(measured), self.tolerance))
        return checks

    def result(self) -> TierResult:
        greedy = self.greedy()
        return TierResult(
            expected=self.expected.value,
            labels=[lab.tier.value for lab in self.labels],
            passed=bool(self.labels)
            and all(lab.passed for lab in self.labels)
            and not any(m.result.aborted for m in self.measured)
            and all(check.verdict in (SAME, NUMERICS) for check in greedy),
            ttft_s=StatModel.of([m.result.ttft_s for m in self.measured if not m.result.aborted]),
            server_ttft_s=StatModel.of([m.window.server_ttft_mean for m in self.measured if not m.result.aborted]),
            ttft_within_tolerance=[m.ttft_check.within for m in self.measured if m.ttft_check],
            ttft_pairs=[
                TTFTPair(
                    client_s=m.ttft_check.client_s,
                    server_s=m.ttft_check.server_s,
                    within=m.ttft_check.within,
                    api_overhead_s=m.ttft_check.api_overhead_s,
                )
                for m in self.measured
                if m.ttft_check
            ],
            greedy=greedy,
            prompt_tokens=[m.result.prompt_tokens or p.tokens for m, p in zip(self.measured, self.prompts)],
            aborted=[m.result.abort_phase or "?" for m in self.measured if m.result.aborted],
            proofs=[
                TierProof(
                    label=lab.tier.value,
                    gpu_hits=lab.gpu_hits,
                    gpu_queries=lab.gpu_queries,
                    external_hits=lab.external_hits,
                    external_queries=lab.external_queries,
                    external_kv_transfer_tokens=lab.external_kv_transfer_tokens,
                    counters_reset=m.window.reset,
                    text=lab.proof,
                    store_tier=lab.store_tier,
                    store_tier_source=lab.store_tier_source,
                )
                for m, lab in zip(self.measured, self.labels)
            ],
        )
