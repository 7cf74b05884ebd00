"""Choosing n_micro exactly: every ``n`` dividing the global batch planned and composed.

For every ``n`` the job is planned from scratch and composed exactly
(:func:`solver.planner.stages.search.plan_job`, which validates). Nothing worth caching is independent
of ``n``: the micro-batch ``B / n`` changes every latency, memory and link time, and so every
parallelizer call; what is independent (islands, the link model's bandwidths) costs 0.4 ms per
``n`` against about a second of planning, 90 % of it in the parallelizer (measured on the seed
and three-gen jobs). The sweep therefore parallelizes over ``n`` instead (``workers``).
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Sequence

from solver.planner.stages.candidates import MAX_AUTO_MICRO, candidate_n_micro
from solver.planner.plan import Plan
from solver.planner.stages.search import REL_TIE, PlannerConfig, plan_job
from solver.spec.domain import JobSpec
from solver.spec.errors import InfeasibleError

__all__ = ["MAX_AUTO_MICRO", "REL_TIE", "SweepPoint", "SweepResult", "candidate_n_micro",
           "plan_auto", "plan_point", "sweep"]


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
    """Plan ``job`` at ``n`` micro-batches (a module-level function so workers can run it): the
    job with its ``n_micro`` set to ``n``, so a job that fixes another one is swept too."""
    at_n = dataclasses.replace(job, training=dataclasses.replace(job.training, n_micro=n))
    try:
        return SweepPoint(n, plan_job(at_n, config, n_micro=n))
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
    """``plan_job`` at the job's n_micro, or searched over n_micro when it is ``"auto"``
    (``plan_job`` searches it itself; ``workers`` is kept for callers and unused)."""
    del workers
    return plan_job(job, config)
