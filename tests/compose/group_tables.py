"""Random node-group stage tables, written once for Hypothesis and for seeded hunts.

:func:`stage_table` builds a small table and its restrictions from a :class:`Draws` source:
:class:`HypothesisDraws` inside a property test (Hypothesis shrinks what fails),
:class:`SeededDraws` in parametrized tests and in ``scripts/hunt_group_dp.py`` (a seed names
every table, so a disagreement is reproduced by its seed alone). The binding helpers say whether
the drawn allowed depths and stage limit change the optimum (brute force decides).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol, Sequence

import numpy as np
from hypothesis import strategies as st

from solver.compose.groups.group_brute import compose_groups_brute
from solver.compose.stage_table import (UNLIMITED, GroupRestrictions, IslandSlots, Options,
                                        StageTable)
from solver.compose.table import Budget, Position

POSITIONS = list(Position)
CAPACITIES = (1, 2, 3, UNLIMITED)


class Draws(Protocol):
    """Where the random choices come from."""

    def integer(self, lo: int, hi: int) -> int:
        """An integer in ``[lo, hi]``."""

    def real(self, lo: float, hi: float) -> float:
        """A float in ``[lo, hi]``."""

    def pick(self, values: Sequence):
        """One of ``values``."""


class HypothesisDraws:
    """Draws of a Hypothesis ``@st.composite`` strategy (``draw`` is its first argument)."""

    def __init__(self, draw) -> None:
        self.draw = draw

    def integer(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, hi))

    def real(self, lo: float, hi: float) -> float:
        return self.draw(st.floats(lo, hi))

    def pick(self, values: Sequence):
        return self.draw(st.sampled_from(values))


class SeededDraws:
    """Draws of NumPy's PCG64 from one seed: table ``seed`` is the same on every machine."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def integer(self, lo: int, hi: int) -> int:
        return int(self.rng.integers(lo, hi + 1))

    def real(self, lo: float, hi: float) -> float:
        return float(self.rng.uniform(lo, hi))

    def pick(self, values: Sequence):
        return values[int(self.rng.integers(len(values)))]


def stage_table(src: Draws) -> tuple[StageTable, GroupRestrictions | None]:
    """A small random stage table and its restrictions: 1-3 islands of 1-3 nodes, 2-6 layers,
    several options with capacities and per-iteration times, links inside and between
    islands."""
    layers, n = src.integer(2, 6), src.integer(1, 6)
    big_k = src.integer(1, 3)
    islands, options = [], {}
    for k in range(big_k):
        nodes = src.integer(1, 3)
        groups = tuple(sorted({src.integer(1, nodes) for _ in range(src.integer(1, 3))}))
        islands.append(IslandSlots(f"i{k}", nodes, src.pick([1, 2]), groups))
        for g in groups:
            for pos in POSITIONS:
                rows = _rows(src, pos, layers, g)
                if rows:
                    options[(k, g, pos)] = Options.from_lists(layers, rows)
    rate = np.array([[src.pick([0.0, 0.5, 2.0]) for _ in range(big_k)] for _ in range(big_k)])
    table = StageTable(layers, n, tuple(islands), options, rate,
                       use_all=bool(src.integer(0, 1)) and big_k > 1)
    return table, restrictions(src, table)


def _rows(src: Draws, pos: Position, layers: int, g: int) -> dict:
    lengths = {Position.ONLY: [layers], Position.MIDDLE: range(1, layers - 1)}.get(
        pos, range(1, layers))
    rows = {}
    for d in lengths:
        if src.integer(0, 9) == 0:
            continue  # an entry that fits nowhere
        rows[d] = [(round(src.real(0.5, 2.0) * d / g, 3), src.pick([0.0, 0.25, 1.0, 2.0]),
                    src.pick(CAPACITIES)) for _ in range(src.integer(1, 3))]
    return rows


def most_stages(table: StageTable) -> int:
    """Most stages any plan of ``table`` can have (a layer and a group of nodes each)."""
    return min(table.layers, sum(i.nodes // min(i.groups) for i in table.islands))


def restrictions(src: Draws, table: StageTable) -> GroupRestrictions | None:
    """Bans, a budget, allowed depths and a stage limit, or None (half the draws).

    Allowed depths and the stage limit are drawn within the depths a plan of the table can
    have (``1..most_stages``), so they exclude plans the table allows: the share of draws in
    which they change the optimum is measured by :func:`binding` (reported by the tests and by
    ``scripts/hunt_group_dp.py``)."""
    names = table.names()
    if not src.integer(0, 1):
        return None
    bans = frozenset((a, b) for a in names for b in names
                     if a != b and src.integer(0, 3) == 0)
    budget = None
    if src.integer(0, 1):
        rates = {name: float(src.integer(0, 3)) for name in names}
        budget = Budget(rates, float(src.integer(0, 6)))
    top = most_stages(table)
    depths = None
    if src.integer(0, 2):  # two draws in three: one or two allowed depths
        depths = frozenset(src.integer(1, top) for _ in range(src.integer(1, 2)))
    limit = src.integer(1, top) if src.integer(0, 2) == 0 else None
    return GroupRestrictions(bans, limit, budget, depths)


def binding(table: StageTable, restr: GroupRestrictions | None, overlap: bool) -> dict:
    """Which of the depth restrictions change the brute-force optimum of ``table``.

    Returns
    -------
    dict
        ``depths``: dropping the allowed depths changes the optimum; ``top_depth``: dropping
        only the largest allowed depth does (a model that loses it answers differently);
        ``max_stages``: dropping the stage limit does. A restriction that is absent is False.
    """
    out = {"depths": False, "top_depth": False, "max_stages": False}
    if restr is None:
        return out
    base = compose_groups_brute(table, restr, overlap).objective
    if restr.depths is not None:
        out["depths"] = _differs(base, table, replace(restr, depths=None), overlap)
        fewer = restr.depths - {max(restr.depths)}
        out["top_depth"] = _differs(base, table, replace(restr, depths=fewer or frozenset({0})),
                                    overlap)
    if restr.max_stages is not None:
        out["max_stages"] = _differs(base, table, replace(restr, max_stages=None), overlap)
    return out


def _differs(base: float | None, table: StageTable, restr: GroupRestrictions,
             overlap: bool) -> bool:
    other = compose_groups_brute(table, restr, overlap).objective
    if base is None or other is None:
        return (base is None) != (other is None)
    return abs(base - other) > 1e-9 * max(base, other)


def seeded_problem(seed: int) -> tuple[StageTable, GroupRestrictions | None, bool, float]:
    """Table ``seed`` of the seeded family: the table, its restrictions, whether links overlap,
    and an incumbent slack in ``[1, 1.5]`` (a bar above the optimum for the bounded DP)."""
    src = SeededDraws(seed)
    table, restr = stage_table(src)
    return table, restr, bool(src.integer(0, 1)), src.real(1.0, 1.5)
