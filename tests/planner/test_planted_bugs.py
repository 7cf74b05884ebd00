"""One named test per bug a review planted and the suite missed: each pins a formula on numbers
worked out by hand in its comment, so the planted change fails it."""

from __future__ import annotations

import pytest

from solver.cost.parallelizer import PartialPlan, pipeline_time
from solver.cost.stage import StageConfig
from solver.planner.plan import bubble_ratio, cycle_time, interleaved_cycle_time
from solver.planner.pruning import bound_window
from solver.spec.domain import Island, Schedule


def _partial(pp: int, latency: float, iteration: float) -> PartialPlan:
    """A partial plan with only the fields the pipeline formulas read."""
    return PartialPlan(StageConfig(pp=pp), latency, latency / 3, 2 * latency / 3, iteration,
                       1.0, None, (1, 1, 1), (latency,) * pp)


def test_planted_bubble_ratio_uses_n_not_n_minus_1():
    # Three equal stages of 1 s, n = 4: T_pipe = (4 - 1) * 1 + 3 = 6 s; eq. (7) gives
    # 1 - 4 * 1 / 6 = 1/3 (with n - 1 it would be 1 - 3/6 = 1/2).
    t = cycle_time([1.0, 1.0, 1.0], [], 4)
    assert t == 6.0
    assert bubble_ratio([1.0, 1.0, 1.0], t, 4) == pytest.approx(1 / 3)
    # Stages of 2 s: T = 3 * 2 + 6 = 12 s, bubble 1 - 4 * 2 / 12 = 1/3 (n / mean: 1 - 2/12).
    assert bubble_ratio([2.0, 2.0, 2.0], cycle_time([2.0] * 3, [], 4), 4) == pytest.approx(1 / 3)


def test_planted_interleaved_bubble_is_divided_by_v():
    # Two stages of 2 s, n = 4, v = 2: (4 - 1) * 2 + 2 + (4 - 2) / 2 = 9 s (10 s without / v).
    assert interleaved_cycle_time([2.0, 2.0], 4, 2) == 9.0
    # The parallelizer's own form: (n + (p - 1) / v) t + per-iteration = (8 + 3/2) * 1 + 0.5.
    assert pipeline_time(_partial(4, 1.0, 0.5), 8, Schedule.INTERLEAVED, 2) == 10.0


def test_planted_fill_term_of_the_homogeneous_baseline_is_p_minus_1():
    # pp = 4, 1 s per micro-batch, n = 8, 0.5 s per iteration: (8 + 4 - 1) * 1 + 0.5 = 11.5 s
    # (12.5 s with the fill off by one stage, 10.5 s without it).
    assert pipeline_time(_partial(4, 1.0, 0.5), 8) == 11.5
    assert pipeline_time(_partial(1, 1.0, 0.5), 8) == 8.5


def test_planted_rule_2s_bound_window_by_hand(catalog):
    h100 = Island.homogeneous("h", catalog["H100-SXM-80GB"], 8)
    a100 = Island.homogeneous("a", catalog["A100-SXM-80GB"], 8)
    assert (h100.total_tflops, a100.total_tflops) == (8 * 989, 8 * 312)
    # 10 layers of 1e15 FLOP per micro-batch, n = 4, incumbent 6 s.
    # H100 stage of l layers: 4 l / 7.912 <= 6 always; the rest on the A100s:
    # 4 (10 - l) / 2.496 <= 6  <=>  l >= 6.26, so l in 7..10.
    assert bound_window((h100, a100), h100, 10, 1e15, 4, 6.0) == (7, 10)
    # A100 stage: 4 l / 2.496 <= 6  <=>  l <= 3.74; the rest on the H100s always fits: 1..3.
    assert bound_window((h100, a100), a100, 10, 1e15, 4, 6.0) == (1, 3)
    # Half the incumbent (3 s): H100 needs l <= 5.93 and l >= 8.13 -> nothing.
    assert bound_window((h100, a100), h100, 10, 1e15, 4, 3.0) == (11, 0)


def test_overlapped_cycle_time_by_hand():
    # Stages 1 s and 2 s, a 3 s link, n = 2. Eq. 9: e = (max(1, 3), max(2, 0)) = (3, 2):
    # (2 - 1) * 3 + 5 = 8 s. Links as stages: (1, 2, 3): (2 - 1) * 3 + 6 = 9 s.
    assert cycle_time([1.0, 2.0], [3.0], 2, overlap=True) == 8.0
    assert cycle_time([1.0, 2.0], [3.0], 2) == 9.0
    assert cycle_time([4.0], [], 3, overlap=True) == 12.0
    # Sub-second stages (the last one has no link after it, so it costs its own 0.25 s):
    # e = (max(0.25, 0.125), max(0.5, 0.75), 0.25) = (0.25, 0.75, 0.25), n = 4:
    # 3 * 0.75 + 1.25 = 3.5 s.
    assert cycle_time([0.25, 0.5, 0.25], [0.125, 0.75], 4, overlap=True) == 3.5
