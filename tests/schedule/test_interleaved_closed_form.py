"""Interleaved 1F1B: the closed form and the in-flight counts the cost model uses, against the
event simulator."""

from __future__ import annotations

import numpy as np
import pytest

from solver.cost.stage_costs import PipelineSetting, in_flight_of
from solver.planner.plan import interleaved_cycle_time
from solver.schedule.simulator import PipelineSpec, ScheduleKind, simulate
from solver.spec.domain import Schedule


@pytest.mark.parametrize("p,n,v", [(2, 4, 2), (4, 8, 2), (4, 16, 4), (3, 9, 3), (2, 2, 5)])
def test_equal_stages_match_the_simulator(p, n, v):
    tau = 3.0
    spec = PipelineSpec((1.0,) * p, (2.0,) * p, (0.0,) * (p - 1), n, ScheduleKind.INTERLEAVED,
                        virtual_stages=v)
    result = simulate(spec)
    assert interleaved_cycle_time([tau] * p, n, v) == pytest.approx(result.makespan_s)
    # (n + (p - 1) / v) tau: Narayanan et al., SC'21, Sec. 2.2.
    assert interleaved_cycle_time([tau] * p, n, v) == pytest.approx((n + (p - 1) / v) * tau)
    held = in_flight_of(PipelineSetting(n, 1, Schedule.INTERLEAVED, v), np.full(p, p),
                        np.arange(p))
    assert list(held * v) == list(result.peak_in_flight)


def test_unequal_stages_closed_form_is_an_upper_bound():
    taus = (2.0, 3.0, 2.5, 1.0)
    spec = PipelineSpec(tuple(t / 3 for t in taus), tuple(2 * t / 3 for t in taus),
                        (0.0,) * 3, 8, ScheduleKind.INTERLEAVED, virtual_stages=2)
    assert simulate(spec).makespan_s <= interleaved_cycle_time(taus, 8, 2) + 1e-9
