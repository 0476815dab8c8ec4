"""The L1 gate of issue 42: a warning when the declared CPU tier cannot hold one session of max_model_len under its
cache's eviction rule (rigkit.settings.eviction): such a session is evicted, wholly or in part, before it is asked
again, and every long request recomputes."""

from __future__ import annotations

import math

from rigkit.preflight.findings import Finding
from rigkit.settings.hostdata import Settings
from rigkit.settings.sizing import GB, GIB


def check_l1_session(settings: Settings) -> list[Finding]:
    max_len, per_token, rule = settings.knobs.get("max_model_len"), settings.kv_bytes_per_token, settings.l1_eviction
    if rule is None or not settings.l1_gib or not max_len or not per_token:
        return []  # no CPU tier, a rule rigkit does not know, or the session's size unknown: nothing to compare
    session = max_len * per_token
    if rule.sessions_held(settings.l1_bytes, session) >= 1:
        return []
    needed_gib = math.ceil(session / rule.fits_fraction / GIB)
    return [
        Finding(
            "warn",
            "l1_session",
            "l1_size_gb",
            settings.l1_gib,
            f"L1 {settings.l1_gib} GiB cannot hold one {max_len:,}-token session ({session / GB:.1f} GB at "
            f"{per_token:,} bytes/token): {rule.text}, so it holds {100 * rule.fits_fraction:.0f} % of it "
            f"before evicting; a session this long is recomputed",
            f"set l1_size_gb to at least {needed_gib} (GiB), or a lower max_model_len",
        )
    ]
