"""Brute force over node-group plans: the ground truth for tiny stage tables.

Enumerates every ordered subset of islands, every ordered sequence of group sizes per island
that fits its nodes, every composition of the layers over the resulting stages and, per plan,
every per-iteration cap among its options' values (at a fixed cap each stage takes its fastest
option within it, which minimizes both the bottleneck and the sum). Exact by construction.
"""

from __future__ import annotations

import itertools
import math
from time import perf_counter

from solver.compose.result import TooLargeError
from solver.compose.stage_table import (GroupRestrictions, GroupResult, GroupStage, StageTable,
                                        group_objective, in_flight_counts)
from solver.compose.table import slice_position

BRUTE_LIMIT = 300_000  # structural plans (island order, groups, cuts)


def _group_sequences(sizes: tuple[int, ...], nodes: int, most: int):
    """Ordered sequences of group sizes with sum <= nodes and length 1..most."""
    for q in range(1, most + 1):
        for seq in itertools.product(sizes, repeat=q):
            if sum(seq) <= nodes:
                yield seq


def _structures(table: StageTable, depth: int):
    big_k = len(table.islands)
    for m in range(big_k if table.use_all else 1, big_k + 1):
        for order in itertools.permutations(range(big_k), m):
            per = [list(_group_sequences(table.islands[k].groups, table.islands[k].nodes, depth))
                   for k in order]
            for combo in itertools.product(*per):
                stages = [(k, g) for k, seq in zip(order, combo) for g in seq]
                if len(stages) <= min(depth, table.layers):
                    yield order, stages


def _best_options(table: StageTable, plan: list, overlap: bool):
    """Least ``T`` of one structural plan over its options, or None."""
    held = in_flight_counts(len(plan), table.n_micro)
    choices = []
    for (k, g, a, b), h in zip(plan, held):
        key = (k, g, slice_position(a, b, table.layers))
        if key not in table.options:
            return None
        o = table.options[key]
        col = [(float(o.latency[b - a, i]), float(o.iteration[b - a, i]), i)
               for i in range(o.latency.shape[1])
               if math.isfinite(o.latency[b - a, i]) and o.capacity[b - a, i] >= h]
        if not col:
            return None
        choices.append(col)
    best = None
    for vcap in sorted({it for col in choices for _, it, _ in col}):
        picked = []
        for col in choices:
            within = [c for c in col if c[1] <= vcap]
            if not within:
                break
            picked.append(min(within))
        else:
            stages = tuple(GroupStage(table.islands[k].name, k, g, a, b, i, lat, it, h)
                           for (k, g, a, b), (lat, it, i), h in zip(plan, picked, held))
            t = group_objective(table, stages, overlap)[0]
            if best is None or t < best[0]:
                best = (t, stages)
    return best


def compose_groups_brute(table: StageTable, restrictions: GroupRestrictions | None = None,
                         overlap: bool = False) -> GroupResult:
    """Optimal node-group composition by enumeration (tiny tables only).

    Raises
    ------
    TooLargeError
        More than ``BRUTE_LIMIT`` structural plans.
    """
    t0 = perf_counter()
    r = restrictions or GroupRestrictions()
    depth = r.depth_bound(table.layers)
    names = table.names()
    count, best = 0, None
    for order, stages in _structures(table, depth):
        if any((names[a], names[b]) in r.banned_links for a, b in zip(order, order[1:])):
            continue
        if r.budget is not None and not r.budget.allows([names[k] for k in order]):
            continue
        if not r.allows_depth(len(stages)):
            continue
        for cuts in itertools.combinations(range(1, table.layers), len(stages) - 1):
            count += 1
            if count > BRUTE_LIMIT:
                raise TooLargeError(f"brute force would enumerate more than {BRUTE_LIMIT} plans")
            bounds = (0, *cuts, table.layers)
            plan = [(k, g, a, b) for (k, g), a, b in zip(stages, bounds, bounds[1:])]
            found = _best_options(table, plan, overlap)
            if found is not None and (best is None or found[0] < best[0]):
                best = found
    elapsed = perf_counter() - t0
    if best is None:
        return GroupResult((), None, "brute", False, "infeasible", elapsed)
    return GroupResult(best[1], best[0], "brute", True, "optimal", elapsed, best[0], 0.0)
