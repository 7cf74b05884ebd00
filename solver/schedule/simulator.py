"""Event-driven simulation of one training iteration's pipeline: GPipe, 1F1B, interleaved 1F1B.

The closed form of ``shared/design.md`` (eq. 5 with links as stages of their own) treats every
stage as an atomic ``τ = f + b`` per micro-batch. The simulator keeps forward and backward apart,
runs each stage's operations in its schedule's program order, and starts an operation as soon as
its inputs have arrived and its resources are free (list scheduling, driven by completion events).

Transfers. A boundary's link time ``c`` (``solver.planner.check.validate.link_model``) covers the activation
sent forward *and* its gradient sent back; both tensors have the same shape (``b·s·h`` bf16), so
each direction takes ``c / 2``. With :attr:`LinkDuplex.HALF` one channel carries both directions,
so the link is busy ``c`` per micro-batch exactly as eq. 5 assumes; :attr:`LinkDuplex.FULL` gives
each direction its own channel. :attr:`TransferMode.ASYNC` runs a send on the link while the
sender computes on (overlap, the seed note's double buffering); :attr:`TransferMode.BLOCKING`
holds the sender until its send is done.

Where the closed form is exact and where it is not:

* GPipe with asynchronous transfers is two flow shops of ``n`` identical jobs (all forwards, then
  all backwards), whose makespan is ``Σp + (n − 1)·max p`` each, so ``T = Σf + Σb + (n − 1)·(max f
  + max b)`` with every link a machine of ``c/2`` in both lists (the directions never contend:
  the phases do not overlap; ``solver.schedule.report.gpipe_time``). As ``max f + max b ≥
  max(f + b)``, GPipe ≥ eq. 5, with equality iff one stage (or link) holds both maxima, e.g.
  when every stage has the same forward:backward ratio and there are no links.
* 1F1B lets stage ``i`` hold only ``min(P − i, n)`` micro-batches (Narayanan et al., SC'21).
  With equal stages and no links that exactly covers the round trip and ``T = (n + P − 1)·τ``
  (eq. 5). With unequal stages the bottleneck may hide the others' fill and drain (shorter than
  eq. 5); with links the round trip grows by ``c`` per boundary but the in-flight limit does not,
  so the first stages stall (longer than eq. 5 and eq. 9; ``round_trip_estimate`` in
  ``solver.schedule.report`` corrects for it). ``tests/test_pipeline_sim.py`` pins both on
  hand-worked cases.
"""

from __future__ import annotations

import enum
import heapq
from dataclasses import dataclass
from typing import Hashable


class ScheduleKind(enum.Enum):
    """Pipeline schedule."""

    GPIPE = "gpipe"              #: all forwards, then all backwards
    ONE_F_ONE_B = "1f1b"         #: Megatron non-interleaved 1F1B: P − i − 1 warm-up forwards
    INTERLEAVED = "interleaved"  #: Megatron interleaved 1F1B with ``virtual_stages`` chunks


class TransferMode(enum.Enum):
    """How a boundary transfer relates to the sender's compute."""

    ASYNC = "async"        #: the link works while the sender computes (overlap)
    BLOCKING = "blocking"  #: the sender waits for its own send


class LinkDuplex(enum.Enum):
    """Channels per boundary."""

    HALF = "half"  #: one channel carries activations and gradients (busy c per micro-batch)
    FULL = "full"  #: one channel per direction (each busy c/2 per micro-batch)


class EventKind(enum.Enum):
    """What an event is."""

    FORWARD = "fwd"
    BACKWARD = "bwd"
    SEND_ACTIVATION = "send_fwd"
    SEND_GRADIENT = "send_bwd"

    @property
    def is_compute(self) -> bool:
        """Forward or backward pass (not a transfer)."""
        return self in (EventKind.FORWARD, EventKind.BACKWARD)


@dataclass(frozen=True)
class PipelineSpec:
    """A pipeline to simulate.

    Attributes
    ----------
    fwd_s, bwd_s : tuple[float, ...]
        Forward and backward seconds per micro-batch of each stage (whole stage, all chunks).
    links_s : tuple[float, ...]
        Round-trip transfer seconds per micro-batch of each boundary (``P − 1`` of them).
    n_micro : int
        Micro-batches per iteration.
    schedule : ScheduleKind
        Schedule.
    transfers : TransferMode
        Whether sends overlap the sender's compute.
    duplex : LinkDuplex
        Channels per boundary.
    virtual_stages : int
        Chunks per stage (interleaved only; each runs ``1/v`` of the stage's time).
    wrap_link_s : float
        Interleaved only: round trip between the last stage and the first (chunk hand-over).
    """

    fwd_s: tuple[float, ...]
    bwd_s: tuple[float, ...]
    links_s: tuple[float, ...]
    n_micro: int
    schedule: ScheduleKind = ScheduleKind.ONE_F_ONE_B
    transfers: TransferMode = TransferMode.ASYNC
    duplex: LinkDuplex = LinkDuplex.HALF
    virtual_stages: int = 1
    wrap_link_s: float = 0.0

    def __post_init__(self) -> None:
        p = len(self.fwd_s)
        if p < 1 or len(self.bwd_s) != p or len(self.links_s) != p - 1:
            raise ValueError("need P >= 1 forward and backward times and P - 1 links")
        if min(*self.fwd_s, *self.bwd_s, *self.links_s, self.wrap_link_s, 0.0) < 0:
            raise ValueError("times must be >= 0")
        if self.n_micro < 1:
            raise ValueError(f"n_micro must be >= 1, got {self.n_micro}")
        interleaved = self.schedule is ScheduleKind.INTERLEAVED
        if interleaved and (self.virtual_stages < 2 or self.n_micro % p):
            raise ValueError("interleaved 1F1B needs virtual_stages >= 2 and P | n_micro")
        if not interleaved and self.virtual_stages != 1:
            raise ValueError("virtual_stages > 1 needs the interleaved schedule")

    @property
    def stages(self) -> int:
        """Number of stages ``P``."""
        return len(self.fwd_s)

    @property
    def taus(self) -> list[float]:
        """``f + b`` per stage (the closed form's τ)."""
        return [f + b for f, b in zip(self.fwd_s, self.bwd_s)]


@dataclass(frozen=True)
class Event:
    """One operation as simulated.

    Attributes
    ----------
    stage : int
        Compute: the stage. Sends: the boundary ``k`` between stages ``k`` and ``k + 1``
        (``P − 1`` is the interleaved wrap-around from the last stage to the first).
    micro : int
        Micro-batch.
    kind : EventKind
        Forward, backward, activation send or gradient send.
    start, end : float
        Seconds from the start of the iteration.
    chunk : int
        Model chunk (interleaved; 0 otherwise).
    """

    stage: int
    micro: int
    kind: EventKind
    start: float
    end: float
    chunk: int = 0


@dataclass(frozen=True)
class SimResult:
    """Outcome of :func:`simulate`.

    Attributes
    ----------
    makespan_s : float
        End of the last operation.
    busy_s, idle_s : tuple[float, ...]
        Per stage: seconds occupied (compute and blocking sends) and not.
    compute_s : tuple[float, ...]
        Per stage: forward + backward seconds.
    link_busy_s : tuple[float, ...]
        Per boundary: seconds a transfer was running.
    peak_in_flight : tuple[int, ...]
        Per stage: most micro-batches whose forward started and backward had not ended (in
        chunks for the interleaved schedule, each ``1/v`` of a micro-batch's activations).
    events : tuple[Event, ...]
        Every operation, by start time.
    """

    makespan_s: float
    busy_s: tuple[float, ...]
    idle_s: tuple[float, ...]
    compute_s: tuple[float, ...]
    link_busy_s: tuple[float, ...]
    peak_in_flight: tuple[int, ...]
    events: tuple[Event, ...]

    @property
    def bubble_ratio(self) -> float:
        """Eq. (7) measured: ``1 − Σ compute / (P · makespan)``."""
        return 1.0 - sum(self.compute_s) / (len(self.compute_s) * self.makespan_s)


def program(spec: PipelineSpec, stage: int) -> list[tuple[EventKind, int, int]]:
    """Compute operations ``(kind, micro, chunk)`` of ``stage`` in its schedule's order."""
    p, n, v = spec.stages, spec.n_micro, spec.virtual_stages
    F, B = EventKind.FORWARD, EventKind.BACKWARD
    if spec.schedule is ScheduleKind.GPIPE:
        return [(F, m, 0) for m in range(n)] + [(B, m, 0) for m in range(n)]
    if spec.schedule is ScheduleKind.ONE_F_ONE_B:
        fwd = [(F, m, 0) for m in range(n)]
        bwd = [(B, m, 0) for m in range(n)]
        warm = min(p - stage - 1, n)
    else:
        # Megatron-LM's interleaved order: groups of P micro-batches per chunk, chunks ascending
        # forward and descending backward; 2 (P − i − 1) + (v − 1) P warm-up units.
        units = range(n * v)
        micro = [(k // (p * v)) * p + k % p for k in units]
        fwd = [(F, micro[k], (k // p) % v) for k in units]
        bwd = [(B, micro[k], v - 1 - (k // p) % v) for k in units]
        warm = min(2 * (p - stage - 1) + (v - 1) * p, n * v)
    steady = [op for pair in zip(fwd[warm:], bwd) for op in pair]
    return fwd[:warm] + steady + bwd[len(fwd) - warm:]


@dataclass(frozen=True)
class _Op:
    """One schedulable operation (internal)."""

    kind: EventKind
    stage: int
    micro: int
    chunk: int
    duration: float
    resources: tuple[Hashable, ...]
    deps: tuple[int, ...]
    owner: int | None   # the stage whose program order it follows (None: FIFO on its link)


def simulate(spec: PipelineSpec) -> SimResult:
    """Simulate one iteration of ``spec``."""
    ops, programs = _build(spec)
    times = _run(ops, programs)
    events = sorted((Event(o.stage, o.micro, o.kind, s, e, o.chunk) for o, (s, e) in
                     zip(ops, times)), key=lambda e: (e.start, e.kind.value, e.stage, e.micro))
    return _summarize(spec, ops, times, tuple(events))


def _boundary(spec: PipelineSpec, vstage: int) -> tuple[int, float]:
    """Boundary index and one-way seconds from virtual stage ``vstage`` to ``vstage + 1``."""
    p = spec.stages
    k = vstage % p
    c = spec.wrap_link_s if k == p - 1 else spec.links_s[k]
    return k, c / 2


def _build(spec: PipelineSpec) -> tuple[list[_Op], dict[int, list[int]]]:
    """Operations with dependencies, and each stage's program as operation ids."""
    last = spec.stages * spec.virtual_stages - 1
    keys = [(kind, s, m) for kind in (EventKind.FORWARD, EventKind.BACKWARD)
            for s in range(last + 1) for m in range(spec.n_micro)]
    keys += [(kind, s, m) for kind in (EventKind.SEND_ACTIVATION, EventKind.SEND_GRADIENT)
             for s in range(last) if _boundary(spec, s)[1] > 0 for m in range(spec.n_micro)]
    ids = {key: j for j, key in enumerate(keys)}
    return [_make_op(spec, key, ids) for key in keys], _programs(spec, ids)


def _make_op(spec: PipelineSpec, key: tuple, ids: dict[tuple, int]) -> _Op:
    """The operation ``(kind, virtual stage, micro)`` with its resources and inputs."""
    kind, s, m = key
    p, last = spec.stages, spec.stages * spec.virtual_stages - 1
    dev, chunk, v = s % p, s // p, spec.virtual_stages
    F, B, SA, SG = (EventKind.FORWARD, EventKind.BACKWARD, EventKind.SEND_ACTIVATION,
                    EventKind.SEND_GRADIENT)
    if kind.is_compute:
        if kind is F:
            prev = ids.get((SA, s - 1, m), ids.get((F, s - 1, m)))
            deps = () if s == 0 else (prev,)
        else:
            nxt = ids.get((SG, s, m), ids.get((B, s + 1, m)))
            deps = (ids[(F, s, m)],) + (() if s == last else (nxt,))
        times = spec.fwd_s if kind is F else spec.bwd_s
        return _Op(kind, dev, m, chunk, times[dev] / v, (("stage", dev),), deps, dev)
    k, dt = _boundary(spec, s)
    sender = dev if kind is SA else (s + 1) % p
    channel = 1 if kind is SG and spec.duplex is LinkDuplex.FULL else 0
    res: tuple[Hashable, ...] = (("link", k, channel),)
    owner = None
    if spec.transfers is TransferMode.BLOCKING:
        res, owner = res + (("stage", sender),), sender
    src = ids[(F, s, m)] if kind is SA else ids[(B, s + 1, m)]
    return _Op(kind, k, m, chunk if kind is SA else (s + 1) // p, dt, res, (src,), owner)


def _programs(spec: PipelineSpec, ids: dict[tuple, int]) -> dict[int, list[int]]:
    """Operation ids each stage runs, in order (blocking sends right after their compute)."""
    p = spec.stages
    out: dict[int, list[int]] = {}
    for dev in range(p):
        seq = []
        for kind, m, chunk in program(spec, dev):
            s = chunk * p + dev
            seq.append(ids[(kind, s, m)])
            send = (EventKind.SEND_ACTIVATION, s, m) if kind is EventKind.FORWARD else \
                (EventKind.SEND_GRADIENT, s - 1, m)
            if spec.transfers is TransferMode.BLOCKING and send in ids:
                seq.append(ids[send])
        out[dev] = seq
    return out


def _run(ops: list[_Op], programs: dict[int, list[int]]) -> list[tuple[float, float]]:
    """List scheduling driven by completion events; returns (start, end) per operation."""
    waiting = [len(o.deps) for o in ops]
    dependents: list[list[int]] = [[] for _ in ops]
    for j, o in enumerate(ops):
        for d in o.deps:
            dependents[d].append(j)
    run = _Scheduler(ops, programs)
    run.release([j for j, w in enumerate(waiting) if w == 0], 0.0)
    done = 0
    while run.start_all():
        for j in run.finish_next():
            done += 1
            for d in dependents[j]:
                waiting[d] -= 1
            run.release([d for d in dependents[j] if waiting[d] == 0], run.now)
    if done != len(ops):
        raise RuntimeError(f"schedule deadlocked after {done} of {len(ops)} operations")
    return run.times


class _Scheduler:
    """Mutable state of one simulation (internal): a stage starts the next operation of its
    program once its inputs are in; a link serves ready asynchronous sends first come, first
    served (ties: creation order)."""

    def __init__(self, ops: list[_Op], programs: dict[int, list[int]]) -> None:
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


def _summarize(spec: PipelineSpec, ops: list[_Op], times: list[tuple[float, float]],
               events: tuple[Event, ...]) -> SimResult:
    """Busy, idle, link and in-flight figures of a finished simulation."""
    p = spec.stages
    makespan = max((e for _, e in times), default=0.0)
    busy, compute, links = [0.0] * p, [0.0] * p, [0.0] * p
    for o, (s, e) in zip(ops, times):
        if o.kind.is_compute:
            compute[o.stage] += e - s
        else:
            links[o.stage] += e - s
        if o.owner is not None:
            busy[o.owner] += e - s
    return SimResult(makespan, tuple(busy), tuple(makespan - b for b in busy), tuple(compute),
                     tuple(links[:p - 1] if spec.virtual_stages == 1 else links),
                     tuple(_peak(events, dev) for dev in range(p)), events)


def _peak(events: tuple[Event, ...], stage: int) -> int:
    """Most activations held by ``stage``: +1 at a forward's start, −1 at a backward's end."""
    marks = [(e.start, 1) if e.kind is EventKind.FORWARD else (e.end, -1)
             for e in events if e.stage == stage and e.kind.is_compute]
    held = peak = 0
    for _, delta in sorted(marks):   # at equal times, releases (−1) sort first
        held += delta
        peak = max(peak, held)
    return peak
