"""Issue 42 wired into validation: the setting validate_pays_lengths, the sweep against the fake OpenAI server (a
prefix cache with a CPU tier behind it, as vLLM's /metrics counters show one), the rig probe as validate.py runs it
over SSH (the disk half really run here, the container's GPU half answering as a CPU rig's does), and the card
to_card assembles from them."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest
from fake_openai import FakeOpenAI
from recorded_run import RecordedRun

from rigkit.errors import ConfigError
from rigkit.remote.client import ServingClient
from rigkit.validation.card.assemble import to_card
from rigkit.validation.card.rig import render_rig_markdown
from rigkit.validation.pays import CPU_TIER, SweepPoint
from rigkit.validation.pays_sweep import check_lengths_fit, sweep_after_tiers
from rigkit.validation.procedure import TierValidation, ValidationSettings, validate_tiers
from rigkit.validation.rig_limits_probe import ProbeSizes, disk_command, gpu_command, merged, probe_rig_limits

# --- the setting ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "given,kept",
    [
        ("2048,8192,32768", (2048, 8192, 32768)),
        ("32768, 2048 ,8192", (2048, 8192, 32768)),  # sorted for the user
        ("2048,2048", (2048,)),
        ("", ()),
        (4096, (4096,)),  # pyinfra's --data turns one number into an int
        ([8192, "1024"], (1024, 8192)),  # group data as a list
    ],
)
def test_pays_lengths_are_integers_kept_sorted(given, kept):
    assert ValidationSettings.from_data({"validate_pays_lengths": given}).pays_lengths == kept


def test_no_sweep_unless_asked():
    assert ValidationSettings.from_data({}).pays_lengths == ()


@pytest.mark.parametrize(
    "given,problem",
    [
        ("512,2048", "512 not between 1,024 and"),
        ("2048,,8192", "an empty item"),
        ("2k,8k", "not an integer"),
        (True, "got a bool"),
    ],
)
def test_bad_pays_lengths_are_refused_naming_the_setting(given, problem):
    with pytest.raises(ConfigError) as caught:
        ValidationSettings.from_data({"validate_pays_lengths": given})
    assert caught.value.field == "validate_pays_lengths" and problem in caught.value.problem
    assert "2048,8192,32768" in caught.value.fix


def test_a_length_that_does_not_fit_max_model_len_with_the_reply_is_refused():
    check_lengths_fit((2048, 8000), 64, 8192)  # 8,000 + 64 + the slack fit
    with pytest.raises(ConfigError) as caught:
        check_lengths_fit((2048, 8192, 32768), 64, 8192)
    assert "8,192, 32,768 tokens" in caught.value.problem and "max-model-len 8,192" in caught.value.problem
    assert caught.value.fix == "keep every length <= 8,064"
    check_lengths_fit((32768,), 64, None)  # unknown: nothing to refuse


# --- the sweep against the fake server -------------------------------------------------------------------------------

BLOCK_TOKENS, GPU_BLOCKS = 16, 8  # a 128-token GPU pool: one filler pushes it through
# apart by 100 ms and more: a loaded 2-core host once measured the 20 ms tier above a 60 ms cold
TTFT_S = {"cold": 0.250, "warm-gpu": 0.005, "warm-connector": 0.100}


class TieredCache:
    """A fake engine's prefix cache with a CPU tier behind it, as /metrics counters and first-token delays: a session
    prompt seen and still in the GPU pool is a GPU hit; one a filler pushed out is an external hit (the CPU tier, when
    there is one); anything else is cold. A filler (max_tokens 1) empties the GPU pool of every session."""

    def __init__(self, server: FakeOpenAI, cpu_tier: bool = True):
        self.server, self.cpu_tier = server, cpu_tier
        self.gpu: set[str] = set()
        self.cpu: set[str] = set()
        self.counters = dict.fromkeys(("queries", "hits", "external_queries", "external_hits"), 0)
        server.on_completion = self.completion
        self.show()

    def completion(self, body: dict) -> None:
        prompt, tokens = body["prompt"], len(body["prompt"]) // 4
        self.counters["queries"] += tokens
        if prompt in self.gpu:
            self.counters["hits"] += tokens
            tier = "warm-gpu"
        elif prompt in self.cpu:
            self.counters["external_queries"] += tokens
            self.counters["external_hits"] += tokens
            tier = "warm-connector"
        else:
            self.counters["external_queries"] += tokens
            tier = "cold"
        if body["max_tokens"] == 1:
            self.gpu.clear()
        else:
            self.gpu.add(prompt)
            if self.cpu_tier:
                self.cpu.add(prompt)
        self.server.first_token_delay_s = TTFT_S[tier]
        self.show()

    def show(self) -> None:
        labels = '{engine="0",model_name="tiny"}'
        lines = [
            "# TYPE vllm:cache_config_info gauge",
            f'vllm:cache_config_info{{block_size="{BLOCK_TOKENS}",engine="0",num_gpu_blocks="{GPU_BLOCKS}"}} 1.0',
        ]
        for name, value in self.counters.items():
            metric = f"vllm:{'external_' if name.startswith('external') else ''}prefix_cache_"
            metric += name.removeprefix("external_")
            lines += [f"# TYPE {metric} counter", f"{metric}_total{labels} {float(value)}"]
        self.server.metrics_text = "\n".join(lines) + "\n"


def sweep_on(cache_has_cpu_tier: bool, lengths: str = "1024,2048"):
    with FakeOpenAI() as server:
        TieredCache(server, cache_has_cpu_tier)
        client = ServingClient(server.url, model="tiny")
        settings = ValidationSettings.from_data(
            {"validate_sessions": 2, "validate_seed": 7, "validate_pays_lengths": lengths, "validate_output_tokens": 4}
        )
        pool = client.metrics()
        validation = TierValidation([], [], 10_000.0, pool, client.max_model_len, [])
        progress: list[str] = []
        points = sweep_after_tiers(client, validation, settings, True, progress.append)
        return points, progress, server.completions


def test_the_sweep_measures_each_length_longest_first_and_keeps_what_the_counters_proved():
    points, progress, completions = sweep_on(cache_has_cpu_tier=True)
    assert [p.tokens for p in points] == [2048, 1024]
    for point in points:
        assert point.sessions == 2 and set(point.tiers) == {CPU_TIER}
        assert point.warm_gpu_s < point.tiers[CPU_TIER] < point.cold_s  # the fake's delays, as measured
    assert not any("not counted" in line for line in progress)
    fillers = [c for c in completions if c["max_tokens"] == 1]
    assert len(fillers) == 4  # one per session and length: the 128-token pool, pushed through by one


def test_a_cpu_tier_that_does_not_serve_is_kept_out_of_the_means_and_said():
    points, progress, _ = sweep_on(cache_has_cpu_tier=False)
    assert [p.tokens for p in points] == [2048, 1024] and all(not p.tiers for p in points)
    assert "not counted: 2,048 tokens warm-connector: 2 of 2 proved retrieved-but-unused" in progress


def test_the_sweep_refuses_lengths_the_served_context_cannot_hold():
    with pytest.raises(ConfigError) as caught:
        sweep_on(cache_has_cpu_tier=True, lengths="1024,8192")
    assert caught.value.field == "validate_pays_lengths"


# --- the rig probe as validate.py runs it ----------------------------------------------------------------------------

CPU_CONTAINER = {"gpus": [], "no_gpu": "torch sees no CUDA device", "disk": None, "errors": []}


def on_this_machine(container_answer):
    """A RigCommand running the rig's half here (a small write: the test's disk is shared) and answering for the
    container."""
    calls = []

    def run(command: str, stdin: str):
        calls.append(command)
        args = shlex.split(command)
        if args[0] == "docker":
            return None if container_answer is None else json.dumps(container_answer)
        done = subprocess.run(
            [sys.executable, *args[1:], "--disk-bytes", "2000000", "--o-direct", "no"],
            input=stdin,
            capture_output=True,
            text=True,
            env={"PATH": "/nonexistent"},  # no nvidia-smi: the lab rig's case
        )
        return done.stdout

    return run, calls


def test_a_rig_without_a_gpu_says_so_and_its_disk_is_still_measured(tmp_path):
    store = tmp_path / "lmcache"
    store.mkdir()
    run, calls = on_this_machine(CPU_CONTAINER)
    limits = probe_rig_limits(run, str(store), "rigkit-serving", ProbeSizes(file_bytes=(300_000,)))
    assert limits.no_gpu == "torch sees no CUDA device" and limits.gpus == [] and limits.pinned is None
    assert limits.errors == []  # no GPU is a finding, not an error
    assert limits.disk_path == str(tmp_path)  # beside the store, on its filesystem, not in it
    assert {(r.file_bytes, r.threads) for r in limits.disk_reads} == {(300_000, 1), (300_000, 16)}
    assert list(tmp_path.iterdir()) == [store] and list(store.iterdir()) == []
    assert calls[1].startswith("docker exec -i rigkit-serving python3 - --gpu")


def test_a_silent_container_on_a_gpu_rig_is_listed_as_not_measured():
    rig = {"gpus": [{"index": 0, "name": "NVIDIA H100", "pcie_gen": 5, "pcie_width": 16}], "disk": None, "errors": []}
    limits = probe_rig_limits(
        lambda command, stdin: None if "docker" in command else json.dumps(rig), None, "c", ProbeSizes()
    )
    assert limits.gpus[0].name == "NVIDIA H100" and limits.no_gpu is None
    assert "GPU half (the serving container) printed no result" in limits.errors[0]


def test_the_containers_rates_join_the_rigs_pcie_links_by_gpu_index():
    rig = {"gpus": [{"index": 0, "name": "H100", "pcie_gen": 4, "pcie_gen_max": 5}], "errors": ["x"], "disk": {}}
    container = {
        "gpus": [{"index": 0, "name": "H100", "h2d": {"pinned": {"bulk": 5e10}}, "block_bytes": 4096}],
        "no_gpu": None,
        "errors": [],
    }
    out = merged(rig, container, [])
    assert out["gpus"] == [
        {
            "index": 0,
            "name": "H100",
            "pcie_gen": 4,
            "pcie_gen_max": 5,
            "h2d": {"pinned": {"bulk": 5e10}},
            "block_bytes": 4096,
        }
    ]
    assert out["errors"] == ["rig: x"] and out["no_gpu"] is None


def test_probe_sizes_are_the_tiers_block_and_file():
    lmcache = ProbeSizes.of(16, 147_456, 256, 147_456)
    assert (lmcache.block_bytes, lmcache.file_bytes) == (16 * 147_456, (256 * 147_456,))
    native = ProbeSizes.of(16, 147_456, None, None)
    assert native.file_bytes == (16 * 147_456,)  # vLLM's fs tier: a file per block
    assert ProbeSizes.of(None, None, None, None) == ProbeSizes()
    assert "--block-bytes 2359296" in gpu_command("rigkit-serving", lmcache)
    assert disk_command(None, lmcache) == "python3 -"  # no L2: GPU identity only
    assert "--l2-dir /mnt/rigkit-l2 --threads 1,16 --file-bytes 37748736" in disk_command(
        "/mnt/rigkit-l2/lmcache", lmcache
    )


# --- the card ---------------------------------------------------------------------------------------------------------


def test_the_card_of_a_cpu_rig_says_no_gpu_and_still_judges_its_tiers(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    run, _ = on_this_machine(CPU_CONTAINER)
    limits = probe_rig_limits(run, str(store), "rigkit-serving", ProbeSizes(file_bytes=(300_000,)))
    with FakeOpenAI() as server:
        recorded = RecordedRun(server)
        client = ServingClient(server.url, model="tiny")
        settings = ValidationSettings.from_data({"validate_sessions": 1, "validate_seed": 1234})
        validation = validate_tiers(client, recorded.restart, settings)
    card = to_card("rig1", "run", validation, settings, rig_limits=limits, declared_kv_bytes_per_token=131_000)
    assert card.rig_limits == limits and card.pays is not None
    assert card.pays.kv_bytes_source.startswith("declared")  # no store growth in this run
    floors = {f.tier: f for f in card.pays.floors}
    assert floors["warm-connector"].floor_s is None and floors["warm-connector"].gain is not None
    md = render_rig_markdown(card)
    section = md[md.index("## ⑤ Does the tier pay?") :]
    assert "GPU: none on this rig (torch sees no CUDA device): no host-to-device link" in section
    assert "- L2 disk" in section and "KV per token: 131.0 KB (declared" in section


def test_a_sweep_joins_the_cards_own_point():
    with FakeOpenAI() as server:
        recorded = RecordedRun(server)
        client = ServingClient(server.url, model="tiny")
        settings = ValidationSettings.from_data({"validate_sessions": 1, "validate_seed": 1234})
        validation = validate_tiers(client, recorded.restart, settings)
    sweep = [SweepPoint(tokens=8000, cold_s=2.0, warm_gpu_s=0.1, tiers={CPU_TIER: 0.3}, sessions=3)]
    card = to_card("rig1", "run", validation, settings, sweep=sweep, declared_kv_bytes_per_token=131_000)
    assert sorted(p.tokens for p in card.pays.sweep)[-1] == 8000 and len(card.pays.sweep) == 2
    assert "warm-persistent" in {f.tier for f in card.pays.floors}  # only the card's own point has it
