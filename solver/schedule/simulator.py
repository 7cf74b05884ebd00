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
from dataclasses import dataclass, replace
from typing import Hashable

from solver.schedule.list_schedule import Op as _Op
from solver.schedule.list_schedule import run as _run


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
    overlap_hidden_s : tuple[float, ...]
        Megatron-Core's MoE all-to-all overlap (empty: off): per stage, the seconds per
        micro-batch it hides. Every stage runs one more warm-up forward, and each steady-state
        forward runs with its backward as one step of ``f + b - hidden`` (per chunk), which
        starts once both have their inputs and hands both outputs on at its end
        (``combined_1f1b_schedule_for_interleaved_pipelining`` / ``..._for_no_pipelining``,
        ``megatron/core/pipeline_parallel/combined_1f1b.py``). With pipeline stages it needs
        the interleaved schedule, as Megatron-Core does.
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
    overlap_hidden_s: tuple[float, ...] = ()

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
        if self.overlap_hidden_s and (len(self.overlap_hidden_s) != p or (
                p > 1 and not interleaved) or self.schedule is ScheduleKind.GPIPE):
            raise ValueError("the all-to-all overlap needs one hidden time per stage and, with "
                             "several stages, the interleaved schedule")

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
    warm, steady, cool = _phases(spec, stage)
    return warm + [op for pair in steady for op in pair] + cool


def _phases(spec: PipelineSpec, stage: int) -> tuple[list, list, list]:
    """Warm-up forwards, steady (forward, backward) pairs and cool-down backwards of
    ``stage`` (the overlap adds a warm-up forward, Megatron-Core's ``get_pp_rank_microbatches``
    with ``overlap_moe_expert_parallel_comm``)."""
    p, n, v = spec.stages, spec.n_micro, spec.virtual_stages
    more = 1 if spec.overlap_hidden_s else 0
    F, B = EventKind.FORWARD, EventKind.BACKWARD
    if spec.schedule is ScheduleKind.GPIPE:
        return [(F, m, 0) for m in range(n)], [], [(B, m, 0) for m in range(n)]
    if spec.schedule is ScheduleKind.ONE_F_ONE_B:
        fwd = [(F, m, 0) for m in range(n)]
        bwd = [(B, m, 0) for m in range(n)]
        warm = min(p - stage - 1 + more, n)
    else:
        # Megatron-LM's interleaved order: groups of P micro-batches per chunk, chunks ascending
        # forward and descending backward; 2 (P − i − 1) + (v − 1) P warm-up units.
        units = range(n * v)
        micro = [(k // (p * v)) * p + k % p for k in units]
        fwd = [(F, micro[k], (k // p) % v) for k in units]
        bwd = [(B, micro[k], v - 1 - (k // p) % v) for k in units]
        warm = min(2 * (p - stage - 1) + (v - 1) * p + more, n * v)
    return fwd[:warm], list(zip(fwd[warm:], bwd)), bwd[len(fwd) - warm:]


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
    ops = [_make_op(spec, key, ids) for key in keys]
    if spec.overlap_hidden_s:
        _combine_steady(spec, ops, ids)
    return ops, _programs(spec, ids)


def _combine_steady(spec: PipelineSpec, ops: list[_Op], ids: dict[tuple, int]) -> None:
    """Each steady (forward, backward) pair as one step (``PipelineSpec.overlap_hidden_s``):
    the forward takes the step's time and waits for the backward's inputs too; the backward
    then ends with it."""
    p, v = spec.stages, spec.virtual_stages
    F, B = EventKind.FORWARD, EventKind.BACKWARD
    for dev in range(p):
        for (_, mf, cf), (_, mb, cb) in _phases(spec, dev)[1]:
            f, b = ids[(F, cf * p + dev, mf)], ids[(B, cb * p + dev, mb)]
            own = ids[(F, cb * p + dev, mb)]
            inputs = tuple(d for d in ops[b].deps if d != own)
            ops[f] = replace(ops[f], deps=ops[f].deps + inputs, duration=(
                ops[f].duration + ops[b].duration - spec.overlap_hidden_s[dev] / v))
            ops[b] = replace(ops[b], duration=0.0)


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
