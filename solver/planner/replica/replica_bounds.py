"""The island partitions of the replica search and the provably safe bounds that cut them.

* :func:`partition_bound` — the shard-wise ring (:func:`~solver.planner.replica.replica_plan.allreduce_s`,
  the least exchange any replicas there can pay) plus the continuous min-max of the replicas' floors
  (:func:`replica_floor`: compute at the fastest kernel rates, and the pipeline fill of a
  replica spanning islands);
* :func:`share_window` — shares whose replica alone, at its compute floor, is not faster than
  the incumbent, or that leave the others more than they can do in time, are not planned;
* :func:`holds_model` — a set of islands without the HBM for one copy of the model's states
  hosts no replica.

:func:`proportional_shares` (shares in proportion to the floors' rates) and
:func:`rebalanced_shares` (shares in proportion to the rates planned replicas reached) are
heuristics: they only pick the first incumbents.
"""

from __future__ import annotations

from typing import Iterator, Sequence

from solver.cost.efficiency import Calibration
from solver.cost.reserve import gpu_usable_bytes
from solver.planner.stages.candidates import MAX_AUTO_MICRO
from solver.planner.bounds.floors import pipeline_floor
from solver.planner.pruning import job_state_bytes
from solver.planner.replica.replica_plan import allreduce_s
from solver.spec.domain import Island, JobSpec

__all__ = ["Partition", "partitions", "replica_floor", "holds_model", "partition_bound",
           "ranked_partitions", "share_window", "proportional_shares", "rebalanced_shares"]

Partition = tuple[tuple[Island, ...], ...]


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

    The share's part of :func:`~solver.planner.bounds.floors.pipeline_floor` over ``group`` (1F1B
    with every kernel at its fastest rate; ``calib``: the parallelizer's calibration); the
    interleaved schedule, on one island's group, needs its compute floor, more. ``n`` is the
    job's, or the largest searched when it is searched (the bound falls with ``n``).
    """
    n = job.training.n_micro or MAX_AUTO_MICRO
    return share / job.training.global_batch * pipeline_floor(job, group, n, calib)


def holds_model(job: JobSpec, group: Sequence[Island]) -> bool:
    """Whether ``group`` has the memory for one copy of the model's states (bf16 weights, fp32
    gradients and Adam states, 18 B/param with Megatron-LM's defaults: the job's
    :func:`~solver.planner.pruning.job_state_bytes`, all sharded as ZeRO-3 would) within every
    GPU's usable bytes (:func:`~solver.cost.reserve.gpu_usable_bytes`). A replica on a group
    without it cannot exist: provably safe."""
    need = job.model.total_params * job_state_bytes(job)
    eps = job.planner.epsilon
    return sum(n.gpus * gpu_usable_bytes(n.gpu, eps) for i in group for n in i.nodes) >= need


def partition_bound(job: JobSpec, part: Partition, calib: Calibration | None = None) -> float:
    """No plan on ``part`` beats this: its shard-wise ring (the least exchange: replicas whose
    shard layouts differ pay the full-gradient all-reduce, more) plus the continuous min-max of its
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
                 calib: Calibration | None = None,
                 wholes: Sequence[float] | None = None) -> list[range]:
    """Per replica, the shares a plan whose replicas all finish within ``budget`` could use.

    Dropped: shares whose replica at its compute floor needs ``budget`` or more, and shares so
    small that the others, each at most its largest share, cannot cover the batch. Provably
    safe (the floor is a lower bound on the replica's time). ``wholes``: the replicas' floors
    at the whole batch, when known (:func:`replica_floor` otherwise)."""
    batch, r = job.training.global_batch, len(part)
    if wholes is None:
        wholes = [replica_floor(job, g, batch, calib) for g in part]
    his = []
    for whole in wholes:  # the floor is linear in the share
        top = batch - (r - 1) * unit
        while top >= unit and top / batch * whole >= budget:
            top -= unit
        his.append(top)
    return [range(max(unit, batch - (sum(his) - hi)), hi + 1, unit) for hi in his]


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


def rebalanced_shares(times: Sequence[float], shares: Sequence[int], batch: int,
                      unit: int) -> tuple[int, ...]:
    """Shares in whole units that minimize the slowest replica if each replica's time grew in
    proportion to its share from ``times[r]`` at ``shares[r]`` (every time finite and
    positive): one unit each, then every further unit to the replica it leaves fastest, the
    first on ties (exact for linear times: no other shares have a faster slowest replica)."""
    per_unit = [t / s * unit for t, s in zip(times, shares)]
    units = [1] * len(shares)
    for _ in range(batch // unit - len(shares)):
        r = min(range(len(units)), key=lambda r: (units[r] + 1) * per_unit[r])
        units[r] += 1
    return tuple(k * unit for k in units)
