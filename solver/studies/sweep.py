"""The n_micro studies: the exact sweep behind ``tangram sweep`` set beside eq. (10).

The exact sweep itself (every ``n`` planned and composed) is :mod:`solver.planner.micro`, which
also resolves ``n_micro = "auto"``.

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
from dataclasses import dataclass
from typing import Any, Sequence

from solver.cost.runtime.frameworks import job_runtime
from solver.cost.efficiency import DEFAULT_CALIBRATION
from solver.cost.reserve import usable_bytes
from solver.cost.stage import ConfigArrays, ModelSlice
from solver.cost.stage_costs import PipelineSetting, stage_costs, substage_latencies
from solver.planner.micro import (
    MAX_AUTO_MICRO,
    REL_TIE,
    SweepPoint,
    SweepResult,
    candidate_n_micro,
    plan_auto,
    plan_point,
    sweep,
)
from solver.planner.plan import Plan, cycle_time
from solver.planner.check.validate import link_model

__all__ = ["MAX_AUTO_MICRO", "REL_TIE", "NStar", "NStarModel", "SweepPoint", "SweepResult",
           "candidate_n_micro", "eq10", "plan_auto", "plan_point", "point_json", "sweep",
           "sweep_json"]


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
        behind = sum(t.plan.config.pp for t in plan.stages[i + 1:])
        pipe = PipelineSetting(n, min(behind + 1, n))
        costs = stage_costs(slc, s.group, seq, cfg, pipe, runtime=job_runtime(job))
        if not costs.fits(usable_bytes(s.island, job.planner.epsilon), DEFAULT_CALIBRATION)[0]:
            return None
        subs = substage_latencies(slc, s.group, seq, cfg, pipe, runtime=job_runtime(job))[0]
        taus += list(subs)
        links += [0.0] * (len(subs) - 1)
        if i + 1 < len(plan.stages):
            nxt = plan.stages[i + 1]
            links.append(lm.rate(s.island, nxt.island) / min(s.gpus, nxt.gpus))
        extras.append(float(costs.iteration_s[0]))
    return cycle_time(taus, links, n, plan.overlap) + max(extras)
