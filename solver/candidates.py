"""Candidate generation: the parallelizer's partial plans arranged into latency tables.

For each island, slice length and position the parallelizer returns a Pareto set; the fastest
plan (ties: less per-iteration time, then less memory) becomes the table entry. Because 1F1B
memory depends on where a stage sits, an entry is also keyed by the number of micro-batches in
flight: a stage with ``d`` stages after it holds ``min(d + 1, n)`` of them (Narayanan et al.,
SC'21). The planner composes one table per pipeline depth ``P``: there the first stage has
``d = P − 1`` and the last ``d = 0``; middle stages are checked at ``d = P − 2``, the deepest
middle position, which is exact for ``P ≤ 3`` and conservative (never over memory) beyond.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from solver.parallelizer import Parallelizer, PartialPlan, PlanContext
from solver.pruning import Rule, dedupe_slices
from solver.specs import Island, ModelSpec
from solver.stage import ModelSlice
from solver.table import LatencyTable, Position


@dataclass(frozen=True)
class CandidateKey:
    """What a table entry depends on.

    Attributes
    ----------
    island : str
        Island name.
    length : int
        Layers in the slice.
    position : Position
        First / middle / last / only.
    in_flight : int
        Micro-batches of activations held (1F1B).
    """

    island: str
    length: int
    position: Position
    in_flight: int


def after_for(position: Position, depth: int) -> int | None:
    """Stages after a slice at ``position`` in a pipeline of ``depth`` stages (None: impossible)."""
    if position is Position.ONLY:
        return 0 if depth == 1 else None
    if position is Position.FIRST:
        return depth - 1 if depth >= 2 else None
    if position is Position.LAST:
        return 0 if depth >= 2 else None
    return depth - 2 if depth >= 3 else None


def choose(plans: list[PartialPlan]) -> PartialPlan | None:
    """The entry's plan: least latency, then least per-iteration time, then least memory."""
    if not plans:
        return None
    return min(plans, key=lambda p: (p.latency_s, p.iteration_s, p.memory_gb))


@dataclass
class CandidateCache:
    """Calls the parallelizer at most once per (key, slice) and counts the calls.

    Attributes
    ----------
    model : ModelSpec
        The model.
    islands : dict[str, Island]
        Islands by name.
    parallelizer : Parallelizer
        The homogeneous parallelizer.
    context : PlanContext
        Fixed context; ``in_flight`` is replaced per key.
    dedupe : bool
        Rule 1: plan one slice per (length, position) instead of every ``(a, b)``.
    calls : int
        Parallelizer calls made so far.
    """

    model: ModelSpec
    islands: dict[str, Island]
    parallelizer: Parallelizer
    context: PlanContext
    dedupe: bool = True
    calls: int = 0
    mismatches: int = 0
    entries: dict[CandidateKey, PartialPlan | None] = field(default_factory=dict)

    def get(self, key: CandidateKey) -> PartialPlan | None:
        """The entry's chosen plan, planning it if needed."""
        if key not in self.entries:
            self.entries[key] = self._plan(key)
        return self.entries[key]

    def _plan(self, key: CandidateKey) -> PartialPlan | None:
        L = self.model.layers
        slices = [(a, b) for a, b in dedupe_slices(L, key.length, self.dedupe)
                  if _position(a, b, L) is key.position]
        ctx = PlanContext(**{**self.context.__dict__, "in_flight": key.in_flight})
        results = []
        for a, b in slices:
            slc = ModelSlice(self.model, key.length, a == 0, b == L)
            results.append(choose(self.parallelizer.plan(slc, self.islands[key.island], ctx)))
            self.calls += 1
        # Rule 1's claim, checked whenever it is off: every slice of one length and position
        # gets the same plan.
        self.mismatches += sum(1 for r in results[1:] if r != results[0])
        return results[0] if results else None


def _position(a: int, b: int, layers: int) -> Position:
    if a == 0:
        return Position.ONLY if b == layers else Position.FIRST
    return Position.LAST if b == layers else Position.MIDDLE


@dataclass(frozen=True)
class TableSpec:
    """Which entries a depth-``P`` table needs and which the rules let through.

    Attributes
    ----------
    depth : int
        Pipeline depth ``P`` (stages).
    windows : dict[str, tuple[int, int]]
        Allowed lengths per island (rule 2 or its safe variant); absent = all.
    caps : dict[tuple[str, Position], int]
        Longest length per island and position (rule 3); absent = all.
    """

    depth: int
    windows: dict[str, tuple[int, int]]
    caps: dict[tuple[str, Position], int]

    def allowed(self, island: str, length: int, position: Position) -> bool:
        """Whether the rules let the parallelizer plan this entry."""
        lo, hi = self.windows.get(island, (1, length))
        return lo <= length <= hi and length <= self.caps.get((island, position), length)


def build_table(cache: CandidateCache, spec: TableSpec, n_micro: int,
                links: dict[tuple[str, str], float]) -> tuple[LatencyTable, dict]:
    """The depth-``P`` latency table and its plans keyed by (island, position, length)."""
    L = cache.model.layers
    latency: dict[str, dict[str, list[float | None]]] = {}
    plans: dict[tuple[str, Position, int], PartialPlan] = {}
    for name in cache.islands:
        rows = {}
        for pos in Position:
            after = after_for(pos, spec.depth)
            row: list[float | None] = []
            for length in range(1, L + 1):
                plan = None
                if after is not None and _fits_position(pos, length, L) and \
                        spec.allowed(name, length, pos):
                    plan = cache.get(CandidateKey(name, length, pos, min(after + 1, n_micro)))
                row.append(None if plan is None else plan.latency_s)
                if plan is not None:
                    plans[(name, pos, length)] = plan
            rows[pos.value] = row
        latency[name] = rows
    table = LatencyTable(L, n_micro, tuple(cache.islands), latency,
                         {k: v for k, v in links.items() if v > 0})
    return table, plans


def _fits_position(pos: Position, length: int, layers: int) -> bool:
    if pos is Position.ONLY:
        return length == layers
    if pos is Position.MIDDLE:
        return length <= layers - 2
    return length <= layers - 1
