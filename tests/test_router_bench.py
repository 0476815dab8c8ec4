"""The router benchmark (bench/router_bench.py) without the lab: its pure parts on real captured /metrics and on
constructed records, and one whole run with the REAL vllm-router (the .venv's, pinned) in front of three fake
OpenAI workers (tests/fake_openai.py) whose /metrics move per request through a made-up prefix cache.
"""

import os
import re
import sys

import pytest

from rigkit import metrics
from rigkit.errors import ConfigError
from rigkit.fleet.inventory import load_inventory
from rigkit.paths import REPO_ROOT
from rigkit.validation.soak import Plan
from tests.fake_openai import FakeOpenAI

sys.path.insert(0, str(REPO_ROOT / "bench"))
import router_bench  # noqa: E402
import router_launcher  # noqa: E402
from router_bench import (
    CACHE_AWARE,
    DIRECT,
    ROUND_ROBIN,
    LatencyPair,
    Results,
    TurnRecord,
    added_latency,  # noqa: E402
    bench_rigs,
    cache_tokens,
    format_table,
    later_turns_hit_rate,
    per_turn,
    requests_per_rig,
    served_by,
    sessions_on_one_rig,
)

METRICS = REPO_ROOT / "tests" / "fixtures" / "metrics"  # captured from the lab's vLLM (steps.json says what ran)
LAB_STATE_DIR = REPO_ROOT / "tests" / "fixtures" / "lab"


def captured_window(before: str, after: str) -> metrics.Delta:
    read = lambda name: metrics.parse((METRICS / f"{name}.txt").read_text())  # noqa: E731
    return metrics.delta(read(before), read(after))


# --- which rig served a request, and from which cache -------------------------------------------------------------


def test_a_warm_request_reads_as_its_gpu_hits_over_its_prompt_tokens():
    # prompt A again at once: 3456 of its 3516 tokens from the GPU cache (the response said cached_tokens 3456)
    assert cache_tokens(captured_window("01-after-cold", "02-after-warm-gpu")) == (3456.0, 3516.0)


def test_a_connector_hit_counts_as_a_cache_hit():
    # prompt A after the fillers: the GPU copy evicted, 3456 tokens from the ExampleConnector store
    assert cache_tokens(captured_window("03-after-fillers", "04-after-warm-connector")) == (3456.0, 3516.0)


def test_without_tokens_by_source_the_prefix_counters_are_read():
    made_up = metrics.Delta(prefix_cache_queries=300.0, prefix_cache_hits=128.0, external_prefix_cache_hits=64.0)
    assert cache_tokens(made_up) == (192.0, 300.0)


def test_the_rig_whose_tokens_moved_served_the_request():
    warm, idle = captured_window("01-after-cold", "02-after-warm-gpu"), captured_window("00-idle", "00-idle")
    assert served_by({"rig1": idle, "rig2": warm, "rig3": idle}) == ("rig2", 3456.0, 3516.0)
    # two rigs moved in one window (something else sent a request): the window names no rig
    assert served_by({"rig1": warm, "rig2": warm})[0] is None
    assert served_by({"rig1": idle})[0] is None


# --- aggregation over the records ---------------------------------------------------------------------------------


def record(target, session, turn, rig, cached, prompt, ttft, error=None):
    return TurnRecord(target, session, turn, rig, cached, prompt, ttft, error)


CONSTRUCTED = [
    record(CACHE_AWARE, 0, 0, "rig1", 0, 100, 0.30),
    record(CACHE_AWARE, 1, 0, "rig1", 0, 300, 0.50),
    record(CACHE_AWARE, 0, 1, "rig1", 100, 200, 0.10),
    record(CACHE_AWARE, 1, 1, "rig1", 300, 400, 0.20),
    record(ROUND_ROBIN, 0, 0, "rig1", 0, 100, 0.30),
    record(ROUND_ROBIN, 1, 0, "rig2", 0, 100, 0.40),
    record(ROUND_ROBIN, 0, 1, "rig3", 0, 200, 0.35),
    record(ROUND_ROBIN, 1, 1, None, 0, 0, None, error="ServingError: refused"),
]


def test_a_turns_hit_rate_weighs_its_sessions_by_tokens_and_its_ttft_is_the_median():
    first, second = per_turn(CONSTRUCTED, CACHE_AWARE)
    assert (first.turn, first.hit_rate, first.answered) == (0, 0.0, 2)
    # 400 of 600 tokens, not the mean of 50 % and 75 %
    assert second.hit_rate == pytest.approx(400 / 600)
    assert second.ttft_median_s == pytest.approx(0.15)
    assert later_turns_hit_rate(CONSTRUCTED, CACHE_AWARE) == pytest.approx(400 / 600)


def test_a_failed_turn_is_left_out_of_the_figures_and_breaks_its_sessions_rig():
    _, second = per_turn(CONSTRUCTED, ROUND_ROBIN)
    assert (second.answered, second.hit_rate, second.ttft_median_s) == (1, 0.0, 0.35)
    assert sessions_on_one_rig(CONSTRUCTED, CACHE_AWARE) == (2, 2)
    assert sessions_on_one_rig(CONSTRUCTED, ROUND_ROBIN) == (0, 2)
    assert requests_per_rig(CONSTRUCTED, ROUND_ROBIN) == {"rig1": 1, "rig2": 1, "rig3": 1}


def test_the_routers_added_latency_is_routed_minus_direct_per_pair():
    pairs = [
        LatencyPair("rig1", routed, direct)
        for routed, direct in [(0.012, 0.010), (0.015, 0.010), (0.011, 0.010), (0.030, 0.010), (0.009, 0.010)]
    ]
    figure = added_latency(pairs)
    assert figure.pairs == 5
    assert figure.median_s == pytest.approx(0.002)  # differences -1, 1, 2, 5, 20 ms
    assert figure.p90_s == pytest.approx(0.014)  # inclusive: 5 ms + 0.6 x (20 - 5) ms
    assert added_latency([]) is None


def test_the_table_puts_both_policies_side_by_side_with_direct_beside_them():
    results = Results(
        Plan(2, 2, 64, 8),
        ["rig1", "rig2", "rig3"],
        list(CONSTRUCTED),
        {CACHE_AWARE: [LatencyPair("rig1", 0.012, 0.010)], ROUND_ROBIN: []},
    )
    lines = format_table(results).splitlines()
    assert lines[0].split() == [CACHE_AWARE, ROUND_ROBIN, DIRECT]
    rows = {label: cells for label, *cells in (re.split(r"\s{2,}", line.strip()) for line in lines[1:])}
    assert rows["turn 2 hit rate"] == ["66.7%", "0.0%", "-"]
    assert rows["turn 1 TTFT median"] == ["400.0 ms", "350.0 ms", "-"]
    assert rows["sessions kept on one rig"] == ["2/2", "0/2", "0/0"]
    assert rows["requests on rig1"] == ["4", "1", "0"]
    assert rows["failed requests"] == ["0", "1", "0"]
    assert rows["router's added TTFT, median (1 pairs)"] == ["+2.0 ms", "-", "-"]


# --- the rigs of an inventory -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lab_hosts():
    """The lab inventory for the captured lab state (two host-network rigs and a netns rig), as pyinfra loads it."""
    os.environ["RIGKIT_LAB_DIR"] = str(LAB_STATE_DIR)
    try:
        return load_inventory(str(REPO_ROOT / "inventory" / "lab.py"))
    finally:
        del os.environ["RIGKIT_LAB_DIR"]


def test_every_rig_of_the_inventory_is_benched_and_a_gateway_is_not(lab_hosts):
    hosts = {**lab_hosts, "gateway": {"data": {}, "groups": ["routers"]}}
    rigs = bench_rigs(hosts)
    assert [rig.name for rig in rigs] == sorted(lab_hosts)
    assert all(rig.bind_address == "127.0.0.1" and rig.model == "tiny" for rig in rigs)
    assert [rig.serving_port for rig in rigs] == [lab_hosts[r.name]["data"]["serving_port"] for r in rigs]
    assert [rig.name for rig in bench_rigs(hosts, ["rig2"])] == ["rig2"]
    with pytest.raises(ConfigError, match="--rigs='gateway'"):
        bench_rigs(hosts, ["gateway"])


# --- the whole run, with the real router --------------------------------------------------------------------------

FAKE_BLOCK_CHARS = 64  # a block of 16 four-character "tokens"


class MadeUpPrefixCache:
    """A fake worker's prefix cache, made up: a prompt hits, in whole blocks, the longest prefix it shares with a prompt
    this worker saw before; its vllm:prefix_cache_* counters (in the captured text's format) move per completion."""

    def __init__(self, fake: FakeOpenAI):
        self.fake, self.seen, self.queries, self.hits = fake, [], 0, 0
        fake.on_completion = self.complete
        self._publish()

    def complete(self, body: dict) -> None:
        prompt = body["prompt"]
        shared = max((len(os.path.commonprefix([prompt, earlier])) for earlier in self.seen), default=0)
        self.queries += len(prompt) // 4
        self.hits += (shared // FAKE_BLOCK_CHARS) * FAKE_BLOCK_CHARS // 4
        self.seen.append(prompt)
        self._publish()

    def _publish(self) -> None:
        labels = '{engine="0",model_name="tiny"}'
        self.fake.metrics_text = (
            f"# TYPE vllm:prefix_cache_queries_total counter\n"
            f"vllm:prefix_cache_queries_total{labels} {self.queries}.0\n"
            f"# TYPE vllm:prefix_cache_hits_total counter\n"
            f"vllm:prefix_cache_hits_total{labels} {self.hits}.0\n"
        )


@pytest.fixture
def fake_workers():
    workers = [FakeOpenAI() for _ in range(3)]
    for worker in workers:
        worker.__enter__()
        worker.stream_chunks = 4
        MadeUpPrefixCache(worker)
    yield workers
    for worker in workers:
        worker.__exit__(None, None, None)


def test_the_bench_runs_through_the_real_router_which_keeps_a_session_under_cache_aware_and_spreads_it_round_robin(
    fake_workers,
):
    urls = {f"fake{i}": worker.url for i, worker in enumerate(fake_workers)}
    pairs = 3
    results = router_bench.run_bench(urls, Plan(2, 2, 64, 4), pairs, progress=lambda _line: None, seed=1)
    records = results.records
    assert [r for r in records if r.error] == []
    assert sorted((r.target, r.session, r.turn) for r in records) == sorted(
        (target, s, t) for target in (CACHE_AWARE, ROUND_ROBIN, DIRECT) for s in (0, 1) for t in (0, 1)
    )
    assert all(r.rig in urls for r in records)  # every window named the worker that answered

    # the router's behaviour: cache_aware keeps each session on one worker, round_robin moves it every turn
    assert sessions_on_one_rig(records, CACHE_AWARE) == (2, 2)
    assert sessions_on_one_rig(records, ROUND_ROBIN) == (0, 2)
    assert later_turns_hit_rate(records, CACHE_AWARE) > 0.3
    assert later_turns_hit_rate(records, ROUND_ROBIN) == 0.0
    # salted per target: no target's first turn hits what an earlier target left on the workers
    assert [per_turn(records, target)[0].hit_rate for target in (CACHE_AWARE, ROUND_ROBIN, DIRECT)] == [0.0] * 3
    salts = ("User: Session cache_aware-", "User: Session round_robin-", "User: Session direct-", "Session latency-")
    assert all(body["prompt"].startswith(salts) for worker in fake_workers for body in worker.completions)
    assert later_turns_hit_rate(records, DIRECT) == pytest.approx(later_turns_hit_rate(records, CACHE_AWARE), rel=0.2)

    # each pair's direct request went to the rig the router chose: a worker got the latency prompt once to warm it,
    # then twice per pair it served
    for policy in (CACHE_AWARE, ROUND_ROBIN):
        assert len(results.latency[policy]) == pairs
        for name, worker in zip(urls, fake_workers):
            sent = sum(1 for body in worker.completions if body["prompt"].startswith(f"Session latency-{policy}-"))
            assert sent == 1 + 2 * sum(1 for pair in results.latency[policy] if pair.rig == name), (policy, name)
    assert len({pair.rig for pair in results.latency[ROUND_ROBIN]}) == 3

    table = router_bench.report(results)
    print(table)
    assert "sessions kept on one rig" in table and "router's added TTFT, median (3 pairs)" in table


def test_a_router_over_a_dead_worker_is_reported_with_its_log():
    dead = f"http://127.0.0.1:{router_launcher.free_port()}"
    router_launcher.READY_TIMEOUT_S, saved = 3.0, router_launcher.READY_TIMEOUT_S
    try:
        with pytest.raises(router_launcher.RouterStartError, match="not healthy after 3 s"):
            with router_launcher.started_router(CACHE_AWARE, [dead]):
                pass
    finally:
        router_launcher.READY_TIMEOUT_S = saved


def test_an_unknown_policy_is_refused_before_a_router_starts():
    with pytest.raises(ConfigError, match="policy='cache-aware'"):
        router_launcher.router_argv("cache-aware", ["http://127.0.0.1:1"], 1, 2)
