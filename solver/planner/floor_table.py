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
from dataclasses import replace

import numpy as np

from solver.compose.group_dp import beats
from solver.compose.result import TooLargeError
from solver.compose.stage_table import (UNLIMITED, GroupRestrictions, IslandSlots, Options,
                                        StageTable)
from solver.compose.table import Position
from solver.cost.configs import _layouts
from solver.cost.parallelizer import kernel_calibration, stage_calibration
from solver.cost.stage import ConfigArrays, ModelSlice
from solver.cost.stage_costs import least_latencies
from solver.planner.candidates import TableSpec
from solver.planner.floors import kernel_floor
from solver.planner.runs import PlanningRun
from solver.spec.domain import Island

__all__ = ["gemm_shapes", "floor_table", "floor_cuts"]

ROUNDING = 1e-9  # relative margin below the cost model's own sums


def _entry(lengths: list[int], floors: list[tuple[float, float]],
           free: tuple[np.ndarray, np.ndarray]) -> Options:
    """One option per allowed length at the floor latency, the largest of ``d · a + b`` over
    the floors ``(a, b)`` (per layer, and for what else the stage holds); ``free``: the shared
    (read-only) columns of no per-iteration time and no memory limit."""
    lat = np.full_like(free[0], np.inf)
    d = np.asarray(lengths)
    lat[d, 0] = np.max([d * a + b for a, b in floors], axis=0)
    return Options(lat, free[0], free[1])


def _group_floors(run: PlanningRun, group: Island, nodes: int
                  ) -> tuple[tuple[float, float], tuple[float, ...] | None]:
    """Per micro-batch on ``group``: the kernel floor of a layer and of the LM head, and the
    cost model's least latencies of a layer, the head and the embedding over the group's
    layouts (None where the parallelizer is not priced by the cost model). They depend on the
    micro-batch, not on ``n_micro``: a parallelizer that remembers (the replica search's
    memo) keeps them for every share and ``n_micro`` of that micro-batch."""
    remember = getattr(run.cache.parallelizer, "remember", None)
    if remember is None:
        return _price_group_floors(run, group, nodes)
    key = ("floors", replace(run.cache.context, n_micro=0), run.features)
    return remember(key, group, lambda: _price_group_floors(run, group, nodes))


def _price_group_floors(run: PlanningRun, group: Island, nodes: int
                        ) -> tuple[tuple[float, float], tuple[float, ...] | None]:
    """:func:`_group_floors`, computed."""
    ctx, n, job = run.cache.context, run.n_micro, run.job
    shapes = gemm_shapes(run, group)
    layer, head = kernel_floor(job, group, nodes, kernel_calibration(run.cache.parallelizer),
                               shapes)
    calib = stage_calibration(run.cache.parallelizer)
    if calib is None:
        return (layer / n, head / n), None
    layouts = np.array(_layouts(ModelSlice(job.model, 1), group, ctx, run.features),
                       dtype=np.int64).reshape(-1, 5)
    tp, cp, _, dp, ep = layouts.T
    zeros = np.zeros_like(tp)
    cfg = ConfigArrays(tp=tp, cp=cp, ep=ep, pp=np.ones_like(tp), dp=dp, zero=zeros,
                       recompute=zeros, offload=zeros.astype(bool),
                       micro_batch=ctx.micro_batch // np.maximum(dp, 1))
    least = least_latencies(job.model, group, ctx.seq_len, cfg, calib, ctx.runtime)
    # The stage sums the same terms in another order: a margin far above rounding keeps the
    # floor below every option.
    return (layer / n, head / n), tuple(x * (1 - ROUNDING) for x in least)


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
    layers, n = run.job.model.layers, run.n_micro
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
            (layer, head), least = _group_floors(run, run.cache.group(name, g), g)
            for pos in Position:
                lengths = spec.lengths(name, g, pos, layers)
                if lengths:
                    first = pos in (Position.FIRST, Position.ONLY)
                    last = pos in (Position.LAST, Position.ONLY)
                    floors = [(layer, head * last)]
                    if least is not None:
                        floors.append((least[0], least[1] * last + least[2] * first))
                    options[(len(slots), g, pos)] = _entry(lengths, floors, free)
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
