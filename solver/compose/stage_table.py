"""The stage table: the seam between "inside an island" and "across islands" for node-group stages.

A pipeline stage runs on a *group* of ``g`` whole nodes of one island; an island may host several
consecutive stages on disjoint groups (its *block*), and nodes may stay idle. Composition sees,
per (island, group size, position), the options the homogeneous parallelizer found for every
slice length — seconds per micro-batch, per-iteration seconds, and the largest number of
micro-batches in flight that fit in memory — plus the link rates between islands. It never sees
a GPU, so every composition algorithm can be tested on tables alone.

In-flight memory is exact by global position: in a 1F1B pipeline of ``P`` stages, stage ``i``
(0-based from the front) holds ``min(P − i, n)`` micro-batches of activations (Narayanan et al.,
SC'21), so an option is usable at stage ``i`` only when its ``capacity`` reaches that count.

Objective (``shared/design.md``), for stages with latencies ``τ_i``, per-iteration times ``v_i``
and the link times ``c`` between consecutive stages (links are pipeline stages of their own)::

    T = (n − 1) · max(τ, c) + Σ τ + Σ c + max_i v_i

A boundary between a stage on island ``a`` and the next on island ``b`` (``a = b`` inside an
island) takes ``rate[a, b] / min(G_a, G_b)`` seconds per micro-batch, ``G`` being the GPUs of the
two boundary stages: every GPU of the smaller group sends (or receives) its share of the
boundary activations and gradients over its own NIC.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import numpy as np

from solver.compose.table import POSITIONS, Budget, Position, slice_position
from solver.spec.errors import InputError

#: Capacity meaning "fits with any number of micro-batches in flight".
UNLIMITED = 1 << 30


@dataclass(frozen=True)
class Options:
    """The options of one (island, group size, position), for every slice length.

    Row ``d`` (``1 <= d <= L``) holds the options of a slice of ``d`` layers; row 0 is unused.
    Columns are options, padded with ``inf`` latency (and capacity 0).

    Attributes
    ----------
    latency : numpy.ndarray
        ``(L + 1, O)`` seconds per micro-batch (forward + backward).
    iteration : numpy.ndarray
        ``(L + 1, O)`` per-iteration seconds outside the pipeline (exposed gradient
        synchronisation and optimizer step).
    capacity : numpy.ndarray
        ``(L + 1, O)`` integers: most micro-batches in flight that fit (0: never fits).
    """

    latency: np.ndarray
    iteration: np.ndarray
    capacity: np.ndarray

    @classmethod
    def from_lists(cls, layers: int, rows: Mapping[int, Sequence[tuple[float, float, int]]]
                   ) -> "Options":
        """Options from ``{length: [(latency, iteration, capacity), ...]}`` (missing: none)."""
        width = max([len(v) for v in rows.values()] + [1])
        lat = np.full((layers + 1, width), np.inf)
        it = np.zeros((layers + 1, width))
        cap = np.zeros((layers + 1, width), dtype=np.int64)
        for d, opts in rows.items():
            for o, (a, b, c) in enumerate(opts):
                lat[d, o], it[d, o], cap[d, o] = a, b, min(int(c), UNLIMITED)
        return cls(lat, it, cap)


@dataclass(frozen=True)
class IslandSlots:
    """One island as composition sees it.

    Attributes
    ----------
    name : str
        Island name.
    nodes : int
        Nodes available.
    gpus_per_node : int
        GPUs per node (boundary link streams are GPUs).
    groups : tuple[int, ...]
        Allowed stage sizes in nodes, ascending (each at most ``nodes``).
    """

    name: str
    nodes: int
    gpus_per_node: int
    groups: tuple[int, ...]


@dataclass(frozen=True)
class StageTable:
    """Everything exact composition over node-group stages needs.

    Attributes
    ----------
    layers : int
        Model layers ``L``.
    n_micro : int
        Micro-batches per iteration ``n``.
    islands : tuple[IslandSlots, ...]
        Islands, indexed by position in this tuple.
    options : Mapping[tuple[int, int, Position], Options]
        ``(island index, group size in nodes, position)`` → options; a missing key has none.
    link_rate : numpy.ndarray
        ``(K, K)`` seconds × GPUs per micro-batch for a boundary from island ``a`` to ``b``; the
        diagonal is the rate between two stages of one island.
    use_all : bool
        Every island must host at least one stage.
    """

    layers: int
    n_micro: int
    islands: tuple[IslandSlots, ...]
    options: Mapping[tuple[int, int, Position], Options]
    link_rate: np.ndarray
    use_all: bool = False

    def __post_init__(self) -> None:
        _validate(self)

    def names(self) -> tuple[str, ...]:
        """Island names in index order."""
        return tuple(i.name for i in self.islands)

    def link(self, a: int, ga: int, b: int, gb: int) -> float:
        """Seconds per micro-batch from a group of ``ga`` nodes of island ``a`` to ``gb`` of ``b``."""
        streams = min(ga * self.islands[a].gpus_per_node, gb * self.islands[b].gpus_per_node)
        return float(self.link_rate[a, b]) / streams

    def option(self, k: int, g: int, pos: Position, length: int, o: int) -> tuple[float, float, int]:
        """``(latency, iteration, capacity)`` of one option."""
        opts = self.options[(k, g, pos)]
        return (float(opts.latency[length, o]), float(opts.iteration[length, o]),
                int(opts.capacity[length, o]))


def _validate(t: StageTable) -> None:
    src = "<stage table>"
    if t.layers < 1 or t.n_micro < 1:
        raise InputError(src, "layers", f"layers and n_micro must be >= 1, got {t.layers}, "
                                        f"{t.n_micro}")
    names = [i.name for i in t.islands]
    if not names or len(set(names)) != len(names):
        raise InputError(src, "islands", f"need distinct island names, got {names}")
    for k, isl in enumerate(t.islands):
        if isl.nodes < 1 or not isl.groups or any(g < 1 or g > isl.nodes for g in isl.groups):
            raise InputError(src, f"islands[{k}]", f"bad groups {isl.groups} for {isl.nodes} nodes")
    if t.link_rate.shape != (len(names), len(names)) or not np.all(t.link_rate >= 0):
        raise InputError(src, "link_rate", "must be a K x K array of non-negative rates")
    for (k, g, pos), opts in t.options.items():
        if g not in t.islands[k].groups or opts.latency.shape[0] != t.layers + 1:
            raise InputError(src, f"options[{k},{g},{pos.value}]", "unknown group or wrong length")


@dataclass(frozen=True)
class GroupRestrictions:
    """Pruning rules and user limits as constraints on node-group plans.

    Length windows and memory caps act on single entries and are applied to the table itself
    (the planner masks the options); these are the rules that act on whole plans.

    Attributes
    ----------
    banned_links : frozenset[tuple[str, str]]
        Ordered island pairs that may not be consecutive (island ``a``'s block right before ``b``).
    max_stages : int | None
        At most this many pipeline stages.
    budget : Budget | None
        The used islands' rates must add up to at most the limit.
    depths : frozenset[int] | None
        Allowed stage counts of a plan (the user's ``pp``); None: any.
    """

    banned_links: frozenset[tuple[str, str]] = frozenset()
    max_stages: int | None = None
    budget: Budget | None = None
    depths: frozenset[int] | None = None

    def depth_bound(self, upper: int) -> int:
        """``upper`` capped by ``max_stages`` and the largest allowed depth."""
        if self.max_stages is not None:
            upper = min(upper, self.max_stages)
        return upper if self.depths is None else min(upper, max(self.depths, default=0))

    def allows_depth(self, depth: int) -> bool:
        """Whether a plan of ``depth`` stages is allowed (``max_stages`` and ``depths``)."""
        return (self.max_stages is None or depth <= self.max_stages) and \
            (self.depths is None or depth in self.depths)

    def among(self, names: set[str]) -> "GroupRestrictions":
        """These restrictions for a table of the islands ``names`` (bans of others dropped)."""
        return replace(self, banned_links=frozenset(p for p in self.banned_links
                                                    if p[0] in names and p[1] in names))


@dataclass(frozen=True)
class GroupStage:
    """One stage of a composed plan.

    Attributes
    ----------
    island : str
        Island name; ``k`` its index in the table.
    k : int
        Island index.
    nodes : int
        Nodes of the stage's group.
    start, end : int
        Half-open layer range.
    option : int
        Column of the option used (see :class:`Options`).
    latency, iteration : float
        Its seconds per micro-batch and per-iteration seconds.
    in_flight : int
        Micro-batches in flight at its position, ``min(P − i, n)``.
    """

    island: str
    k: int
    nodes: int
    start: int
    end: int
    option: int
    latency: float
    iteration: float
    in_flight: int


@dataclass(frozen=True)
class GroupResult:
    """What a node-group composition solver found.

    Attributes
    ----------
    stages : tuple[GroupStage, ...]
        Stages front to back; empty without a plan.
    objective : float | None
        ``T`` recomputed by :func:`group_objective`.
    solver : str
        Solver label.
    optimal : bool
        Optimality proven (within the solver's stated tolerance).
    status : str
        ``optimal``, ``feasible``, ``infeasible`` or ``time_limit``.
    time_s : float
        Wall time.
    bound, gap : float | None
        Proven lower bound and relative gap when not optimal.
    """

    stages: tuple[GroupStage, ...]
    objective: float | None
    solver: str
    optimal: bool
    status: str
    time_s: float
    bound: float | None = None
    gap: float | None = None

    @property
    def feasible(self) -> bool:
        """A plan was found."""
        return bool(self.stages)


def in_flight_counts(depth: int, n_micro: int) -> list[int]:
    """1F1B: stage ``i`` of ``depth`` holds ``min(depth − i, n)`` micro-batches."""
    return [min(depth - i, n_micro) for i in range(depth)]


def group_objective(table: StageTable, stages: Sequence[GroupStage],
                    overlap: bool = False) -> tuple[float, float, float]:
    """``(T, T_pipe, max per-iteration)`` of a plan, recomputed from the table alone.

    With ``overlap`` (eq. 9) a stage costs ``max(τ_i, c_i)``, ``c_i`` the link after it, and links
    are not stages of their own.

    Raises
    ------
    ValueError
        Empty plan, an unknown option, or an option whose capacity is below its in-flight count.
    """
    if not stages:
        raise ValueError("a plan needs at least one stage")
    held = in_flight_counts(len(stages), table.n_micro)
    taus, its = [], []
    for s, h in zip(stages, held):
        pos = slice_position(s.start, s.end, table.layers)
        if (s.k, s.nodes, pos) not in table.options:
            raise ValueError(f"{s.island}: no options for {s.nodes} nodes at {pos.value}")
        lat, it, cap = table.option(s.k, s.nodes, pos, s.end - s.start, s.option)
        if not math.isfinite(lat) or cap < h:
            raise ValueError(f"{s.island} [{s.start}, {s.end}) on {s.nodes} nodes: option "
                             f"{s.option} holds {cap} micro-batches, its position needs {h}")
        taus.append(lat)
        its.append(it)
    links = [table.link(a.k, a.nodes, b.k, b.nodes) for a, b in zip(stages, stages[1:])]
    if overlap:
        costs = [max(t, c) for t, c in zip(taus, links + [0.0])]
    else:
        costs = taus + links
    pipe = (table.n_micro - 1) * max(costs) + sum(costs)
    return pipe + max(its), pipe, max(its)


def group_problems(table: StageTable, stages: Sequence[GroupStage],
                   restrictions: GroupRestrictions | None = None) -> list[str]:
    """Everything structurally wrong with a plan (empty when valid): layer cover, island blocks
    contiguous and used once, node budgets, positions, use_all and the restrictions."""
    out: list[str] = []
    cursor, seen, nodes_used = 0, [], {}
    for s in stages:
        if s.start != cursor or s.end <= s.start:
            out.append(f"{s.island}: [{s.start}, {s.end}) does not continue at {cursor}")
        cursor = s.end
        if not seen or seen[-1] != s.k:
            if s.k in seen:
                out.append(f"island {s.island} hosts two separate blocks")
            seen.append(s.k)
        nodes_used[s.k] = nodes_used.get(s.k, 0) + s.nodes
        if s.nodes not in table.islands[s.k].groups:
            out.append(f"{s.island}: group of {s.nodes} nodes is not allowed")
    if cursor != table.layers:
        out.append(f"layers end at {cursor}, expected {table.layers}")
    for k, u in nodes_used.items():
        if u > table.islands[k].nodes:
            out.append(f"{table.islands[k].name}: {u} nodes used of {table.islands[k].nodes}")
    if table.use_all and len(set(seen)) != len(table.islands):
        out.append("use_all: some island hosts no stage")
    if restrictions is not None:
        out += _restriction_problems(table, stages, restrictions, seen)
    return out


def _restriction_problems(table: StageTable, stages: Sequence[GroupStage],
                          r: GroupRestrictions, order: list[int]) -> list[str]:
    out = []
    names = table.names()
    for a, b in zip(order, order[1:]):
        if (names[a], names[b]) in r.banned_links:
            out.append(f"banned link {names[a]} -> {names[b]}")
    if r.max_stages is not None and len(stages) > r.max_stages:
        out.append(f"{len(stages)} stages exceed max_stages {r.max_stages}")
    if r.depths is not None and len(stages) not in r.depths:
        out.append(f"{len(stages)} stages are not an allowed depth {sorted(r.depths)}")
    if r.budget is not None and not r.budget.allows([names[k] for k in order]):
        out.append(f"islands {[names[k] for k in order]} exceed the budget {r.budget.limit}")
    return out


def stage_table_from_latency(latency_table) -> StageTable:
    """A :class:`~solver.compose.table.LatencyTable` as a stage table: every island is one node
    that runs one stage (one group size, one option per entry, no memory limit), so the
    node-group composers solve exactly the one-stage-per-island problem of ``tangram compose``.

    Links become rates over one GPU stream; an island never follows itself (diagonal 0).
    """
    names = latency_table.islands
    big_l = latency_table.layers
    slots = tuple(IslandSlots(n, 1, 1, (1,)) for n in names)
    options = {}
    for k, name in enumerate(names):
        for pos in POSITIONS:
            row = latency_table.latency[name][pos]
            rows = {d: [(v, 0.0, UNLIMITED)] for d, v in enumerate(row, start=1) if v is not None}
            if rows:
                options[(k, 1, pos)] = Options.from_lists(big_l, rows)
    rate = np.zeros((len(names), len(names)))
    for (a, b), v in latency_table.link.items():
        rate[names.index(a), names.index(b)] = v
    return StageTable(big_l, latency_table.n_micro, slots, options, rate, latency_table.use_all)
