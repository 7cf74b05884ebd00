"""Choosing n_micro: the exact sweep behind ``n_micro = "auto"`` and ``tangram sweep``, and eq. (10).

For every ``n`` dividing the global batch the job is planned from scratch and composed exactly
(:func:`solver.planner.plan_job`, which validates). Nothing worth caching is independent of ``n``:
the micro-batch ``B / n`` changes every latency, memory and link time, and so every parallelizer
call; what is independent (islands, the link model's bandwidths) costs 0.4 ms per ``n`` against
about a second of planning, 90 % of it in the parallelizer (measured on the seed and three-gen
jobs). The sweep therefore parallelizes over ``n`` instead (``workers``).

Eq. (10) of the seed note, ``n* = argmax_n B / ((n − 1) τ_max + Σ τ)``, holds the τ's fixed, which
makes ``n* = 1``. Read with τ and c ∝ 1/n (the micro-batch shrinks), ``T(n)`` decreases in ``n``
and ``n*`` is the largest ``n`` (:attr:`NStarModel.SCALED`). :attr:`NStarModel.FIXED_LAYOUT`
keeps the reference plan's slices and configurations and re-costs them at every ``n`` with the
cost model (GEMM efficiency, per-micro-batch communication, memory, ``dp | micro-batch``), so
the gap between it and the exact sweep is what re-planning per ``n`` buys.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence

from solver.costmodel import PipelineSetting, stage_costs, substage_latencies
from solver.efficiency import DEFAULT_CALIBRATION
from solver.errors import InfeasibleError
from solver.plan import Plan, cycle_time
from solver.planner import PlannerConfig, plan_job
from solver.specs import JobSpec
from solver.stage import ConfigArrays, ModelSlice
from solver.validate import link_model

MAX_AUTO_MICRO = 128
REL_TIE = 1e-12   # relative tolerance under which two iteration times tie (smaller n wins)


def candidate_n_micro(job: JobSpec, lo: int = 1, hi: int = MAX_AUTO_MICRO) -> list[int]:
    """Micro-batch counts in ``[lo, hi]`` that divide the global batch."""
    b = job.training.global_batch
    return [n for n in range(max(lo, 1), min(b, hi) + 1) if b % n == 0]


@dataclass(frozen=True)
class SweepPoint:
    """The exact optimum at one ``n_micro``.

    Attributes
    ----------
    n_micro : int
        Micro-batches per iteration.
    plan : Plan | None
        The validated optimal plan, None when nothing fits.
    reason : str
        Why nothing fits (empty when feasible).
    """

    n_micro: int
    plan: Plan | None
    reason: str = ""

    @property
    def feasible(self) -> bool:
        """A plan exists."""
        return self.plan is not None

    @property
    def iteration_time_s(self) -> float | None:
        """Closed-form iteration time (None when infeasible)."""
        return None if self.plan is None else self.plan.iteration_time_s

    @property
    def tokens_per_s(self) -> float | None:
        """Throughput (None when infeasible)."""
        return None if self.plan is None else self.plan.tokens_per_s

    @property
    def bubble_ratio(self) -> float | None:
        """Eq. (7) (None when infeasible)."""
        return None if self.plan is None else self.plan.bubble_ratio


@dataclass(frozen=True)
class SweepResult:
    """All points of a sweep.

    Attributes
    ----------
    points : tuple[SweepPoint, ...]
        One per ``n``, ascending.
    elapsed_s : float
        Wall time of the sweep.
    """

    points: tuple[SweepPoint, ...]
    elapsed_s: float

    @property
    def best(self) -> SweepPoint | None:
        """The fastest feasible point (ties: the smaller ``n``), None when none is feasible."""
        best = None
        for p in self.points:
            if p.plan is not None and (best is None or p.plan.iteration_time_s
                                       < best.plan.iteration_time_s * (1 - REL_TIE)):
                best = p
        return best


def plan_point(job: JobSpec, config: PlannerConfig, n: int) -> SweepPoint:
    """Plan ``job`` at ``n`` micro-batches (a module-level function so workers can run it)."""
    try:
        return SweepPoint(n, plan_job(job, config, n_micro=n))
    except InfeasibleError as exc:
        return SweepPoint(n, None, str(exc))


def sweep(job: JobSpec, config: PlannerConfig = PlannerConfig(),
          ns: Sequence[int] | None = None, workers: int = 1) -> SweepResult:
    """Exact optimum at every ``n`` of ``ns`` (default: :func:`candidate_n_micro`).

    ``workers > 1`` plans the ``n`` values in that many processes (identical results).
    """
    start = time.perf_counter()
    ns = sorted(set(ns if ns is not None else candidate_n_micro(job)))
    if workers > 1 and len(ns) > 1:
        with ProcessPoolExecutor(max_workers=min(workers, len(ns))) as pool:
            points = list(pool.map(plan_point, [job] * len(ns), [config] * len(ns), ns))
    else:
        points = [plan_point(job, config, n) for n in ns]
    return SweepResult(tuple(points), time.perf_counter() - start)


def plan_auto(job: JobSpec, config: PlannerConfig = PlannerConfig(), workers: int = 1) -> Plan:
    """``plan_job`` at the job's n_micro, or the best of :func:`sweep` for ``"auto"``."""
    if job.training.n_micro is not None:
        return plan_job(job, config)
    result = sweep(job, config, workers=workers)
    if result.best is None:
        reasons = [p.reason for p in result.points if p.reason]
        raise InfeasibleError(reasons[-1] if reasons else "no n_micro divides the global batch")
    return result.best.plan


def point_json(p: SweepPoint) -> dict[str, Any]:
    """One point as in ``tangram sweep --json`` (public contract)."""
    return {"n_micro": p.n_micro, "iteration_time_s": _r(p.iteration_time_s),
            "tokens_per_s": _r(p.tokens_per_s), "bubble_ratio": _r(p.bubble_ratio),
            "feasible": p.feasible}


def sweep_json(result: SweepResult) -> dict[str, Any]:
    """``{"points": [...], "best": {...}}`` (public contract; best is null when none fits)."""
    best = result.best
    return {"points": [point_json(p) for p in result.points],
            "best": None if best is None else point_json(best)}


def _r(x: float | None) -> float | None:
    return None if x is None else float(f"{x:.9g}")


class NStarModel(enum.Enum):
    """How eq. (10) predicts ``T(n)`` from one reference plan."""

    SCALED = "scaled"              #: every τ and c ∝ 1/n, per-iteration terms fixed
    FIXED_LAYOUT = "fixed_layout"  #: the plan's slices and configs re-costed at every n


@dataclass(frozen=True)
class NStar:
    """Eq. (10)'s optimum under a model.

    Attributes
    ----------
    model : NStarModel
        The prediction model.
    n_ref : int
        n_micro of the reference plan.
    curve : tuple[tuple[int, float | None], ...]
        Predicted iteration time per ``n`` (None where the model has no feasible layout).
    """

    model: NStarModel
    n_ref: int
    curve: tuple[tuple[int, float | None], ...]

    @property
    def n_star(self) -> int | None:
        """The ``n`` of least predicted time (ties: smaller ``n``)."""
        feasible = [(t, n) for n, t in self.curve if t is not None]
        return min(feasible)[1] if feasible else None


def eq10(plan: Plan, ns: Sequence[int], model: NStarModel) -> NStar:
    """Eq. (10)'s prediction of ``T(n)`` for every ``n`` of ``ns`` from ``plan``."""
    predict = _scaled_time if model is NStarModel.SCALED else _fixed_layout_time
    return NStar(model, plan.n_micro, tuple((n, predict(plan, n)) for n in sorted(ns)))


def _scaled_time(plan: Plan, n: int) -> float:
    """``T(n)`` with the plan's τ's and link times scaled by ``n_ref / n``."""
    k = plan.n_micro / n
    taus = [t * k for t in plan.taus]
    links = [c * k for c in plan.all_links]
    return cycle_time(taus, links, n, plan.overlap) + plan.iteration_extra_s


def _fixed_layout_time(plan: Plan, n: int) -> float | None:
    """``T(n)`` of the plan's slices and configurations re-costed at ``n`` (None: no fit)."""
    job = plan.job
    micro, seq = job.training.global_batch // n, job.training.seq_len
    if job.training.global_batch % n:
        return None
    taus, links, extras = [], [], []
    lm = link_model(job, micro)
    for i, s in enumerate(plan.stages):
        c = s.plan.config
        if micro % c.dp:
            return None
        cfg = ConfigArrays.of([dataclasses.replace(c, micro_batch=micro // c.dp)])
        slc = ModelSlice(job.model, s.end - s.start, s.start == 0, s.end == job.model.layers)
        pipe = PipelineSetting(n, min(len(plan.stages) - i, n))
        costs = stage_costs(slc, s.island, seq, cfg, pipe)
        if not costs.fits(s.island.hbm_gb, job.planner.epsilon, DEFAULT_CALIBRATION)[0]:
            return None
        subs = substage_latencies(slc, s.island, seq, cfg, pipe)[0]
        taus += list(subs)
        links += [0.0] * (len(subs) - 1)
        if i + 1 < len(plan.stages):
            links.append(lm.time(s.island, plan.stages[i + 1].island))
        extras.append(float(costs.iteration_s[0]))
    return cycle_time(taus, links, n, plan.overlap) + max(extras)
