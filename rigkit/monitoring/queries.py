"""Every dashboard panel and alert rule as a declaration: its PromQL, the metrics it reads and what a rig needs
to have them. The metric names come from rigkit.metrics (vLLM, LMCache: the ones the tier proof
reads), rigkit/files/node_textfile.py (GPUs, /dev/shm, L2), the node exporter and vllm-router; nothing here
spells a metric name of its own in a query.

A panel's query holds ``{sel}`` where its label selector goes: nothing on the fleet dashboard, the chosen rig
on the per-rig one (Grafana's ``$rig``). ``needs`` names what a rig must have for the series to exist
(NEEDS); the lab test skips a panel whose needs the CPU lab cannot meet, with that reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from rigkit import metrics as vllm
from rigkit.files import node_textfile as textfile

# Prometheus jobs (rigkit.monitoring.prometheus renders one scrape job each).
JOB_VLLM = "rigkit_vllm"
JOB_LMCACHE = "rigkit_lmcache"
JOB_NODE = "rigkit_node"
JOB_ROUTER = "rigkit_router"

# Prometheus' own and the node exporter's metrics (node_exporter 1.5, Debian 12), and vllm-router 0.1.17's
# (tests/fixtures/router/vllm-router-0.1.17-metrics.txt, captured from the real router).
UP = "up"
NODE_MEM_AVAILABLE = "node_memory_MemAvailable_bytes"
NODE_MEM_TOTAL = "node_memory_MemTotal_bytes"
# Workers the router routes to. Its per-worker gauge (vllm_router_worker_health) keeps a removed worker's last
# value (1) after /remove_worker: only this count says a rig left.
ROUTER_ACTIVE_WORKERS = "vllm_router_active_workers"
ROUTER_PROCESSED = "vllm_router_processed_requests_total"

# What a rig needs for a panel's series to exist, and why the CPU lab has it or not (LAB_LACKS).
NEEDS = {
    "gpu": "nvidia-smi on the rig (rigkit_gpu_* from the textfile collector)",
    "lmcache": "a profile running LMCache MP (lmcache_mp_* on its lmcache_http_port)",
    "native_offload": "vLLM's OffloadingConnector (native-offload, native-tiered: vllm:kv_offload_*)",
    "cached_by_source": "vLLM 0.32 or later (0.26 does not export vllm:prompt_tokens_cached_by_source)",
    "router": "a gateway (group routers) scraped by the monitoring host",
    "l2": "an L2 tier with its janitor (rigkit_l2_* from its status file)",
    "node_exporter": "node_exporter: true on the rig",
}
# The one place the lab's missing series are declared: what a CPU lab rig cannot have, with the reason.
LAB_LACKS = {
    "gpu": "the lab's rigs have no GPU and no nvidia-smi",
    "lmcache": "LMCache MP needs a GPU: the lab serves cpu-lab (vLLM's CPU build) only",
    "native_offload": "the lab's cpu-lab profile uses no OffloadingConnector",
}


@dataclass(frozen=True)
class Panel:
    title: str
    query: str  # PromQL with {sel} for the label selector
    metrics: tuple[str, ...]
    unit: str = "short"  # Grafana's unit id
    legend: str = "{{rig}}"
    needs: frozenset = field(default_factory=frozenset)


@dataclass(frozen=True)
class Rule:
    alert: str
    expr: str  # PromQL with {threshold} where a setting's value goes
    metrics: tuple[str, ...]
    summary: str
    for_: str = "5m"
    severity: str = "warning"
    setting: str = ""  # the monitoring setting whose value fills {threshold}
    needs: frozenset = field(default_factory=frozenset)


def _needs(*names: str) -> frozenset:
    unknown = set(names) - set(NEEDS)
    if unknown:
        raise ValueError(f"undeclared needs {sorted(unknown)}")
    return frozenset(names)


def _rate(metric: str, by: str = "rig") -> str:
    return f"sum by ({by}) (rate({metric}{{{{sel}}}}[5m]))"


def _quantile(q: float, histogram: str) -> str:
    return f"histogram_quantile({q}, sum by (rig, le) (rate({histogram}_bucket{{{{sel}}}}[5m])))"


def _ratio(hits: str, queries: str) -> str:
    return f"{_rate(hits)} / {_rate(queries)}"


PANELS: tuple[Panel, ...] = (
    Panel("Engine up", f'{UP}{{job="{JOB_VLLM}",{{sel}}}}', (UP,)),
    Panel("Requests finished /s", _rate(vllm.REQUEST_SUCCESS), (vllm.REQUEST_SUCCESS,), "reqps"),
    Panel("Requests running", f"sum by (rig) ({vllm.REQUESTS_RUNNING}{{{{sel}}}})", (vllm.REQUESTS_RUNNING,)),
    Panel("Requests waiting", f"sum by (rig) ({vllm.REQUESTS_WAITING}{{{{sel}}}})", (vllm.REQUESTS_WAITING,)),
    Panel("TTFT p50", _quantile(0.5, vllm.TTFT), (vllm.TTFT + "_bucket",), "s"),
    Panel("TTFT p95", _quantile(0.95, vllm.TTFT), (vllm.TTFT + "_bucket",), "s"),
    Panel("ITL p50", _quantile(0.5, vllm.INTER_TOKEN_LATENCY), (vllm.INTER_TOKEN_LATENCY + "_bucket",), "s"),
    Panel("ITL p95", _quantile(0.95, vllm.INTER_TOKEN_LATENCY), (vllm.INTER_TOKEN_LATENCY + "_bucket",), "s"),
    Panel(
        "GPU KV cache usage",
        f"max by (rig) ({vllm.KV_CACHE_USAGE}{{{{sel}}}})",
        (vllm.KV_CACHE_USAGE,),
        "percentunit",
    ),
    Panel(
        "Prefix cache hit rate",
        _ratio(vllm.PREFIX_HITS, vllm.PREFIX_QUERIES),
        (vllm.PREFIX_HITS, vllm.PREFIX_QUERIES),
        "percentunit",
    ),
    Panel(
        "External (connector) hit rate",
        _ratio(vllm.EXTERNAL_HITS, vllm.EXTERNAL_QUERIES),
        (vllm.EXTERNAL_HITS, vllm.EXTERNAL_QUERIES),
        "percentunit",
    ),
    Panel(
        "Prompt tokens by source /s",
        _rate(vllm.PROMPT_TOKENS_BY_SOURCE, "rig, source"),
        (vllm.PROMPT_TOKENS_BY_SOURCE,),
        legend="{{rig}} {{source}}",
    ),
    Panel(
        "Cached prompt tokens by tier /s",
        _rate(vllm.PROMPT_TOKENS_CACHED_BY_SOURCE, "rig, source"),
        (vllm.PROMPT_TOKENS_CACHED_BY_SOURCE,),
        legend="{{rig}} {{source}}",
        needs=_needs("cached_by_source"),
    ),
    Panel(
        "KV offload stored bytes /s",
        _rate(vllm.KV_OFFLOAD_STORE_BYTES),
        (vllm.KV_OFFLOAD_STORE_BYTES,),
        "Bps",
        needs=_needs("native_offload"),
    ),
    Panel(
        "KV offload loaded bytes /s",
        _rate(vllm.KV_OFFLOAD_LOAD_BYTES),
        (vllm.KV_OFFLOAD_LOAD_BYTES,),
        "Bps",
        needs=_needs("native_offload"),
    ),
    Panel(
        "KV offload CPU tier usage",
        f"max by (rig) ({vllm.KV_OFFLOAD_CPU_USAGE}{{{{sel}}}})",
        (vllm.KV_OFFLOAD_CPU_USAGE,),
        "percentunit",
        needs=_needs("native_offload"),
    ),
    Panel(
        "LMCache lookup hit rate",
        _ratio(vllm.LMCACHE_LOOKUP_HITS, vllm.LMCACHE_LOOKUP_REQUESTED),
        (vllm.LMCACHE_LOOKUP_HITS, vllm.LMCACHE_LOOKUP_REQUESTED),
        "percentunit",
        needs=_needs("lmcache"),
    ),
    Panel(
        "LMCache chunks loaded into vLLM /s",
        _rate(vllm.LMCACHE_CHUNKS_LOADED),
        (vllm.LMCACHE_CHUNKS_LOADED,),
        needs=_needs("lmcache"),
    ),
    Panel(
        "LMCache L1 usage",
        f"max by (rig) ({vllm.LMCACHE_L1_USAGE}{{{{sel}}}})",
        (vllm.LMCACHE_L1_USAGE,),
        "percentunit",
        needs=_needs("lmcache"),
    ),
    Panel(
        "GPU memory used",
        f"{textfile.GPU_MEMORY_USED}{{{{sel}}}} / {textfile.GPU_MEMORY_TOTAL}{{{{sel}}}}",
        (textfile.GPU_MEMORY_USED, textfile.GPU_MEMORY_TOTAL),
        "percentunit",
        "{{rig}} GPU {{gpu}}",
        _needs("gpu", "node_exporter"),
    ),
    Panel(
        "GPU utilisation",
        f"{textfile.GPU_UTILIZATION}{{{{sel}}}}",
        (textfile.GPU_UTILIZATION,),
        "percentunit",
        "{{rig}} GPU {{gpu}}",
        _needs("gpu", "node_exporter"),
    ),
    Panel(
        "GPU temperature",
        f"{textfile.GPU_TEMPERATURE}{{{{sel}}}}",
        (textfile.GPU_TEMPERATURE,),
        "celsius",
        "{{rig}} GPU {{gpu}}",
        _needs("gpu", "node_exporter"),
    ),
    Panel(
        "GPU power against its cap",
        f"{textfile.GPU_POWER_DRAW}{{{{sel}}}} / {textfile.GPU_POWER_LIMIT}{{{{sel}}}}",
        (textfile.GPU_POWER_DRAW, textfile.GPU_POWER_LIMIT),
        "percentunit",
        "{{rig}} GPU {{gpu}}",
        _needs("gpu", "node_exporter"),
    ),
    Panel(
        "GPU throttling",
        f"{textfile.GPU_THROTTLE}{{{{sel}}}} == 1",
        (textfile.GPU_THROTTLE,),
        legend="{{rig}} GPU {{gpu}} {{reason}}",
        needs=_needs("gpu", "node_exporter"),
    ),
    Panel(
        "Host RAM used",
        f"1 - {NODE_MEM_AVAILABLE}{{{{sel}}}} / {NODE_MEM_TOTAL}{{{{sel}}}}",
        (NODE_MEM_AVAILABLE, NODE_MEM_TOTAL),
        "percentunit",
        needs=_needs("node_exporter"),
    ),
    Panel(
        "/dev/shm used",
        f"1 - {textfile.SHM_FREE}{{{{sel}}}} / {textfile.SHM_SIZE}{{{{sel}}}}",
        (textfile.SHM_FREE, textfile.SHM_SIZE),
        "percentunit",
        needs=_needs("node_exporter"),
    ),
    Panel(
        "L2 store against its budget",
        f"{textfile.L2_STORE}{{{{sel}}}} / {textfile.L2_BUDGET}{{{{sel}}}}",
        (textfile.L2_STORE, textfile.L2_BUDGET),
        "percentunit",
        needs=_needs("l2", "node_exporter"),
    ),
)

# The router's panels: fleet-wide, no rig to select.
FLEET_PANELS: tuple[Panel, ...] = (
    Panel(
        "Rigs serving against rigs routed to",
        f'count({UP}{{job="{JOB_VLLM}"}} == 1) - max({ROUTER_ACTIVE_WORKERS})',
        (UP, ROUTER_ACTIVE_WORKERS),
        legend="rigs serving but not routed to",
        needs=_needs("router"),
    ),
    Panel(
        "Router requests per rig /s",
        f"sum by (worker) (rate({ROUTER_PROCESSED}[5m]))",
        (ROUTER_PROCESSED,),
        "reqps",
        "{{worker}}",
        _needs("router"),
    ),
)

# The alert thresholds that are not settings: a full KV pool with a queue behind it is saturation whatever the
# fleet; a pool above 95 % alone is vLLM's normal steady state under load.
KV_POOL_FULL = 0.95

RULES: tuple[Rule, ...] = (
    Rule(
        "RigEngineDown",
        f'{UP}{{job="{JOB_VLLM}"}} == 0',
        (UP,),
        "{{ $labels.rig }}: vLLM's /metrics has not answered for 2 minutes",
        "2m",
        "critical",
    ),
    Rule(
        "RigTTFTRegression",
        f"histogram_quantile(0.95, sum by (rig, le) (rate({vllm.TTFT}_bucket[15m])))"
        " > {threshold} * "
        f"histogram_quantile(0.95, sum by (rig, le) (rate({vllm.TTFT}_bucket[6h] offset 15m)))",
        (vllm.TTFT + "_bucket",),
        "{{ $labels.rig }}: TTFT p95 of the last 15 minutes is {{ $value | humanize }} s, over {threshold} times "
        "its p95 of the 6 hours before",
        "10m",
        setting="monitoring_ttft_regression_factor",
    ),
    Rule(
        "RigKVPoolSaturated",
        f"max by (rig) ({vllm.KV_CACHE_USAGE}) > {KV_POOL_FULL} and sum by (rig) ({vllm.REQUESTS_WAITING}) > 0",
        (vllm.KV_CACHE_USAGE, vllm.REQUESTS_WAITING),
        "{{ $labels.rig }}: the GPU KV pool is over 95 % full with requests waiting",
    ),
    Rule(
        "RigGPUThrottled",
        f'max by (rig, gpu) ({textfile.GPU_THROTTLE}{{reason!="sw_power_cap"}}) == 1',
        (textfile.GPU_THROTTLE,),
        "{{ $labels.rig }} GPU {{ $labels.gpu }}: clocks slowed by a thermal or hardware reason (not its power cap)",
        needs=_needs("gpu", "node_exporter"),
    ),
    Rule(
        "RigGPUXid",
        f"{textfile.GPU_XID_ERRORS} > 0",
        (textfile.GPU_XID_ERRORS,),
        "{{ $labels.rig }}: {{ $value }} NVIDIA Xid error(s) in the kernel log since boot",
        "0m",
        "critical",
        needs=_needs("gpu", "node_exporter"),
    ),
    Rule(
        "RigShmFilling",
        f"{textfile.SHM_FREE} / {textfile.SHM_SIZE} < {{threshold}}",
        (textfile.SHM_FREE, textfile.SHM_SIZE),
        "{{ $labels.rig }}: /dev/shm has {{ $value | humanizePercentage }} free",
        setting="monitoring_shm_free_min_fraction",
        needs=_needs("node_exporter"),
    ),
    Rule(
        "RigL2NearBudget",
        f"{textfile.L2_STORE} > {{threshold}} * {textfile.L2_BUDGET}",
        (textfile.L2_STORE, textfile.L2_BUDGET),
        "{{ $labels.rig }}: the L2 store is past {threshold} of its budget",
        "10m",
        setting="monitoring_l2_budget_fraction",
        needs=_needs("l2", "node_exporter"),
    ),
    Rule(
        "RigOutOfRouter",
        f'count({UP}{{job="{JOB_VLLM}"}} == 1) > max({ROUTER_ACTIVE_WORKERS})',
        (UP, ROUTER_ACTIVE_WORKERS),
        "{{ $value }} rig(s) serve but the router routes to fewer: a rig was left out (a halted rollout?); "
        "`rigkit status` names it",
        needs=_needs("router"),
    ),
)


def panel_query(panel: Panel, selector: str = "") -> str:
    """The panel's PromQL with ``selector`` (``rig=~"$rig"``) in every metric's braces."""
    return panel.query.replace("{sel}", selector).replace(",}", "}").replace("{}", "")


def rule_expr(rule: Rule, settings: Mapping) -> str:
    return rule.expr.replace("{threshold}", f"{settings[rule.setting]:g}") if rule.setting else rule.expr


def rule_summary(rule: Rule, settings: Mapping) -> str:
    return rule.summary.replace("{threshold}", f"{settings[rule.setting]:g}") if rule.setting else rule.summary
