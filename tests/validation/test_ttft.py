"""The TTFT cross-check: a client-side TTFT against vLLM's own histogram over the same single request.

The probe that times TTFT on the rig is in tests/validation/test_ttft_probe.py.
"""

import pytest

from rigkit.metrics import Delta
from rigkit.validation.ttft import crosscheck_ttft, ttft_agrees


def _window(ttft_sum, ttft_count):
    return Delta(ttft_sum=ttft_sum, ttft_count=ttft_count)


def test_ttft_crosscheck_holds_the_client_within_5_percent_or_5_ms_of_the_histogram():
    assert crosscheck_ttft(1.04, _window(1.0, 1)).within and crosscheck_ttft(0.96, _window(1.0, 1)).within
    assert not crosscheck_ttft(1.06, _window(1.0, 1)).within  # 60 ms on 1 s: over 5 %
    assert crosscheck_ttft(0.036, _window(0.032, 1)).within  # 4 ms on 32 ms: the 5 ms floor
    # the lab rig's card through the tunnel: 83 ms against a histogram of 38 ms
    tunnelled = crosscheck_ttft(0.083, _window(0.038, 1))
    assert not tunnelled.within and tunnelled.difference_s == pytest.approx(0.045)
    assert not crosscheck_ttft(0.050, _window(0.038, 1)).within  # the SDK through ssh -L: 50 vs 38 ms


def test_ttft_crosscheck_refuses_a_window_with_other_requests():
    check = crosscheck_ttft(1.0, _window(2.0, 2))
    assert not check.within and check.server_requests == 2
    assert not crosscheck_ttft(1.0, _window(0.0, 0)).within


def test_the_measured_api_overhead_is_taken_off_the_client_figure_before_the_comparison():
    # the lab's loopback figures: warm-gpu 44 ms client against 33 ms in the histogram, 10 ms of it the API's
    raw = crosscheck_ttft(0.044, _window(0.033, 1))
    assert not raw.within and raw.difference_s == pytest.approx(0.011)
    less_overhead = crosscheck_ttft(0.044, _window(0.033, 1), api_overhead_s=0.010)
    assert less_overhead.within and less_overhead.compared_s == pytest.approx(0.034)
    assert less_overhead.difference_s == pytest.approx(0.001) and less_overhead.client_s == 0.044
    # an overhead that explains nothing does not hide a real gap
    assert not crosscheck_ttft(0.083, _window(0.038, 1), api_overhead_s=0.010).within


def test_a_client_figure_far_below_the_histogram_disagrees():
    # a client TTFT of 10 ms against 200 ms in vLLM's histogram: the measurement is broken, however small the
    # figure looks (issue 29: without abs() this counted as within tolerance)
    low = crosscheck_ttft(0.010, _window(0.200, 1))
    assert not low.within and low.difference_s == pytest.approx(-0.190)
    assert not ttft_agrees(0.010, 0.200) and not ttft_agrees(0.032 - 0.006, 0.032)  # below the 5 ms floor too
    assert ttft_agrees(0.032 - 0.004, 0.032) and ttft_agrees(0.955, 1.0)  # within both, from below
    # exactly the tolerance off, either side, agrees (0.01 - 0.005 is exact in binary)
    assert ttft_agrees(0.010, 0.005) and ttft_agrees(0.0, 0.005)
    # an API overhead larger than the client figure leaves it below the histogram: not within either
    assert not crosscheck_ttft(0.040, _window(0.038, 1), api_overhead_s=0.030).within
