"""A drain waits for every request the rig holds (issue 43): the queued ones (vllm:num_requests_waiting) as well as
the running ones, summed over engines; the by-reason breakdown of the same queue, NaNs and other gauges dropped."""

from __future__ import annotations

from pathlib import Path

import pytest

from rigkit import metrics
from rigkit.rollout.router_admin import RouterError, wait_idle

IDLE = (Path(__file__).parents[1] / "fixtures" / "metrics" / "00-idle.txt").read_text()
RUNNING = 'vllm:num_requests_running{engine="0",model_name="tiny"} 0.0'
WAITING = 'vllm:num_requests_waiting{engine="0",model_name="tiny"} 0.0'
CAPACITY = 'vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="capacity"} 0.0'


def scrape(running: float = 0.0, waiting: float = 0.0, by_reason: float = 0.0, extra: str = "") -> str:
    text = (
        IDLE.replace(RUNNING, RUNNING.replace("0.0", str(running)))
        .replace(WAITING, WAITING.replace("0.0", str(waiting)))
        .replace(CAPACITY, CAPACITY.replace("0.0", str(by_reason)))
    )
    return text.replace("# EOF", "") + extra


@pytest.mark.parametrize(
    "text, busy",
    [
        (scrape(), 0),
        (scrape(waiting=3), 3),  # queued only: the rig still has work
        (scrape(running=2), 2),
        (scrape(running=2, waiting=3), 5),
        (scrape(by_reason=3), 0),  # the breakdown of the waiting gauge: never counted twice
        (scrape(extra='vllm:num_requests_waiting{engine="1",model_name="tiny"} 4.0\n'), 4),  # a second engine
        (scrape(extra='vllm:num_requests_waiting{engine="1",model_name="tiny"} NaN\n'), 0),
    ],
    ids=["idle", "queued", "running", "both", "by-reason", "second-engine", "nan"],
)
def test_in_flight_counts_queued_requests_too(text, busy):
    assert metrics.requests_in_flight(text) == busy


def test_a_rig_with_only_queued_requests_is_not_idle():
    now = [0.0]
    readings = iter([metrics.requests_in_flight(scrape(waiting=1))] * 3 + [0.0] * 10)

    def sleep(seconds):
        now[0] += seconds

    wait_idle(lambda: next(readings), "http://rig", poll_s=0.5, settle_s=1.0, clock=lambda: now[0], sleep=sleep)
    assert now[0] >= 1.5 + 1.0  # three busy polls, then idle for settle_s
    now[0] = 0.0
    with pytest.raises(RouterError, match="still busy"):
        wait_idle(
            lambda: metrics.requests_in_flight(scrape(waiting=1)),
            "http://rig",
            timeout_s=2,
            clock=lambda: now[0],
            sleep=sleep,
        )
