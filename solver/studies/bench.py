"""Benchmark suite runner (``tangram bench``): one row of measurements per job.

A row holds the Tangram plan (islands, stage split, throughput, bubble ratio, planning time,
parallelizer calls with the paper's rules and without any), optionally every composition solver's
answer on the same candidates (objective, time, proof status, bound/gap, agreement), and optionally
the Figure 7 comparison: throughput of the ``oblivious`` and ``restricted`` baselines and of
Tangram, normalized to ``oblivious`` = 1.0.

The unpruned call count is computed without planning: the planner runs with ``Rule.NONE`` against
a parallelizer that plans nothing, so the count is exactly the number of calls an unpruned run
makes (``tests/test_bench.py`` checks it against a real unpruned run) at the cost of enumerating
slices only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from solver.islands import Thresholds, build_islands
from solver.planner.baselines import Baseline, plan_baseline
from solver.planner.plan import Plan
from solver.planner.pruning import Rule
from solver.planner.replica.replicas import ReplicaOptions, plan_replicas
from solver.planner.stages.search import PlannerConfig, PlanningRun, plan_job, start_run
from solver.planner.check.validate import PlanInvalid
from solver.spec.domain import JobSpec, SolverKind
from solver.spec.errors import InfeasibleError, InputError, SolverTooLarge
from solver.spec.loaders import INSTANCES, load_job
from solver.studies.bench_rows import BaselineRun, BenchRow, ReplicaRun, SolverRun, SolverStatus
from solver.studies.sweep import plan_auto

SUITE = INSTANCES / "jobs"
AGREE_REL_TOL = 1e-4  # CP-SAT scales latencies to integers; same tolerance as `tangram verify`


@dataclass(frozen=True)
class BenchOptions:
    """What ``tangram bench`` measures besides the Tangram plan.

    Attributes
    ----------
    solvers : tuple[SolverKind, ...]
        Composition solvers to run on the same candidates (empty: none).
    baselines : bool
        Also plan the oblivious and restricted baselines.
    time_limit_s : float | None
        CP-SAT / MILP time limit per solve (None: the job's).
    replicas : bool
        Also search pipeline replicas across islands (:mod:`solver.planner.replica.replicas`) on
        every job; a job with ``[planner] replicas = true`` has them searched anyway.
    replica_time_limit_s : float
        Time limit of that search.
    replica_workers : int
        Processes for that search.
    workers : int
        Processes searching the ``n_micro`` values of a job that leaves it open (the same plan).
    """

    solvers: tuple[SolverKind, ...] = ()
    baselines: bool = False
    time_limit_s: float | None = None
    replicas: bool = False
    replica_time_limit_s: float = 60.0
    replica_workers: int = 1
    workers: int = 1


def suite_paths(jobs: Sequence[str] = ()) -> list[Path]:
    """Job files: the given paths or suite names, or every job of ``instances/jobs``."""
    if not jobs:
        return sorted(SUITE.glob("*.toml"))
    out = []
    for j in jobs:
        path = Path(j)
        if not path.is_file() and (SUITE / f"{j}.toml").is_file():
            path = SUITE / f"{j}.toml"
        if not path.is_file():
            raise InputError(j, "<file>", "no such file, and no suite job of that name")
        out.append(path)
    return out


class _NullParallelizer:
    """Plans nothing, so the table loop runs at the cost of enumerating slices."""

    def plan(self, slice, island, context) -> list:  # noqa: D102 - Parallelizer protocol
        return []


def unpruned_calls(job: JobSpec, n_micro: int) -> int:
    """Parallelizer calls of an unpruned (``Rule.NONE``) run, counted without planning.

    The planner itself runs, but against a parallelizer that plans nothing: without rules no
    entry depends on another's result, so the count is exact, and the run fails fast as infeasible.
    """
    config = PlannerConfig(rules=Rule.NONE, solver=SolverKind.DP)
    run = start_run(job, config, n_micro, parallelizer=_NullParallelizer())
    try:
        plan_job(job, config, run=run)
    except InfeasibleError:
        pass
    return run.cache.calls


_UNPROVEN = (SolverStatus.LIMIT, SolverStatus.UNPROVEN, SolverStatus.NO_PLAN_LIMIT,
             SolverStatus.NOT_RUN)


def agreement(runs: Sequence[SolverRun]) -> bool | None:
    """Whether the solvers agree: every one proved its answer and the answers match.

    A solver that hit its limit never counts as agreeing, even with the same objective, and
    neither does one that did not run (the instance exceeds its model).
    """
    if len(runs) < 2:
        return None
    if any(r.status in _UNPROVEN for r in runs):
        return False
    values = [r.objective_s for r in runs]
    if all(v is None for v in values):
        return True
    if any(v is None for v in values):
        return False
    return max(values) - min(values) <= AGREE_REL_TOL * min(values)


def solver_runs(job: JobSpec, config: PlannerConfig, run: PlanningRun,
                kinds: Sequence[SolverKind]) -> tuple[SolverRun, ...]:
    """Every solver in ``kinds`` on ``run``'s candidates (cache shared, so times are composition)."""
    limit = config.time_limit_s or job.planner.time_limit_s
    out = []
    for kind in kinds:
        cfg = replace(config, solver=kind)
        start = time.perf_counter()
        try:
            plan = plan_job(job, cfg, run=replace(run, config=cfg))
        except PlanInvalid:
            raise
        except InfeasibleError:
            plan = None
        except SolverTooLarge as exc:  # that solver's size limit: the others still report
            out.append(SolverRun(kind.value, SolverStatus.NOT_RUN, None,
                                 time.perf_counter() - start, not_run=exc.limit))
            continue
        out.append(_solver_run(kind, plan, time.perf_counter() - start, limit))
    return tuple(out)


def _solver_run(kind: SolverKind, plan: Plan | None, elapsed: float, limit: float) -> SolverRun:
    # Each CP-SAT / MILP solve is limited, so a run shorter than one limit hit none. A longer run
    # may have, and the planner skips a pipeline depth whose solve timed out without any plan, so
    # neither its "no plan" nor its "optimal" is a proof then.
    limited = kind is not SolverKind.DP and elapsed >= limit
    if plan is None:
        status = SolverStatus.NO_PLAN_LIMIT if limited else SolverStatus.INFEASIBLE
        return SolverRun(kind.value, status, None, elapsed)
    info = plan.solver
    if not info.optimal:
        return SolverRun(kind.value, SolverStatus.LIMIT, plan.iteration_time_s, elapsed,
                         info.bound, info.gap)
    status = SolverStatus.UNPROVEN if limited else SolverStatus.OPTIMAL
    return SolverRun(kind.value, status, plan.iteration_time_s, elapsed)


def baseline_runs(job: JobSpec, tangram: Plan | None, note: str = "") -> tuple[BaselineRun, ...]:
    """Oblivious, restricted and Tangram throughput, normalized to oblivious = 1.0."""
    found = [(b.value, *_try(lambda b=b: plan_baseline(job, b)))
             for b in (Baseline.OBLIVIOUS, Baseline.RESTRICTED)]
    found.append(("tangram", tangram, note))
    ref = found[0][1].tokens_per_s if found[0][1] else None
    out = []
    for name, plan, why in found:
        tps = plan.tokens_per_s if plan else None
        out.append(BaselineRun(name, tps, None if tps is None or ref is None else tps / ref, why))
    return tuple(out)


def _try(make: Callable[[], Plan]) -> tuple[Plan | None, str]:
    try:
        return make(), ""
    except PlanInvalid:
        raise
    except InfeasibleError as exc:
        return None, str(exc)


def bench_job(path: Path | str, options: BenchOptions = BenchOptions()) -> BenchRow:
    """Plan one job file and measure it as ``options`` asks."""
    job = load_job(path)
    config = PlannerConfig(time_limit_s=options.time_limit_s, workers=options.workers)
    start = time.perf_counter()
    run: PlanningRun | None = None
    try:
        # What `tangram plan` runs: every view of the cluster the runtime can run (one vendor,
        # one precision) and the one-mesh interleaved family, not one run over all islands.
        plan = plan_auto(job, config) if job.training.n_micro is None else plan_job(job, config)
        note = ""
    except PlanInvalid:
        raise
    except InfeasibleError as exc:
        plan, note = None, str(exc)
    elapsed = time.perf_counter() - start
    row = _row(job, plan, note, elapsed)
    n = plan.n_micro if plan else job.training.n_micro
    if n is not None:
        row = replace(row, calls_unpruned=unpruned_calls(job, n))
    if options.solvers and n is not None:
        runs = solver_runs(job, config, run or start_run(job, config, n), options.solvers)
        row = replace(row, solvers=runs, agree=agreement(runs))
    if options.baselines:
        row = replace(row, baselines=baseline_runs(job, plan, note))
    # The replica search where the bench asks for it (--replicas) or the job does
    # ([planner] replicas = true), not under max_replicas = 1.
    if (options.replicas or job.planner.replicas) and plan is not None and \
            job.constraints.max_replicas != 1:
        row = replace(row, replicas=replica_run(job, plan, config, options))
    return row


def replica_run(job: JobSpec, plan: Plan, config: PlannerConfig,
                options: BenchOptions) -> ReplicaRun:
    """The replica search over ``plan`` (validated by the search)."""
    start = time.perf_counter()
    rp = plan_replicas(job, plan, config, options=ReplicaOptions(
        time_limit_s=options.replica_time_limit_s, workers=options.replica_workers))
    return ReplicaRun(len(rp.replicas), rp.shares, rp.tokens_per_s,
                      time.perf_counter() - start, rp.solver.optimal)


def _row(job: JobSpec, plan: Plan | None, note: str, elapsed: float) -> BenchRow:
    if plan is None:
        islands = len(build_islands(job.cluster, Thresholds.of(job.planner)).islands)
        return BenchRow(job.name, job.cluster.total_gpus, islands, "", None, None, None, None,
                        elapsed, None, None, None, note)
    split = " ".join(f"{s.island.name}:{s.end - s.start}" for s in plan.stages)
    return BenchRow(job.name, job.cluster.total_gpus, len(plan.islands.islands), split,
                    plan.n_micro, plan.tokens_per_s, plan.iteration_time_s, plan.bubble_ratio,
                    elapsed, plan.solver.parallelizer_calls, None, plan.solver.optimal)
