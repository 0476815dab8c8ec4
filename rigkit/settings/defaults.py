"""Every variable a role, validate.py or a rollout reads from host data, declared once: one section each.

The serving knobs live in rigkit.settings.knobs (the one registry of the stack's tunables), the validation
settings in rigkit.validation.procedure; this file holds the roles'. rigkit.settings.hostdata validates a host's data
against all of them once (``rig_settings``) and the roles get the result; docs/settings.md's tables
are generated from these declarations (rigkit.settings.docs).
"""

from __future__ import annotations

import posixpath

from rigkit.errors import ConfigError
from rigkit.paths import bind_source_problem
from rigkit.prompts import PROMPT_KINDS
from rigkit.remote.registry import parse_reference
from rigkit.settings.firewalls import API_FIREWALL, KV_STORE_FIREWALL, sources_check
from rigkit.settings.knobs import KNOBS, check_port
from rigkit.settings.types import (
    DOCKER_DAEMON_OPTIONS,
    LABEL_LIMITS,
    PACKAGE_REPOSITORY_SCHEMES,
    ControllerPath,
    DebianVersion,
    FsLabel,
    FstabSource,
    HostAddress,
    IntegersBetween,
    IpAddress,
    Release,
    SecretText,
    Url,
    UrlOrDirectory,
    address_problem,
    between,
    check_account_name,
    check_device_path,
    check_host_path,
    check_mount_options,
    check_relative_path,
)
from rigkit.settings.variables import REDACTED, IntegerList, Variable, check_of, one_of

SOURCES = ("docker-ce", "distro")


def _source(value: str) -> None:
    if value not in SOURCES:
        raise ValueError(f"must be one of {', '.join(SOURCES)}")


_source.fix = "write docker-ce or distro"


def _user_names(value: list) -> None:
    if not all(isinstance(item, str) and item for item in value):
        raise ValueError("must be a list of user names")
    for item in value:
        check_account_name(item)


_user_names.fix = 'write a list of user names, e.g. ["alice", "bob"]'


def _image_reference(value: str) -> None:
    try:
        parse_reference(value)
    except ConfigError as exc:
        raise ValueError(f"{exc.problem}; {exc.fix}") from None


def _daemon_options(value: dict) -> None:
    DOCKER_DAEMON_OPTIONS(value)
    if "data-root" in value:
        check_host_path(value["data-root"])


_daemon_options.fix = DOCKER_DAEMON_OPTIONS.fix
_image_reference.fix = "write an image reference docker accepts, e.g. debian:12 or repo@sha256:<64 hex>"


def _branch(value: str) -> None:
    if not value.isdigit():
        raise ValueError(f"a driver branch is a number like 580, not {value!r}")


_branch.fix = "write the branch number, e.g. 580"


def _fstype(value: str) -> None:
    if value not in LABEL_LIMITS:
        raise ValueError(f"must be one of {', '.join(LABEL_LIMITS)}")


_fstype.fix = "write ext4 or xfs"


GPUS = Variable(
    "gpus", 0, "number of NVIDIA GPUs in the host; 0 skips the GPU roles (the lab)", int, between(0, 64, "GPUs")
)
# Package repositories are https unless this opts in (a repository on loopback needs no opt-in: no one is between).
PACKAGE_REPOS_ALLOW_HTTP = Variable(
    "package_repos_allow_http",
    False,
    "allow http:// package repositories (apt URLs, router_pip_find_links) on "
    "another host: apt checks signatures but not freshness, so anyone on the path can hold a rig on old packages",
    bool,
)
PACKAGE_REPOSITORY = Url(schemes=PACKAGE_REPOSITORY_SCHEMES)


RIG_LOCK_VARIABLES: list[Variable] = [
    Variable(
        "rig_lock_wait_s",
        600,
        "seconds a deploy waits while another deploy holds the rig's lock (0 = refuse at once)",
        int,
        between(0, 86400, "seconds"),
    ),
    Variable(
        "rig_lock_stale_s",
        7200,
        "a lock held longer than this (seconds) is stale: its holder is ended and the lock taken over",
        int,
        between(60, 7 * 86400, "seconds"),
    ),
]


NVIDIA_DRIVER_VARIABLES: list[Variable] = [
    Variable("nvidia_driver_branch", "580", "driver branch to install and hold (e.g. 580)", str, _branch),
    Variable(
        "nvidia_driver_version",
        None,
        "exact apt version to pin (as `apt-cache policy` lists it); None = newest of the branch",
        str,
        DebianVersion(),
    ),
    Variable("nvidia_driver_server", False, "Ubuntu: the -server (datacenter) packages", bool),
    Variable("nvidia_driver_headless", False, "no X/desktop components: headless driver + nvidia-utils", bool),
    Variable(
        "nvidia_driver_open",
        True,
        "the open kernel modules: NVIDIA's recommendation from Turing on, required "
        "by Blackwell; false = the proprietary modules (GPUs before Turing)",
        bool,
    ),
    Variable(
        "nvidia_driver_persistence_mode",
        True,
        "keep the driver loaded between jobs: nvidia-persistenced enabled and running, as NVIDIA's driver role does",
        bool,
    ),
    Variable(
        "nvidia_driver_allow_reboot",
        True,
        "reboot when the new driver cannot be loaded otherwise; false stops with 'reboot required'",
        bool,
    ),
    Variable(
        "nvidia_driver_reboot_timeout",
        600,
        "seconds to wait for a rebooted host to answer SSH",
        int,
        between(1, 3600, "seconds"),
    ),
    Variable(
        "nvidia_driver_power_limit_w",
        None,
        "the power limit every GPU of the rig runs at (watts), e.g. 260 for a capped RTX 3090: the NVIDIA role sets "
        "it (`nvidia-smi -pl`, all GPUs) and a unit sets it again at every boot; refused before any change outside "
        "a card's min/max (`nvidia-smi -q -d POWER`); rigkit status warns when a GPU enforces another; None = the "
        "cards' default (after an earlier declaration each GPU is set back to its default and the unit removed)",
        float,
        between(1, 2000, "W"),
        optional=True,
    ),
    Variable(
        "nvidia_driver_cuda_repo_url",
        "https://developer.download.nvidia.com/compute/cuda/repos",
        "Debian 12: base URL of NVIDIA's CUDA apt repository",
        str,
        PACKAGE_REPOSITORY,
    ),
]


DOCKER_VARIABLES: list[Variable] = [
    Variable(
        "docker_source",
        "docker-ce",
        "docker-ce (Docker's apt repository, compose v2 plugin) or distro (docker.io + compose)",
        str,
        _source,
    ),
    Variable(
        "docker_version",
        None,
        "exact apt version of the engine (docker-ce and its cli, or docker.io); None = newest available",
        str,
        DebianVersion(),
    ),
    Variable(
        "docker_compose_version",
        None,
        "exact apt version of the compose package; None = newest available",
        str,
        DebianVersion(),
    ),
    Variable(
        "docker_daemon_options",
        {},
        "keys merged into /etc/docker/daemon.json (log-opts, data-root, default-runtime...)",
        dict,
        _daemon_options,
    ),
    Variable("docker_users", [], "users added to the docker group", list, _user_names),
    Variable(
        "docker_apt_url",
        "https://download.docker.com/linux",
        "docker-ce: base URL of Docker's apt repository",
        str,
        PACKAGE_REPOSITORY,
    ),
    Variable(
        "docker_verify_image",
        None,
        "image the check runs `true` in (host network); None = an image already on the host, "
        "and with none the run check is skipped, saying so",
        str,
        _image_reference,
        optional=True,
    ),
]


NVIDIA_CONTAINER_TOOLKIT_VARIABLES: list[Variable] = [
    Variable(
        "nvidia_ctk_version",
        None,
        "exact apt version of the toolkit packages (e.g. 1.17.8-1); None = newest available",
        str,
        DebianVersion(),
    ),
    Variable("nvidia_ctk_default_runtime", False, "make nvidia Docker's default runtime", bool),
    Variable(
        "nvidia_ctk_apt_url",
        "https://nvidia.github.io/libnvidia-container",
        "base URL of NVIDIA's libnvidia-container apt repository",
        str,
        PACKAGE_REPOSITORY,
    ),
    Variable(
        "nvidia_ctk_verify_image",
        None,
        "image the GPU check runs nvidia-smi in (the runtime injects it); None = an image already "
        "on the host, and with none the check is skipped, saying so",
        str,
        _image_reference,
        optional=True,
    ),
]


# GPU health in `rigkit status` (rigkit.status.gpu): where a reading turns from ok into warn or fail. The clock event
# reasons, Xids and ECC errors that mean a reset are facts of the hardware (rigkit.nvidia_smi), not settings.
GPU_HEALTH_VARIABLES: list[Variable] = [
    Variable(
        "gpu_temp_warn_c",
        85,
        "rigkit status warns at this GPU temperature (°C); the card's own slowdown shows as a thermal "
        "clock event reason whatever the temperature",
        int,
        between(1, 150, "°C"),
    ),
    Variable(
        "gpu_temp_fail_c",
        92,
        "rigkit status fails a rig with a GPU at this temperature (°C)",
        int,
        between(1, 150, "°C"),
    ),
    Variable(
        "gpu_pcie_min_width",
        8,
        "rigkit status warns when a GPU's PCIe link is narrower (lanes): a x16 card on a x4 riser or slot "
        "moves KV to and from host memory at a quarter of x16 (the story's rigs run Gen4 x8). A link trained "
        "below what both ends support warns whatever this is",
        int,
        between(1, 32, "lanes"),
    ),
    Variable(
        "gpu_ecc_corrected_warn",
        1,
        "rigkit status warns from this many corrected (single-bit) ECC errors since the driver loaded; an "
        "uncorrected one fails the rig (cards without ECC report none)",
        int,
        between(1, 10**9, "errors"),
    ),
    Variable(
        "gpu_power_limit_tolerance_w",
        1.0,
        "how far (watts) a GPU's enforced power limit may lie from nvidia_driver_power_limit_w before rigkit status "
        "warns (the driver keeps the limit in milliwatts steps of the card)",
        float,
        between(0, 100, "W"),
    ),
]


L2_DISK_VARIABLES: list[Variable] = [
    Variable(
        "l2_device",
        None,
        "block device for the L2 tier, a /dev/disk/by-id/ path preferred; None skips",
        str,
        check_device_path,
        optional=True,
    ),
    Variable("l2_fstype", "ext4", "filesystem to make on it: ext4 or xfs", str, _fstype),
    Variable("l2_mount_point", "/mnt/rigkit-l2", "where it is mounted", str, check_host_path),
    Variable("l2_mount_options", "noatime,nofail", "fstab mount options", str, check_mount_options),
    Variable("l2_owner", "root", "user owning the mount point and the cache directory", str, check_account_name),
    Variable("l2_group", "root", "group owning the mount point and the cache directory", str, check_account_name),
    Variable("l2_label", "rigkit-l2", "filesystem label marking the device as rigkit's", str, FsLabel()),
    Variable("l2_format", False, "allow reformatting a device that carries rigkit's label (to change l2_fstype)", bool),
    Variable("l2_force_format", False, "allow wiping a device that holds anything else (its data is lost)", bool),
    Variable(
        "l2_cache_dir", "lmcache", "LMCache's L2 base directory, relative to l2_mount_point", str, check_relative_path
    ),
]


SERVING_VARIABLES: list[Variable] = [
    Variable("serving_smoke", True, "run the smoke checks after every release", bool),
    Variable("serving_auto_rollback", True, "roll back to the last known-good digest when smoke fails", bool),
    Variable(
        "rollback_to",
        None,
        "rollback.py: the image (repo@sha256:...) to roll back to "
        "(empty = the verified release before the latest deploy, from the rig's ledger)",
        str,
        _image_reference,
    ),
]


# Rollout (`rigkit deploy`, rigkit/rollout/run.py; rollout_batch also paces a rolling rollback, rigkit/rollout/rollback.py):
# fleet-wide, so every targeted rig must carry the same values (group data); `rigkit deploy
# --canary/--batch/--on-failure` override them. Plain `pyinfra deploy.py` runs every
# rig at once and refuses while a rollout is set (rigkit.rollout.plan.refuse_unbatched).
ROLLOUT_LEAVE, ROLLOUT_ROLLBACK = "leave", "rollback"

ROLLOUT_VARIABLES: list[Variable] = [
    Variable(
        "rollout_canary",
        0,
        "rigkit deploy: rigs deployed first; each must pass smoke and the cache proof "
        "before any other rig is touched (0 = no canary stage)",
        int,
        between(0, 10000, "rigs"),
    ),
    Variable(
        "rollout_batch",
        0,
        "rigkit deploy: rigs deployed together after the canaries, batch after batch; "
        "a batch with any failure halts the rollout (0 = the rest in one batch); with --deploy rollback.py, "
        "rigs rolled back together through the router (0 = every rig at once, the plain run)",
        int,
        between(0, 10000, "rigs"),
    ),
    Variable(
        "rollout_on_failure",
        ROLLOUT_LEAVE,
        "rigkit deploy: a halted rollout's rigs already upgraded: "
        f"{ROLLOUT_LEAVE} (on the new release, for the operator) or {ROLLOUT_ROLLBACK} (rollback.py on each, "
        "back to its stored verified rendering)",
        str,
        one_of((ROLLOUT_LEAVE, ROLLOUT_ROLLBACK)),
    ),
    Variable(
        "rollout_cache_proof",
        True,
        "rigkit deploy: canaries also prove the cache after smoke (one salted "
        "prompt: warm-gpu hit, then GPU eviction and a warm-connector hit, by metric deltas)",
        bool,
    ),
]


# The router (roles/router.py, issue 15): vllm-router on a gateway host, the hosts of the inventory group
# ROUTER_GROUP; its workers are every other host of the run (the rigs). Read from the gateway's data.
ROUTER_GROUP = "routers"
ROUTER_POLICIES = (
    "cache_aware",
    "round_robin",
    "random",
    "kv_aware",
    "power_of_two",
    "consistent_hash",
    "sticky_least_loaded",
)


ROUTER_VARIABLES: list[Variable] = [
    Variable("router_version", "0.1.17", "vllm-router release installed on the gateway (pinned)", str, Release()),
    Variable(
        "router_policy",
        "cache_aware",
        "how the router picks a rig per request: " + ", ".join(ROUTER_POLICIES),
        str,
        one_of(ROUTER_POLICIES),
    ),
    Variable("router_port", 8300, "TCP port the router serves the OpenAI API on", int, check_port),
    Variable(
        "router_metrics_port",
        8301,
        "TCP port of the router's Prometheus /metrics, on router_bind_address "
        "(vllm-router's own default, 29000, is fixed whatever else runs on the gateway)",
        int,
        check_port,
    ),
    Variable(
        "router_bind_address",
        "127.0.0.1",
        "address the router listens on (its admin endpoints "
        "/add_worker and /remove_worker take no key: keep it on a trusted network)",
        str,
        IpAddress(),
    ),
    Variable(
        "router_api_key",
        None,
        "vllm-router's --api-key, read from a 0600 file on the gateway "
        "(0.1.17 uses it for data-parallel worker queries only; a request carries its client's own "
        "Authorization header through to the rig)",
        str,
        SecretText(),
        optional=True,
        secret=True,
    ),
    Variable(
        "router_worker_address",
        None,
        "a rig's data: the address the gateway reaches its API at (default: "
        "its bind_address, or ssh_hostname when it binds every address)",
        str,
        HostAddress(),
        optional=True,
    ),
    Variable(
        "router_on_controller",
        False,
        "the gateway @local (the controller itself) gets the router role: "
        "vllm-router, its unit and files under /etc installed on the machine running rigkit (refused unless "
        "true; a router you start yourself there is drained through either way)",
        bool,
    ),
    Variable(
        "router_pip_find_links",
        None,
        "a wheelhouse (URL or directory) the gateway installs vllm-router "
        "from with --no-index, instead of the package index (offline gateways, the lab)",
        str,
        UrlOrDirectory(schemes=PACKAGE_REPOSITORY_SCHEMES),
        optional=True,
    ),
]

# The rigs' API firewall (roles/api_firewall.py, rigkit/firewall.py): off unless declared, because turning it on
# for rigs that already serve LAN clients on a non-loopback bind would cut those clients off at the next deploy.
API_FIREWALL_VARIABLES: list[Variable] = [
    Variable(
        "api_firewall",
        False,
        "manage nft table inet rigkit_api: the stack's TCP ports (serving_port, the "
        "LMCache ports) only from loopback, the controller and api_allowed_sources, every other packet "
        "untouched; false = no rules (a table an earlier deploy made is removed)",
        bool,
    ),
    Variable(
        "api_allowed_sources",
        [],
        "addresses or CIDR networks, as the rig sees them, that may reach the "
        "stack's ports besides loopback and the controller: the router's (gateway's) address",
        list,
        sources_check(API_FIREWALL),
    ),
    Variable(
        "api_allow_controller",
        True,
        "also allow the address the deploy's SSH session comes from (the "
        "controller, read at every deploy), so smoke and validate.py reach a non-loopback bind directly",
        bool,
    ),
]


# The fleet's shared KV store (roles/kv_store.py, issue 15): valkey-server on the hosts of the inventory group
# KV_STORE_GROUP, which get that role only. Its password is the serving knob kv_store_password (a secret, read
# from the controller's environment): the store requires it and the rigs' LMCache sends it, one value for both.
KV_STORE_GROUP = "kv_stores"
# Every maxmemory-policy valkey 8.1 accepts (valkey.conf), and the ones rigkit refuses, with why.
VALKEY_POLICIES = (
    "allkeys-lru",
    "allkeys-lfu",
    "allkeys-random",
    "noeviction",
    "volatile-lru",
    "volatile-lfu",
    "volatile-random",
    "volatile-ttl",
)
REFUSED_VALKEY_POLICIES = {
    policy: "evicts only keys with a TTL, and LMCache's Valkey adapter writes its chunks without one (its "
    "ttl_seconds is not rendered): a full store would refuse every write, as noeviction does"
    for policy in VALKEY_POLICIES
    if policy.startswith("volatile-")
}


def _valkey_policy(value: str) -> None:
    one_of(VALKEY_POLICIES)(value)
    if value in REFUSED_VALKEY_POLICIES:
        raise ValueError(
            f"{REFUSED_VALKEY_POLICIES[value]}; use allkeys-lru (or noeviction to refuse writes when full)"
        )


_valkey_policy.fix = "write allkeys-lru (or allkeys-lfu, allkeys-random, noeviction)"


def _bind_addresses(value: list) -> None:
    if not value:
        raise ValueError("must name at least one address (valkey listens nowhere otherwise)")
    for item in value:
        if not isinstance(item, str):
            raise ValueError(f"{item!r} is not text: each item must be an IP address")
        problem = address_problem(item)
        if problem:
            raise ValueError(f"{item!r} {problem} (a host name is not resolved by valkey's bind)")
    if len(set(value)) != len(value):
        raise ValueError("names an address twice")


_bind_addresses.fix = 'write a list of IP addresses, e.g. ["127.0.0.1", "10.0.0.5"]'


KV_STORE_PORT = Variable(
    "kv_store_port", 6379, "TCP port valkey-server listens on (the rigs' LMCache connects to it)", int, check_port
)
KV_STORE_VARIABLES: list[Variable] = [
    KV_STORE_PORT,
    Variable(
        "kv_store_bind_addresses",
        ["127.0.0.1"],
        "IP addresses valkey-server listens on: the store host's "
        "address on the rigs' network (and 127.0.0.1 for the role's own checks); never 0.0.0.0 on a host "
        "reachable from elsewhere",
        list,
        _bind_addresses,
    ),
    Variable(
        "kv_store_maxmemory_gib",
        8,
        "memory valkey may hold, in GiB (2^30 bytes; valkey gets the bytes): past it the policy evicts",
        int,
        between(1, 65536, "GiB"),
    ),
    Variable(
        "kv_store_maxmemory_policy",
        "allkeys-lru",
        "what a full store does: allkeys-lru (default: the "
        "fleet's rigs each count only their own writes, so only the server sees the total and evicts the "
        "least recently used chunk, which is a cache miss, never a wrong answer), allkeys-lfu, "
        "allkeys-random, or noeviction (writes refused when full); volatile-* are refused",
        str,
        _valkey_policy,
    ),
    # On by default, unlike api_firewall: the store has no clients but the rigs, so limiting it to them cuts
    # nobody off (a lab rig on host networking must set it false: rigkit.settings.firewalls.refuse_on_shared_network).
    Variable(
        "kv_store_firewall",
        True,
        "manage nft table inet rigkit_kv_store: kv_store_port only from loopback "
        "and the rigs (kv_store_allowed_sources), every other packet untouched; false = no rules (a table an "
        "earlier deploy made is removed)",
        bool,
    ),
    Variable(
        "kv_store_allowed_sources",
        None,
        "addresses or CIDR networks, as the store sees them, that may reach "
        "kv_store_port besides loopback; None = every rig of the inventory (the hosts neither routers nor "
        "kv_stores), at its address resolved on the controller (router_worker_address, else its one bind "
        "address, else ssh_hostname)",
        list,
        sources_check(KV_STORE_FIREWALL),
    ),
]

# Monitoring (roles/monitoring.py, issue 27): Prometheus from the distribution on the hosts of the inventory group
# MONITORING_GROUP, which get that role only, scraping every rig of the inventory (rigkit.monitoring). Read from the
# monitoring host's data; the alert thresholds are the fleet's, in its rules file.
MONITORING_GROUP = "monitoring"
MONITORING_VARIABLES: list[Variable] = [
    Variable("monitoring_port", 9090, "TCP port Prometheus serves its UI and API on", int, check_port),
    Variable(
        "monitoring_bind_address",
        "127.0.0.1",
        "address Prometheus listens on (its UI and API take no password: keep it on loopback or a trusted network)",
        str,
        IpAddress(),
    ),
    Variable(
        "monitoring_scrape_interval_s",
        15,
        "how often Prometheus scrapes every target, in seconds",
        int,
        between(1, 3600, "s"),
    ),
    Variable("monitoring_retention_days", 15, "how long Prometheus keeps its samples", int, between(1, 3650, "days")),
    Variable(
        "monitoring_ttft_regression_factor",
        2.0,
        "alert RigTTFTRegression: a rig's TTFT p95 over the last 15 minutes is this many times its p95 of the 6 hours "
        "before",
        float,
        between(1.1, 100.0, "times"),
    ),
    Variable(
        "monitoring_shm_free_min_fraction",
        0.1,
        "alert RigShmFilling: /dev/shm's free space under this fraction of its size",
        float,
        between(0.001, 0.9),
    ),
    Variable(
        "monitoring_l2_budget_fraction",
        0.9,
        "alert RigL2NearBudget: the L2 store past this fraction of its budget (each rig's l2_budget_gb, as its "
        "janitor reports it)",
        float,
        between(0.1, 1.0),
    ),
]

# The node exporter on a rig (roles/node_exporter.py): Debian's prometheus-node-exporter on the rig's bind_address,
# with rigkit's textfile collector (GPUs from nvidia-smi, Xid lines, /dev/shm, the L2 store) from a systemd timer.
NODE_EXPORTER_VARIABLES: list[Variable] = [
    Variable(
        "node_exporter",
        False,
        "install Debian's prometheus-node-exporter on the rig (listening on its bind_address, behind the API "
        "firewall when that is on) and rigkit's textfile collector: GPUs from nvidia-smi, Xid lines, /dev/shm, "
        "the L2 store; false = neither is installed or changed",
        bool,
    ),
    Variable("node_exporter_port", 9100, "TCP port of the rig's node exporter", int, check_port),
]

# The shared KV mount (roles/kv_share.py): an export every rig of the store mounts at the same point; a profile
# puts its connector store there with the kv_share knob (rigkit.settings.knobs), hashing with the fleet's kv_hash_seed.
KV_SHARE_FSTYPES = ("nfs4", "nfs", "none")  # none: a directory the host already shares (the lab's bind mount)
KV_SHARE_NFS_CLIENT_PACKAGE = "nfs-common"


_share_mount_point = check_of(
    bind_source_problem, "write an absolute directory without ':' such as /mnt/rigkit-kv-share"
)


KV_SHARE_VARIABLES: list[Variable] = [
    Variable(
        "kv_share_source",
        None,
        "the export the rigs share, e.g. nas:/export/rigkit-kv (with kv_share_fstype "
        "none: the name of the directory every rig already sees at kv_share_mount_point); rigs naming the same "
        "source share one store; None = no shared tier",
        str,
        FstabSource(),
        optional=True,
    ),
    Variable(
        "kv_share_mount_point",
        "/mnt/rigkit-kv-share",
        "where every rig mounts the export (the same path on every rig)",
        str,
        _share_mount_point,
    ),
    Variable(
        "kv_share_fstype",
        "nfs4",
        "nfs4 or nfs (mounted from /etc/fstab, nfs-common installed), or none "
        "(already mounted: only checked to be a mount point and writable)",
        str,
        one_of(KV_SHARE_FSTYPES),
    ),
    Variable(
        "kv_share_mount_options",
        "_netdev,nofail,noatime",
        "fstab mount options of the export",
        str,
        check_mount_options,
    ),
    Variable(
        "kv_share_store_dir",
        "kv",
        "the connector store's directory, relative to kv_share_mount_point (a "
        "directory of its own: the janitor never works on a mount point)",
        str,
        check_relative_path,
    ),
]


# Validation (validate.py): what rigkit.validation.procedure measures and how; its ValidationSettings reads these.
CALIBRATION_MIN_TOKENS = 256
# The shortest context length the "does the tier pay?" sweep measures: below it a session's KV is a few tens of MB,
# moved in about a millisecond over any link, and the TTFTs differ by less than the run-to-run spread.
PAYS_MIN_TOKENS = 1024


_fraction = between(0.001, 1.0)


# vLLM refuses more top logprobs than its --max-logprobs (20 by default).
MAX_TOP_LOGPROBS = 20


VALIDATION_VARIABLES: list[Variable] = [
    Variable(
        "validate_prompt_tokens",
        3500,
        "size of each salted session prompt in tokens (the user's card: ~37000; the lab CPU build: ~3500)",
        int,
        check=between(CALIBRATION_MIN_TOKENS, 2**24, "tokens"),
    ),
    Variable(
        "validate_sessions",
        3,
        "salted sessions per tier (the n of each TTFT figure)",
        int,
        check=between(1, 1000, "sessions"),
    ),
    Variable(
        "validate_prompt_kind",
        "narrative",
        "prompt body of the tier sessions: narrative or code",
        str,
        check=one_of(PROMPT_KINDS),
    ),
    Variable(
        "validate_output_tokens",
        16,
        "tokens generated per tier request (TTFT is what is measured)",
        int,
        check=between(1, 2**20, "tokens"),
    ),
    Variable(
        "validate_decode_tokens",
        128,
        "tokens generated per decode A/B request (ignore_eos)",
        int,
        check=between(1, 2**20, "tokens"),
    ),
    Variable(
        "validate_decode_prompt_tokens", 256, "size of the decode A/B prompts", int, check=between(1, 2**24, "tokens")
    ),
    Variable(
        "validate_seed",
        None,
        "base seed of the prompt bodies (recorded; random when unset)",
        int,
        between(0, 2**63 - 1),
        optional=True,
    ),
    Variable("validate_restart", True, "measure the persistent tier (does a full compose down/up)", bool),
    Variable(
        "validate_decode_ab",
        False,
        "also run the decode A/B: switches the rig between its profile and the "
        "derived baseline once per visit (2 x measured restarts: minutes of downtime, so opt-in)",
        bool,
    ),
    Variable(
        "validate_soak_sessions",
        0,
        "soak: multi-turn conversations run after the tiers (0 = no soak; at "
        "least 2: decode retention compares the last with the first clean one; the field notes ran ~20)",
        int,
        check=between(2, 1000, "conversations", off=0),
    ),
    Variable(
        "validate_soak_turns",
        5,
        "soak: turns per conversation (each sends the whole conversation so far plus a new salted user message)",
        int,
        check=between(1, 1000, "turns"),
    ),
    Variable(
        "validate_soak_message_tokens",
        256,
        "soak: size of each new user message in tokens",
        int,
        check=between(16, 2**20, "tokens"),
    ),
    Variable(
        "validate_soak_reply_tokens",
        128,
        "soak: most tokens per reply (the model may stop early; "
        "an empty reply counts against validate_soak_empty_reply_max_fraction)",
        int,
        check=between(2, 2**20, "tokens"),
    ),
    Variable(
        "validate_soak_memory_growth_mib",
        200.0,
        "soak: most memory growth allowed (MiB) from the end of "
        "the first clean conversation to the last turn: GPU memory from nvidia-smi, on a rig without GPUs "
        "the serving container's cgroup",
        float,
        check=between(0, 2**20, "MiB"),
    ),
    Variable(
        "validate_soak_decode_retention_min",
        0.8,
        "soak: least decode tok/s of the last conversation, as a fraction of the first clean conversation's",
        float,
        check=_fraction,
    ),
    Variable(
        "validate_soak_empty_reply_max_fraction",
        0.5,
        "soak: the soak fails when at least this fraction of the answered turns got an empty reply",
        float,
        check=_fraction,
    ),
    Variable(
        "validate_top_logprobs",
        5,
        "top logprobs asked of every tier request (token ids): they tell a warm "
        "output whose logprobs moved within the band numerics moves them from wrong KV; 0 = not asked, then any "
        "difference is served-but-wrong (an engine that cannot compute logprobs needs 0)",
        int,
        check=between(0, MAX_TOP_LOGPROBS, "logprobs (vLLM's default --max-logprobs)"),
    ),
    Variable(
        "validate_numerics_ceiling_nats",
        0.5,
        "the most numerics may move a top logprob (nats). The served-right verdict measures each path's band in "
        "the same run (the GPU prefix cache asked twice, and against the fresh prefill) and holds every connector "
        "tier to it; warm-gpu moving further than this from the fresh prefill, or a band above it, is not taken "
        "for numerics. Seen: 0.000 repeat and 0.016-0.059 cached-vs-fresh on an H200 and an H100",
        float,
        check=between(0.001, 20.0, "nats"),
    ),
    Variable(
        "validate_power_selftest",
        False,
        "after the tiers, damage the store entries of self-test sessions of their own in four ways (every block, "
        "one layer, a few blocks, a few bytes per block) and report which the served-right verdict catches: the "
        "check's power on the card (needs the store reachable from the validating process and the restart)",
        bool,
    ),
    Variable(
        "validate_pays_lengths",
        IntegerList(),
        "context lengths in tokens (e.g. 2048,8192,32768; kept sorted) at which, after the tiers, salted sessions "
        "measure cold, warm-gpu and the CPU tier: the card's plot and each tier's breakeven (\"pays from 9K tokens\"). "
        "Each length and the reply must fit max_model_len; empty: no sweep, the card judges the tiers at "
        "validate_prompt_tokens only",
        IntegerList,
        check=IntegersBetween(floor=PAYS_MIN_TOKENS, ceiling=2**24, unit="tokens", example="2048,8192,32768"),
    ),
]


REPLAY = Variable(
    "replay",
    None,
    "results/<run-id> whose prompt sizes, kind and seeds this run repeats",
    str,
    ControllerPath(),
    optional=True,
)


# Section name (the role's name) -> the variables it reads, in pipeline order.
ROLE_SECTIONS: dict[str, list[Variable]] = {
    "host": [GPUS, PACKAGE_REPOS_ALLOW_HTTP],
    "rig_lock": RIG_LOCK_VARIABLES,
    "nvidia_driver": NVIDIA_DRIVER_VARIABLES,
    "docker": DOCKER_VARIABLES,
    "nvidia_container_toolkit": NVIDIA_CONTAINER_TOOLKIT_VARIABLES,
    "gpu_health": GPU_HEALTH_VARIABLES,
    "l2_disk": L2_DISK_VARIABLES,
    "serving": SERVING_VARIABLES,
    "rollout": ROLLOUT_VARIABLES,
    "router": ROUTER_VARIABLES,
    "api_firewall": API_FIREWALL_VARIABLES,
    "kv_share": KV_SHARE_VARIABLES,
    "kv_store": KV_STORE_VARIABLES,
    "monitoring": MONITORING_VARIABLES,
    "node_exporter": NODE_EXPORTER_VARIABLES,
    "validation": [*VALIDATION_VARIABLES, REPLAY],
}
ALL_VARIABLES: list[Variable] = [variable for section in ROLE_SECTIONS.values() for variable in section]


def kv_share_store_path(kv_share: dict) -> str:
    """Absolute path of the shared connector store on every rig (kv_share mounts it, serving mounts it in)."""
    return posixpath.join(kv_share["kv_share_mount_point"], kv_share["kv_share_store_dir"])


def l2_cache_path(l2_disk: dict) -> str:
    """Absolute path of the L2 store's base directory on the host (l2_disk mounts it, serving mounts it in)."""
    return posixpath.join(l2_disk["l2_mount_point"], l2_disk["l2_cache_dir"])


# Settings naming a package repository: plain http to another host needs package_repos_allow_http.
PACKAGE_REPOSITORY_SETTINGS = frozenset(
    variable.name for variable in ALL_VARIABLES if isinstance(variable.check, (Url, UrlOrDirectory))
)

# Every setting declared secret (Variable.secret), role variables and knobs: what every printed place redacts.
SECRET_SETTINGS = frozenset(variable.name for variable in [*ALL_VARIABLES, *KNOBS] if variable.secret)


def shown_settings(values: dict) -> dict:
    """``values`` (settings by name) as a card, a log or a ledger may show them: every declared secret redacted."""
    return {
        name: REDACTED if name in SECRET_SETTINGS and value not in (None, "") else value
        for name, value in values.items()
    }
