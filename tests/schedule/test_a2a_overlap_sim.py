"""Megatron-Core's MoE all-to-all overlap in the event simulator, against the closed form the
cost model prices it with (:mod:`solver.cost.a2a_overlap`): the interleaved cycle at the
latency ``τ − H`` plus ``p · H`` per iteration.

Source: ``combined_1f1b_schedule_for_interleaved_pipelining`` and ``..._for_no_pipelining``
(``megatron/core/pipeline_parallel/combined_1f1b.py``), ``get_pp_rank_microbatches``
(``megatron/core/pipeline_parallel/schedules.py``: one warm-up forward more with the overlap),
core_v0.15.0.
"""

from __future__ import annotations

import random

import pytest

from solver.planner.plan import interleaved_cycle_time
from solver.schedule.simulator import EventKind, PipelineSpec, ScheduleKind, program, simulate


def _spec(f, b, h, n, v):
    p = len(f)
    kind = ScheduleKind.INTERLEAVED if v > 1 else ScheduleKind.ONE_F_ONE_B
    return PipelineSpec(tuple(f), tuple(b), (0.0,) * (p - 1), n, kind, virtual_stages=v,
                        overlap_hidden_s=tuple(h))


def test_one_stage_by_hand():
    """No pipelining, 8 micro-batches of f = 1, b = 2, 0.5 hidden: the first forward, seven
    overlapped steps of 2.5, the last backward: 1 + 7 · 2.5 + 2 = 20.5 = 8 · 2.5 + 0.5."""
    assert simulate(_spec([1.0], [2.0], [0.5], 8, 1)).makespan_s == pytest.approx(20.5)


@pytest.mark.parametrize("p,n,v", [(2, 4, 2), (4, 8, 2), (4, 16, 4), (3, 9, 3), (8, 16, 2)])
def test_equal_stages_match_the_closed_form(p, n, v):
    f, b, h = 1.0, 2.0, 0.6
    result = simulate(_spec([f] * p, [b] * p, [h] * p, n, v))
    assert result.makespan_s == pytest.approx(
        interleaved_cycle_time([f + b - h] * p, n, v) + p * h, rel=1e-12)


def test_unequal_stages_closed_form_is_an_upper_bound():
    """Unequal ranks: the closed form at each rank's own latency plus ``p`` times the largest
    hidden time is never below the simulated iteration (how stage costs combine them)."""
    rng = random.Random(3)
    for _ in range(100):
        p, v = rng.choice([2, 3, 4]), rng.choice([2, 3])
        n = p * rng.choice([1, 2, 3])
        f = [rng.uniform(0.5, 2.0) for _ in range(p)]
        b = [2 * x * rng.uniform(0.8, 1.2) for x in f]
        h = [rng.uniform(0.0, 0.8) * (x + y) / 3 for x, y in zip(f, b)]
        sim = simulate(_spec(f, b, h, n, v)).makespan_s
        taus = [x + y - z for x, y, z in zip(f, b, h)]
        assert sim <= interleaved_cycle_time(taus, n, v) + p * max(h) + 1e-9


def test_one_more_warm_up_forward():
    """Rank ``r`` of 4 with 2 chunks runs ``2 (3 − r) + 4`` forwards before its first steady
    pair without the overlap and one more with it."""
    plain = PipelineSpec((1.0,) * 4, (2.0,) * 4, (0.0,) * 3, 8, ScheduleKind.INTERLEAVED,
                         virtual_stages=2)
    ours = _spec([1.0] * 4, [2.0] * 4, [0.5] * 4, 8, 2)
    for r in range(4):
        first = [next(i for i, op in enumerate(program(s, r)) if op[0] is EventKind.BACKWARD)
                 for s in (plain, ours)]
        assert first == [2 * (3 - r) + 4 + 1, 2 * (3 - r) + 4 + 2]


def test_pipelined_overlap_needs_interleaving():
    with pytest.raises(ValueError, match="interleaved"):
        PipelineSpec((1.0, 1.0), (2.0, 2.0), (0.0,), 4, ScheduleKind.ONE_F_ONE_B,
                     overlap_hidden_s=(0.5, 0.5))
