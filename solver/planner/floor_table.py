"""The floor stage table: proving an ``(n_micro, view)`` cannot beat a bar before pricing it.

Pricing a stage table (every slice length on every group size and position through the
parallelizer) is most of what a search costs, and a replica asked to beat its budget
(:func:`~solver.planner.search.plan_job` with ``upper``) usually finds nothing.
The floor table has the real table's structure — the same islands, group sizes, slice lengths
the rules allow, links, banned boundaries and depth limits — and one option per entry, priced
from :func:`~solver.planner.floors.kernel_floor` instead of the parallelizer:

* latency ``(d · c_g + [the stage holds the LM head] · h_g) / n`` for ``d`` layers on a group
  ``g`` whose layer and head floors per iteration are ``c_g`` and ``h_g``, the layer's GEMMs
  at the least time any of the group's layouts at the run's micro-batch gives them (a
  micro-batch of few sequences forces tensor parallelism on a large group, which narrows its
  GEMMs, and caps the rows of each); every option the parallelizer prices for that entry
  takes at least as long (``tests/planner/test_floor_table.py`` checks this premise on the
  cost model);
* per-iteration time 0 and unlimited micro-batches in flight (every real option costs
  ``v >= 0`` and holds at most what fits).

The composition objective ``T = (n − 1)·max(τ, c) + Σ τ + Σ c + max v`` is monotone in every
``τ`` and ``v``, and every plan of the real table is a plan of the floor table (capacities are
only relaxed, links are the same), so the floor table's optimum is at most the real one. When
the exact group DP proves that nothing in the floor table beats the bar, nothing in the real
table does: the cut is provably safe.
"""

from __future__ import annotations

import math

import numpy as np

from solver.compose.group_dp import beats
from solver.compose.result import TooLargeError
from solver.compose.stage_table import (UNLIMITED, GroupRestrictions, IslandSlots, Options,
                                        StageTable)
from solver.compose.table import Position
from solver.cost.configs import _layouts
from solver.cost.parallelizer import kernel_calibration
from solver.cost.stage import ModelSlice
from solver.planner.candidates import TableSpec
from solver.planner.floors import kernel_floor
from solver.planner.runs import PlanningRun
from solver.spec.domain import Island

__all__ = ["gemm_shapes", "floor_table", "floor_cuts"]


def _entry(lengths: list[int], layer: float, head: float, n: int,
           free: tuple[np.ndarray, np.ndarray]) -> Options:
    """One option per allowed length at the floor latency; ``free``: the shared (read-only)
    columns of no per-iteration time and no memory limit."""
    lat = np.full_like(free[0], np.inf)
    d = np.asarray(lengths)
    lat[d, 0] = (d * layer + head) / n
    return Options(lat, free[0], free[1])


def gemm_shapes(run: PlanningRun, group: Island) -> tuple[np.ndarray, np.ndarray]:
    """GEMM rows (a rank's tokens per micro-batch, ``b s / cp``) and tensor-parallel degree
    of every layout a stage on ``group`` may use at the run's micro-batch: every layout the
    parallelizer enumerates there (stages never pipeline inside, and the framework's and the
    user's limits only remove layouts)."""
    ctx = run.cache.context
    layouts = np.array(_layouts(ModelSlice(run.job.model, 1), group, ctx, run.features),
                       dtype=float).reshape(-1, 5)
    tp, cp, dp = layouts[:, 0], layouts[:, 1], layouts[:, 3]
    return (ctx.micro_batch // dp) * ctx.seq_len / cp, tp


def floor_table(run: PlanningRun, spec: TableSpec,
                rate: np.ndarray) -> StageTable | None:
    """The floor stage table of ``run`` under ``spec`` (None: no entry is allowed).

    ``rate``: the link rates between the run's islands, in their order
    (:func:`~solver.planner.search.link_rates`)."""
    job, layers, n = run.job, run.job.model.layers, run.n_micro
    calib = kernel_calibration(run.cache.parallelizer)
    slots: list[IslandSlots] = []
    options: dict[tuple[int, int, Position], Options] = {}
    kept: list[int] = []
    free = (np.zeros((layers + 1, 1)), np.full((layers + 1, 1), UNLIMITED, dtype=np.int64))
    for index, island in enumerate(run.islands.islands):
        name = island.name
        sizes = spec.groups[name] if spec.groups is not None else \
            run.cache.sizes(name, run.features)
        used = []
        for g in sizes:
            group = run.cache.group(name, g)
            layer, head = kernel_floor(job, group, g, calib, gemm_shapes(run, group))
            for pos in Position:
                lengths = spec.lengths(name, g, pos, layers)
                if lengths:
                    last = pos in (Position.LAST, Position.ONLY)
                    options[(len(slots), g, pos)] = _entry(lengths, layer,
                                                           head if last else 0.0, n, free)
                    used.append(g)
        if used:
            full = run.cache.islands[name]
            slots.append(IslandSlots(name, len(full.nodes), full.gpus_per_node,
                                     tuple(sorted(set(used)))))
            kept.append(index)
    if not slots:
        return None
    return StageTable(layers, n, tuple(slots), options, rate[np.ix_(kept, kept)])


def floor_cuts(run: PlanningRun, spec: TableSpec, restrictions: GroupRestrictions,
               rate: np.ndarray, bar: float) -> bool:
    """Whether the floor table proves that no plan of ``run`` under ``spec`` and
    ``restrictions`` beats ``bar`` seconds per iteration (provably safe; the module docstring
    says why). False when ``bar`` is infinite, or the table is too large for the group DP."""
    if not math.isfinite(bar):
        return False
    table = floor_table(run, spec, rate)
    if table is None:
        return True  # nothing is allowed, so nothing beats the bar
    try:
        return not beats(table, restrictions.among(set(table.names())), run.job.planner.overlap,
                         bar)
    except TooLargeError:
        return False
