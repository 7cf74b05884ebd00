"""The rows ``tangram bench`` reports (:mod:`solver.studies.bench` measures them): per-solver
results, the Figure 7 baselines, the replica search and one job's row, and their ``--json``
form."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

from solver.planner.plan import _r

class SolverStatus(enum.Enum):
    """How one solver's planning run ended."""

    OPTIMAL = "optimal"          #: plan, optimality proven
    LIMIT = "limit"              #: plan, optimality not proven (a time limit was hit)
    UNPROVEN = "unproven"        #: plan the planner calls optimal, but the run outlasted one
    #: solve's time limit, and a solve that times out without any plan is not flagged by it
    INFEASIBLE = "infeasible"    #: no plan, and no time limit was hit: proven
    NO_PLAN_LIMIT = "no plan within limit"  #: no plan, but a limit may have cut the search
    NOT_RUN = "not run"          #: the instance is larger than the solver's model is built for


@dataclass(frozen=True)
class SolverRun:
    """One composition solver on the job's (shared) candidates.

    Attributes
    ----------
    solver : str
        ``dp``, ``cpsat`` or ``milp``.
    status : SolverStatus
        How it ended.
    objective_s : float | None
        Iteration time of its plan (None: no plan).
    time_s : float
        Wall time of planning with a warm candidate cache (composition, sweeps, validation).
    bound, gap : float | None
        Lower bound and relative gap when optimality was not proven (as the solver reports).
    not_run : str
        The size limit that kept the solver from running (status ``not run``; else empty).
    """

    solver: str
    status: SolverStatus
    objective_s: float | None
    time_s: float
    bound: float | None = None
    gap: float | None = None
    not_run: str = ""


@dataclass(frozen=True)
class BaselineRun:
    """Throughput of one planner in the Figure 7 comparison.

    Attributes
    ----------
    name : str
        ``oblivious``, ``restricted`` or ``tangram``.
    tokens_per_s : float | None
        Throughput (None: infeasible).
    relative : float | None
        ``tokens_per_s`` over the oblivious baseline's (None when either is infeasible).
    note : str
        Why there is no plan (empty when there is one).
    """

    name: str
    tokens_per_s: float | None
    relative: float | None
    note: str = ""


@dataclass(frozen=True)
class ReplicaRun:
    """The replica search on one job.

    Attributes
    ----------
    count : int
        Replicas of the best plan (1: the single pipeline won).
    shares : tuple[int, ...]
        Sequences per replica.
    tokens_per_s : float
        Throughput of the best plan.
    time_s : float
        Wall time of the search (after the single-pipeline plan).
    optimal : bool
        The search was exact (every island partition settled).
    """

    count: int
    shares: tuple[int, ...]
    tokens_per_s: float
    time_s: float
    optimal: bool


@dataclass(frozen=True)
class BenchRow:
    """Measurements of one job.

    Attributes
    ----------
    job : str
        Job name.
    gpus : int
        GPUs in the cluster.
    islands : int
        Islands built.
    split : str
        Layers per stage in pipeline order, ``island:layers`` (empty without a plan).
    n_micro : int | None
        Micro-batches of the plan.
    tokens_per_s, iteration_time_s, bubble_ratio : float | None
        Objective of the plan (None without a plan).
    plan_time_s : float
        Wall time of planning (islands, candidates, composition, validation).
    calls : int | None
        Parallelizer calls with the paper's rules (None without a plan).
    calls_unpruned : int | None
        Calls an unpruned run makes at the same n_micro (None when n_micro is unknown).
    optimal : bool | None
        Optimality proven for the plan.
    infeasible : str
        Why there is no plan (empty when there is one).
    solvers : tuple[SolverRun, ...]
        Per-solver results (empty unless asked).
    agree : bool | None
        All solvers proved the same answer (None unless at least two ran).
    baselines : tuple[BaselineRun, ...]
        Figure 7 comparison (empty unless asked).
    replicas : ReplicaRun | None
        The replica search (None unless asked, or without a plan).
    """

    job: str
    gpus: int
    islands: int
    split: str
    n_micro: int | None
    tokens_per_s: float | None
    iteration_time_s: float | None
    bubble_ratio: float | None
    plan_time_s: float
    calls: int | None
    calls_unpruned: int | None
    optimal: bool | None
    infeasible: str = ""
    solvers: tuple[SolverRun, ...] = ()
    agree: bool | None = None
    baselines: tuple[BaselineRun, ...] = ()
    replicas: ReplicaRun | None = None


def row_json(row: BenchRow) -> dict[str, Any]:
    """One row of ``tangram bench --json`` (every key always present; null when not measured).

    Wall-clock keys (``planning_time_s``, ``time_s``) are those ``--stable-json`` zeroes.
    """
    return {
        "job": row.job, "gpus": row.gpus, "islands": row.islands, "split": row.split,
        "n_micro": row.n_micro, "tokens_per_s": _opt(row.tokens_per_s, 6),
        "iteration_time_s": _opt(row.iteration_time_s), "bubble_ratio": _opt(row.bubble_ratio),
        "planning_time_s": _r(row.plan_time_s, 4), "parallelizer_calls": row.calls,
        "parallelizer_calls_unpruned": row.calls_unpruned, "optimal": row.optimal,
        "infeasible": row.infeasible or None,
        "solvers": {s.solver: {"status": s.status.value, "optimal": s.status is SolverStatus.OPTIMAL,
                               "objective_s": _opt(s.objective_s), "time_s": _r(s.time_s, 4),
                               "bound": _opt(s.bound), "gap": _opt(s.gap),
                               "not_run": s.not_run or None}
                    for s in row.solvers},
        "agree": row.agree,
        "baselines": {b.name: {"tokens_per_s": _opt(b.tokens_per_s, 6),
                               "relative": _opt(b.relative, 4), "infeasible": b.note or None}
                      for b in row.baselines} or None,
        "replicas": None if row.replicas is None else {
            "count": row.replicas.count, "shares": list(row.replicas.shares),
            "tokens_per_s": _r(row.replicas.tokens_per_s, 6),
            "time_s": _r(row.replicas.time_s, 4), "optimal": row.replicas.optimal},
    }


def _opt(x: float | None, digits: int = 9) -> float | None:
    return None if x is None or not math.isfinite(x) else _r(x, digits)
