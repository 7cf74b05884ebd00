"""Candidate generation: the parallelizer's partial plans arranged into a stage table.

For every island, every group size (nodes) that admits a valid layout, every position (first /
middle / last / only) and every slice length the pruning rules let through, the homogeneous
parallelizer returns its options: latency, per-iteration time and the most micro-batches in
flight that fit in memory (:meth:`~solver.cost.parallelizer.AnalyticParallelizer.plan_stages`).
Composition then places each stage where its in-flight count is exact (stage ``i`` of ``P``
holds ``min(P − i, n)``), so no entry is sized for a guessed position.

A group is planned at its island's effective (weakest-member) figures
(:func:`solver.islands.group_island`): any ``g`` nodes of the island can run it. On islands of
more than :data:`MAX_GROUP_UNITS` nodes, group sizes are multiples of a granule (a power of two),
which bounds the composition's node dimension; the idle remainder is reported with the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from solver.compose.stage_table import UNLIMITED, IslandSlots, Options, StageTable
from solver.compose.table import Position
from solver.cost.configs import FeatureSet, _layouts
from solver.cost.parallelizer import Parallelizer, PartialPlan, PlanContext
from solver.cost.stage import ModelSlice
from solver.cost.stage_options import shares_across_n
from solver.islands import group_island
from solver.spec.domain import Island, JobSpec, ModelSpec

MAX_AUTO_MICRO = 128  # the largest n_micro searched when the job leaves it to the planner


def candidate_n_micro(job: JobSpec, lo: int = 1, hi: int = MAX_AUTO_MICRO) -> list[int]:
    """Micro-batch counts in ``[lo, hi]`` that divide the global batch."""
    b = job.training.global_batch
    return [n for n in range(max(lo, 1), min(b, hi) + 1) if b % n == 0]


MAX_GROUP_UNITS = 16  # node granules per island in the composition


@dataclass(frozen=True)
class EntryKey:
    """What a group of options depends on besides the planning context.

    Attributes
    ----------
    island : tuple
        The group's figures (:attr:`~solver.spec.domain.Island.signature` and its host link):
        groups of equal figures share their options, whichever island or view they belong to.
    nodes : int
        Nodes in the stage's group.
    position : Position
        First / middle / last / only.
    length : int
        Layers in the slice.
    """

    island: tuple
    nodes: int
    position: Position
    length: int


def granule(nodes: int) -> int:
    """Group sizes of an island of ``nodes`` nodes are multiples of this power of two."""
    g = 1
    while nodes > MAX_GROUP_UNITS * g:
        g *= 2
    return g


def position_lengths(position: Position, layers: int) -> range:
    """Slice lengths a stage at ``position`` can hold (the rest needs >= 1 layer per stage)."""
    if position is Position.ONLY:
        return range(layers, layers + 1)
    if position is Position.MIDDLE:
        return range(1, layers - 1)
    return range(1, layers)


def group_sizes(model: ModelSpec, island: Island, context: PlanContext, features: FeatureSet,
                groups: Callable[[int], Island] | None = None) -> tuple[int, ...]:
    """Node counts for which some layout exists (tp inside a node, ``dp`` dividing the
    micro-batch, cp and ep as the features allow), multiples of the island's granule.
    ``groups``: the group of ``g`` nodes (default :func:`~solver.islands.group_island`)."""
    step = granule(len(island.nodes))
    out = []
    for g in range(step, len(island.nodes) + 1, step):
        grp = groups(g) if groups is not None else group_island(island, g)
        if _layouts(ModelSlice(model, 1), grp, context, features):
            out.append(g)
    return tuple(out)


def stage_options(parallelizer: Parallelizer, model: ModelSpec, lengths: list[int],
                  has_embedding: bool, has_head: bool, group: Island,
                  context: PlanContext) -> list[list[PartialPlan]]:
    """Options per length from ``parallelizer``: its ``plan_stages`` when it has one, else one
    ``plan`` per length and in-flight count (a plan's capacity is the largest count it is
    returned for)."""
    batch = getattr(parallelizer, "plan_stages", None)
    if batch is not None:
        return batch(model, lengths, has_embedding, has_head, group, context)
    out = []
    for length in lengths:
        slc = ModelSlice(model, length, has_embedding, has_head)
        seen: dict = {}
        for h in range(1, context.n_micro + 1):
            ctx = replace(context, in_flight=h, max_pp=1)
            for p in parallelizer.plan(slc, group, ctx):
                key = (p.config, p.latency_s, p.iteration_s)
                seen[key] = replace(p, max_in_flight=h)
        out.append(sorted(seen.values(), key=lambda p: (p.latency_s, p.iteration_s)))
    return out


@dataclass
class GroupCache:
    """Calls the parallelizer at most once per entry and counts the calls.

    Attributes
    ----------
    model : ModelSpec
        The model.
    islands : dict[str, Island]
        Islands by name.
    parallelizer : Parallelizer
        The homogeneous parallelizer.
    context : PlanContext
        Sequence, micro-batch, n_micro, ε, features.
    dedupe : bool
        Rule 1: plan one slice per (length, position) instead of every ``[a, b)``.
    calls : int
        Slices planned so far (one call per slice, as the paper counts them).
    mismatches : int
        Slices of one length and position that got different options (rule 1's claim says 0).
    entries : dict[EntryKey, tuple[PartialPlan, ...]]
        The planned entries.
    signatures : dict[tuple[str, int], tuple]
        (island, group nodes) → the group's hardware signature (entries of equal hardware are
        shared), kept here because hashing an island walks all its nodes.
    groups : dict[tuple[str, int], Island]
        (island, group nodes) → the group (:meth:`group`), built once: building one walks
        the island's nodes.
    sized : dict[tuple[str, FeatureSet], tuple[int, ...]]
        (island, features) → the group sizes that admit a layout (:meth:`sizes`), found once:
        the views' floors and the searches both ask for them.
    """

    model: ModelSpec
    islands: dict[str, Island]
    parallelizer: Parallelizer
    context: PlanContext
    dedupe: bool = True
    calls: int = 0
    mismatches: int = 0
    entries: dict[EntryKey, tuple[PartialPlan, ...]] = field(default_factory=dict)
    signatures: dict[tuple[str, int], tuple] = field(default_factory=dict)
    groups: dict[tuple[str, int], Island] = field(default_factory=dict)
    sized: dict[tuple[str, FeatureSet], tuple[int, ...]] = field(default_factory=dict)

    def group(self, island: str, nodes: int) -> Island:
        """``nodes`` nodes of island ``island`` at its effective figures (built once)."""
        got = self.groups.get((island, nodes))
        if got is None:
            got = self.groups[(island, nodes)] = group_island(self.islands[island], nodes)
        return got

    def sizes(self, island: str, features: FeatureSet) -> tuple[int, ...]:
        """:func:`group_sizes` of island ``island`` under this cache's context, on its groups
        (found once per island and feature set)."""
        got = self.sized.get((island, features))
        if got is None:
            got = self.sized[(island, features)] = self._remembered_sizes(island, features)
        return got

    def _remembered_sizes(self, island: str, features: FeatureSet) -> tuple[int, ...]:
        """:func:`group_sizes`, remembered across runs by a parallelizer that remembers (the
        replica search's memo) where ``n_micro`` leaves the layouts alone."""
        def find() -> tuple[int, ...]:
            return group_sizes(self.model, self.islands[island], self.context, features,
                               lambda g: self.group(island, g))
        remember = getattr(self.parallelizer, "remember", None)
        if remember is None or not shares_across_n(self.context):
            return find()
        key = ("sizes", replace(self.context, n_micro=0), features)
        return remember(key, self.islands[island], find)

    def _sig(self, island: str, nodes: int) -> tuple:
        got = self.signatures.get((island, nodes))
        if got is None:
            group = self.group(island, nodes)
            got = self.signatures[(island, nodes)] = group.signature + (group.pcie_gbs,)
        return got

    def fetch(self, island: str, nodes: int, position: Position, lengths: list[int]) -> None:
        """Plan the entries of ``lengths`` not planned yet (one batched call per start layer)."""
        sig = self._sig(island, nodes)
        todo = [d for d in lengths if EntryKey(sig, nodes, position, d) not in self.entries]
        if not todo:
            return
        big_l = self.model.layers
        first = position in (Position.FIRST, Position.ONLY)
        last = position in (Position.LAST, Position.ONLY)
        group = self.group(island, nodes)
        starts = [None] if self.dedupe or position is not Position.MIDDLE else range(1, big_l - 1)
        for a in starts:
            batch = [d for d in todo if a is None or a + d <= big_l - 1]
            if not batch:
                continue
            found = stage_options(self.parallelizer, self.model, batch, first, last, group,
                                  self.context)
            self.calls += len(batch)
            for d, plans in zip(batch, found):
                key = EntryKey(sig, nodes, position, d)
                plans = plans if hasattr(plans, "latency") else tuple(plans)
                if key in self.entries:
                    self.mismatches += plans != self.entries[key]
                else:
                    self.entries[key] = plans

    def get(self, island: str, nodes: int, position: Position, length: int):
        """The options of one planned entry."""
        return self.entries[EntryKey(self._sig(island, nodes), nodes, position, length)]


@dataclass(frozen=True)
class TableSpec:
    """Which entries the rules let through.

    Attributes
    ----------
    windows : dict[tuple[str, int], tuple[int, int]]
        (island, group nodes) → allowed stage lengths (rule 2 or its safe variant).
    caps : dict[tuple[str, int, Position], int]
        (island, group nodes, position) → longest slice whose state can fit (rule 3).
    groups : dict[str, tuple[int, ...]] | None
        Island → the group sizes that admit a layout (:func:`group_sizes`), when the caller
        has them already; None: found here.
    """

    windows: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    caps: dict[tuple[str, int, Position], int] = field(default_factory=dict)
    groups: dict[str, tuple[int, ...]] | None = None

    def lengths(self, island: str, nodes: int, position: Position, layers: int) -> list[int]:
        """Lengths of an entry the rules allow."""
        lo, hi = self.windows.get((island, nodes), (1, layers))
        cap = self.caps.get((island, nodes, position), layers)
        return [d for d in position_lengths(position, layers) if lo <= d <= min(hi, cap)]


@dataclass(frozen=True)
class CandidateTable:
    """A stage table and the partial plans behind its options.

    Attributes
    ----------
    table : StageTable
        What composition sees.
    islands : tuple[Island, ...]
        The islands of the table, in its index order.
    plans : dict[tuple[int, int, Position], dict[int, tuple[PartialPlan, ...]]]
        ``(island index, nodes, position)`` → length → the options' plans, in column order.
    unusable : dict[str, str]
        Islands left out of the table and why.
    """

    table: StageTable
    islands: tuple[Island, ...]
    plans: dict
    unusable: dict[str, str]


def build_stage_table(cache: GroupCache, spec: TableSpec, link_rate: np.ndarray,
                      order: tuple[str, ...], features: FeatureSet) -> CandidateTable | None:
    """Plan every entry ``spec`` allows and arrange the options (None: no island is usable).

    ``link_rate`` is indexed like ``order`` (the islands' names).
    """
    big_l, n = cache.model.layers, cache.context.n_micro
    slots, options, plans, kept, unusable = [], {}, {}, [], {}
    for name in order:
        island = cache.islands[name]
        sizes = spec.groups[name] if spec.groups is not None else cache.sizes(name, features)
        k, used = len(slots), []
        for g in sizes:
            for pos in Position:
                lengths = spec.lengths(name, g, pos, big_l)
                cache.fetch(name, g, pos, lengths)
                rows = {d: cache.get(name, g, pos, d) for d in lengths}
                rows = {d: p for d, p in rows.items() if p}
                if rows:
                    options[(k, g, pos)] = _options(big_l, rows, n)
                    plans[(k, g, pos)] = rows
                    used.append(g)
        groups = tuple(sorted(set(used)))
        if not groups:
            unusable[name] = ("no group of its nodes admits a layout that fits"
                              if sizes else "no layout divides the micro-batch")
            options = {key: v for key, v in options.items() if key[0] != k}
            plans = {key: v for key, v in plans.items() if key[0] != k}
            continue
        slots.append(IslandSlots(name, len(island.nodes), island.gpus_per_node, groups))
        kept.append(order.index(name))
    if not slots:
        return None
    rate = link_rate[np.ix_(kept, kept)]
    table = StageTable(big_l, n, tuple(slots), options, rate)
    return CandidateTable(table, tuple(cache.islands[order[i]] for i in kept), plans, unusable)


def _columns(plans) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(latency, iteration, capacity) of options: arrays of a StageOptions, or read from plans."""
    if hasattr(plans, "latency"):
        return plans.latency, plans.iteration, plans.capacity
    return (np.array([p.latency_s for p in plans]), np.array([p.iteration_s for p in plans]),
            np.array([p.max_in_flight for p in plans], dtype=np.int64))


def _options(layers: int, rows: dict, n_micro: int) -> Options:
    """The option arrays of one (island, group, position); capacity >= n means unlimited."""
    width = max(len(v) for v in rows.values())
    lat = np.full((layers + 1, width), np.inf)
    it = np.zeros((layers + 1, width))
    cap = np.zeros((layers + 1, width), dtype=np.int64)
    for d, plans in rows.items():
        a, b, c = _columns(plans)
        lat[d, :a.size], it[d, :a.size] = a, b
        cap[d, :a.size] = np.where(c >= n_micro, UNLIMITED, c)
    return Options(lat, it, cap)
