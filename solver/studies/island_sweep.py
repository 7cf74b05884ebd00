"""Sensitivity of the islands and the planned throughput to the compute threshold τ_C.

Phase 1 of Algorithm 1 links two nodes when their effective compute differs by at most τ_C
(relative to the larger); phase 2 then merges while the loss stays within ``t_merge``. The
partition therefore only changes where τ_C crosses the relative compute gap of two node kinds:
the islands are a step function of τ_C with steps at those gaps (:func:`compute_gaps`). The sweep
samples the range and adds every gap inside it, so no step is missed and each distinct partition
is planned once (the partial-plan cache also shares entries of islands common to several
partitions).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from solver.cost.parallelizer import Parallelizer
from solver.islands import Thresholds, build_islands, partition_loss
from solver.planner.plan import Plan
from solver.planner.stages.search import PlannerConfig
from solver.spec.domain import ClusterSpec, Island, JobSpec
from solver.spec.errors import InfeasibleError, InputError
from solver.studies.pareto import default_parallelizer, plan_with_targets

MAX_STEPS = 1000


def parse_range(text: str, key: str = "--tau-c") -> tuple[float, float]:
    """``"0.05..0.4"`` -> (0.05, 0.4); both ends in [0, 1], low <= high."""
    lo_s, sep, hi_s = text.partition("..")
    try:
        lo, hi = float(lo_s), float(hi_s)
    except ValueError:
        lo = hi = float("nan")
    if not sep or not (0.0 <= lo <= hi <= 1.0):
        raise InputError("<cli>", key,
                         f"must be LOW..HIGH with 0 <= LOW <= HIGH <= 1, got {text!r}")
    return lo, hi


@dataclass(frozen=True)
class Gap:
    """The relative compute gap between two node kinds: where their similarity edge switches on.

    Attributes
    ----------
    tau_c : float
        ``|C_a − C_b| / max(C_a, C_b)`` (the edge exists for τ_C at or above it).
    kinds : tuple[str, str]
        The two kinds, ``GPU`` or ``GPU@perf``.
    """

    tau_c: float
    kinds: tuple[str, str]


def _kind_label(node) -> str:
    return node.gpu.name if node.perf == 1.0 else f"{node.gpu.name}@{node.perf:g}"


def compute_gaps(cluster: ClusterSpec, lo: float = 0.0, hi: float = 1.0) -> list[Gap]:
    """Relative compute gaps of all node-kind pairs within ``[lo, hi]``, ascending."""
    kinds = {}
    for n in cluster.nodes:
        kinds.setdefault(_kind_label(n), n.tflops)
    labels = sorted(kinds)
    gaps = [Gap(abs(kinds[a] - kinds[b]) / max(kinds[a], kinds[b]), (a, b))
            for i, a in enumerate(labels) for b in labels[i + 1:]]
    return sorted((g for g in gaps if lo <= g.tau_c <= hi and g.tau_c > 0),
                  key=lambda g: (g.tau_c, g.kinds))


def sample_values(lo: float, hi: float, steps: int, gaps: list[Gap]) -> list[float]:
    """``steps`` evenly spaced values plus every gap (sorted, duplicates removed)."""
    if not 1 <= steps <= MAX_STEPS:
        raise InputError("<cli>", "--steps", f"must be in 1..{MAX_STEPS}, got {steps}")
    grid = np.linspace(lo, hi, steps) if steps > 1 else np.array([lo])
    exact = sorted({g.tau_c for g in gaps})
    # A grid value within rounding of a gap is that gap (1 − 0.85 is 0.15000000000000002).
    near = [v for v in (round(float(x), 12) for x in grid)
            if all(abs(v - g) > 1e-9 for g in exact)]
    return sorted(set(near) | set(exact))


@dataclass(frozen=True)
class SweepPoint:
    """Islands and plan at one τ_C.

    Attributes
    ----------
    tau_c : float
        The threshold.
    islands : tuple[Island, ...]
        Islands built with it (other thresholds from the job).
    compute_loss : float
        Fraction of the cluster's compute lost by running each island at its weakest member.
    plan : Plan | None
        The plan, or None when no plan fits.
    reason : str
        Why there is no plan ("" when there is one).
    """

    tau_c: float
    islands: tuple[Island, ...]
    compute_loss: float
    plan: Plan | None
    reason: str = ""

    @property
    def partition(self) -> tuple[tuple[str, ...], ...]:
        """The islands as sets of node ids (what decides the plan)."""
        return tuple(tuple(n.node_id for n in i.nodes) for i in self.islands)


def with_tau_c(job: JobSpec, tau_c: float) -> JobSpec:
    """``job`` with its compute threshold replaced."""
    return replace(job, planner=replace(job.planner, tau_c=tau_c))


def sweep_tau_c(job: JobSpec, values: list[float], config: PlannerConfig = PlannerConfig(),
                parallelizer: Parallelizer | None = None) -> list[SweepPoint]:
    """Islands and the planned throughput at each τ_C in ``values`` (one plan per partition)."""
    par = parallelizer or default_parallelizer(job, config)
    plans: dict[tuple, tuple[Plan | None, str]] = {}
    out = []
    for tau in values:
        variant = with_tau_c(job, tau)
        islands = build_islands(variant.cluster, Thresholds.of(variant.planner)).islands
        key = tuple(tuple(n.node_id for n in i.nodes) for i in islands)
        if key not in plans:
            try:
                plans[key] = (plan_with_targets(variant, config, par), "")
            except InfeasibleError as exc:
                plans[key] = (None, str(exc))
        loss = partition_loss([i.nodes for i in islands])
        out.append(SweepPoint(tau, islands, loss, *plans[key]))
    return out


def changes(points: list[SweepPoint]) -> list[float]:
    """The τ_C values at which the partition differs from the previous sample's."""
    return [b.tau_c for a, b in zip(points, points[1:]) if a.partition != b.partition]


def sweep_json(job: JobSpec, points: list[SweepPoint], gaps: list[Gap]) -> dict[str, Any]:
    """The ``tangram sweep-islands --json`` object."""
    rows = []
    for p in points:
        rows.append({
            "tau_c": round(p.tau_c, 9),
            "islands": [{"name": i.name, "gpu": i.gpu.name, "gpus": i.gpus, "nodes": len(i.nodes)}
                        for i in p.islands],
            "compute_loss": round(p.compute_loss, 6),
            "tokens_per_s": None if p.plan is None else round(p.plan.tokens_per_s, 3),
            "iteration_time_s": None if p.plan is None else round(p.plan.iteration_time_s, 9),
            "reason": p.reason or None})
    return {"job": job.name, "thresholds": {"tau_m": job.planner.tau_m, "tau_b": job.planner.tau_b,
                                            "t_merge": job.planner.t_merge},
            "gaps": [{"tau_c": round(g.tau_c, 9), "between": list(g.kinds)} for g in gaps],
            "changes": [round(c, 9) for c in changes(points)], "points": rows}
