"""A validation run recorded on a real vLLM, replayed by the fake OpenAI server (tests/fake_openai.py): its /metrics
moves along the recorded steps as the procedure's requests arrive."""

from __future__ import annotations

from pathlib import Path

from fake_openai import FakeOpenAI

METRICS = Path(__file__).parent / "fixtures" / "metrics"


class RecordedRun:
    """Moves the fake server's /metrics along the recorded steps as the procedure's requests arrive:
    the session prompt once (cold), again at once (warm-gpu), other prompts (the fillers), the session
    prompt again (warm-connector), a down/up, the session prompt again (warm-persistent). One session, as
    recorded; the calibration prompt (before the session's first request) leaves the counters as they are."""

    def __init__(
        self,
        server: FakeOpenAI,
        folder: Path = METRICS,
        restarted: str = "05-restarted-idle",
        persistent: str = "06-after-warm-persistent",
    ):
        self.server = server
        self.folder, self.restarted, self.persistent = folder, restarted, persistent
        self.session_prompt = None
        self.step = "00-idle"
        server.on_completion = self.completion
        self.show("00-idle")

    def show(self, step: str) -> None:
        self.step = step
        self.server.metrics_text = (self.folder / f"{step}.txt").read_text()

    def completion(self, body: dict) -> None:
        prompt = body["prompt"]
        if self.session_prompt is None:
            if body["max_tokens"] == 1:  # calibration
                return
            self.session_prompt = prompt
        session = prompt == self.session_prompt
        after = {
            ("00-idle", True): "01-after-cold",
            ("01-after-cold", True): "02-after-warm-gpu",
            # the unmeasured repeat of warm-gpu (the repeat band), not in the recording: no window reads it
            ("02-after-warm-gpu", True): "02-after-warm-gpu",
            ("02-after-warm-gpu", False): "03-after-fillers",
            ("03-after-fillers", False): "03-after-fillers",
            ("03-after-fillers", True): "04-after-warm-connector",
            (self.restarted, True): self.persistent,
            # the restarted engine's logprobs warm-up, not in the recording: shorter than a block, it stores nothing
            (self.restarted, False): self.restarted,
        }
        self.show(after[(self.step, session)])

    def restart(self) -> None:
        """compose down/up: the engine's counters start again (the recorded idle text after the restart)."""
        self.show(self.restarted)
