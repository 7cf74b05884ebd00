"""The event-driven pipeline simulator against the closed form (eq. 5) and hand-worked schedules.

Notation: stage ``i`` has forward ``f_i`` and backward ``b_i`` per micro-batch, ``τ_i = f_i + b_i``;
a boundary's round-trip link time ``c`` is ``c/2`` each way; ``n`` micro-batches.
Eq. 5: ``T = (n − 1)·max(τ, c) + Στ + Σc``.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.schedule.report import closed_form, gpipe_time
from solver.schedule.simulator import (
    EventKind,
    LinkDuplex,
    PipelineSpec,
    ScheduleKind,
    TransferMode,
    program,
    simulate,
)

GPIPE, ONE_F_ONE_B, INTERLEAVED = ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B, \
    ScheduleKind.INTERLEAVED


def spec(f, b, c=None, n=1, **kw) -> PipelineSpec:
    c = [0.0] * (len(f) - 1) if c is None else c
    return PipelineSpec(tuple(map(float, f)), tuple(map(float, b)), tuple(map(float, c)), n, **kw)


def spans(result, stage, kind):
    return [(e.micro, e.start, e.end) for e in result.events if e.stage == stage and e.kind is kind]


def megatron_peaks(p: int, n: int, v: int = 1) -> tuple[int, ...]:
    """Most units (micro-batches, or chunks of one with ``v`` virtual stages) each stage holds,
    by Megatron-Core's own count (NVIDIA/Megatron-LM, megatron/core/pipeline_parallel/
    schedules.py, ``get_pp_rank_microbatches`` and ``forward_backward_pipelining_without_
    interleaving``, commit d98e8a6): rank ``i`` runs ``w_i`` warm-up forwards, ``P − i − 1``
    without interleaving and ``2 (P − i − 1) + (v − 1) · P`` with it (micro-batch groups of
    ``P``), capped at all ``n · v`` units; its first backward follows one more forward
    (``max_outstanding_backprops = w_i + 1``), so it holds ``min(w_i + 1, n · v)``."""
    warm = [p - i - 1 if v == 1 else 2 * (p - i - 1) + (v - 1) * p for i in range(p)]
    return tuple(min(w + 1, n * v) for w in warm)


# --- where the closed form is exact ------------------------------------------------------------

@pytest.mark.parametrize("taus, ratio, n", [((3, 6), 1 / 3, 4), ((6, 3, 9, 3), 0.5, 5),
                                            ((2, 2, 2), 0.25, 1), ((4,), 0.5, 7)])
def test_gpipe_with_one_forward_share_and_no_links_is_eq5(taus, ratio, n):
    # GPipe = forward flow shop then backward flow shop of n identical jobs, each
    # Σp + (n − 1)·max p. With f = r·τ and b = (1 − r)·τ for every stage the maxima sit on
    # the same stage: Σf + Σb + (n − 1)(r + 1 − r)·max τ = Στ + (n − 1)·max τ = eq. 5.
    s = spec([ratio * t for t in taus], [(1 - ratio) * t for t in taus], n=n, schedule=GPIPE)
    assert simulate(s).makespan_s == pytest.approx(closed_form(s), rel=1e-12)


def test_gpipe_hand_worked_unequal_ratio_exceeds_eq5():
    # f = (1, 3), b = (4, 2), n = 2.  Stage 0: F0 [0,1] F1 [1,2]; stage 1: F0 [1,4] F1 [4,7];
    # stage 1: B0 [7,9] B1 [9,11]; stage 0: B0 [9,13] B1 [13,17]  →  T = 17.
    # Formula: Σf + Σb + (n−1)(max f + max b) = 4 + 6 + 1·(3 + 4) = 17; eq. 5: 1·5 + 10 = 15.
    s = spec([1, 3], [4, 2], n=2, schedule=GPIPE)
    r = simulate(s)
    assert r.makespan_s == 17.0 == gpipe_time(s)
    assert closed_form(s) == 15.0
    assert spans(r, 0, EventKind.BACKWARD) == [(0, 9.0, 13.0), (1, 13.0, 17.0)]


times = st.lists(st.floats(0.05, 5.0), min_size=1, max_size=5)


@settings(max_examples=60, deadline=None)
@given(f=times, data=st.data(), n=st.integers(1, 8),
       transfers=st.sampled_from(TransferMode), duplex=st.sampled_from(LinkDuplex))
def test_gpipe_is_two_flow_shops(f, data, n, transfers, duplex):
    p = len(f)
    b = data.draw(st.lists(st.floats(0.05, 5.0), min_size=p, max_size=p))
    c = data.draw(st.lists(st.sampled_from([0.0, 0.3, 2.0, 7.0]), min_size=p - 1,
                           max_size=p - 1))
    s = spec(f, b, c, n, schedule=GPIPE, transfers=transfers, duplex=duplex)
    assert simulate(s).makespan_s == pytest.approx(gpipe_time(s), rel=1e-9)
    # eq. 5 never overestimates GPipe: max f + max b >= max (f + b)
    assert closed_form(s) <= gpipe_time(s) * (1 + 1e-12) or transfers is TransferMode.BLOCKING


@pytest.mark.parametrize("p, n", [(1, 5), (2, 1), (3, 4), (4, 4), (5, 12)])
def test_1f1b_equal_stages_no_links_is_eq5(p, n):
    # Each stage holds P − i micro-batches, exactly the round trip: T = (n + P − 1)·(f + b).
    s = spec([1.0] * p, [2.0] * p, n=n)
    r = simulate(s)
    assert r.makespan_s == pytest.approx((n + p - 1) * 3.0) == closed_form(s)
    assert r.peak_in_flight == megatron_peaks(p, n) == tuple(min(p - i, n) for i in range(p))


@settings(max_examples=80, deadline=None)
@given(taus=st.lists(st.integers(1, 6), min_size=2, max_size=5), n=st.integers(1, 9),
       ratio=st.sampled_from([1 / 3, 0.5]))
def test_1f1b_one_forward_share_no_links_never_exceeds_eq5(taus, n, ratio):
    # Checked, not proven: eq. 5 is an upper bound of 1F1B without links; when the last stage
    # is a bottleneck it is also a lower bound of any schedule (stage P−1 cannot start before
    # Σ_{j<P−1} f_j, works n·τ_{P−1}, and its last gradient needs Σ_{j<P−1} b_j to travel back),
    # so 1F1B equals it.
    s = spec([ratio * t for t in taus], [(1 - ratio) * t for t in taus], n=n)
    t = simulate(s).makespan_s
    assert t <= closed_form(s) * (1 + 1e-12)
    if taus[-1] == max(taus):
        assert t == pytest.approx(closed_form(s))


# --- where it is not: pinned on hand-worked cases -----------------------------------------------

def test_1f1b_bottleneck_first_hides_fill_and_drain():
    # f = (2, 1), b = (4, 2), n = 3; stage 0 warms up with 1 forward.
    # s0: F0 [0,2] F1 [2,4] · idle [4,5] · B0 [5,9] F2 [9,11] B1 [11,15] B2 [15,19]
    # s1: F0 [2,3] B0 [3,5] F1 [5,6] B1 [6,8] F2 [11,12] B2 [12,14]
    # T = 19; eq. 5 = 2·6 + 9 = 21: the drain of stage 1 (3 s) hides under B1 on stage 0.
    s = spec([2, 1], [4, 2], n=3)
    r = simulate(s)
    assert r.makespan_s == 19.0 and closed_form(s) == 21.0
    assert r.peak_in_flight == (2, 1)  # s0 holds F0, F1 until B0 ends at 9; s1 one at a time
    assert spans(r, 0, EventKind.BACKWARD) == [(0, 5.0, 9.0), (1, 11.0, 15.0), (2, 15.0, 19.0)]
    assert r.idle_s == (1.0, 10.0)   # 19 − 18 and 19 − 9


def test_1f1b_links_stall_the_first_stage():
    # f = (1, 1), b = (2, 2), c = 2 (1 s each way, one half-duplex channel), n = 4, async sends.
    # s0: F0 [0,1] F1 [1,2] B0 [6,8] F2 [8,9] B1 [9,11] F3 [11,12] B2 [14,16] B3 [17,19]
    # link: a0 [1,2] a1 [2,3] g0 [5,6] g1 [8,9] a2 [9,10] a3 [12,13] g2 [13,14] g3 [16,17]
    # s1: F0 [2,3] B0 [3,5] F1 [5,6] B1 [6,8] F2 [10,11] B2 [11,13] F3 [13,14] B3 [14,16]
    # Stage 0 holds 2 micro-batches, but a round trip takes f1 + b1 + c = 5 > 2·f0, so it waits
    # (e.g. [2,6]). T = 19 against eq. 5 = 3·3 + 8 = 17 and eq. 9 = 3·3 + 6 = 15; GPipe (no
    # in-flight limit) reaches 17.
    s = spec([1, 1], [2, 2], [2], n=4)
    r = simulate(s)
    assert r.makespan_s == 19.0
    assert closed_form(s) == 17.0 and closed_form(s, overlap=True) == 15.0
    assert gpipe_time(spec([1, 1], [2, 2], [2], n=4, schedule=GPIPE)) == 17.0
    assert spans(r, 0, EventKind.BACKWARD) == [(0, 6.0, 8.0), (1, 9.0, 11.0), (2, 14.0, 16.0),
                                               (3, 17.0, 19.0)]
    assert r.link_busy_s == (8.0,)   # 4 micro-batches × (1 + 1)
    assert r.peak_in_flight == (2, 1)  # the stall keeps the limit: F2 waits for B0 on s0


def test_blocking_sends_occupy_the_sender():
    # Same pipeline, n = 1, blocking: s0 F0 [0,1] send [1,2]; s1 F0 [2,3] B0 [3,5] send [5,6];
    # s0 B0 [6,8]. T = 8 = Στ + c (nothing to overlap with one micro-batch); each stage is busy
    # 4 s (compute 3 + its own send 1).
    r = simulate(spec([1, 1], [2, 2], [2], n=1, transfers=TransferMode.BLOCKING))
    assert r.makespan_s == 8.0 and r.busy_s == (4.0, 4.0) and r.idle_s == (4.0, 4.0)


def test_full_duplex_never_slower_than_half():
    half = simulate(spec([1, 1, 1], [2, 2, 2], [3, 3], n=6))
    full = simulate(spec([1, 1, 1], [2, 2, 2], [3, 3], n=6, duplex=LinkDuplex.FULL))
    assert full.makespan_s <= half.makespan_s


# --- interleaved --------------------------------------------------------------------------------

@pytest.mark.parametrize("p, n, v", [(2, 4, 2), (4, 8, 2), (4, 8, 4), (3, 9, 3)])
def test_interleaved_equal_stages_bubble_shrinks_by_v(p, n, v):
    # Narayanan et al. (SC'21): the bubble of the interleaved schedule is (P − 1)·τ / v.
    r = simulate(spec([1.0] * p, [2.0] * p, n=n, schedule=INTERLEAVED, virtual_stages=v))
    assert r.makespan_s == pytest.approx(n * 3.0 + (p - 1) * 3.0 / v)
    assert r.peak_in_flight == megatron_peaks(p, n, v)  # beside the makespan: the warm-up


@pytest.mark.parametrize("p, v", [(2, 2), (2, 3), (3, 2), (4, 2), (4, 3)])
@pytest.mark.parametrize("groups", [1, 2, 3])
def test_interleaved_peak_in_flight_per_stage_is_megatrons(p, v, groups):
    """Every stage, unequal stages and links, ``n`` from ``P`` (every unit in the warm-up) to
    ``3 P``: each stage's peak is Megatron-Core's warm-up plus one (:func:`megatron_peaks`),
    and the makespan is at least the busiest stage's work and at most the closed form of
    ``solver.planner.plan.interleaved_cycle_time`` (checked there) without links."""
    n = groups * p
    fwd = [1.0 + 0.5 * (i % 2) for i in range(p)]
    s = spec(fwd, [2 * f for f in fwd], [0.3] * (p - 1), n=n, schedule=INTERLEAVED,
             virtual_stages=v)
    r = simulate(s)
    assert r.peak_in_flight == megatron_peaks(p, n, v)
    assert r.makespan_s >= max(n * 3 * f for f in fwd) - 1e-9


@pytest.mark.parametrize("p, v", [(2, 2), (4, 2), (4, 4), (3, 2)])
def test_interleaved_first_stage_holds_more(p, v):
    # In chunks of 1/v micro-batch: stage 0 holds P·(1 + (P − 1)/(P·v)) micro-batches, the
    # growth factor solver.cost.stage_costs applies to the interleaved first sub-stage.
    r = simulate(spec([1.0] * p, [2.0] * p, n=4 * p, schedule=INTERLEAVED, virtual_stages=v))
    assert r.peak_in_flight[0] / v == pytest.approx(p * (1 + (p - 1) / (p * v)))


# --- in-flight micro-batches: what the planner's memory check assumes ---------------------------

@pytest.mark.parametrize("p", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("n", [1, 2, 4, 7, 16])
def test_1f1b_peak_in_flight_is_min_p_minus_i_n(p, n):
    fwd = [1.0 + 0.7 * (i % 3) for i in range(p)]          # unequal stages, links too
    s = spec(fwd, [2 * x for x in fwd], [0.4] * (p - 1), n=n)
    assert simulate(s).peak_in_flight == tuple(min(p - i, n) for i in range(p))


def test_gpipe_holds_every_micro_batch():
    r = simulate(spec([1, 2, 1], [2, 4, 2], n=5, schedule=GPIPE))
    assert r.peak_in_flight == (5, 5, 5)
    # Beside it the makespan, two flow shops: Σf + Σb + (n − 1)(max f + max b) = 4 + 8 + 4·6.
    assert r.makespan_s == pytest.approx(36.0)


# --- structure ----------------------------------------------------------------------------------

def test_events_respect_dependencies_and_never_overlap_on_a_stage():
    s = spec([1, 2, 1.5], [2, 3, 2], [1.0, 0.5], n=6)
    r = simulate(s)
    at = {(e.kind, e.stage, e.micro): e for e in r.events}
    for m in range(6):
        for i in (1, 2):
            assert at[(EventKind.FORWARD, i, m)].start >= \
                at[(EventKind.SEND_ACTIVATION, i - 1, m)].end >= at[(EventKind.FORWARD, i - 1, m)].end
            assert at[(EventKind.BACKWARD, i - 1, m)].start >= at[(EventKind.SEND_GRADIENT, i - 1, m)].end
    for i in range(3):
        own = sorted((e.start, e.end) for e in r.events if e.stage == i and e.kind.is_compute)
        assert all(a[1] <= b[0] for a, b in zip(own, own[1:]))
        assert r.compute_s[i] == pytest.approx(6 * (s.fwd_s[i] + s.bwd_s[i]))
    assert len(r.events) == 2 * 3 * 6 + 2 * 2 * 6


def test_1f1b_program_order():
    # Stage 0 of 3 with 4 micro-batches: 2 warm-up forwards, then alternate, then drain.
    s = spec([1, 1, 1], [1, 1, 1], n=4)
    order = [(k.value, m) for k, m, _ in program(s, 0)]
    assert order == [("fwd", 0), ("fwd", 1), ("fwd", 2), ("bwd", 0), ("fwd", 3), ("bwd", 1),
                     ("bwd", 2), ("bwd", 3)]


@pytest.mark.parametrize("kwargs", [dict(f=[1, 1], b=[1], c=[0]), dict(f=[1, 1], b=[1, 1], c=[]),
                                    dict(f=[1, -1], b=[1, 1], c=[0]),
                                    dict(f=[1, 1], b=[1, 1], c=[0], n=0),
                                    dict(f=[1, 1], b=[1, 1], c=[0], n=3, schedule=INTERLEAVED,
                                         virtual_stages=2),
                                    dict(f=[1, 1], b=[1, 1], c=[0], n=4, virtual_stages=2)])
def test_bad_specs_are_rejected(kwargs):
    f, b, c = kwargs.pop("f"), kwargs.pop("b"), kwargs.pop("c")
    with pytest.raises(ValueError):
        PipelineSpec(tuple(f), tuple(b), tuple(c), kwargs.pop("n", 2), **kwargs)
