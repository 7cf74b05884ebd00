"""List scheduling driven by completion events: the engine under the pipeline simulator.

Each operation needs resources (a stage, a link channel) and inputs (other operations). An
operation with an owner runs in its owner's program order, as soon as its inputs are in and
its resources are free; one without (an asynchronous send) waits in its link's queue, first
come, first served (ties: creation order). :mod:`solver.schedule.simulator` builds the
operations and programs of a pipeline schedule and runs them here.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Hashable

__all__ = ["Op", "run"]


@dataclass(frozen=True)
class Op:
    """One schedulable operation."""

    kind: Hashable  # what the simulator reports it as (its EventKind)
    stage: int
    micro: int
    chunk: int
    duration: float
    resources: tuple[Hashable, ...]
    deps: tuple[int, ...]
    owner: int | None   # the stage whose program order it follows (None: FIFO on its link)


def run(ops: list[Op], programs: dict[int, list[int]]) -> list[tuple[float, float]]:
    """List scheduling driven by completion events; returns (start, end) per operation."""
    waiting = [len(o.deps) for o in ops]
    dependents: list[list[int]] = [[] for _ in ops]
    for j, o in enumerate(ops):
        for d in o.deps:
            dependents[d].append(j)
    sched = _Scheduler(ops, programs)
    sched.release([j for j, w in enumerate(waiting) if w == 0], 0.0)
    done = 0
    while sched.start_all():
        for j in sched.finish_next():
            done += 1
            for d in dependents[j]:
                waiting[d] -= 1
            sched.release([d for d in dependents[j] if waiting[d] == 0], sched.now)
    if done != len(ops):
        raise RuntimeError(f"schedule deadlocked after {done} of {len(ops)} operations")
    return sched.times


class _Scheduler:
    """Mutable state of one simulation (internal): a stage starts the next operation of its
    program once its inputs are in; a link serves ready asynchronous sends first come, first
    served (ties: creation order)."""

    def __init__(self, ops: list[Op], programs: dict[int, list[int]]) -> None:
        self.ops, self.programs = ops, programs
        self.head = dict.fromkeys(programs, 0)
        self.ready: dict[int, float] = {}           # owned operations whose inputs are in
        self.queues: dict[Hashable, list] = {}      # per link channel: (ready time, id) heap
        self.busy: set[Hashable] = set()
        self.times: list[tuple[float, float]] = [(0.0, 0.0)] * len(ops)
        self.running: list[tuple[float, int]] = []  # (end, id) heap
        self.now = 0.0

    def release(self, ids: list[int], t: float) -> None:
        """Operations whose inputs are all in at ``t``."""
        for j in ids:
            if self.ops[j].owner is None:
                heapq.heappush(self.queues.setdefault(self.ops[j].resources[0], []), (t, j))
            else:
                self.ready[j] = t

    def start_all(self) -> bool:
        """Start what can start now, earliest ready first; False when nothing is running."""
        cands = [(self.ready[prog[i]], prog[i]) for dev, prog in self.programs.items()
                 if (i := self.head[dev]) < len(prog) and prog[i] in self.ready]
        cands += [q[0] for q in self.queues.values() if q]
        for _, j in sorted(cands):
            o = self.ops[j]
            if not self.busy.isdisjoint(o.resources):
                continue
            self.busy.update(o.resources)
            if o.owner is None:
                heapq.heappop(self.queues[o.resources[0]])
            else:
                self.head[o.owner] += 1
                del self.ready[j]
            self.times[j] = (self.now, self.now + o.duration)
            heapq.heappush(self.running, (self.now + o.duration, j))
        return bool(self.running)

    def finish_next(self) -> list[int]:
        """Advance to the next completion time; the operations ending then, resources freed."""
        self.now = self.running[0][0]
        out = []
        while self.running and self.running[0][0] == self.now:
            j = heapq.heappop(self.running)[1]
            self.busy.difference_update(self.ops[j].resources)
            out.append(j)
        return out


