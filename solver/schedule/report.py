"""A plan's schedule simulated (:mod:`solver.schedule.simulator`) and set beside its closed-form objective.

A plan becomes a :class:`~solver.schedule.simulator.PipelineSpec` stage by stage: an island with internal
``pp > 1`` contributes its sub-stages (joined by zero-time links, their point-to-point traffic is
inside their latency), each split into forward and backward in its stage's ``fwd_s : bwd_s``
ratio. Boundary links carry ``c / 2`` each way (activation, gradient: same bytes). The simulated
iteration time adds the plan's per-iteration terms (DP sync, optimizer step), exactly as the
closed form does, so the two differ only in the pipeline part.

Closed forms of a :class:`~solver.schedule.simulator.PipelineSpec` live here too: eq. 5/eq. 9
(:func:`closed_form`), GPipe's exact makespan (:func:`gpipe_time`) and eq. 5 corrected for 1F1B's
in-flight limit (:func:`round_trip_estimate`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from solver.planner.plan import Plan, cycle_time, interleaved_cycle_time
from solver.schedule.simulator import (
    PipelineSpec,
    ScheduleKind,
    SimResult,
    TransferMode,
    simulate,
)


def pipeline_spec(plan: Plan, schedule: ScheduleKind | None = None,
                  transfers: TransferMode = TransferMode.ASYNC) -> PipelineSpec:
    """The plan's pipeline: sub-stages expanded, forward/backward split, links in both ways
    (``schedule`` None: the plan's own, interleaved with its chunks where it has them)."""
    v = plan.virtual_stages if schedule in (None, ScheduleKind.INTERLEAVED) else 1
    if schedule is None:
        schedule = ScheduleKind.INTERLEAVED if v > 1 else ScheduleKind.ONE_F_ONE_B
    fwd, bwd = [], []
    for s in plan.stages:
        # The cost model reports fwd/bwd of the bottleneck sub-stage only; every sub-stage runs
        # the same kind of layers, so its split is taken to be the same.
        share = s.plan.fwd_s / (s.plan.fwd_s + s.plan.bwd_s)
        fwd += [t * share for t in s.plan.stage_latencies]
        bwd += [t * (1.0 - share) for t in s.plan.stage_latencies]
    return PipelineSpec(tuple(fwd), tuple(bwd), tuple(plan.all_links), plan.n_micro, schedule,
                        transfers, virtual_stages=v)


def planned_in_flight(plan: Plan) -> list[int]:
    """Micro-batches of activations the planner sized each pipeline (sub-)stage for.

    Sub-stage ``j`` of ``pp`` holds ``min(in_flight + pp − 1 − j, n)`` (``solver.cost.stage_costs``);
    interleaved, in chunks as the simulator counts them (``2 (P − j − 1) + (v − 1) P + 1``).
    """
    v, out = plan.virtual_stages, []
    if v > 1:
        p = len(plan.taus)
        return [min(2 * (p - j - 1) + (v - 1) * p + 1, plan.n_micro * v) for j in range(p)]
    for s in plan.stages:
        pp = len(s.plan.stage_latencies)
        out += [min(s.in_flight + pp - 1 - j, plan.n_micro) for j in range(pp)]
    return out


@dataclass(frozen=True)
class SimulatedPlan:
    """A plan and its simulated schedule.

    Attributes
    ----------
    plan : Plan
        The plan.
    spec : PipelineSpec
        What was simulated.
    result : SimResult
        The simulation.
    """

    plan: Plan
    spec: PipelineSpec
    result: SimResult

    @property
    def iteration_time_s(self) -> float:
        """Simulated pipeline makespan plus the plan's per-iteration terms."""
        return self.result.makespan_s + self.plan.iteration_extra_s

    @property
    def tokens_per_s(self) -> float:
        """Simulated throughput."""
        return self.plan.job.training.tokens / self.iteration_time_s


def run_simulation(plan: Plan, schedule: ScheduleKind | None = None,
                   transfers: TransferMode = TransferMode.ASYNC) -> SimulatedPlan:
    """Simulate ``plan`` under ``schedule`` (None: its own) with ``transfers``."""
    spec = pipeline_spec(plan, schedule, transfers)
    return SimulatedPlan(plan, spec, simulate(spec))


def closed_form(spec: PipelineSpec, overlap: bool = False) -> float:
    """Eq. 5 with links as stages (or eq. 9 with ``overlap``) for the spec's τ's and links;
    the interleaved closed form for an interleaved spec."""
    if spec.schedule is ScheduleKind.INTERLEAVED:
        return interleaved_cycle_time(spec.taus, spec.n_micro, spec.virtual_stages)
    return cycle_time(spec.taus, spec.links_s, spec.n_micro, overlap)


def gpipe_time(spec: PipelineSpec) -> float:
    """Exact GPipe makespan: two identical-job flow shops (see :mod:`solver.schedule.simulator`)."""
    half = [c / 2 for c in spec.links_s]
    if spec.transfers is TransferMode.BLOCKING:
        fwd = [f + c for f, c in zip(spec.fwd_s, half + [0.0])]
        bwd = [b + c for b, c in zip(spec.bwd_s, [0.0] + half)]
    else:
        fwd, bwd = list(spec.fwd_s) + half, list(spec.bwd_s) + half
    n = spec.n_micro
    return sum(fwd) + sum(bwd) + (n - 1) * (max(fwd) + max(bwd))


def round_trip_estimate(spec: PipelineSpec) -> float:
    """Eq. 5 with 1F1B's in-flight limit: a closer closed form of the simulated 1F1B time.

    Stage ``i`` holds at most ``P − i`` micro-batches, and one that enters it returns after the
    round trip ``R_i = Σ_{j≥i} τ_j + Σ_{j≥i} c_j``; so (Little's law) stage ``i`` finishes at most
    ``P − i`` micro-batches per ``R_i`` and the period is at least ``R_i / (P − i)``:
    ``T ≈ (n − 1)·max(τ_max, c_max, max_i R_i / (P − i)) + Στ + Σc``. Without links and with equal
    stages ``R_i / (P − i) = τ`` and this is eq. 5; links make ``R_0 / P = τ + Σc / P``.
    """
    taus, links, p = spec.taus, list(spec.links_s), spec.stages
    period = max(taus + links)
    for i in range(p):
        period = max(period, (sum(taus[i:]) + sum(links[i:])) / (p - i))
    return (spec.n_micro - 1) * period + sum(taus) + sum(links)


@dataclass(frozen=True)
class ObjectiveCheck:
    """The two closed forms of a plan against its simulated 1F1B time (all include the plan's
    per-iteration terms).

    Attributes
    ----------
    links_as_stages_s : float
        Eq. 5 with links as stages of their own.
    eq9_s : float
        Eq. 9: ``e_i = max(τ_i, c_i)``.
    round_trip_s : float
        :func:`round_trip_estimate`.
    simulated_s : float
        Simulated 1F1B with asynchronous transfers.
    simulated_blocking_s : float
        Simulated 1F1B with blocking sends.
    """

    links_as_stages_s: float
    eq9_s: float
    round_trip_s: float
    simulated_s: float
    simulated_blocking_s: float

    def error(self, predicted: float) -> float:
        """Relative error of ``predicted`` against the simulated (asynchronous) time."""
        return predicted / self.simulated_s - 1.0


def check_objectives(plan: Plan) -> ObjectiveCheck:
    """Both closed forms and both transfer modes for ``plan``."""
    extra = plan.iteration_extra_s
    spec = pipeline_spec(plan)
    blocking = run_simulation(plan, transfers=TransferMode.BLOCKING)
    return ObjectiveCheck(closed_form(spec) + extra, closed_form(spec, overlap=True) + extra,
                          round_trip_estimate(spec) + extra, simulate(spec).makespan_s + extra,
                          blocking.iteration_time_s)


def simulate_plan(plan: Plan, sim: SimulatedPlan | None = None) -> dict[str, Any]:
    """What ``tangram plan --simulate`` adds: simulated 1F1B beside the closed form.

    Parameters
    ----------
    plan : Plan
        A validated plan.
    sim : SimulatedPlan | None
        Its simulation, if already run (``--plot`` draws the same one); run here otherwise.

    Returns
    -------
    dict
        Flat ``key: value`` entries (JSON-ready) merged into the plan's output: the simulated
        iteration time, throughput, bubble ratio and peak in-flight micro-batches per pipeline
        stage; the plan's own closed form and both closed forms (eq. 5 with links as stages,
        eq. 9) for the same stages; and the in-flight counts the planner sized memory for.
    """
    sim = sim or run_simulation(plan)
    closed = plan.iteration_time_s
    extra = plan.iteration_extra_s
    out: dict[str, Any] = {
        "simulated_schedule": sim.spec.schedule.value,
        "simulated_transfers": TransferMode.ASYNC.value,
        "simulated_iteration_time_s": _r(sim.iteration_time_s),
        "closed_form_iteration_time_s": _r(closed),
        "simulated_vs_closed_form": round(sim.iteration_time_s / closed - 1.0, 5) + 0.0,
        "eq5_iteration_time_s": _r(closed_form(sim.spec) + extra),
        "eq9_iteration_time_s": _r(closed_form(sim.spec, overlap=True) + extra),
        "simulated_tokens_per_s": _r(sim.tokens_per_s),
        "simulated_bubble_ratio": round(sim.result.bubble_ratio, 5) + 0.0,
        "simulated_peak_in_flight": list(sim.result.peak_in_flight),
        "planned_in_flight": planned_in_flight(plan),
    }
    return out


def _r(x: float, digits: int = 6) -> float:
    """Round to ``digits`` significant digits (model estimates, not measurements)."""
    return float(f"{x:.{digits}g}")
