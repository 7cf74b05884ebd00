"""The exact pass of the replica search: each partition's best shares, partitions in bound order.

One partition's search (:func:`partition_search`) is a generator of the replica plans it needs
next, so a driver decides where they are planned. In this process the partitions are searched
one at a time and every replica is planned when it is read (:func:`solve_partition`). With
worker processes (:class:`ParallelPass`) the workers are kept busy: each takes the waiting ask
of the lowest-bound partition, a partition resumes as soon as the plans it reads are in, and a
further partition is started whenever a worker would otherwise idle. Results are committed in
bound order, so the incumbent moves as in the one-at-a-time search; a partition started before
an earlier one improved the incumbent searches a wider window against a larger budget, which
finds the same best value (exact either way).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Generator, Sequence

from solver.planner.replica.replica_bounds import Partition, share_window
from solver.planner.replica.replica_plan import Replica, allreduce_s, exchange_s
from solver.planner.replica.replica_workers import Ask, ReplicaMemo
from solver.spec.domain import Island

__all__ = ["SearchState", "best_shares", "priced_shares", "partition_search", "solve_partition",
           "exact_pass"]

Asks = list[tuple[tuple[Island, ...], int, float]]  # (islands, share, budget) to plan
Found = tuple[float, tuple[int, ...]] | None  # a partition's best value (all-reduce in), shares
Search = Generator[Asks, None, Found]  # yields the asks it reads next
# Partitions searched side by side per worker at most: a window walk has one new ask at a
# time, most of them shared with other partitions, so it takes several to keep one busy.
PARTITIONS_PER_WORKER = 8


@dataclass
class SearchState:
    """The incumbent and the proof bookkeeping of one search."""

    value: float
    least_allreduce: float = 0.0
    choice: tuple[Partition, tuple[int, ...]] | None = None
    settled: int = 0
    open_bound: float = math.inf
    total: int = 0

    def improve(self, part: Partition, found: Found) -> None:
        """Take ``part``'s best shares if they beat the incumbent (ties keep it)."""
        if found is not None and found[0] < self.value * (1 - 1e-12):
            self.value, self.choice = found[0], (part, found[1])


def best_shares(times: Sequence[dict[int, float]], batch: int, unit: int
                ) -> tuple[float, tuple[int, ...]] | None:
    """``min max_r times[r][b_r]`` over shares summing to ``batch`` (each a key of
    ``times[r]``), exactly, by a dynamic program over replicas; None when no shares fit. Ties
    go to the smallest shares first, whatever order the times were planned in."""
    best: dict[int, tuple[float, tuple[int, ...]]] = {0: (0.0, ())}
    for table in times:
        nxt: dict[int, tuple[float, tuple[int, ...]]] = {}
        for used, (worst, shares) in best.items():
            for b, t in sorted(table.items()):
                s = used + b
                if s > batch or not math.isfinite(t):
                    continue
                cand = (max(worst, t), shares + (b,))
                if s not in nxt or cand[0] < nxt[s][0]:
                    nxt[s] = cand
        best = nxt
    return best.get(batch)


def partition_search(reps: ReplicaMemo, part: Partition, unit: int, st: SearchState) -> Search:
    """The exact search of ``part``'s shares against the incumbent of ``st``.

    It yields the asks it reads next, and reads them through :meth:`ReplicaMemo.time` once
    resumed; it returns the best value and shares, None when no shares beat the incumbent.
    Each replica's window (:func:`share_window`) is first shrunk from the top
    (:func:`_shrink_tops`): a largest share whose plan is not faster than the incumbent is of
    no use, which raises the smallest share the other replicas may take. Then every share left
    is planned and the shares are chosen exactly (:func:`priced_shares`). The windows allow
    for the partition's shard-wise ring, the least exchange its replicas can pay. The
    incumbent is read again at every step: searched side by side, an earlier partition may
    lower it meanwhile (only plans beating it can matter, so a lower one only cuts more)."""
    job, batch = reps.job, reps.job.training.global_batch
    extra = allreduce_s(job, part)
    wholes = [reps.whole_floor(g) for g in part]
    windows = share_window(job, part, unit, st.value - extra, wholes=wholes)
    if any(len(w) == 0 for w in windows):
        return None  # some replica has no share a better plan could use
    his, times = [w[-1] for w in windows], [dict() for _ in part]
    if (yield from _shrink_tops(reps, part, unit, (st, extra), (his, times, wholes))):
        return None
    asks = [(g, b) for r, g in enumerate(part)
            for b in range(max(unit, batch - (sum(his) - his[r])), his[r] + 1, unit)
            if b not in times[r]]
    for k in range(0, len(asks), 4):
        ask = _ask(st)
        yield [(g, b, ask) for g, b in asks[k:k + 4]]
        for g, b in asks[k:k + 4]:
            times[part.index(g)][b] = reps.time(g, b, ask)
    return priced_shares(reps, part, unit, times, extra)


def priced_shares(reps: ReplicaMemo, part: Partition, unit: int,
                  times: Sequence[dict[int, float]], ring: float) -> Found:
    """The best shares of ``part`` over the planned ``times``, the exchange priced on the
    replicas' plans (:func:`~solver.planner.replica.replica_plan.exchange_s`; ``ring``: the
    partition's shard-wise ring, the least it can be).

    Exact over the table: the min-max shares either have plans of one shard layout (then the
    ring, the least exchange, makes them the best), or pay the full-gradient all-reduce;
    then the only shares that can beat them are those whose plans share one shard layout,
    each layout searched on its own entries at the ring's price."""
    job, batch = reps.job, reps.job.training.global_batch
    found = best_shares(times, batch, unit)
    if found is None:
        return None
    plans = [Replica(g, b, reps.plan(g, b)) for g, b in zip(part, found[1])]
    best = (found[0] + exchange_s(job, plans), found[1])
    if len({reps.layout(g, b) for g, b in zip(part, found[1])}) == 1:
        return best
    layouts = [{b: reps.layout(g, b) for b, t in table.items() if math.isfinite(t)}
               for g, table in zip(part, times)]
    for sig in set.intersection(*(set(x.values()) for x in layouts)):
        same = best_shares([{b: t for b, t in table.items() if lay.get(b) == sig}
                            for table, lay in zip(times, layouts)], batch, unit)
        if same is not None and same[0] + ring < best[0]:
            best = (same[0] + ring, same[1])
    return best


def _ask(st: SearchState) -> float:
    """The budget replicas are planned at: the largest any partition can still use (the
    incumbent less the smallest all-reduce), so each (islands, share) is planned once."""
    return st.value - st.least_allreduce


def _shrink_tops(reps: ReplicaMemo, part: Partition, unit: int,
                 incumbent: tuple[SearchState, float],
                 state: tuple[list[int], list[dict[int, float]], list[float]]
                 ) -> Generator[Asks, None, bool]:
    """Walk every window's top (``his``, planned times in ``times``; ``whole``: the replicas'
    floors at the whole batch, linear in the share) down until each top
    beats the incumbent less the partition's all-reduce. Returns True when no shares of the
    partition beat the incumbent (settled), False when the tops hold.

    One top is planned at a time: one the memo already answers first, else the one whose
    floor is nearest the budget (the likeliest to fail; ties to the first replica). Only the
    order of the plans depends on it, not the result."""
    (st, extra), (his, times, whole), batch = incumbent, state, reps.job.training.global_batch
    while True:
        for r in range(len(part)):  # tops no faster than the budget are of no use
            while his[r] >= unit and (times[r].get(his[r], 0.0) >= st.value - extra or
                                      his[r] / batch * whole[r] >= st.value - extra):
                his[r] -= unit
        if any(his[r] < max(unit, batch - (sum(his) - his[r])) for r in range(len(part))):
            return True
        walking = [r for r in range(len(part)) if his[r] not in times[r]]
        if not walking:
            return False
        # A top that fails is cheap (the floor table settles it) and may settle the
        # partition; one that holds is dear (an exact plan) and never settles it.
        ask = _ask(st)
        r = min(walking, key=lambda r: (not reps.answers(part[r], his[r], ask),
                                        -his[r] * whole[r]))
        yield [(part[r], his[r], ask)]
        times[r][his[r]] = reps.time(part[r], his[r], ask)


def solve_partition(reps: ReplicaMemo, part: Partition, unit: int, st: SearchState,
                    deadline: float) -> bool:
    """Improve ``st`` with the best shares of ``part``, its asks planned a batch at a time
    (:meth:`ReplicaMemo.prefetch`); False when the deadline stopped it."""
    search = partition_search(reps, part, unit, st)
    try:
        while True:
            read = next(search)
            if time.perf_counter() > deadline:
                search.close()
                return False
            reps.prefetch(read)
    except StopIteration as end:
        st.improve(part, end.value)
    return True


def exact_pass(reps: ReplicaMemo, ranked: Sequence[tuple[float, Partition]], unit: int,
               st: SearchState, deadline: float) -> None:
    """Search the partitions in bound order until a bound reaches the incumbent: one at a
    time in this process, side by side with workers (:class:`ParallelPass`). At the deadline,
    ``st.open_bound`` is the lowest bound of a partition not settled."""
    if reps.planner.parallel > 1:
        ParallelPass(reps, ranked, unit, st).run(deadline)
        return
    for k, (bound, part) in enumerate(ranked):
        if bound >= st.value:
            break  # every later bound is at least this one
        if not solve_partition(reps, part, unit, st, deadline):
            st.open_bound = bound
            return
        st.settled = k + 1
    st.settled = len(ranked)


class ParallelPass:
    """The exact pass with the planner's workers kept busy (module docstring)."""

    def __init__(self, reps: ReplicaMemo, ranked: Sequence[tuple[float, Partition]],
                 unit: int, st: SearchState):
        self.reps, self.ranked, self.unit, self.st = reps, ranked, unit, st
        self.active: dict[int, tuple[Search, Asks]] = {}  # partition -> its search, its reads
        self.done: dict[int, Found] = {}
        self.waiting: list[tuple[int, Ask]] = []  # (partition, ask)
        self.next = 0

    def run(self, deadline: float) -> None:
        """Search until every partition is settled or the deadline passes."""
        planner, st = self.reps.planner, self.st
        while True:
            self._start()
            if not self.active:
                st.settled = len(self.ranked)  # searched, or cut: every later bound is higher
                return
            if time.perf_counter() > deadline:
                st.open_bound = self.ranked[min(self.active)][0]
                for k in sorted(self.done):  # plans finished after an open one still count
                    st.improve(self.ranked[k][1], self.done.pop(k))
                return
            self._dispatch()
            for ask, planned in planner.receive():
                self.reps.store(ask, planned)
            for k in sorted(self.active):
                self._resume(k)

    def _start(self) -> None:
        """Start partitions in bound order while a worker would idle (one at least), up to
        :data:`PARTITIONS_PER_WORKER` per worker; cut those the incumbent has passed."""
        reps, st, ranked = self.reps, self.st, self.ranked
        while self._startable() and (not self.active
                                     or reps.planner.idle() > len(self.waiting)):
            k, self.next = self.next, self.next + 1
            self.active[k] = (partition_search(reps, ranked[k][1], self.unit, st), [])
            self._resume(k, started=True)
        for k in [k for k in self.active if ranked[k][0] >= st.value]:
            self.active.pop(k)[0].close()  # the incumbent moved past its bound: settled
            self.done[k] = None
        self._commit()

    def _resume(self, k: int, started: bool = False) -> None:
        """Run partition ``k``'s search while the plans it reads are in; queue what it needs
        (again, where a plan came back for a smaller budget than it reads at)."""
        search, reads = self.active[k]
        while started or not self.reps.unknown(reads):
            started = False
            try:
                reads = next(search)
            except StopIteration as end:
                self.active.pop(k)
                self.done[k] = end.value
                self._commit()
                return
        self.active[k] = (search, reads)
        self._queue(k, reads)

    def _startable(self) -> bool:
        """Whether a further partition may start: one is left below the incumbent, and fewer
        than :data:`PARTITIONS_PER_WORKER` per worker are active."""
        return (self.next < len(self.ranked) and self.ranked[self.next][0] < self.st.value
                and len(self.active) < PARTITIONS_PER_WORKER * self.reps.planner.parallel)

    def _queue(self, k: int, asks: Asks) -> None:
        """Queue partition ``k``'s asks not known, planned nor queued yet."""
        pending = {a[:2]: a[2] for _, a in self.waiting}
        pending.update(self.reps.planner.flying())
        for key, budget in self.reps.unknown(asks).items():
            if pending.get(key, -math.inf) < budget:
                self.waiting.append((k, (key[0], key[1], budget)))
                pending[key] = budget

    def _dispatch(self) -> None:
        """Give every idle worker the waiting ask of the lowest-bound partition still unknown."""
        planner = self.reps.planner
        self.waiting.sort(key=lambda w: w[0])
        while self.waiting and planner.idle():
            # An ask goes to its own worker, whose memo has its share, where one idles.
            got = next((w for w in self.waiting if planner.home_idle(w[1])), self.waiting[0])
            self.waiting.remove(got)
            if not self.reps.known(got[1]):
                planner.send(got[1])

    def _commit(self) -> None:
        """Take finished results into the incumbent in bound order, as far as every earlier
        partition has finished (``st.settled`` counts them)."""
        st = self.st
        while st.settled in self.done:
            st.improve(self.ranked[st.settled][1], self.done.pop(st.settled))
            st.settled += 1
