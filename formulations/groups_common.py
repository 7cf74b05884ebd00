"""The node-group composition model, written once for CP-SAT and the PuLP MILP.

Decision (:mod:`solver.compose.stage_table`): stages on groups of nodes of islands, consecutive
per island, an island's groups within its nodes, slice lengths covering the model, and per stage
one option whose capacity holds the micro-batches its position keeps in flight.

Formulation by *slots* counted from the pipeline's end: slot ``r`` is the stage with ``r``
stages behind it, so its in-flight count ``min(r + 1, n)`` and its position class (``r = 0``
holds the LM head) are known in advance and every entry's usability per slot is fixed data.

* ``x[r, e]`` = 1 when slot ``r`` runs entry ``e`` = (island, group, position, length, option);
  ``active[r]`` = the slot is used (slots fill from the back: ``active[r+1] <= active[r]``);
* ``on[r, k, g]`` = slot ``r`` runs a group of ``g`` nodes of island ``k`` (a sum of ``x``);
* ``link[r]`` >= ``c(front group → back group) · (on[r+1, ·] + on[r, ·] − 1)``, the boundary
  between slot ``r + 1`` and slot ``r``;
* ``M`` >= every stage latency and link (``overlap``: ``stage_cost[r] >= max(τ, link)``),
  ``V`` >= every per-iteration time; minimize ``(n−1)·M + Σ τ + Σ link + V``.

Only options undominated in (latency, per-iteration time) among those a slot may use become
variables; with ``upper`` (the objective of a known plan) entries slower than ``upper / n``
are left out, which keeps every plan better than ``upper`` (``T >= n · max τ``): a solver that
finds nothing below ``upper`` proves that plan optimal. Each backend supplies variables and
constraints; solver objects never leave the backend module.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from formulations.assignment_common import Backend  # the same modelling interface
from solver.compose.result import TooLargeError
from solver.compose.stage_table import (GroupRestrictions, GroupStage, StageTable,
                                        in_flight_counts)
from solver.compose.table import Position

MAX_SLOT_VARS = 150_000  # x variables; beyond this use the DP
BUDGET_UNITS = 1_000_000
MAX_LEVELS = 64  # bottleneck thresholds of the level cuts
_HEAD = {Position.LAST, Position.ONLY}
_FRONT = {Position.FIRST, Position.ONLY}


@dataclass(frozen=True)
class SlotEntry:
    """A usable (island, group, position, length, option) of one slot, with its numbers."""

    k: int
    g: int
    position: Position
    length: int
    option: int
    latency: float
    iteration: float


def slot_depth(table: StageTable, restrictions: GroupRestrictions | None) -> int:
    """Most stages a plan can have (each needs a layer and a group of nodes)."""
    depth = min(table.layers, sum(i.nodes // min(i.groups) for i in table.islands))
    return depth if restrictions is None else restrictions.depth_bound(depth)


def slot_entries(table: StageTable, depth: int, upper: float = math.inf
                 ) -> list[list[SlotEntry]]:
    """Per slot, the entries it may use (capacity, position class, ``upper / n``), keeping
    only options not dominated in (latency, iteration) at that slot's in-flight count."""
    held = [min(r + 1, table.n_micro) for r in range(depth)]
    limit = upper / table.n_micro
    out: list[list[SlotEntry]] = [[] for _ in range(depth)]
    for (k, g, pos), opts in sorted(table.options.items(), key=lambda kv: (kv[0][0], kv[0][1],
                                                                         kv[0][2].value)):
        slots = [0] if pos in _HEAD else range(1, depth)
        for r in slots:
            for d in range(1, table.layers + 1):
                out[r] += _undominated(k, g, pos, d, opts, held[r], limit)
    count = sum(len(e) for e in out)
    if count > MAX_SLOT_VARS:
        raise TooLargeError(f"the slot model would have {count} stage variables (limit "
                            f"{MAX_SLOT_VARS}); use the DP")
    return out


def _undominated(k, g, pos, d, opts, held, limit) -> list[SlotEntry]:
    lat, it, cap = opts.latency[d], opts.iteration[d], opts.capacity[d]
    ok = np.flatnonzero(np.isfinite(lat) & (cap >= held) & (lat <= limit * (1 + 1e-12)))
    ok = ok[np.lexsort((it[ok], lat[ok]))]
    out, best_it = [], math.inf
    for o in ok:
        if it[o] < best_it:
            best_it = it[o]
            out.append(SlotEntry(k, g, pos, d, int(o), float(lat[o]), float(it[o])))
    return out


@dataclass(frozen=True)
class SlotModel:
    """Handles of a built model."""

    entries: list[list[SlotEntry]]
    x: list[list[Any]]
    objective: Any
    levels: list[Any]
    bottleneck: Any


def build_model(be: Backend, table: StageTable, restrictions: GroupRestrictions | None,
                overlap: bool, upper: float = math.inf) -> SlotModel | None:
    """Variables, constraints and objective on ``be`` (None when no slot has an entry)."""
    depth = slot_depth(table, restrictions)
    entries = slot_entries(table, depth, upper)
    if not entries or not entries[0]:
        return None
    x = [[be.new_bool(f"x_{r}_{i}") for i in range(len(es))] for r, es in enumerate(entries)]
    active = [be.new_bool(f"active_{r}") for r in range(depth)]
    add_slots_fill_from_back(be, x, active)
    add_allowed_depths(be, restrictions, active)
    add_cover_layers(be, entries, x, table.layers)
    add_front_holds_embedding(be, entries, x, active)
    on = _groups_on(be, table, entries, x)
    add_island_blocks(be, table, on, depth)
    add_node_budget(be, table, entries, x)
    add_island_limits(be, table, restrictions, on, depth)
    links = add_links(be, table, restrictions, on, depth)
    objective, levels, bottleneck = add_objective(be, table, entries, x, links, overlap)
    return SlotModel(entries, x, objective, levels, bottleneck)


def add_allowed_depths(be: Backend, restrictions: GroupRestrictions | None, active) -> None:
    """The plan's stage count is one the user allows: with slots filled from the back, ``d``
    stages means slot ``d − 1`` active and slot ``d`` not, so a forbidden ``d`` pins them
    equal."""
    if restrictions is None or restrictions.depths is None:
        return
    for d in range(1, len(active) + 1):
        if d in restrictions.depths:
            continue
        if d < len(active):
            be.add(active[d - 1] - active[d] <= 0, f"depth_{d}_not_allowed")
        else:
            be.add(active[d - 1] <= 0, f"depth_{d}_not_allowed")


def add_slots_fill_from_back(be: Backend, x, active) -> None:
    """Each active slot runs exactly one entry; slots are used from the pipeline's end on."""
    be.add(active[0] == 1, "last_stage_exists")
    for r, xs in enumerate(x):
        be.add(be.total(xs) == active[r], f"one_entry_{r}")
        if r + 1 < len(x):
            be.add(active[r + 1] <= active[r], f"fill_from_back_{r}")


def add_cover_layers(be: Backend, entries, x, layers: int) -> None:
    """The slices' lengths add up to the model: every layer is covered exactly once."""
    be.add(be.total([e.length * v for es, xs in zip(entries, x) for e, v in zip(es, xs)])
           == layers, "cover_layers")


def add_front_holds_embedding(be: Backend, entries, x, active) -> None:
    """The front stage (the last active slot) holds the embedding, and only it."""
    for r, (es, xs) in enumerate(zip(entries, x)):
        front = be.total([v for e, v in zip(es, xs) if e.position in _FRONT])
        after = active[r + 1] if r + 1 < len(x) else 0
        be.add(front == active[r] - after, f"front_{r}")


def _groups_on(be: Backend, table: StageTable, entries, x) -> list[dict]:
    """Per slot: (island, group) -> expression, 1 when the slot runs that group."""
    out = []
    for es, xs in zip(entries, x):
        terms = defaultdict(list)
        for e, v in zip(es, xs):
            terms[(e.k, e.g)].append(v)
        out.append({key: be.total(vs) for key, vs in terms.items()})
    return out


def _island_on(on: dict, k: int, be: Backend):
    return be.total([v for (kk, _), v in on.items() if kk == k])


def add_island_blocks(be: Backend, table: StageTable, on, depth: int) -> None:
    """An island's stages are consecutive: its block starts (going from the back) once."""
    for k in range(len(table.islands)):
        starts = []
        for r in range(depth):
            here = _island_on(on[r], k, be)
            before = _island_on(on[r - 1], k, be) if r > 0 else 0
            s = be.new_bool(f"block_start_{r}_{k}")
            be.add(s >= here - before, f"block_start_{r}_{k}")
            starts.append(s)
        be.add(be.total(starts) <= 1, f"one_block_{k}")


def add_node_budget(be: Backend, table: StageTable, entries, x) -> None:
    """An island's groups fit in its nodes."""
    for k, isl in enumerate(table.islands):
        terms = [e.g * v for es, xs in zip(entries, x) for e, v in zip(es, xs) if e.k == k]
        if terms:
            be.add(be.total(terms) <= isl.nodes, f"nodes_{k}")


def add_island_limits(be: Backend, table: StageTable, r: GroupRestrictions | None, on,
                      depth: int) -> None:
    """``use_all`` and the budget on the used islands' rates (``used[k]`` >= any slot of k)."""
    big_k, names = len(table.islands), table.names()
    used = [be.new_bool(f"used_{k}") for k in range(big_k)]
    for k in range(big_k):
        for s in range(depth):
            be.add(used[k] >= _island_on(on[s], k, be), f"used_{k}_{s}")
        if table.use_all:
            be.add(be.total([_island_on(on[s], k, be) for s in range(depth)]) >= 1,
                   f"use_all_{k}")
    if r is not None and r.budget is not None:
        terms = [round(r.budget.rates[names[k]] * BUDGET_UNITS) * used[k] for k in range(big_k)]
        slack = big_k // 2 + 1  # per-term rounding, so a set exactly at the limit is kept
        be.add(be.total(terms) <= round(r.budget.limit * BUDGET_UNITS) + slack, "budget")


def add_links(be: Backend, table: StageTable, r: GroupRestrictions | None, on,
              depth: int) -> list[Any]:
    """Boundary time between slot ``s + 1`` (in front) and slot ``s``; banned island pairs
    never meet."""
    names = table.names()
    banned = set(r.banned_links) if r is not None else set()
    top = max([float(table.link_rate.max())] + [0.0])
    out = []
    for s in range(depth - 1):
        lk = be.new_value(f"link_{s}", be.coeff(top))
        for (kf, gf), front in on[s + 1].items():
            for (kb, gb), back in on[s].items():
                if (names[kf], names[kb]) in banned and kf != kb:
                    be.add(front + back <= 1, f"ban_{s}_{kf}_{gf}_{kb}_{gb}")
                    continue
                c = be.coeff(table.link(kf, gf, kb, gb))
                if c > 0:
                    be.add(lk >= c * (front + back - 1), f"link_{s}_{kf}_{gf}_{kb}_{gb}")
        out.append(lk)
    return out


def add_objective(be: Backend, table: StageTable, entries, x, links, overlap: bool) -> Any:
    """``(n − 1)·M + Σ τ + Σ link + V`` (overlap: ``Σ max(τ, link after)``)."""
    top = max([e.latency for es in entries for e in es] + [float(table.link_rate.max())])
    worst = be.coeff(top)
    taus = [be.total([be.coeff(e.latency) * v for e, v in zip(es, xs)])
            for es, xs in zip(entries, x)]
    its = [be.total([be.coeff(e.iteration) * v for e, v in zip(es, xs)])
           for es, xs in zip(entries, x)]
    top_it = be.coeff(max([e.iteration for es in entries for e in es] + [0.0]))
    v_max = be.new_value("iteration_max", top_it)
    be.add_max(v_max, its, "iteration_max")
    bottleneck = be.new_value("bottleneck", worst)
    levels = add_bottleneck_levels(be, entries, x, bottleneck)
    if not overlap:
        be.add_max(bottleneck, taus + links, "bottleneck")
        return ((table.n_micro - 1) * bottleneck + be.total(taus) + be.total(links) + v_max,
                levels, bottleneck)
    costs = []
    for s, tau in enumerate(taus):
        e_s = be.new_value(f"stage_cost_{s}", worst)  # eq. 9: the link behind overlapped
        be.add_max(e_s, [tau] + ([links[s - 1]] if s > 0 else []), f"overlap_{s}")
        costs.append(e_s)
    be.add_max(bottleneck, costs, "bottleneck")
    return (table.n_micro - 1) * bottleneck + be.total(costs) + v_max, levels, bottleneck


def bottleneck_thresholds(entries, levels: int = MAX_LEVELS) -> list[float]:
    """Up to ``levels`` latencies, spread evenly over the sorted distinct entry latencies."""
    values = np.unique([e.latency for es in entries for e in es])
    if values.size <= levels:
        return values.tolist()
    return values[np.linspace(0, values.size - 1, levels).round().astype(int)].tolist()


def add_bottleneck_levels(be: Backend, entries, x, bottleneck) -> list[Any]:
    """Valid cuts that tie the bottleneck to the slowest stage in the LP relaxation.

    ``z[j]`` = 1 when the bottleneck reaches threshold ``c[j]`` (``z`` decreasing in ``j``,
    ``M >= Σ (c[j] − c[j−1]) z[j]``); slot ``r`` may run an entry of latency ``>= c[j]`` only
    to the extent ``z[j]`` is on (``u[r, j] <= z[j]``, ``u[r, j]`` the slot's weight on such
    entries, built as a running sum so the model grows by slots × levels). Every plan
    satisfies them with ``z[j] = [max τ >= c[j]]``: they remove no plan, only the relaxation's
    habit of spreading a slow stage over fractional slots (``M`` then bounded by an average).
    """
    cuts = bottleneck_thresholds(entries)
    z = [be.new_bool(f"bottleneck_level_{j}") for j in range(len(cuts))]
    steps = [be.coeff(c) - (be.coeff(cuts[j - 1]) if j else 0) for j, c in enumerate(cuts)]
    be.add(bottleneck >= be.total([s * v for s, v in zip(steps, z)]), "bottleneck_levels")
    for j in range(1, len(z)):
        be.add(z[j] <= z[j - 1], f"levels_ordered_{j}")
    for r, (es, xs) in enumerate(zip(entries, x)):
        by_level = defaultdict(list)
        for e, v in zip(es, xs):
            by_level[int(np.searchsorted(cuts, e.latency, side="right")) - 1].append(v)
        above = None  # u[r, j + 1]
        for j in range(len(cuts) - 1, -1, -1):
            if above is None and not by_level.get(j):
                continue
            u = be.new_value(f"slot_level_{r}_{j}", 1)
            be.add(u == be.total(by_level.get(j, []) + ([above] if above is not None else [])),
                   f"slot_level_sum_{r}_{j}")  # the slot's weight on entries >= c[j]
            be.add(u <= z[j], f"slot_level_{r}_{j}")  # ... needs the bottleneck at c[j]
            above = u
    return z


def hint_values(model: SlotModel, stages) -> list[list[int]]:
    """0/1 values of ``x`` that encode ``stages`` (a plan to start from; absent entries: 0)."""
    wanted = {len(stages) - 1 - i: (s.k, s.nodes, s.end - s.start, s.option)
              for i, s in enumerate(stages)}
    return [[int(wanted.get(r) == (e.k, e.g, e.length, e.option)) for e in es]
            for r, es in enumerate(model.entries)]


def decode(table: StageTable, model: SlotModel, chosen: list[list[bool]]) -> tuple[GroupStage, ...]:
    """Stages front to back from the chosen slot entries."""
    picked = [next((e for e, on in zip(es, flags) if on), None)
              for es, flags in zip(model.entries, chosen)]
    slots = [e for e in picked if e is not None][::-1]  # slot P-1 (front) first
    held = in_flight_counts(len(slots), table.n_micro)
    out, start = [], 0
    for e, h in zip(slots, held):
        out.append(GroupStage(table.islands[e.k].name, e.k, e.g, start, start + e.length,
                              e.option, e.latency, e.iteration, h))
        start += e.length
    if start != table.layers:
        raise RuntimeError(f"decoded slots cover {start} of {table.layers} layers")  # a bug
    return tuple(out)
