"""The router benchmark (bench/router_bench.py) on the deployed lab: the real vllm-router over every lab rig (rig3 in
its own network namespace through its SSH tunnel, like the others), 3 sessions × 3 turns per target and 5 latency
pairs per policy. Behaviour is asserted, never speed: under cache_aware every later turn of a session hit the cache
of the rig its session stayed on, round_robin moved sessions between rigs and its later turns hit less, direct
(session s on rig s mod 3) hit as cache_aware does, and the table prints both policies. The bench only sends
requests: the rigs keep serving release 1 as the `deployed` fixture left them.
"""

from __future__ import annotations

import sys

import pytest

from rigkit.fleet.inventory import load_inventory
from rigkit.paths import REPO_ROOT
from rigkit.validation.soak import Plan

sys.path.insert(0, str(REPO_ROOT / "bench"))
import router_bench  # noqa: E402
from router_bench import CACHE_AWARE, DIRECT, ROUND_ROBIN  # noqa: E402

pytestmark = [pytest.mark.lab, pytest.mark.vllm]

# a message fills one KV block of the CPU build (128 tokens): a later turn hits at least the block before it
PLAN = Plan(sessions=3, turns=3, message_tokens=128, reply_tokens=16)
PAIRS = 5


@pytest.fixture(scope="module")
def bench(lab, deployed):
    # the inventory as pyinfra merges it (group_data/lab.py's profile), as the bench's own command reads it
    rigs = router_bench.bench_rigs(load_inventory(str(REPO_ROOT / "inventory" / "lab.py")))
    with router_bench.rig_urls(rigs) as urls:
        results = router_bench.run_bench(urls, PLAN, PAIRS, model=rigs[0].model, seed=15)
    print("\n" + router_bench.report(results))
    return results


def test_the_bench_ran_every_turn_over_every_rig(lab, bench):
    assert sorted(bench.rigs) == sorted(rig.name for rig in lab.rigs)
    assert [r for r in bench.records if r.error] == []
    assert len(bench.records) == 3 * PLAN.sessions * PLAN.turns
    assert all(r.rig in bench.rigs for r in bench.records), "a /metrics window named no single rig"


def test_cache_aware_keeps_each_session_on_one_rig_and_every_later_turn_hits(bench):
    records = [r for r in bench.records if r.target == CACHE_AWARE]
    assert router_bench.sessions_on_one_rig(bench.records, CACHE_AWARE) == (PLAN.sessions, PLAN.sessions)
    assert all(r.cached_tokens == 0 for r in records if r.turn == 0)  # salted
    later = [r for r in records if r.turn > 0]
    assert all(r.cached_tokens >= 128 for r in later), [(r.session, r.turn, r.cached_tokens) for r in later]
    for figure in router_bench.per_turn(bench.records, CACHE_AWARE)[1:]:
        assert figure.hit_rate >= 0.3, figure


def test_round_robin_moves_sessions_and_its_later_turns_hit_less(bench):
    assert router_bench.sessions_on_one_rig(bench.records, ROUND_ROBIN)[0] == 0
    cache_aware = router_bench.later_turns_hit_rate(bench.records, CACHE_AWARE)
    round_robin = router_bench.later_turns_hit_rate(bench.records, ROUND_ROBIN)
    assert round_robin < cache_aware / 2, (round_robin, cache_aware)
    direct = router_bench.later_turns_hit_rate(bench.records, DIRECT)
    assert direct >= 0.3 and router_bench.sessions_on_one_rig(bench.records, DIRECT) == (PLAN.sessions, PLAN.sessions)


def test_the_latency_pairs_ran_and_the_table_prints_both_policies(bench):
    for policy in (CACHE_AWARE, ROUND_ROBIN):
        assert len(bench.latency[policy]) == PAIRS
        assert all(pair.rig in bench.rigs for pair in bench.latency[policy])
    header, *rows = router_bench.format_table(bench).splitlines()
    assert header.split() == [CACHE_AWARE, ROUND_ROBIN, DIRECT]
    assert any(row.startswith("router's added TTFT, median") and row.count("ms") == 2 for row in rows)
