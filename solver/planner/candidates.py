"""Candidate generation: the parallelizer's partial plans arranged into latency tables.

For each island, slice length and position the parallelizer returns a Pareto set; the fastest
plan (ties: less per-iteration time, then less memory) becomes the table entry. Because 1F1B
memory depends on where a stage sits, an entry is also keyed by the number of micro-batches in
flight: a stage with ``d`` stages after it holds ``min(d + 1, n)`` of them (Narayanan et al.,
SC'21). The planner composes one table per pipeline depth ``P``: there the first stage has
``d = P − 1`` and the last ``d = 0``; middle stages are checked at ``d = P − 2``, the deepest
middle position, which is exact for ``P ≤ 3`` and conservative (never over memory) beyond.

An entry keeps every plan of the parallelizer's Pareto set that is not beaten in both latency
and per-iteration time (a "staircase"); composition at a cap ``v`` on the per-iteration time uses,
per entry, the fastest plan within the cap, which keeps the end-to-end objective exact over the
whole Pareto set. A single-stage plan (position ONLY) may pipeline inside its island (``pp > 1``):
its entry is the effective per-micro-batch time ``((n − 1)·max τ_j + Σ τ_j) / n`` of its
sub-stages, which makes ``n · τ`` equal to its pipeline time exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from solver.compose.table import LatencyTable, Position, slice_position
from solver.cost.parallelizer import Parallelizer, PartialPlan, PlanContext
from solver.cost.stage import ModelSlice
from solver.planner.pruning import dedupe_slices
from solver.spec.domain import Island, ModelSpec


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


MAX_INTERNAL_PP = 16


@dataclass(frozen=True)
class Option:
    """One plan of an entry: its table latency (effective for internal pipelines) and plan."""

    latency: float
    iteration: float
    plan: PartialPlan


def effective_latency(plan: PartialPlan, n_micro: int) -> float:
    """Per-micro-batch time whose ``n``-fold is the plan's pipeline time (exact for pp = 1)."""
    subs = plan.stage_latencies
    return ((n_micro - 1) * max(subs) + sum(subs)) / n_micro


def staircase(plans: list[PartialPlan], n_micro: int) -> tuple[Option, ...]:
    """Plans not beaten in both latency and per-iteration time, by increasing latency
    (ties: less memory first)."""
    opts = sorted((Option(effective_latency(p, n_micro), p.iteration_s, p) for p in plans),
                  key=lambda o: (o.latency, o.iteration, o.plan.memory_gb))
    out: list[Option] = []
    for o in opts:
        if not out or o.iteration < out[-1].iteration:
            out.append(o)
    return tuple(out)


def best_within(options: tuple[Option, ...], cap: float) -> Option | None:
    """The fastest option whose per-iteration time is within ``cap``."""
    return next((o for o in options if o.iteration <= cap), None)


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
    entries: dict[CandidateKey, tuple[Option, ...]] = field(default_factory=dict)

    def get(self, key: CandidateKey) -> tuple[Option, ...]:
        """The entry's options (empty when nothing fits), planning it if needed."""
        if key not in self.entries:
            self.entries[key] = self._plan(key)
        return self.entries[key]

    def prefetch(self, keys: list[CandidateKey]) -> None:
        """Plan many entries of one (island, position, in-flight) together when the parallelizer
        can batch slices (``plan_many``); counts one call per slice planned.

        With rule 1 each length is planned once. Without it every slice ``[a, b)`` is planned:
        one batch per start layer ``a``, and every slice must give its length's plan (rule 1's
        claim, counted in ``mismatches``).
        """
        todo = [k for k in keys if k not in self.entries]
        batch = getattr(self.parallelizer, "plan_many", None)
        if not todo or batch is None or todo[0].position is Position.ONLY:
            return
        head, L = todo[0], self.model.layers
        ctx = PlanContext(**{**self.context.__dict__, "in_flight": head.in_flight, "max_pp": 1})
        island, first = self.islands[head.island], head.position is Position.FIRST
        last = head.position is Position.LAST
        # First and last slices are unique per length; middle ones repeat for every start.
        starts = [None] if self.dedupe or first or last else range(1, L - 1)
        for a in starts:
            group = [k for k in todo if a is None or a + k.length <= L - 1]
            if not group:
                continue
            results = batch(self.model, [k.length for k in group], first, last, island, ctx)
            self.calls += len(group)
            for key, plans in zip(group, results):
                options = staircase(plans, self.context.n_micro)
                if key in self.entries:
                    self.mismatches += options != self.entries[key]
                else:
                    self.entries[key] = options

    def _plan(self, key: CandidateKey) -> tuple[Option, ...]:
        L = self.model.layers
        slices = [(a, b) for a, b in dedupe_slices(L, key.length, self.dedupe)
                  if slice_position(a, b, L) is key.position]
        # Only a single-stage plan pipelines inside its island (see the module docstring).
        max_pp = min(MAX_INTERNAL_PP, L) if key.position is Position.ONLY else 1
        ctx = PlanContext(**{**self.context.__dict__, "in_flight": key.in_flight,
                             "max_pp": max_pp})
        results = []
        for a, b in slices:
            slc = ModelSlice(self.model, key.length, a == 0, b == L)
            plans = self.parallelizer.plan(slc, self.islands[key.island], ctx)
            results.append(staircase(plans, self.context.n_micro))
            self.calls += 1
        # Rule 1's claim, checked whenever it is off: every slice of one length and position
        # gets the same plan.
        self.mismatches += sum(1 for r in results[1:] if r != results[0])
        return results[0] if results else ()


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


@dataclass(frozen=True)
class DepthTable:
    """The entries of a depth-``P`` table as option lists.

    Attributes
    ----------
    depth : int
        Pipeline depth ``P``.
    options : dict[tuple[str, Position, int], tuple[Option, ...]]
        Non-empty option lists keyed by (island, position, length).
    """

    depth: int
    options: dict[tuple[str, Position, int], tuple[Option, ...]]

    def iteration_values(self) -> list[float]:
        """Distinct per-iteration times of all options, ascending."""
        return sorted({o.iteration for opts in self.options.values() for o in opts})

    def at(self, cache: "CandidateCache", cap: float, links: dict[tuple[str, str], float]
           ) -> tuple[LatencyTable, dict[tuple[str, Position, int], Option]]:
        """The latency table using, per entry, the fastest option within ``cap``."""
        L = cache.model.layers
        chosen = {k: o for k, opts in self.options.items()
                  if (o := best_within(opts, cap)) is not None}
        latency = {name: {pos.value: [chosen[(name, pos, n)].latency if (name, pos, n) in chosen
                                      else None for n in range(1, L + 1)] for pos in Position}
                   for name in cache.islands}
        table = LatencyTable(L, cache.context.n_micro, tuple(cache.islands), latency,
                             {k: v for k, v in links.items() if v > 0})
        return table, chosen


def build_table(cache: CandidateCache, spec: TableSpec) -> DepthTable:
    """Plan (or look up) every entry the depth-``P`` table needs and the rules allow."""
    L, n = cache.model.layers, cache.context.n_micro
    options = {}
    for name in cache.islands:
        for pos in Position:
            after = after_for(pos, spec.depth)
            if after is None:
                continue
            keys = [CandidateKey(name, length, pos, min(after + 1, n))
                    for length in range(1, L + 1)
                    if _fits_position(pos, length, L) and spec.allowed(name, length, pos)]
            cache.prefetch(keys)
            for key in keys:
                opts = cache.get(key)
                if opts:
                    options[(name, pos, key.length)] = opts
    return DepthTable(spec.depth, options)


def _fits_position(pos: Position, length: int, layers: int) -> bool:
    if pos is Position.ONLY:
        return length == layers
    if pos is Position.MIDDLE:
        return length <= layers - 2
    return length <= layers - 1
