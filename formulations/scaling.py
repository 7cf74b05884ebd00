"""The one place where float seconds become integers for CP-SAT.

CP-SAT only takes integer coefficients, so every latency and link time ``v`` is replaced by
``round(v · s)`` with ``s = SCALE_TARGET / v_max`` (``v_max`` the largest finite entry of the
table): the largest entry maps to ``SCALE_TARGET`` and each entry is off by at most ``0.5 / s``
seconds after unscaling.

Tolerance (stated, and checked by the tests). ``T`` is a non-negative combination of entries
with total weight at most ``W = (n - 1) + 2K - 1`` (the bottleneck counted ``n - 1`` times, at
most ``K`` stages and ``K - 1`` links summed; with overlap at most ``(n - 1) + K``). So for every
plan ``|T_true - T_scaled / s| <= W · 0.5 / s``, and the plan CP-SAT proves optimal for the
rounded data is within ``2 · W · 0.5 / s = W · v_max / SCALE_TARGET`` of the true optimum:

    T(CP-SAT plan) - T_opt <= objective_tolerance(table)

Relative to ``T_opt >= n · v_min`` (``v_min`` the smallest positive entry any plan must use) this
is about ``(1 + 2K/n) · (v_max / v_min) · 1e-6``: negligible for realistic tables.
"""

from __future__ import annotations

import math

from solver.compose.table import LatencyTable

SCALE_TARGET = 1_000_000  # the largest entry maps to this many units


def max_entry(table: LatencyTable) -> float:
    """Largest finite latency or link time of the table (0 for an all-zero table)."""
    values = [v for rows in table.latency.values() for row in rows.values() for v in row
              if v is not None]
    values += list(table.link.values())
    return max(values, default=0.0)


def scale_factor(table: LatencyTable) -> float:
    """Units per second: ``SCALE_TARGET / v_max`` (1 when every entry is 0)."""
    top = max_entry(table)
    return SCALE_TARGET / top if top > 0 else 1.0


def to_units(seconds: float, scale: float) -> int:
    """An entry in integer units (round half to even; error <= 0.5 unit)."""
    return int(round(seconds * scale))


def to_seconds(units: float, scale: float) -> float:
    """Integer units back to seconds."""
    return units / scale


def objective_weight(table: LatencyTable, overlap: bool = False) -> int:
    """Largest total weight ``W`` of entries in ``T``: ``(n-1) + 2K-1`` (``(n-1) + K`` overlapped)."""
    big_k = len(table.islands)
    return (table.n_micro - 1) + (big_k if overlap else 2 * big_k - 1)


def objective_tolerance(table: LatencyTable, overlap: bool = False) -> float:
    """Absolute bound (seconds) on ``T(CP-SAT plan) - T_opt`` caused by rounding.

    Equal to ``W · v_max / SCALE_TARGET``; see the module docstring for the derivation.
    """
    return objective_weight(table, overlap) * max_entry(table) / SCALE_TARGET


def relative_tolerance(table: LatencyTable, optimum: float, overlap: bool = False) -> float:
    """:func:`objective_tolerance` relative to a known optimum (inf when the optimum is 0)."""
    tol = objective_tolerance(table, overlap)
    if optimum <= 0:
        return 0.0 if tol == 0 else math.inf
    return tol / optimum


# Island merging (formulations/island_merge.py) scales hardware figures, not seconds: TFLOP/s and
# GB become integers in hundredths. Catalog figures have at most two decimals (perf factors give
# more), so each value is off by at most 0.005 units of 100 — a relative error below 1e-5 for any
# GPU above 1 TFLOP/s or 1 GB, far inside the 20% similarity and 10% merge thresholds it is
# compared against.
UNITS_PER_TFLOP = 100.0
