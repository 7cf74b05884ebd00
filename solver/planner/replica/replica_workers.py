"""Planning the replicas of the replica search: in this process or in long-lived workers, and
the memo of their plans by (islands, share) with its budget semantics (:class:`ReplicaMemo`).

A replica (a set of islands and a batch share) is planned as a job of its own
(:func:`plan_share`). The search plans hundreds of them on one cluster, and an island at a
share is planned again for every island set it belongs to; so every planner here keeps one
:class:`~solver.planner.stages.memo.MemoParallelizer` for all its replicas. Workers are
processes that live as long as the search, each with its own memo in its own loop
(:func:`_serve`); a share goes to its own worker (share units ``mod`` workers) unless that
one is busy and another idles, so the island sets planned at one share mostly meet the same
memo. The plans are the same with any number of workers.
"""

from __future__ import annotations

import math
import multiprocessing
from dataclasses import replace
from multiprocessing.connection import Connection, wait
from typing import Sequence

from solver.cost.parallelizer import AnalyticParallelizer, Parallelizer, kernel_calibration
from solver.islands import IslandSet
from solver.planner.plan import Plan
from solver.planner.stages.memo import MemoParallelizer
from solver.planner.replica.replica_bounds import replica_floor
from solver.planner.replica.replica_plan import replica_job
from solver.planner.replica.replica_runtime import shard_layout
from solver.planner.stages.runs import PlannerConfig, cluster_islands
from solver.planner.stages.search import plan_job
from solver.spec.domain import Island, JobSpec
from solver.spec.errors import InfeasibleError

__all__ = ["Ask", "Planned", "plan_share", "ReplicaPlanner", "ReplicaMemo"]

Ask = tuple[tuple[str, ...], int, float]  # (island names, share, budget)
Planned = tuple[Plan | None, int]  # the plan (None: none faster), parallelizer calls spent
_FAILED = "failed"  # what a worker sends back for an ask whose planning raised


def plan_share(job: JobSpec, config: PlannerConfig, ask: Ask, islands: IslandSet,
               parallelizer: Parallelizer) -> Planned:
    """The replica's exact plan if one is faster than the ask's budget, else None, with the
    parallelizer calls it took (``islands``: the cluster's, built once for every replica).
    Not validated here: most are never kept, and the search validates those it keeps
    (:func:`~solver.planner.replica.replica_plan.validate_replicated`)."""
    names, share, budget = ask
    try:
        plan = plan_job(replica_job(job, names, share), config, parallelizer=parallelizer,
                        upper=budget, islands=islands, check=False)
    except InfeasibleError as none:
        return None, none.calls
    return plan, plan.solver.parallelizer_calls


def _memo(job: JobSpec, config: PlannerConfig) -> MemoParallelizer:
    return MemoParallelizer(AnalyticParallelizer(config.features or job.planner.features))


def _serve(conn: Connection, job: JobSpec, config: PlannerConfig, islands: IslandSet) -> None:
    """A worker's loop: plan each ask received, send the plan back; stop on None."""
    par = _memo(job, config)
    while (ask := conn.recv()) is not None:
        try:
            conn.send(plan_share(job, config, ask, islands, par))
        except Exception:  # noqa: BLE001 - the searching process plans it again, and raises
            conn.send(_FAILED)
    conn.close()


class ReplicaPlanner:
    """Plans asks in this process (``workers <= 1`` or a given parallelizer) or in workers.

    Use as a context manager: the workers are started on entry and stopped on exit.
    """

    def __init__(self, job: JobSpec, config: PlannerConfig, unit: int, workers: int = 1,
                 parallelizer: Parallelizer | None = None):
        self.job, self.islands, self.unit = job, cluster_islands(job), unit
        self.config = replace(config, workers=1)  # the processes here are the search's own
        self.par = parallelizer or _memo(job, self.config)
        self.workers = workers if parallelizer is None and workers > 1 else 1
        self._conns: list[Connection] = []
        self._procs: list = []
        self._flying: dict[Connection, Ask] = {}  # what each busy worker plans (send/receive)

    def __enter__(self) -> "ReplicaPlanner":
        for _ in range(self.workers if self.workers > 1 else 0):
            mine, theirs = multiprocessing.Pipe()
            proc = multiprocessing.Process(target=_serve, daemon=True,
                                           args=(theirs, self.job, self.config, self.islands))
            proc.start()
            theirs.close()
            self._conns.append(mine)
            self._procs.append(proc)
        return self

    def __exit__(self, *exc) -> None:
        for conn, proc in zip(self._conns, self._procs):
            if conn in self._flying:  # still planning an ask no one waits for (a deadline)
                proc.terminate()
        for conn in self._conns:
            try:
                conn.send(None)
            except OSError:  # the worker is gone already
                pass
            conn.close()
        for proc in self._procs:
            proc.join()

    def plan(self, asks: Sequence[Ask]) -> list[Planned]:
        """The plan of every ask (None: none faster than its budget) and its calls, in order.

        The first waiting ask whose own worker idles goes first, else the first waiting ask:
        the memo is reused where it can be, and no worker idles while asks wait. Not for use
        while asks given by :meth:`send` are out (their plans would come back here)."""
        assert not self._flying, "plan() while asks sent by send() are out"
        if not self._conns:
            return [plan_share(self.job, self.config, a, self.islands, self.par) for a in asks]
        waiting, got = list(dict.fromkeys(asks)), {}
        while waiting or self._flying:
            while waiting and self.idle():
                own = [a for a in waiting if self._home(a) not in self._flying]
                waiting.remove(first := (own or waiting)[0])
                self.send(first)
            got.update(self.receive())
        return [got[a] for a in asks]

    def idle(self) -> int:
        """Workers with nothing to plan (for :meth:`send`)."""
        return len(self._conns) - len(self._flying)

    def flying(self) -> dict[tuple[tuple[str, ...], int], float]:
        """The asks being planned, by (island names, share), with their budgets."""
        return {(a[0], a[1]): a[2] for a in self._flying.values()}

    def home_idle(self, ask: Ask) -> bool:
        """Whether the ask's own worker (:meth:`send`) idles."""
        return self._home(ask) not in self._flying

    def send(self, ask: Ask) -> None:
        """Give the ask to its own worker when that one idles, else to an idle one."""
        idle = [c for c in self._conns if c not in self._flying]
        conn = self._home(ask) if self._home(ask) in idle else idle[0]
        conn.send(ask)
        self._flying[conn] = ask

    def receive(self) -> list[tuple[Ask, Planned]]:
        """The asks sent whose plans are back (waiting for one at least; none if none is
        out); an ask whose planning raised in its worker is planned here, to raise."""
        out = [(self._flying.pop(c), c.recv()) for c in (wait(list(self._flying))
                                                        if self._flying else [])]
        if any(isinstance(got, str) for _, got in out):  # first the others, so none is left
            out += [(self._flying.pop(c), c.recv()) for c in list(self._flying)]
        return [(a, plan_share(self.job, self.config, a, self.islands, self.par)
                 if isinstance(got, str) else got) for a, got in out]

    def _home(self, ask: Ask) -> Connection:
        """The worker whose memo has the ask's share (share units ``mod`` workers)."""
        return self._conns[ask[1] // self.unit % len(self._conns)]

    @property
    def parallel(self) -> int:
        """Asks worth sending at once (the workers; one in this process)."""
        return max(1, len(self._conns))


class ReplicaMemo:
    """Replica plans by (islands, share), each planned once, by ``planner``.

    A replica is planned only for plans faster than the budget it is asked about; "none as
    fast" is remembered with its budget and answers every later ask at that budget or below;
    a larger budget plans again (the search asks at the largest budget any partition can
    still use, so it does not happen there). ``calib``: its parallelizer's kernel
    calibration, for the floors (:func:`~solver.cost.parallelizer.kernel_calibration`)."""

    def __init__(self, job: JobSpec, planner: ReplicaPlanner):
        self.job, self.planner = job, planner
        self.calib = kernel_calibration(planner.par)  # the floors' kernel rates, read once
        self.plans: dict[tuple[tuple[str, ...], int], Plan | float] = {}
        self._floors: dict[tuple[str, ...], float] = {}  # whole-batch floors by island names
        self._names: dict[int, tuple[Sequence[Island], tuple[str, ...]]] = {}
        self.calls = 0

    def _key(self, group: Sequence[Island], share: int) -> tuple[tuple[str, ...], int]:
        """Memo key of a replica: its islands' names and its share. The names are kept per
        group object (the search asks about the same groups hundreds of thousands of times);
        the group is kept with them, so its id is not reused."""
        got = self._names.get(id(group))
        if got is None:
            got = self._names[id(group)] = (group, tuple(i.name for i in group))
        return got[1], share

    def _known(self, key: tuple[tuple[str, ...], int], budget: float) -> bool:
        got = self.plans.get(key)
        return isinstance(got, Plan) or (got is not None and budget <= got)

    def answers(self, group: Sequence[Island], share: int, budget: float) -> bool:
        """Whether :meth:`time` answers the replica at ``budget`` without planning."""
        return self._known(self._key(group, share), budget)

    def known(self, ask: Ask) -> bool:
        """Whether :meth:`time` answers the ask (island names, share, budget) without planning."""
        return self._known((ask[0], ask[1]), ask[2])

    def _store(self, key: tuple[tuple[str, ...], int], planned: Planned, budget: float) -> None:
        plan, calls = planned
        self.calls += calls  # a search that found nothing faster costs calls as well
        self.plans[key] = budget if plan is None else plan

    def store(self, ask: Ask, planned: Planned) -> None:
        """Remember what planning the ask (island names, share, budget) gave."""
        self._store((ask[0], ask[1]), planned, ask[2])

    def unknown(self, asks: Sequence[tuple[Sequence[Island], int, float]]
                ) -> dict[tuple[tuple[str, ...], int], float]:
        """The asks :meth:`time` cannot answer yet, by key, each at its largest budget (which
        answers the others)."""
        todo: dict[tuple[tuple[str, ...], int], float] = {}
        for g, b, u in asks:
            key = self._key(g, b)
            todo[key] = max(u, todo.get(key, u))
        return {k: u for k, u in todo.items() if not self._known(k, u)}

    def prefetch(self, asks: Sequence[tuple[tuple[Island, ...], int, float]]) -> None:
        """Plan the asks :meth:`time` cannot answer yet, side by side (a no-op in this
        process)."""
        todo = self.unknown(asks)
        if self.planner.parallel < 2 or len(todo) < 2:
            return
        for (k, u), plan in zip(todo.items(), self.planner.plan([(k[0], k[1], u)
                                                                 for k, u in todo.items()])):
            self._store(k, plan, u)

    def time(self, group: tuple[Island, ...], share: int, budget: float = math.inf) -> float:
        """The replica's iteration time, or ``inf`` when no plan is faster than ``budget``."""
        key = self._key(group, share)
        if not self._known(key, budget):
            self._store(key, self.planner.plan([(key[0], share, budget)])[0], budget)
        got = self.plans[key]
        return got.iteration_time_s if isinstance(got, Plan) else math.inf

    def whole_floor(self, group: Sequence[Island]) -> float:
        """:func:`~solver.planner.replica.replica_bounds.replica_floor` of ``group`` at the whole batch
        (linear in the share), computed once per group: every partition reads it."""
        key = self._key(group, 0)[0]
        if key not in self._floors:
            self._floors[key] = replica_floor(self.job, group, self.job.training.global_batch,
                                              self.calib)
        return self._floors[key]

    def layout(self, group: Sequence[Island], share: int) -> tuple | None:
        """The shard layout of the replica's plan found by :meth:`time` (None: no plan)."""
        got = self.plans.get(self._key(group, share))
        return shard_layout(got) if isinstance(got, Plan) else None

    def plan(self, group: tuple[Island, ...], share: int) -> Plan:
        """The plan found by :meth:`time` for shares that won."""
        got = self.plans[self._key(group, share)]
        assert isinstance(got, Plan)
        return got
