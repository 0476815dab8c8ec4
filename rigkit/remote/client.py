"""OpenAI-compatible streaming client for measurements: salted prompts (rigkit.prompts) sized with the server's
tokenizer, client-side TTFT (rigkit.remote.probe), decode tok/s."""

from __future__ import annotations

import functools
import time
from dataclasses import asdict, dataclass, field
from typing import Mapping, Optional, Sequence

import requests

from rigkit import metrics
from rigkit.errors import RigkitError
from rigkit.files import ttft_probe
from rigkit.prompts import (
    CHARS_PER_TOKEN_GUESS,
    NUDGE,
    Prompt,
    PromptSpec,
    draft_text,
    new_session_id,
    on_a_block_edge,
)
from rigkit.remote.http_session import server_session
from rigkit.remote.probe import API_OVERHEAD_MODEL, CONTROLLER_TRANSPORT, RigProbe

# The first long prefill must never be cut: its timeout is this many times the time the
# measured prefill rate predicts (prefill slows down with length: attention is superlinear) ...
PREFILL_TIMEOUT_FACTOR = 5.0
# ... and never less than this.
MIN_PREFILL_TIMEOUT_S = 60.0
# Without a measured rate yet (the calibration request itself), wait this long.
UNMEASURED_PREFILL_TIMEOUT_S = 900.0
CONNECT_TIMEOUT_S = 10.0
READY_POLL_S = 3.0
READY_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class TokenChoice:
    """One generated token as the server reported it: `token` is "token_id:<n>" when asked for ids (texts collide:
    many tokens decode to ""), its logprob, and the server's top-k of that position (the chosen one included)."""

    token: str
    logprob: float
    top: Mapping[str, float] = field(default_factory=dict)


@dataclass
class StreamResult:
    ttft_s: Optional[float]
    total_s: float
    prompt_tokens: Optional[int]
    completion_tokens: Optional[int]
    cached_tokens: Optional[int]
    chunks: int
    text: str
    # decode speed from chunk timing: (tokens - 1) / (last token time - first token time)
    decode_tps: Optional[float]
    aborted: bool = False
    # "prefill" (no first token yet) or "decode"
    abort_phase: Optional[str] = None
    error: Optional[str] = None
    timeout_s: Optional[float] = None
    # the same request's cost in the API server outside the engine's TTFT clock (ttft_probe.api_overhead)
    api_overhead_s: Optional[float] = None
    api_overhead_error: Optional[str] = None
    # each generated token with its logprob and the server's top-k (asked with logprobs=k; else empty)
    tokens: list[TokenChoice] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def prefill_timeout(prompt_tokens: int, prefill_tokens_per_s: Optional[float]) -> float:
    """Client timeout for a prefill of `prompt_tokens`, from a measured prefill rate."""
    if not prefill_tokens_per_s:
        return UNMEASURED_PREFILL_TIMEOUT_S
    return max(MIN_PREFILL_TIMEOUT_S, PREFILL_TIMEOUT_FACTOR * prompt_tokens / prefill_tokens_per_s)


class ServingError(RigkitError):
    """The serving API did not answer as an OpenAI-compatible vLLM should."""


class ServingClient:
    """Talks to one vLLM OpenAI-compatible server at `base_url` (direct or through a tunnel)."""

    def __init__(
        self,
        base_url: str,
        model: Optional[str] = None,
        session: Optional[requests.Session] = None,
        extra_metrics_urls: Sequence[str] = (),
        probe: Optional[RigProbe] = None,
    ):
        """extra_metrics_urls: other /metrics to scrape with vLLM's (the LMCache MP server's HTTP port).
        probe: stream completions from the rig itself (RigProbe); None: from this process, through base_url."""
        self.base_url = base_url.rstrip("/")
        self.extra_metrics_urls = tuple(extra_metrics_urls)
        self.probe = probe
        self.session = session or server_session()
        self._model = model
        self._max_model_len: Optional[int] = None

    # --- discovery -------------------------------------------------------------------------
    def models(self) -> list[dict]:
        response = self.session.get(f"{self.base_url}/v1/models", timeout=CONNECT_TIMEOUT_S)
        response.raise_for_status()
        return response.json()["data"]

    @property
    def model(self) -> str:
        if self._model is None:
            self._load_model_card()
        return self._model  # type: ignore[return-value]

    @property
    def max_model_len(self) -> Optional[int]:
        if self._max_model_len is None:
            self._load_model_card()
        return self._max_model_len

    @functools.cached_property
    def block_size(self) -> Optional[int]:
        """The engine's KV block size (vllm:cache_config_info), None when /metrics does not say."""
        try:
            return self.metrics().block_size
        except (requests.RequestException, metrics.MetricsError, ValueError):
            return None

    def _load_model_card(self) -> None:
        cards = self.models()
        if not cards:
            raise ServingError(
                "/v1/models",
                self.base_url,
                "the server lists no model",
                "check the served model name knob and the container log",
            )
        card = next((c for c in cards if c["id"] == self._model), cards[0])
        self._model = card["id"]
        self._max_model_len = card.get("max_model_len")

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S, poll_s: float = READY_POLL_S) -> float:
        """Poll /v1/models until it answers; returns the seconds waited."""
        start = time.monotonic()
        last_error = ""
        while time.monotonic() - start < timeout_s:
            try:
                if self.models():
                    return time.monotonic() - start
            except (requests.RequestException, ValueError, KeyError) as exc:
                last_error = str(exc)
            time.sleep(poll_s)
        raise ServingError(
            "/v1/models",
            self.base_url,
            f"not ready after {timeout_s:.0f} s ({last_error})",
            "read the container log tail; raise the ready timeout for large models",
        )

    def metrics_text(self) -> str:
        """vLLM's /metrics, followed by every extra metrics endpoint's text."""
        texts = []
        for url in (f"{self.base_url}/metrics", *self.extra_metrics_urls):
            response = self.session.get(url, timeout=CONNECT_TIMEOUT_S)
            response.raise_for_status()
            texts.append(response.text.rstrip("\n") + "\n")
        return "".join(texts)

    def metrics(self) -> metrics.Snapshot:
        return metrics.parse(self.metrics_text())

    def count_tokens(self, text: str) -> Optional[int]:
        """Exact prompt size from the server's tokenizer (vLLM /tokenize), None if unavailable."""
        try:
            response = self.session.post(
                f"{self.base_url}/tokenize", json={"model": self.model, "prompt": text}, timeout=CONNECT_TIMEOUT_S
            )
            if response.status_code != 200:
                return None
            return int(response.json()["count"])
        except (requests.RequestException, ValueError, KeyError):
            return None

    # --- prompts ---------------------------------------------------------------------------
    def build_prompt(self, spec: PromptSpec, session_id: Optional[str] = None) -> Prompt:
        """A salted prompt of about `spec.target_tokens` tokens (refined with /tokenize when available)."""
        session_id = session_id or new_session_id()
        chars = int(spec.target_tokens * CHARS_PER_TOKEN_GUESS)
        text = draft_text(spec, session_id, chars)
        counted = self.count_tokens(text)
        if counted is None:
            return Prompt(spec, session_id, text, int(len(text) / CHARS_PER_TOKEN_GUESS), False)
        for _ in range(3):  # rescale the character budget from the measured chars/token
            if abs(counted - spec.target_tokens) <= max(16, spec.target_tokens // 100):
                break
            chars = max(64, int(len(text) * spec.target_tokens / counted))
            text = draft_text(spec, session_id, chars)
            counted = self.count_tokens(text) or counted
        for _ in range(4):  # k x b -> 1 + k x b -> 2 + k x b, a newline that merges into the text's last token
            if not on_a_block_edge(counted, self.block_size):
                break
            text += NUDGE
            counted = self.count_tokens(text) or counted
        return Prompt(spec, session_id, text, counted, True)

    # --- requests --------------------------------------------------------------------------
    @property
    def ttft_transport(self) -> str:
        """Where the client TTFT of this client's streams is measured (the card names it)."""
        return self.probe.transport if self.probe else f"{CONTROLLER_TRANSPORT}, through {self.base_url}"

    def stream_completion(
        self,
        prompt: str,
        max_tokens: int,
        timeout_s: Optional[float] = None,
        ignore_eos: bool = True,
        seed: Optional[int] = None,
        api_overhead: bool = False,
        logprobs: int = 0,
    ) -> StreamResult:
        """One streaming /v1/completions request, greedy (temperature 0; `seed` fixed when given); TTFT and
        decode speed measured by rigkit/files/ttft_probe.py: on the rig with a probe, else in this process.
        api_overhead: first measure the API server's cost of the same body (probe.API_OVERHEAD_MODEL's 404).
        logprobs: ask for each generated token's top-`logprobs` logprobs, tokens as ids (vLLM's
        return_tokens_as_token_ids: token texts collide, many decode to ""); 0: not asked.

        ignore_eos keeps the decode length fixed so decode speeds compare (a vLLM extension).
        A timeout or disconnect is reported as an aborted prefill or decode, never raised.
        """
        timeout_s = timeout_s or UNMEASURED_PREFILL_TIMEOUT_S
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "stream": True,
            "temperature": 0.0,
            "ignore_eos": ignore_eos,
            "stream_options": {"include_usage": True, "continuous_usage_stats": False},
        }
        if seed is not None:
            body["seed"] = seed
        if logprobs:
            body.update(logprobs=logprobs, return_tokens_as_token_ids=True)
        # a served name would stream a real completion inside the measured window
        overhead_model = API_OVERHEAD_MODEL if api_overhead and self.model != API_OVERHEAD_MODEL else None
        if self.probe is not None:
            raw = self.probe.stream("/v1/completions", body, CONNECT_TIMEOUT_S, timeout_s, overhead_model)
        else:
            # the session's Authorization (an endpoint's API key, rigkit validate --url) goes with the request
            authorization = {k: v for k, v in self.session.headers.items() if k.lower() == "authorization"}
            raw = ttft_probe.probe(
                {
                    "url": f"{self.base_url}/v1/completions",
                    "body": body,
                    "timeout_s": timeout_s,
                    "connect_timeout_s": CONNECT_TIMEOUT_S,
                    "overhead_model": overhead_model,
                    "headers": authorization,
                }
            )
        return stream_result(raw, timeout_s)


def stream_result(raw: dict, timeout_s: float) -> StreamResult:
    """The probe's JSON answer as a StreamResult; a refused request (not 200) raises ServingError."""
    status = raw.get("status")
    if status is not None and status != 200:
        raise ServingError(
            "/v1/completions",
            status,
            raw.get("error_body", ""),
            "check the prompt fits --max-model-len and the engine is alive",
        )
    first, last, error = raw.get("first_token_s"), raw.get("last_token_s"), raw.get("error")
    usage = raw.get("usage") or {}
    completion_tokens = usage.get("completion_tokens")
    decode_tps = None
    if completion_tokens and completion_tokens > 1 and first is not None and last is not None and last > first:
        decode_tps = (completion_tokens - 1) / (last - first)
    details = usage.get("prompt_tokens_details") or {}
    return StreamResult(
        ttft_s=first,
        total_s=raw.get("total_s", 0.0),
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=completion_tokens,
        cached_tokens=details.get("cached_tokens"),
        chunks=raw.get("events", 0),
        text=raw.get("text", ""),
        decode_tps=decode_tps,
        aborted=error is not None,
        abort_phase=None if error is None else ("prefill" if first is None else "decode"),
        error=error,
        timeout_s=timeout_s,
        api_overhead_s=raw.get("overhead_s"),
        api_overhead_error=raw.get("overhead_error"),
        tokens=token_choices(raw.get("logprobs")),
    )


def token_choices(logprobs: Optional[dict]) -> list[TokenChoice]:
    """vLLM's completion logprobs (tokens, token_logprobs, top_logprobs, joined over the stream) per token; a
    position without a logprob (null) ends the list: nothing after it can be compared."""
    if not logprobs:
        return []
    choices = []
    for token, logprob, top in zip(
        logprobs.get("tokens") or [], logprobs.get("token_logprobs") or [], logprobs.get("top_logprobs") or []
    ):
        if logprob is None:
            break
        choices.append(TokenChoice(token, float(logprob), {str(k): float(v) for k, v in (top or {}).items()}))
    return choices
