"""The one tie rule of pipeline composition, shared by every solver.

Several plans can reach the optimal ``T`` (the shipped ``counterexample_recurrence`` table has
three). Every composition solver returns the same one:

1. the least ``T``;
2. among those, the smallest bottleneck (the largest stage latency or link time);
3. among those, the plan whose stages, compared **from the last stage back to the first**, have
   the lowest island index (the island's position in the table), then the earliest start
   layer, at the first stage where they differ.

Rule 3 reads the pipeline from its tail because that is the order in which the exact DP
reconstructs a plan (:meth:`solver.compose.dpcore.DPCore.backtrack` keeps every tied state and
takes the smallest stage at each step back). Brute force applies the rule by sorting every plan
by :func:`tie_key`; CP-SAT and MILP prove the optimal ``T`` themselves and their plan is then
replaced by the canonical plan of that ``T``
(:func:`solver.compose.dp.canonical_result`). Ties are equal ``T`` as computed in floating
point: on tables of integers (the shipped counterexamples, the tests) that is exact equality.
"""

from __future__ import annotations

from typing import Sequence


def tie_key(bottleneck: float, stages: Sequence[tuple[int, int]]) -> tuple:
    """Sort key of rules 2 and 3 for a plan of ``T``-equal plans (smaller wins).

    Parameters
    ----------
    bottleneck : float
        The plan's largest stage latency or link time.
    stages : Sequence[tuple[int, int]]
        ``(island index, start layer)`` of every stage in pipeline order.
    """
    return bottleneck, tuple(reversed(list(stages)))
