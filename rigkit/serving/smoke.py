"""Post-deploy smoke: does the stack serve, and did every declared knob reach the container?

HTTP checks take a base URL (direct or through an SSH tunnel); container checks take the text
that `docker inspect` printed on the rig. Each check returns a SmokeCheck; the verdict passes only
when all do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable

from rigkit.metrics import parse_families
from rigkit.settings.knobs import redacted

if TYPE_CHECKING:
    import requests

# requests (and rigkit.remote.http_session, built on it) load when a check runs: every deploy imports this module
# for its release's smoke, and a no-op runs none (~30 ms of each run's start).

PREFIX_CACHE_COUNTERS = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits")
SMOKE_PROMPT = "Say hello in one short sentence."
MIN_STREAM_CHUNKS = 3


@dataclass
class SmokeCheck:
    name: str
    ok: bool
    detail: str = ""


@dataclass
class SmokeReport:
    checks: list[SmokeCheck] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def failures(self) -> list[SmokeCheck]:
        return [c for c in self.checks if not c.ok]

    def summary(self) -> str:
        if self.passed:
            return f"smoke pass ({len(self.checks)} checks)"
        return "smoke FAIL: " + "; ".join(f"{c.name}: {c.detail}" for c in self.failures)


def _check(name: str, func: Callable[[], str]) -> SmokeCheck:
    import requests

    try:
        return SmokeCheck(name, True, func())
    except (requests.RequestException, ValueError, KeyError, AssertionError) as exc:
        return SmokeCheck(name, False, f"{type(exc).__name__}: {exc}")


def chat_answered(session: requests.Session, base_url: str, served_name: str, timeout: float) -> str:
    """One chat completion at ``base_url`` (a rig, or the router in front of them) returns text."""
    response = session.post(
        f"{base_url}/v1/chat/completions",
        timeout=timeout,
        json={
            "model": served_name,
            "max_tokens": 16,
            "temperature": 0,
            "messages": [{"role": "user", "content": SMOKE_PROMPT}],
        },
    )
    response.raise_for_status()
    text = response.json()["choices"][0]["message"]["content"] or ""
    if not text.strip():
        raise ValueError("chat completion returned empty text")
    return f"{len(text)} chars"


def check_router(base_url: str, served_name: str, timeout: float = 60.0) -> list[SmokeCheck]:
    """Smoke through the router: a chat completion is answered by one of its rigs."""
    from rigkit.remote.http_session import server_session

    session = server_session()
    return [_check("chat through the router", lambda: chat_answered(session, base_url, served_name, timeout))]


def check_http(base_url: str, served_name: str, timeout: float = 60.0) -> list[SmokeCheck]:
    from rigkit.remote.http_session import server_session

    session = server_session()

    def health() -> str:
        response = session.get(f"{base_url}/health", timeout=timeout)
        response.raise_for_status()
        return "200"

    def models() -> str:
        names = [m["id"] for m in session.get(f"{base_url}/v1/models", timeout=timeout).json()["data"]]
        if served_name not in names:
            raise ValueError(f"served name {served_name!r} not in /v1/models {names}")
        return ",".join(names)

    def chat() -> str:
        return chat_answered(session, base_url, served_name, timeout)

    def stream() -> str:
        chunks = 0
        with session.post(
            f"{base_url}/v1/completions",
            timeout=timeout,
            stream=True,
            json={
                "model": served_name,
                "prompt": SMOKE_PROMPT,
                "max_tokens": 16,
                "temperature": 0,
                "stream": True,
                "ignore_eos": True,
            },
        ) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if line.startswith(b"data: ") and line != b"data: [DONE]":
                    chunks += 1
        if chunks < MIN_STREAM_CHUNKS:
            raise ValueError(f"streaming completion gave {chunks} chunks, expected >= {MIN_STREAM_CHUNKS}")
        return f"{chunks} chunks"

    def metrics() -> str:
        response = session.get(f"{base_url}/metrics", timeout=timeout)
        response.raise_for_status()
        names = set(parse_families(response.text))
        missing = [n for n in PREFIX_CACHE_COUNTERS if n not in names]
        if missing:
            raise ValueError(f"/metrics lacks {missing}")
        return f"{len(names)} families"

    return [
        _check("health", health),
        _check("models", models),
        _check("chat", chat),
        _check("stream", stream),
        _check("metrics", metrics),
    ]


def parse_env_output(env_output: str) -> dict[str, str]:
    """`docker exec <c> env` output as a dict (values never hold a newline: .env refuses them; env ends each
    variable with "\n" only, so a value may hold U+2028 or a form feed, which str.splitlines would split at)."""
    return dict(line.split("=", 1) for line in env_output.split("\n") if "=" in line)


def container_command_line(inspect_json: str) -> str:
    config = json.loads(inspect_json)[0]["Config"]
    return " ".join((config.get("Entrypoint") or []) + (config.get("Cmd") or []))


HASH_SEED_ENV = "PYTHONHASHSEED"


def check_hash_seed(env_output: str, declared_seed: int) -> SmokeCheck:
    """The container hashes with the fleet's one seed (kv_hash_seed): an engine with another seed, or none
    (Python then draws one per process), never finds the blocks its peers or its own last run stored."""
    actual = parse_env_output(env_output).get(HASH_SEED_ENV)
    if actual != str(declared_seed):
        seen = "unset (a random seed per process)" if actual is None else repr(actual)
        return SmokeCheck(
            "hash_seed",
            False,
            f"{HASH_SEED_ENV} is {seen} in the container but kv_hash_seed "
            f"declares {declared_seed}: its store keys would not match the other engines'",
        )
    return SmokeCheck("hash_seed", True, f"{HASH_SEED_ENV}={actual} as kv_hash_seed declares")


def check_container(
    env_output: str, inspect_json: str, expected_env: dict[str, str], expected_in_command: Iterable[str]
) -> list[SmokeCheck]:
    def env() -> str:
        actual = parse_env_output(env_output)
        wrong = {k: (redacted(k, v), redacted(k, actual.get(k))) for k, v in expected_env.items() if actual.get(k) != v}
        if wrong:
            raise ValueError(
                "knobs that did not reach the container (declared, actual): "
                + ", ".join(f"{k}={d!r} got {a!r}" for k, (d, a) in sorted(wrong.items()))
            )
        return f"{len(expected_env)} knobs match"

    def command() -> str:
        line = container_command_line(inspect_json)
        missing = [fragment for fragment in expected_in_command if fragment not in line]
        if missing:
            raise ValueError(f"command line lacks {missing}")
        return "connector config present"

    return [_check("env", env), _check("command", command)]
