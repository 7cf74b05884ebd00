"""Data parallelism across islands: the exact search over pipeline replicas and batch shares.

The search space: a partition of (some of) the islands into ``R`` sets, ``2 ≤ R ≤ max_replicas``,
each set running one pipeline replica planned exactly by :func:`~solver.planner.stages.search.plan_job`
(node-group stages, ``n_micro`` as the job says), with a share ``b_r`` of the global batch that
is a multiple of the share unit ``u`` (:func:`share_unit`); the objective is
:mod:`solver.planner.replica.replica_plan`'s, its exchange across replicas priced on the replicas'
plans (a shard-wise ring where their shard layouts match, else a full-gradient all-reduce).
The single-pipeline plan (``R = 1``) is the incumbent, so the result is never worse than it.
The search is a research option a job asks for (``[planner] replicas = true``,
:func:`replica_search_runs`): no runtime the planner exports to trains separate pipelines,
and the plan says which could (:mod:`solver.planner.replica.replica_runtime`).

Exactness. For one partition the best shares are a min-max allocation, solved exactly by a
dynamic program over replicas (:func:`~solver.planner.replica.replica_pass.best_shares`) on every share
a better plan could use, then priced (:func:`~solver.planner.replica.replica_pass.priced_shares`: the
min-max shares, or the best shares whose plans share one shard layout at the ring's price).
Every replica runs its own job's optimal plan (its share on its islands), as before the
exchange was priced on layouts: a slower plan of a replica chosen only to match another
replica's shard layout is outside the search space. Partitions are visited in order of a
lower bound and the search stops when the bound reaches the incumbent
(:mod:`solver.planner.replica.replica_pass`; with workers several partitions side by side). Every cut
is provably safe (:mod:`solver.planner.replica.replica_bounds`): the partition bound (the shard-wise
ring, the least exchange the partition can pay, plus the continuous min-max of the replicas'
floors), the share windows (shares whose replica alone, at its floor, is not faster than the
incumbent, or that leave the others more than they can do in time, are not planned) and the
memory cut (a set of islands without the HBM for one copy of the model's states hosts no
replica).

The single pipeline, when the caller has not planned it, is planned here, bounded by the
replicas (:func:`_bounded_single`): a composition that must beat a plan of replicas is mostly
cut by its floors, where an unbounded one searches every ``n_micro`` to its optimum
(``fleet-8448``: 0.3 s instead of about 10 s). First a probe below the first replica
incumbents (:data:`SINGLE_PROBE`; with few partitions, :data:`FEW_PARTITIONS`, the first
incumbent itself): a single pipeline faster than that is found and becomes the incumbent;
else, after the exact pass, it is planned again bounded by the final incumbent unless the
probe's bound is already above it. The result is the same as with the single
pipeline planned first: the bounded search finds it exactly when it is faster than the
replicas (ties go to it, as when it is the first incumbent), and proves otherwise that no
single pipeline is.

A time limit stops the search honestly: the plan then says "not proven" with its bound.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

from solver.cost.runtime.frameworks import precision_problem, profile
from solver.cost.parallelizer import Parallelizer
from solver.islands import same_vendor
from solver.planner.plan import Plan, SolverInfo
from solver.planner.replica.replica_bounds import (Partition, holds_model, partition_bound, partitions,
                                           proportional_shares, ranked_partitions,
                                           rebalanced_shares, replica_floor, share_window)
from solver.planner.replica.replica_pass import SearchState, best_shares, exact_pass
from solver.planner.replica.replica_plan import (Replica, ReplicatedPlan, allreduce_s, exchange_s,
                                         validate_replicated)
from solver.planner.replica.replica_workers import ReplicaMemo, ReplicaPlanner
from solver.planner.stages.runs import REL_TIE, resolved
from solver.planner.stages.search import PlannerConfig, job_islands, plan_job
from solver.spec.domain import Island, JobSpec, SolverKind
from solver.spec.errors import InfeasibleError

__all__ = ["ReplicaOptions", "SinglePipeline", "replica_search_runs", "why_no_replica_search",
           "share_unit", "partitions", "partition_bound", "ranked_partitions",
           "share_window", "best_shares", "holds_model", "replica_floor", "proportional_shares",
           "plan_replicas"]

PROPORTIONAL_TRIES = 4  # partitions tried with proportional shares before the exact pass
# The single pipeline is first planned only if faster than this share of the first replica
# incumbent: a bound well below its optimum cuts the search at once, and where the exact pass
# ends below the bound nothing is left to plan (else it is planned again, bounded by the final
# incumbent). The answer does not depend on it; 0.97 on fleet-8448: 0.3 s instead of 4.3 s.
SINGLE_PROBE = 0.97
# With at most this many partitions the exact pass is short and moves the incumbent little, so
# the single pipeline is planned once, bounded by the first incumbent (ties allowed), and never
# again (the worked example with n_micro searched: 1.67 → 1.39 s; the jobs of 7 and 171
# partitions the same).
FEW_PARTITIONS = 1000


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
    """Whether the replica search runs for ``job``: only where the job asks for it
    (``[planner] replicas = true``: no runtime the planner exports to trains separate
    pipelines, so the default plan is one pipeline), and not with ``[constraints]
    max_replicas = 1``, nor when the job's budget (``max_usd_per_hour``) or throughput target
    (``min_tokens_per_s``) chose among island sets (such plans stay single-pipeline)."""
    p = job.planner
    return p.replicas and p.max_usd_per_hour is None and p.min_tokens_per_s is None and \
        job.constraints.max_replicas != 1


def why_no_replica_search(job: JobSpec) -> str:
    """Why :func:`replica_search_runs` says no for ``job``, in words (empty when it runs)."""
    p = job.planner
    if not p.replicas:
        return "replica search off ([planner] replicas = false: one pipeline)"
    if job.constraints.max_replicas == 1:
        return "replica search off ([constraints] max_replicas = 1)"
    if p.max_usd_per_hour is not None or p.min_tokens_per_s is not None:
        return "replica search off (a budget or throughput target chose the islands)"
    return ""


def share_unit(job: JobSpec, steps: int) -> int:
    """The smallest multiple of the job's ``n_micro`` (1 when searched) that divides the global
    batch into at most ``steps`` units: every replica then runs whole micro-batches."""
    n, batch = job.training.n_micro or 1, job.training.global_batch
    per = batch // n
    d = next(d for d in range(1, per + 1) if per % d == 0 and per // d <= steps)
    return n * d


def _try_proportional(reps: ReplicaMemo, part: Partition, unit: int, st: SearchState) -> None:
    """Improve ``st`` with the proportional shares of ``part``, then with shares rebalanced to
    the rates its replicas reached (heuristic incumbents; the exact pass plans these shares
    again from the memo). The floors' rates are off by different factors on different island
    sets (``fleet-8448``: 7.32 s at proportional shares, 5.76 s rebalanced)."""
    shares = proportional_shares(reps.job, part, unit, reps.calib)
    if shares is None:
        return
    batch = reps.job.training.global_batch
    for _ in range(2):
        ask = st.value - st.least_allreduce
        reps.prefetch([(g, b, ask) for g, b in zip(part, shares)])
        times = [reps.time(g, b, ask) for g, b in zip(part, shares)]
        if not all(math.isfinite(t) for t in times):
            return  # some replica is not faster than the incumbent: no rates to rebalance by
        extra = exchange_s(reps.job, [Replica(g, b, reps.plan(g, b)) for g, b in zip(part, shares)])
        st.improve(part, (max(times) + extra, shares))
        again = rebalanced_shares(times, shares, batch, unit)
        if again == shares:
            return
        shares = again


@dataclass(frozen=True)
class SinglePipeline:
    """The single-pipeline side (``R = 1``) of a replica search.

    Attributes
    ----------
    plan : Plan | None
        Its plan; None when the search proved that none beats the replicas it was bounded by.
    time_s : float
        Planning time spent before the replica search started (0 when planned within it).
    calls : int
        Parallelizer calls its planning took.
    optimal : bool
        Whether its search is proven (optimal, or none faster than the bound).
    heuristic : bool
        Whether it was planned under heuristic pruning rules (and so are the replicas).
    above : float
        Without a plan: no single pipeline is faster than this many seconds per iteration.
    """

    plan: Plan | None
    time_s: float
    calls: int
    optimal: bool
    heuristic: bool
    above: float = 0.0

    @classmethod
    def of(cls, plan: Plan) -> "SinglePipeline":
        """A single-pipeline plan the caller made before the search."""
        info = plan.solver
        return cls(plan, info.time_s, info.parallelizer_calls, info.optimal,
                   info.heuristic_pruning)


def plan_replicas(job: JobSpec, single: Plan | None, config: PlannerConfig = PlannerConfig(),
                  parallelizer: Parallelizer | None = None,
                  options: ReplicaOptions = ReplicaOptions()) -> ReplicatedPlan:
    """The best plan of one or more replicas, the single pipeline (``R = 1``) included;
    validated before it is returned.

    ``single``: the single-pipeline plan, or None to plan it here, bounded by the first
    replica incumbents (module docstring; with the DP composition only, the one solver whose
    bounded search is a proof: CP-SAT and MILP plan it first, unbounded).

    Raises
    ------
    InfeasibleError
        No single pipeline fits and no replicas were found before it was planned.
    """
    start = time.perf_counter()
    islands = job_islands(job).islands
    # Megatron-LM runs one layout and equal batch shares: replicas are its dp, not ours.
    limit = 1 if profile(job.planner.framework).uniform_layout else \
        (job.constraints.max_replicas or len(islands))
    unit = share_unit(job, options.share_steps)
    if single is None and (config.solver or job.planner.solver) is not SolverKind.DP:
        single = plan_job(job, config, parallelizer=parallelizer)
    one = None if single is None else SinglePipeline.of(single)
    with ReplicaPlanner(job, config, unit, options.workers, parallelizer) as planner:
        reps = ReplicaMemo(job, planner)
        st = SearchState(math.inf if one is None else single.iteration_time_s)
        one = _search(reps, (st, one, config, parallelizer), islands, limit, unit,
                      start + options.time_limit_s)
    return _result(job, one, reps, st, unit, (st.total, islands), time.perf_counter() - start)


def _search(reps: ReplicaMemo,
            state: tuple[SearchState, SinglePipeline | None, PlannerConfig, Parallelizer | None],
            islands: tuple[Island, ...], limit: int, unit: int,
            deadline: float) -> SinglePipeline:
    """Partitions in bound order: the proportional incumbents first; then, when the single
    pipeline is not planned yet, a probe of it (:data:`SINGLE_PROBE`, :data:`FEW_PARTITIONS`);
    the exact pass; and the single pipeline again, bounded by the final incumbent, unless the
    probe's cut already covers it. Returns the single pipeline."""
    job, (st, one, config, par) = reps.job, state
    # The runtimes' rules (solver.cost.runtime.frameworks): replicas exchange gradients over one
    # communicator (one vendor), in the job's one precision.
    islands = tuple(i for i in islands if not any(
        precision_problem(n.gpu, job.training.precision) for n in i.nodes))
    every = [p for p in partitions(islands, limit)
             if same_vendor([n for isl in p for i in isl for n in i.nodes])]
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
    if one is None:  # a probe well below the incumbent: cheap to cut, and it often suffices
        t0 = time.perf_counter()
        probe = SINGLE_PROBE if len(every) > FEW_PARTITIONS else 1 + REL_TIE
        one = _bounded_single(job, config, par, st, st.value * probe)
        deadline += time.perf_counter() - t0  # the time limit is the replicas' own
    exact_pass(reps, ranked, unit, st, deadline)
    st.settled += len(every) - len(parts)  # settled by the memory cut
    if one.plan is None and one.above < st.value * (1 + REL_TIE):
        again = _bounded_single(job, config, par, st, st.value * (1 + REL_TIE))
        one = replace(again, calls=again.calls + one.calls)  # the probe's calls count too
    return one


def _bounded_single(job: JobSpec, config: PlannerConfig, par: Parallelizer | None,
                    st: SearchState, upper: float) -> SinglePipeline:
    """The single pipeline if it is faster than ``upper``, and then the incumbent (``upper``
    at most the incumbent with the tie allowance: a single pipeline that ties the replicas
    wins, as when it is planned first); else the proof that none is (provably safe: the
    bounded DP search is exact below its bound). ``par``: the caller's parallelizer, if any
    (else the planner's own, its ``n_micro`` searched by ``config.workers`` processes)."""
    heuristic = resolved(config, job).rules.heuristic
    try:
        plan = plan_job(job, config, parallelizer=par, upper=upper)
    except InfeasibleError as cut:
        if not math.isfinite(upper):
            raise  # no replicas either: the single pipeline's reason is the answer
        return SinglePipeline(None, 0.0, cut.calls, True, heuristic, upper)
    st.value, st.choice = plan.iteration_time_s, None
    return SinglePipeline(plan, 0.0, plan.solver.parallelizer_calls, plan.solver.optimal,
                          heuristic)


def _result(job: JobSpec, one: SinglePipeline, reps: ReplicaMemo, st: SearchState, unit: int,
            space: tuple[int, tuple[Island, ...]], elapsed: float) -> ReplicatedPlan:
    """The winning replicas, with the proof status of the whole search."""
    total, islands = space
    proven = one.optimal and st.settled == total
    bound = None if proven else min(st.open_bound, st.value)
    gap = None if bound is None else max(0.0, (st.value - bound) / st.value)
    # The replicas are planned under the single pipeline's rules, heuristic or not.
    info = SolverInfo("replicas", proven, one.time_s + elapsed, one.calls + reps.calls, bound,
                      gap, one.heuristic)
    if st.choice is None:
        assert one.plan is not None, "the single pipeline was cut by replicas that were kept"
        rp = replace(ReplicatedPlan.single(one.plan, info, _note(st, total), True, unit,
                                           (st.settled, total)), islands=islands)
    else:
        part, shares = st.choice
        replicas = tuple(Replica(g, b, reps.plan(g, b)) for g, b in zip(part, shares))
        rp = ReplicatedPlan(job, replicas, exchange_s(job, replicas), info, unit,
                            (st.settled, total), islands, _note(st, total))
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
