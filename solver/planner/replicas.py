"""Data parallelism across islands: the exact search over pipeline replicas and batch shares.

The search space: a partition of (some of) the islands into ``R`` sets, ``2 ≤ R ≤ max_replicas``,
each set running one pipeline replica planned exactly by :func:`~solver.planner.search.plan_job`
(node-group stages, ``n_micro`` as the job says), with a share ``b_r`` of the global batch that
is a multiple of the share unit ``u`` (:func:`share_unit`); the objective is
:mod:`solver.planner.replica_plan`'s. The single-pipeline plan (``R = 1``) is the incumbent, so
the result is never worse than it.

Exactness. For one partition the best shares are a min-max allocation, solved exactly by a
dynamic program over replicas (:func:`~solver.planner.replica_pass.best_shares`) on every share
a better plan could use. Partitions are visited in order of a lower bound and the search stops
when the bound reaches the incumbent (:mod:`solver.planner.replica_pass`; with workers several
partitions side by side). Every cut is provably safe (:mod:`solver.planner.replica_bounds`):
the partition bound (the all-reduce plus the continuous min-max of the replicas' floors), the
share windows (shares whose replica alone, at its floor, is not faster than the incumbent, or
that leave the others more than they can do in time, are not planned) and the memory cut (a
set of islands without the HBM for one copy of the model's states hosts no replica).

A time limit stops the search honestly: the plan then says "not proven" with its bound.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from solver.cost.frameworks import profile
from solver.cost.parallelizer import Parallelizer
from solver.planner.plan import Plan, SolverInfo
from solver.planner.replica_bounds import (Partition, holds_model, partition_bound, partitions,
                                           proportional_shares, ranked_partitions,
                                           replica_floor, share_window)
from solver.planner.replica_pass import SearchState, best_shares, exact_pass
from solver.planner.replica_plan import (Replica, ReplicatedPlan, allreduce_s,
                                         validate_replicated)
from solver.planner.replica_workers import ReplicaMemo, ReplicaPlanner
from solver.planner.search import PlannerConfig, job_islands
from solver.spec.domain import Island, JobSpec

__all__ = ["ReplicaOptions", "replica_search_runs", "share_unit", "partitions", "partition_bound", "ranked_partitions",
           "share_window", "best_shares", "holds_model", "replica_floor", "proportional_shares",
           "plan_replicas"]

PROPORTIONAL_TRIES = 4  # partitions tried with proportional shares before the exact pass


@dataclass(frozen=True)
class ReplicaOptions:
    """How the replica search runs.

    Attributes
    ----------
    share_steps : int
        The batch is shared in units of at least ``global_batch / share_steps`` sequences.
    time_limit_s : float
        Wall-time limit of the search (the plan reports its bound and gap when it stops).
    workers : int
        Processes planning replicas in parallel (1: in this process; identical results).
    """

    share_steps: int = 32
    time_limit_s: float = 60.0
    workers: int = 1


def replica_search_runs(job: JobSpec) -> bool:
    """Whether the replica search runs for ``job``: not with ``[constraints] max_replicas = 1``,
    nor when the job's budget (``max_usd_per_hour``) or throughput target (``min_tokens_per_s``)
    chose among island sets (such plans stay single-pipeline)."""
    p = job.planner
    return p.max_usd_per_hour is None and p.min_tokens_per_s is None and \
        job.constraints.max_replicas != 1


def share_unit(job: JobSpec, steps: int) -> int:
    """The smallest multiple of the job's ``n_micro`` (1 when searched) that divides the global
    batch into at most ``steps`` units: every replica then runs whole micro-batches."""
    n, batch = job.training.n_micro or 1, job.training.global_batch
    per = batch // n
    d = next(d for d in range(1, per + 1) if per % d == 0 and per // d <= steps)
    return n * d


def _try_proportional(reps: ReplicaMemo, part: Partition, unit: int, st: SearchState) -> None:
    """Improve ``st`` with the proportional shares of ``part`` (a heuristic incumbent; the
    exact pass plans these shares again from the cache)."""
    shares = proportional_shares(reps.job, part, unit, reps.calib)
    if shares is None:
        return
    extra, ask = allreduce_s(reps.job, part), st.value - st.least_allreduce
    reps.prefetch([(g, b, ask) for g, b in zip(part, shares)])
    st.improve(part, (max(reps.time(g, b, ask) for g, b in zip(part, shares)) + extra, shares))


def plan_replicas(job: JobSpec, single: Plan, config: PlannerConfig = PlannerConfig(),
                  parallelizer: Parallelizer | None = None,
                  options: ReplicaOptions = ReplicaOptions()) -> ReplicatedPlan:
    """The best plan of one or more replicas, ``single`` (the single-pipeline plan) included;
    validated before it is returned."""
    start = time.perf_counter()
    islands = job_islands(job).islands
    # Megatron-LM runs one layout and equal batch shares: replicas are its dp, not ours.
    limit = 1 if profile(job.planner.framework).uniform_layout else \
        (job.constraints.max_replicas or len(islands))
    unit = share_unit(job, options.share_steps)
    with ReplicaPlanner(job, config, unit, options.workers, parallelizer) as planner:
        reps = ReplicaMemo(job, planner)
        st = _search(reps, single, islands, limit, unit, start + options.time_limit_s)
    return _result(job, single, reps, st, unit, (st.total, islands), time.perf_counter() - start)


def _search(reps: ReplicaMemo, single: Plan, islands: tuple[Island, ...], limit: int, unit: int,
            deadline: float) -> SearchState:
    """Partitions in bound order: the proportional incumbents first, then the exact pass."""
    job = reps.job
    st = SearchState(single.iteration_time_s)
    every = list(partitions(islands, limit))
    st.total = len(every)
    ranked = ranked_partitions(job, every, reps.calib)
    parts = [p for _, p in ranked]
    st.least_allreduce = min((allreduce_s(job, p) for p in parts), default=0.0)
    # A good incumbent first narrows every window of the exact pass; the partitions of the
    # lowest bounds are the likely winners (a heuristic: the exact pass settles every one).
    for bound, part in ranked[:PROPORTIONAL_TRIES]:
        if time.perf_counter() > deadline or bound >= st.value:
            break
        _try_proportional(reps, part, unit, st)
    exact_pass(reps, ranked, unit, st, deadline)
    st.settled += len(every) - len(parts)  # settled by the memory cut
    return st


def _result(job: JobSpec, single: Plan, reps: ReplicaMemo, st: SearchState, unit: int,
            space: tuple[int, tuple[Island, ...]], elapsed: float) -> ReplicatedPlan:
    """The winning replicas, with the proof status of the whole search."""
    total, islands = space
    proven = single.solver.optimal and st.settled == total
    bound = None if proven else min(st.open_bound, st.value)
    gap = None if bound is None else max(0.0, (st.value - bound) / st.value)
    # The replicas are planned under the single pipeline's rules, heuristic or not.
    info = SolverInfo("replicas", proven, single.solver.time_s + elapsed,
                      single.solver.parallelizer_calls + reps.calls, bound, gap,
                      single.solver.heuristic_pruning)
    if st.choice is None:
        used = tuple(i for i in single.islands.islands
                     if any(s.island.name == i.name for s in single.stages))
        replicas = (Replica(used or single.islands.islands, job.training.global_batch, single),)
        extra = 0.0
    else:
        part, shares = st.choice
        replicas = tuple(Replica(g, b, reps.plan(g, b)) for g, b in zip(part, shares))
        extra = allreduce_s(job, part)
    rp = ReplicatedPlan(job, replicas, extra, info, unit, (st.settled, total), islands,
                        _note(st, total))
    validate_replicated(rp, job)
    return rp


def _note(st: SearchState, total: int) -> str:
    """How the search ended, in words."""
    if total == 0:
        return "fewer than two islands: no replicas across islands to search"
    noun = "island partition" + "s" * (total != 1)
    if st.settled < total:
        return f"replica search stopped at its time limit after {st.settled} of {total} {noun}"
    return f"replica search: {total} {noun} settled"
