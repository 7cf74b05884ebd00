"""Data parallelism across islands: the exact search over pipeline replicas and batch shares.

The search space: a partition of (some of) the islands into ``R`` sets, ``2 ≤ R ≤ max_replicas``,
each set running one pipeline replica planned exactly by :func:`~solver.planner.search.plan_job`
(node-group stages, ``n_micro`` as the job says), with a share ``b_r`` of the global batch that
is a multiple of the share unit ``u`` (:func:`share_unit`); the objective is
:mod:`solver.planner.replica_plan`'s. The single-pipeline plan (``R = 1``) is the incumbent, so
the result is never worse than it.

Exactness. For one partition the best shares are a min-max allocation, solved exactly by a
dynamic program over replicas (:func:`best_shares`) on every share a better plan could use.
Partitions are visited in order of a lower bound and the search stops when the bound reaches
the incumbent. Every cut is provably safe:

* :func:`partition_bound` — the all-reduce plus the continuous min-max of the replicas' floors
  (:func:`replica_floor`: compute at the fastest kernel rates, and the pipeline fill of a
  replica spanning islands);
* :func:`share_window` — shares whose replica alone, at its compute floor, is not faster than
  the incumbent, or that leave the others more than they can do in time, are not planned.

* :func:`holds_model` — a set of islands without the HBM for one copy of the model's states
  hosts no replica.

A time limit stops the search honestly: the plan then says "not proven" with its bound.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Iterator, Sequence

from solver.cost.efficiency import Calibration
from solver.cost.frameworks import profile
from solver.cost.memory import GRAD_BYTES, OPTIMIZER_BYTES, WEIGHT_BYTES
from solver.cost.parallelizer import Parallelizer
from solver.planner.candidates import MAX_AUTO_MICRO
from solver.planner.floors import pipeline_floor
from solver.planner.plan import Plan, SolverInfo
from solver.planner.replica_plan import (Replica, ReplicatedPlan, allreduce_s,
                                         validate_replicated)
from solver.planner.replica_workers import ReplicaMemo, ReplicaPlanner
from solver.planner.search import PlannerConfig, job_islands
from solver.spec.domain import Island, JobSpec

__all__ = ["ReplicaOptions", "share_unit", "partitions", "partition_bound", "ranked_partitions",
           "share_window", "best_shares", "plan_replicas"]

Partition = tuple[tuple[Island, ...], ...]
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
    time_limit_s: float = 30.0
    workers: int = 1


def share_unit(job: JobSpec, steps: int) -> int:
    """The smallest multiple of the job's ``n_micro`` (1 when searched) that divides the global
    batch into at most ``steps`` units: every replica then runs whole micro-batches."""
    n, batch = job.training.n_micro or 1, job.training.global_batch
    per = batch // n
    d = next(d for d in range(1, per + 1) if per % d == 0 and per // d <= steps)
    return n * d


def partitions(islands: Sequence[Island], max_r: int) -> Iterator[Partition]:
    """Every partition of a subset of ``islands`` into ``2..max_r`` sets (islands outside every
    set stay idle), each set in island order."""
    k = len(islands)

    def grow(i: int, labels: list[int], used: int) -> Iterator[list[int]]:
        if i == k:
            yield labels
            return
        for lab in range(0, min(used + 1, max_r) + 1):  # 0: unused
            yield from grow(i + 1, labels + [lab], max(used, lab))

    for labels in grow(0, [], 0):
        r = max(labels, default=0)
        if r >= 2:
            yield tuple(tuple(isl for isl, lab in zip(islands, labels) if lab == j)
                        for j in range(1, r + 1))


def replica_floor(job: JobSpec, group: Sequence[Island], share: int,
                  calib: Calibration | None = None) -> float:
    """No replica on ``group`` trains ``share`` sequences faster (provably safe).

    The share's part of :func:`~solver.planner.floors.pipeline_floor` over ``group`` (1F1B
    with every kernel at its fastest rate; ``calib``: the parallelizer's calibration); the
    interleaved schedule, on one island's group, needs its compute floor, more. ``n`` is the
    job's, or the largest searched when it is searched (the bound falls with ``n``).
    """
    n = job.training.n_micro or MAX_AUTO_MICRO
    return share / job.training.global_batch * pipeline_floor(job, group, n, calib)


def holds_model(job: JobSpec, group: Sequence[Island]) -> bool:
    """Whether ``group`` has the HBM for one copy of the model's states (bf16 weights, fp32
    gradients and Adam states, 18 B/param, all sharded as ZeRO-3 would) within the job's
    margin. A replica on a group without it cannot exist: provably safe."""
    need = job.model.total_params * (WEIGHT_BYTES + GRAD_BYTES + OPTIMIZER_BYTES)
    have = sum(n.gpus * n.gpu.hbm_gb for i in group for n in i.nodes) * 1e9
    return have * (1.0 - job.planner.epsilon) >= need


def partition_bound(job: JobSpec, part: Partition, calib: Calibration | None = None) -> float:
    """No plan on ``part`` beats this: its all-reduce plus the continuous min-max of its
    replicas' floors (:func:`replica_floor`, linear in the share), ``B / Σ_r (B / F_r(B))``."""
    batch = job.training.global_batch
    rate = sum(1.0 / replica_floor(job, g, batch, calib) for g in part)
    return allreduce_s(job, part) + 1.0 / rate


def ranked_partitions(job: JobSpec, every: Sequence[Partition], calib: Calibration | None = None
                      ) -> list[tuple[float, Partition]]:
    """``(partition_bound, partition)`` of the partitions whose every set holds the model
    (:func:`holds_model`), lowest bound first (ties in the given order). Each set's floor and
    memory are computed once: a fleet has tens of thousands of partitions of a few hundred
    sets."""
    batch, rate, holds = job.training.global_batch, {}, {}
    named = [[(tuple(i.name for i in g), g) for g in part] for part in every]  # cheap keys
    for key, g in (pair for part in named for pair in part):
        if key not in rate:
            rate[key] = 1.0 / replica_floor(job, g, batch, calib)
            holds[key] = holds_model(job, g)
    kept = [(p, n) for p, n in zip(every, named) if all(holds[k] for k, _ in n)]
    bounds = [allreduce_s(job, p) + 1.0 / sum(rate[k] for k, _ in n) for p, n in kept]
    return sorted(zip(bounds, (p for p, _ in kept)), key=lambda x: x[0])


def share_window(job: JobSpec, part: Partition, unit: int, budget: float,
                 calib: Calibration | None = None) -> list[range]:
    """Per replica, the shares a plan whose replicas all finish within ``budget`` could use.

    Dropped: shares whose replica at its compute floor needs ``budget`` or more, and shares so
    small that the others, each at most its largest share, cannot cover the batch. Provably
    safe (the floor is a lower bound on the replica's time)."""
    batch, r = job.training.global_batch, len(part)
    his = []
    for g in part:
        top = batch - (r - 1) * unit
        while top >= unit and replica_floor(job, g, top, calib) >= budget:
            top -= unit
        his.append(top)
    return [range(max(unit, batch - (sum(his) - hi)), hi + 1, unit) for hi in his]


def best_shares(times: Sequence[dict[int, float]], batch: int, unit: int
                ) -> tuple[float, tuple[int, ...]] | None:
    """``min max_r times[r][b_r]`` over shares summing to ``batch`` (each a key of
    ``times[r]``), exactly, by a dynamic program over replicas; None when no shares fit."""
    best: dict[int, tuple[float, tuple[int, ...]]] = {0: (0.0, ())}
    for table in times:
        nxt: dict[int, tuple[float, tuple[int, ...]]] = {}
        for used, (worst, shares) in best.items():
            for b, t in table.items():
                s = used + b
                if s > batch or not math.isfinite(t):
                    continue
                cand = (max(worst, t), shares + (b,))
                if s not in nxt or cand[0] < nxt[s][0]:
                    nxt[s] = cand
        best = nxt
    return best.get(batch)


@dataclass
class _State:
    """The incumbent and the proof bookkeeping of one search."""

    value: float
    least_allreduce: float = 0.0
    choice: tuple[Partition, tuple[int, ...]] | None = None
    settled: int = 0
    open_bound: float = math.inf
    total: int = 0


def _solve_partition(reps: ReplicaMemo, part: Partition, unit: int, st: _State,
                     deadline: float) -> bool:
    """Improve ``st`` with the best shares of ``part``; False when the deadline stopped it.

    Each replica's window (:func:`share_window`) is first shrunk from the top: a largest share
    whose plan is not faster than the incumbent is of no use, which raises the smallest share
    the other replicas may take. Then every share left is planned and the shares are chosen
    exactly (:func:`best_shares`)."""
    job, batch = reps.job, reps.job.training.global_batch
    extra = allreduce_s(job, part)
    budget = st.value - extra
    # Replicas are planned up to the largest budget any partition can still ask for (the
    # smallest all-reduce), so each (islands, share) is planned once; times compare to ours.
    ask = st.value - st.least_allreduce
    windows = share_window(job, part, unit, budget, reps.calib)
    if any(len(w) == 0 for w in windows):
        return True  # some replica has no share a better plan could use
    his, times = [w[-1] for w in windows], [dict() for _ in part]
    shrunk = _shrink_tops(reps, part, unit, (budget, ask), (his, times), deadline)
    if shrunk is not None:
        return shrunk
    asks = [(g, b, ask) for r, g in enumerate(part)
            for b in range(max(unit, batch - (sum(his) - his[r])), his[r] + 1, unit)
            if b not in times[r]]
    for k in range(0, len(asks), 4):
        if time.perf_counter() > deadline:
            return False
        reps.prefetch(asks[k:k + 4])
        for g, b, _ in asks[k:k + 4]:
            times[part.index(g)][b] = reps.time(g, b, ask)
    found = best_shares(times, batch, unit)
    if found is not None and found[0] + extra < st.value * (1 - 1e-12):
        st.value, st.choice = found[0] + extra, (part, found[1])
    return True


def _shrink_tops(reps: ReplicaMemo, part: Partition, unit: int, budgets: tuple[float, float],
                 state: tuple[list[int], list[dict[int, float]]], deadline: float
                 ) -> bool | None:
    """Walk every window's top (``his``, planned times in ``times``) down until each top
    beats ``budget``; planned at ``ask``. None when the tops hold, else what
    :func:`_solve_partition` returns (True: settled, no shares beat the incumbent; False:
    the deadline)."""
    (budget, ask), (his, times), batch = budgets, state, reps.job.training.global_batch
    while True:
        if any(his[r] < max(unit, batch - (sum(his) - his[r])) for r in range(len(part))):
            return True  # no shares of this partition beat the incumbent
        walking = [r for r in range(len(part)) if his[r] not in times[r]]
        if not walking:
            return None
        if time.perf_counter() > deadline:
            return False
        # With workers, the shares just below each top are planned alongside it: a top that
        # fails needs the next one, and one that holds has the exact pass plan those below.
        reps.prefetch([(part[r], b, ask) for r in walking
                       for b in range(his[r], max(0, his[r] - reps.ahead * unit), -unit)])
        for r in walking:
            times[r][his[r]] = reps.time(part[r], his[r], ask)
            his[r] -= unit * (times[r][his[r]] >= budget)


def proportional_shares(job: JobSpec, part: Partition, unit: int,
                        calib: Calibration | None = None) -> tuple[int, ...] | None:
    """Shares in proportion to the replicas' floor rates, in whole units (None: too few units)."""
    units = job.training.global_batch // unit
    if units < len(part):
        return None
    rates = [1.0 / replica_floor(job, g, job.training.global_batch, calib) for g in part]
    raw = [max(1, round(units * r / sum(rates))) for r in rates]
    raw[raw.index(max(raw))] += units - sum(raw)
    return tuple(k * unit for k in raw) if min(raw) >= 1 else None


def _try_proportional(reps: ReplicaMemo, part: Partition, unit: int, st: _State) -> None:
    """Improve ``st`` with the proportional shares of ``part`` (a heuristic incumbent; the
    exact pass plans these shares again from the cache)."""
    shares = proportional_shares(reps.job, part, unit, reps.calib)
    if shares is None:
        return
    extra, ask = allreduce_s(reps.job, part), st.value - st.least_allreduce
    reps.prefetch([(g, b, ask) for g, b in zip(part, shares)])
    value = max(reps.time(g, b, ask) for g, b in zip(part, shares)) + extra
    if value < st.value * (1 - 1e-12):
        st.value, st.choice = value, (part, shares)


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
            deadline: float) -> _State:
    """Partitions in bound order: the proportional incumbents first, then the exact pass."""
    job = reps.job
    st = _State(single.iteration_time_s)
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
    for k, (bound, part) in enumerate(ranked):
        if bound >= st.value:
            st.settled = len(parts)  # every later bound is at least this one
            break
        if not _solve_partition(reps, part, unit, st, deadline):
            st.open_bound = bound
            break
        st.settled = k + 1
    st.settled += len(every) - len(parts)  # settled by the memory cut
    return st


def _result(job: JobSpec, single: Plan, reps: ReplicaMemo, st: _State, unit: int,
            space: tuple[int, tuple[Island, ...]], elapsed: float) -> ReplicatedPlan:
    """The winning replicas, with the proof status of the whole search."""
    total, islands = space
    proven = single.solver.optimal and st.settled == total
    bound = None if proven else min(st.open_bound, st.value)
    gap = None if bound is None else max(0.0, (st.value - bound) / st.value)
    info = SolverInfo("replicas", proven, single.solver.time_s + elapsed,
                      single.solver.parallelizer_calls + reps.calls, bound, gap)
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


def _note(st: _State, total: int) -> str:
    """How the search ended, in words."""
    if total == 0:
        return "fewer than two islands: no replicas across islands to search"
    noun = "island partition" + "s" * (total != 1)
    if st.settled < total:
        return f"replica search stopped at its time limit after {st.settled} of {total} {noun}"
    return f"replica search: {total} {noun} settled"
