"""`rigkit validate --url`: the cache-tier proof, "served right" verdict and card of any OpenAI-compatible vLLM
endpoint, one rigkit did not deploy (a Kubernetes Service, production-stack's router, a colleague's box).

    rigkit validate --url http://vllm.example:8000 --profile native-tiered
    rigkit validate --url http://svc:8000 --profile lmcache-mp --lmcache-metrics-url http://svc:8080/metrics \\
        --restart-command 'kubectl rollout restart deploy/rigkit-rig1 && kubectl rollout status deploy/rigkit-rig1'

The profile says which tiers the stack has (profiles.yaml; --data sets the knobs that change that, e.g.
l2_enabled=true, and the validate_* settings). The procedure is validate.py's (rigkit.validation.procedure
.validate_tiers), with two differences a URL imposes: the client TTFT is measured from this machine (the card names
where), and the persistent tier needs a restart, which no URL can do: it is "not applicable" unless
--restart-command gives a shell command that restarts the engine behind the URL (then it runs, and the client waits
for the endpoint to answer again). The power self-test damages the store's files, which a URL cannot reach: off.

Every input is checked before anything is measured: the URLs are http(s), the endpoint answers /v1/models, its
/metrics answers and is vLLM's (the prefix-cache counters), LMCache's /metrics answers. Exit status: 0 PASS, 1 FAIL,
2 refused.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Optional
from urllib.parse import urlsplit

import requests

from rigkit.errors import ConfigError, RigkitError
from rigkit.metrics import PROCESS_START, MetricsError, parse, process_start, require_prefix_counters
from rigkit.paths import REPO_ROOT
from rigkit.remote.client import CONNECT_TIMEOUT_S, ServingClient
from rigkit.remote.http_session import server_session
from rigkit.settings.defaults import ALL_VARIABLES
from rigkit.settings.hostdata import Settings, known_keys, settings_for_host
from rigkit.settings.profiles import load_profiles
from rigkit.settings.variables import closest_name
from rigkit.validation.card import RESULTS_DIR, new_run_id, render_run, write_card
from rigkit.validation.card.assemble import to_card
from rigkit.validation.card.glance import glance_lines
from rigkit.validation.card.store import RUN_ID_ENV
from rigkit.validation.procedure import ValidationSettings, validate_tiers

NO_RESTART = (
    "no restart is possible through a URL: give --restart-command (a shell command that restarts the engine "
    "behind it, e.g. kubectl rollout restart) to measure it"
)
# A profile pins no image for an endpoint rigkit did not deploy: the tier facts only need a valid stack, so it is
# built with this stand-in digest, which is never shown (the card's image is --image, or unknown)
STAND_IN_DIGEST = "sha256:" + "0" * 64
CARD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True, help="the endpoint's base URL, e.g. http://vllm.example:8000")
    parser.add_argument("--profile", required=True, help="the profile the endpoint runs (profiles.yaml)")
    parser.add_argument("--metrics-url", default=None, help="vLLM's /metrics (default: URL/metrics)")
    parser.add_argument(
        "--lmcache-metrics-url", default=None, help="LMCache's /metrics, where the profile runs its server"
    )
    parser.add_argument("--restart-command", default=None, help="restarts the engine behind the URL (shell)")
    parser.add_argument("--name", default=None, help="the card's name (default: the URL's host and port)")
    parser.add_argument("--image", default=None, help="the image the endpoint runs, by digest (for the card)")
    parser.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="knobs and validate_* settings, e.g. l2_enabled=true, validate_sessions=2",
    )
    parser.add_argument(
        "--api-key-env",
        default=None,
        metavar="NAME",
        help="the environment variable holding the endpoint's API key (vLLM --api-key); the key is never shown",
    )
    parser.add_argument("--run-dir", type=Path, default=None, help="results/<run-id> (default: a new run)")


def check_url(field: str, url: str) -> str:
    """``url`` without a trailing slash; ConfigError naming ``field`` unless it is http(s)://host[:port]..."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            field,
            url,
            "is not an http(s) URL with a host",
            f"write it as http://HOST:PORT{'/metrics' if 'metrics' in field else ''}",
        )
    return url.rstrip("/")


def fetch(field: str, url: str, session: requests.Session) -> requests.Response:
    """GET ``url``; ConfigError naming ``field`` when it cannot be reached or does not answer 200."""
    try:
        response = session.get(url, timeout=CONNECT_TIMEOUT_S)
    except requests.RequestException as exc:
        raise ConfigError(
            field, url, f"cannot be reached ({type(exc).__name__})", "check the address and that it serves"
        ) from None
    if response.status_code in (401, 403):
        given = "Authorization" in session.headers
        raise ConfigError(
            field,
            url,
            f"answered HTTP {response.status_code}: "
            + ("the API key given was not accepted" if given else "it wants an API key"),
            "export the endpoint's key in a variable and give its name: --api-key-env NAME",
        )
    if response.status_code != 200:
        raise ConfigError(
            field,
            url,
            f"answered HTTP {response.status_code}",
            "point it at the endpoint's own path (vLLM serves /v1/models and /metrics on its API port)",
        )
    return response


def api_session(key_variable: Optional[str]) -> requests.Session:
    """The session every request goes through, with the key from ``key_variable`` as a bearer token (never shown)."""
    session = server_session()
    if key_variable is None:
        return session
    key = os.environ.get(key_variable, "")
    if not key.strip():
        raise ConfigError(
            "--api-key-env",
            key_variable,
            "names an environment variable that is unset or empty",
            f"export {key_variable}=<the endpoint's API key> first (a key on the command line would show in ps)",
        )
    session.headers["Authorization"] = f"Bearer {key.strip()}"
    return session


def check_endpoint(url: str, metrics_url: str, lmcache_url: Optional[str], session: requests.Session) -> None:
    """ConfigError, naming the option, for an endpoint that cannot be validated: before anything is measured."""
    try:
        models = fetch("--url", f"{url}/v1/models", session).json()["data"]
    except (ValueError, KeyError, TypeError):
        raise ConfigError(
            "--url", url, "its /v1/models is not an OpenAI model list", "point it at an OpenAI-compatible API"
        ) from None
    if not models:
        raise ConfigError("--url", url, "its /v1/models lists no model", "wait until the engine has loaded it")
    text = fetch("--metrics-url", metrics_url, session).text
    try:
        require_prefix_counters(parse(text))
    except MetricsError:
        raise ConfigError(
            "--metrics-url",
            metrics_url,
            "is not vLLM's /metrics: no vllm:prefix_cache_* counters, so no tier can be proven",
            "give the vLLM engine's own /metrics (a router's /metrics sums or lacks them), served with "
            "--enable-prefix-caching",
        ) from None
    if lmcache_url:
        fetch("--lmcache-metrics-url", lmcache_url, session)


def stack_for(profile: str, data: dict, image: Optional[str]) -> Settings:
    """The profile's stack as validation reads it (its tiers, chunk size, bit-exact tiers)."""
    profiles = load_profiles()
    if profile not in profiles:
        raise ConfigError("--profile", profile, "is not a profile", f"pick one of {', '.join(sorted(profiles))}")
    stand_in = f"{profiles[profile].image_repo}@{STAND_IN_DIGEST}"
    values = {"serving_profile": profile, "allow_incubating": True, "model": "endpoint", **data}
    values["serving_image"] = image or stand_in
    return settings_for_host(values)


def parse_data(pairs: list[str]) -> dict:
    """KEY=VALUE pairs; ConfigError for a pair that is not one or names no setting (a typo would be ignored)."""
    known = known_keys(ALL_VARIABLES)
    data = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key:
            raise ConfigError("--data", pair, "is not KEY=VALUE", "write e.g. --data validate_sessions=2")
        if key not in known:
            nearest = closest_name(key, known)
            raise ConfigError(
                "--data",
                pair,
                f"{key} is not a setting rigkit knows, so it would be ignored",
                f"did you mean {nearest}?" if nearest else "see docs/settings.md for the knobs and validate_* settings",
            )
        data[key] = value
    return data


def card_name(name: Optional[str], url: str) -> str:
    """The card's name, a plain file name: --name as given (refused unless it is one), else the URL's host-port."""
    if name is None:
        return re.sub(r"[^A-Za-z0-9._-]+", "-", urlsplit(url).netloc).strip("-.") or "endpoint"
    if not CARD_NAME.fullmatch(name):
        raise ConfigError(
            "--name",
            name,
            "is not a plain file name: the card is written as NAME.md and NAME.card.json in the run directory",
            "use letters, digits, '.', '_' and '-', starting with a letter or digit",
        )
    return name


def ready_run_dir(run_dir: Path) -> Path:
    """The run directory, made; ConfigError before anything is measured when the cards could not be written there."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError("--run-dir", str(run_dir), "is a file, not a directory", "give a directory (or none)")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            "--run-dir", str(run_dir), f"cannot be made ({exc.strerror})", "give a writable path"
        ) from None
    if not os.access(run_dir, os.W_OK):
        raise ConfigError("--run-dir", str(run_dir), "is not writable", "give a directory this user can write")
    return run_dir


def restart_with(command: str, client: ServingClient, metrics_url: str):
    """Runs --restart-command; once the endpoint serves again, ConfigError unless a new engine process answers (the
    persistent tier measured on the old engine would read as the GPU cache: a command that returned too early)."""

    def engine_start() -> Optional[float]:
        return process_start(client.session.get(metrics_url, timeout=CONNECT_TIMEOUT_S).text)

    def restart() -> None:
        before = engine_start()
        result = subprocess.run(command, shell=True, capture_output=True, text=True)
        if result.returncode != 0:
            raise ConfigError(
                "--restart-command",
                command,
                f"exited {result.returncode}: {result.stderr.strip()[-300:]}",
                "run it by hand until it restarts the engine",
            )
        client.wait_ready()
        if before is not None and engine_start() == before:
            raise ConfigError(
                "--restart-command",
                command,
                f"returned, but the engine behind the URL is the same process ({PROCESS_START} unchanged): the "
                "persistent tier would be measured on the engine that never restarted",
                "make the command wait until the new engine serves (e.g. add `kubectl rollout status`)",
            )

    return restart


def run(args: argparse.Namespace) -> int:
    try:
        url = check_url("--url", args.url)
        metrics_url = check_url("--metrics-url", args.metrics_url or f"{url}/metrics")
        lmcache_url = check_url("--lmcache-metrics-url", args.lmcache_metrics_url) if args.lmcache_metrics_url else None
        data = parse_data(args.data)
        name = card_name(args.name, url)
        validation_data = {key: value for key, value in data.items() if key.startswith("validate_")}
        stack = stack_for(args.profile, {k: v for k, v in data.items() if k not in validation_data}, args.image)
        settings = ValidationSettings.from_data(validation_data)
        if settings.power_selftest:
            raise ConfigError(
                "--data",
                "validate_power_selftest=" + validation_data["validate_power_selftest"],
                "the power self-test damages the store's files, which a URL cannot reach: it would not run",
                "drop it; run the self-test where the store is reachable (validate.py on a rig's controller, the lab)",
            )
        session = api_session(args.api_key_env)
        check_endpoint(url, metrics_url, lmcache_url, session)
        # last: an endpoint refused leaves no empty run directory behind
        run_dir = ready_run_dir(args.run_dir or REPO_ROOT / RESULTS_DIR / (os.environ.get(RUN_ID_ENV) or new_run_id()))
    except ConfigError as exc:
        print(f"rigkit validate: refused before anything was measured: {exc}", file=sys.stderr)
        return 2
    not_applicable = dict(stack.tiers_not_applicable)
    if args.restart_command is None:
        not_applicable.setdefault("warm-persistent", NO_RESTART)
    metrics_base = metrics_url.removesuffix("/metrics")
    client = ServingClient(url, session=session, extra_metrics_urls=[lmcache_url] if lmcache_url else [])
    if metrics_base != url:  # the engine's /metrics elsewhere than its API (a proxy in front)
        client.metrics_text = lambda: _metrics_text(client, metrics_url, lmcache_url)  # type: ignore[method-assign]
    try:
        result = validate_tiers(
            client,
            restart_with(args.restart_command, client, metrics_url) if args.restart_command else None,
            settings,
            connector_configured=stack.profile.connector is not None,
            not_applicable=not_applicable,
            store_chunk_tokens=stack.store_chunk_tokens,
            bit_exact_tiers=stack.bit_exact_tiers,
        )
    except RigkitError as exc:
        print(f"rigkit validate: {exc}", file=sys.stderr)
        return 1
    repro = {
        "profile": stack.profile.name,
        "image_digest": args.image or f"unknown (an endpoint rigkit did not deploy: {url})",
        "knobs": {key: data[key] for key in data if key not in validation_data},
        "machine_read": False,
    }
    card = to_card(
        name,
        run_dir.name,
        result,
        settings,
        stack.profile.connector is not None,
        repro=repro,
        speculative=stack.knobs["speculative_config"] is not None,
    )
    write_card(run_dir, card)
    render_run(run_dir)
    print("\n".join(glance_lines(card, run_dir / f"{name}.md")))
    return 0 if card.passed else 1


def _metrics_text(client: ServingClient, metrics_url: str, lmcache_url: Optional[str]) -> str:
    texts = []
    for url in (metrics_url, *([lmcache_url] if lmcache_url else [])):
        response = client.session.get(url, timeout=CONNECT_TIMEOUT_S)
        response.raise_for_status()
        texts.append(response.text.rstrip("\n") + "\n")
    return "".join(texts)
