"""Reference composers: the brute-force enumerator (ground truth for tests) and the paper's DP.

:func:`compose_brute` enumerates every ordered subset of islands and every composition of the
layers; it is exact by construction and only meant for tiny tables. :func:`compose_paper_recurrence`
reproduces Algorithm 2 of the seed note (eq. 8) as printed, to exhibit where it is not exact.
"""

from __future__ import annotations

import itertools
import math
from time import perf_counter
from typing import Sequence

import numpy as np

from solver.compose.result import (
    CompositionResult,
    SolveStatus,
    TooLargeError,
    infeasible_result,
    make_stages,
    objective_of,
    optimal_result,
)
from solver.compose.table import (
    LatencyTable,
    Restrictions,
    dense_arrays,
    position_index,
)
from solver.compose.ties import tie_key

BRUTE_LIMIT = 200_000  # plans enumerated; about a second of pure Python


def brute_plan_count(islands: int, layers: int, use_all: bool = False) -> int:
    """Number of (ordered island subset, composition) pairs the enumerator visits."""
    sizes = [islands] if use_all else range(1, islands + 1)
    return sum(math.perm(islands, m) * math.comb(layers - 1, m - 1) for m in sizes if m <= layers)


def compose_brute(table: LatencyTable, restrictions: Restrictions | None = None,
                  overlap: bool = False) -> CompositionResult:
    """Optimal composition by enumerating every plan (tiny tables only).

    Ties follow the rule of :mod:`solver.compose.ties`, applied here by its sort key
    (:func:`~solver.compose.ties.tie_key`) over every enumerated plan: an independent check of
    the DP's frontier backtracking.

    Raises
    ------
    TooLargeError
        When more than ``BRUTE_LIMIT`` plans would be enumerated.
    """
    t0 = perf_counter()
    big_k, big_l = len(table.islands), table.layers
    count = brute_plan_count(big_k, big_l, table.use_all)
    if count > BRUTE_LIMIT:
        raise TooLargeError(f"brute force would enumerate {count} plans (limit {BRUTE_LIMIT}); "
                            "use the DP")
    tau, link = dense_arrays(table, restrictions)
    best_key, best_plan = (math.inf,), None
    limit = restrictions.max_stages if restrictions is not None else None
    budget = restrictions.budget if restrictions is not None else None
    for seq, cuts in _plans(big_k, big_l, table.use_all):
        if limit is not None and len(seq) > limit:
            continue
        if budget is not None and not budget.allows([table.islands[k] for k in seq]):
            continue
        t, m = _plan_time(tau, link, seq, cuts, table.n_micro, overlap)
        if math.isfinite(t):
            key = (t, *tie_key(m, [(k, a) for k, a in zip(seq, cuts)]))
            if key < best_key:
                best_key, best_plan = key, (seq, cuts)
    if best_plan is None:
        return infeasible_result("brute", perf_counter() - t0)
    seq, cuts = best_plan
    stages = make_stages(table, [(table.islands[k], a, b) for k, a, b in zip(seq, cuts, cuts[1:])])
    return optimal_result(table, stages, "brute", perf_counter() - t0, overlap)


def _plans(big_k: int, big_l: int, use_all: bool):
    """(island sequence, boundaries 0 = b0 < b1 < ... < bm = L) in lexicographic order."""
    for m in ([big_k] if use_all else range(1, big_k + 1)):
        if m > big_l:
            break
        for seq in itertools.permutations(range(big_k), m):
            for inner in itertools.combinations(range(1, big_l), m - 1):
                yield seq, (0, *inner, big_l)


def _plan_time(tau: np.ndarray, link: np.ndarray, seq: tuple, cuts: tuple, n_micro: int,
               overlap: bool) -> tuple[float, float]:
    """``T`` and the bottleneck of one plan from the dense (masked) arrays; inf when an entry
    is infeasible."""
    big_l = cuts[-1]
    taus = [float(tau[k, position_index(a, b, big_l), b - a]) for k, a, b in zip(seq, cuts, cuts[1:])]
    links = [float(link[a, b]) for a, b in zip(seq, seq[1:])]
    costs = [max(t, c) for t, c in zip(taus, links + [0.0])] if overlap else taus + links
    if not all(math.isfinite(c) for c in costs):
        return math.inf, math.inf
    return (n_micro - 1) * max(costs) + sum(costs), max(costs)


def compose_paper_recurrence(table: LatencyTable,
                             order: Sequence[str] | None = None) -> CompositionResult:
    """Algorithm 2 of the seed note (eq. 8) as printed — NOT exact; for comparison only.

    ``f[l][k]`` keeps a single (τ_max, τ_sum) pair: the one with the best throughput for layers
    ``[0, l)`` on the first ``k`` islands of ``order`` (every island used, in that order, each with
    a non-empty slice). Ties keep the first ``l'`` (the printed strict ``>``). Link times are not
    part of the recurrence (as printed); the reported objective is still the full ``T`` of the
    returned plan from :func:`~solver.compose.result.objective_of`. Latencies are position-aware,
    since a slice ``[l', l)`` determines its position.

    Parameters
    ----------
    table : LatencyTable
        The latency table (``use_all`` and links are ignored by the recurrence itself).
    order : sequence of str, optional
        Island order; defaults to ``table.islands``.
    """
    t0 = perf_counter()
    order = tuple(order or table.islands)
    big_l = table.layers
    state = _paper_states(table, order)
    if state[len(order)][big_l] is None:
        return infeasible_result("paper", perf_counter() - t0)
    cuts = [big_l]
    for k in range(len(order), 0, -1):
        cuts.append(state[k][cuts[-1]][3])
    cuts.reverse()
    stages = make_stages(table, list(zip(order, cuts, cuts[1:])))
    return CompositionResult(stages, objective_of(table, stages), "paper", False,
                             SolveStatus.FEASIBLE, perf_counter() - t0)


def _paper_states(table: LatencyTable, order: tuple[str, ...]) -> list[list[tuple | None]]:
    """The printed main loop: ``state[k][l] = (T, τ_max, τ_sum, l')``, None when unreachable."""
    big_l, n = table.layers, table.n_micro
    state: list[list[tuple | None]] = [[None] * (big_l + 1) for _ in range(len(order) + 1)]
    state[0][0] = (0.0, 0.0, 0.0, -1)
    for k, island in enumerate(order, start=1):
        for l in range(1, big_l + 1):
            for lp in range(l):
                prev, tau = state[k - 1][lp], table.tau(island, lp, l)
                if prev is None or tau is None:
                    continue
                t_max, t_sum = max(prev[1], tau), prev[2] + tau
                t = (n - 1) * t_max + t_sum
                # Only the single best (τ_max, τ_sum) pair survives: the step that loses exactness.
                if state[k][l] is None or t < state[k][l][0]:
                    state[k][l] = (t, t_max, t_sum, lp)
    return state
