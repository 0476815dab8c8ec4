"""The cache proof on a canary: validate.py's own procedure cut short (rigkit.validation.procedure.validate_tiers, one salted
session, no restart), through the SSH tunnel to the rig's serving API. Cold, warm-gpu (GPU prefix hits grew), GPU
eviction by fillers, warm-connector (external hits grew)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from rigkit.remote.client import ServingClient
from rigkit.remote.tunnel import serving_url
from rigkit.validation.procedure import ValidationSettings, validate_tiers
from rigkit.validation.tiers import Tier

# The deploy has just waited for the API: a proof that finds it silent this long fails (the engine died).
PROOF_READY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Proof:
    passed: bool
    words: str  # what it proved, or why not


def proof_verdict(validation: Any, connector_configured: bool) -> Proof:
    """A short cache proof's verdict (rigkit.validation.procedure.TierValidation) in words."""
    problems = list(validation.failures)
    proved = []
    expected = [Tier.COLD, Tier.WARM_GPU] + ([Tier.WARM_CONNECTOR] if connector_configured else [])
    for tier in expected:
        run = validation.tier(tier)
        if run is None or not run.labels:
            problems.append(f"{tier.value}: not measured")
            continue
        result = run.result()
        got = run.labels[-1]
        if not result.passed:
            aborted = f", request aborted in {result.aborted[0]}" if result.aborted else ""
            problems.append(
                f"{tier.value} expected, measured {got.tier.value} (GPU hits +{got.gpu_hits:.0f}, "
                f"external hits +{got.external_hits:.0f}{aborted})"
            )
        elif tier == Tier.WARM_GPU:
            proved.append(f"warm-gpu +{got.gpu_hits:.0f} GPU hits")
        elif tier == Tier.WARM_CONNECTOR:
            proved.append(
                f"warm-connector +{got.external_hits:.0f} external hits after {validation.fillers_sent} fillers"
            )
    if problems:
        return Proof(False, "; ".join(problems))
    scope = "" if connector_configured else " (no KV connector: GPU prefix cache only)"
    return Proof(True, "cache proof passed: " + ", ".join(proved) + scope)


def prove_cache(
    client: Any, data: Mapping[str, Any], connector_configured: bool, ready_timeout_s: float = PROOF_READY_TIMEOUT_S
) -> Proof:
    """validate.py's tier procedure cut short: one salted session, no restart, no soak or A/B."""
    settings = replace(ValidationSettings.from_data(data), sessions=1, restart=False, decode_ab=False, soak_sessions=0)
    try:
        client.wait_ready(timeout_s=ready_timeout_s)
        return proof_verdict(
            validate_tiers(client, None, settings, connector_configured=connector_configured), connector_configured
        )
    except Exception as exc:  # a dead engine, a refused request: the proof failed, in its own words
        return Proof(False, f"{type(exc).__name__}: {exc}")


def prove_rig(rig: str, data: Mapping[str, Any], stack: Any) -> Proof:
    """The cache proof on one rig, through the SSH tunnel to its serving API (rigkit.remote.tunnel)."""

    knobs = stack.knobs
    try:
        with serving_url(data, knobs["bind_address"], knobs["serving_port"], inventory_name=rig) as url:
            client = ServingClient(url, model=knobs["served_model_name"])
            return prove_cache(client, data, stack.profile.connector is not None)
    except Exception as exc:  # the tunnel itself
        return Proof(False, f"{type(exc).__name__}: {exc}")
