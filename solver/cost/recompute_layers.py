"""Partial recomputation in the search: the least number of layers a stage must recompute.

Megatron-Core's ``block`` method (``--recompute-granularity full --recompute-method block
--recompute-num-layers k``) checkpoints the first ``k`` layers of every pipeline rank (of every
virtual chunk) and runs the others unchanged (``megatron/core/recompute.py``,
``checkpointed_forward``; the field's meaning in ``megatron/core/transformer/
transformer_config.py``, ``TransformerConfig.recompute_num_layers``). It is one setting for the
job, so every rank of a one-mesh plan recomputes ``min(k, its layers)``. FlagScale sets method
and ``k`` per pipeline stage and micro-batch (``recompute_method_per_stage_micro_batch``, 1 =
block, and ``recompute_num_layers_per_stage_micro_batch``; parsed in
``flagscale/train/arguments.py``, ``FSTrainArguments.post_validate_args``, applied per rank in
its ``transformer_block.py`` patch, ``TransformerBlock.forward``); the planner uses one ``k``
per stage for all its micro-batches. A configuration carries it as
:attr:`~solver.cost.stage.StageConfig.recompute_layers`.

Pricing (:func:`~solver.cost.memory.stored_layer_bytes`, :func:`~solver.cost.timing.
layer_times`): each more recomputed layer saves :func:`~solver.cost.memory.recompute_saving`
bytes per micro-batch in flight and adds one layer's forward (compute, TP and EP traffic, the
CP ring) to every backward pass.

**Why only the least ``k`` that fits is searched.** Fix a stage's slice, layout, ZeRO stage
(0 or 1: what the runtimes with the block method run) and micro-batch, and the micro-batches
``h`` it holds in flight (its place in the 1F1B pipeline). Memory falls with ``k``, so every
``k`` at least the least fitting one, ``k_h``, fits. For ``k' > k``:

* the per-micro-batch latency grows by ``d >= 0``: the added backward work is the forward of
  ``k' - k`` more layers, and nothing in the pass shrinks (ZeRO ≤ 1 gathers nothing per pass);
* the per-iteration terms fall by at most ``(1 - 1/nb) d'``, ``d' <= d`` the added backward
  work: the gradient reduction hides behind the last backward pass but its last bucket
  (:mod:`solver.cost.stage_costs`);
* the iteration time ``(n - 1) max τ + Σ τ + Σ c + max(sync + step)`` therefore does not fall:
  ``Σ τ`` alone grows by ``d`` while the max of the per-iteration terms falls by less.

So at every ``h`` the plan with ``k_h`` is at least as fast as any with a larger ``k``, and the
candidates of a configuration are its ``k_h`` for ``h = 1..n_micro``: at most
``min(L - 1, n_micro)`` values beside none and full. ``tests/cost/test_recompute_layers.py``
checks the least ``k`` and the monotonicity by brute force over every ``k``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from solver.cost.efficiency import Calibration
from solver.cost.runtime.frameworks import Runtime, profile
from solver.cost.memory import recompute_saving
from solver.cost.stage import ConfigArrays
from solver.cost.stage_costs import (
    PipelineSetting,
    attention_fused,
    in_flight_of,
    island_substage_memory,
    light_middle,
    split_layers,
)
from solver.spec.domain import Framework, Island, ModelSpec, Schedule

__all__ = ["RECOMPUTE_LEVELS", "least_recompute_layers", "partial_recompute_allowed",
           "with_partial_recompute"]

#: In-flight counts whose least ``k`` the stage candidates carry, whatever the ``n_micro``
#: (the most micro-batches the planner searches, ``SHARED_MICRO`` of its memo): the candidates
#: then depend on ``n_micro`` only through their capacities' cap, as the memo needs
#: (:func:`~solver.cost.stage_options.shares_across_n`).
RECOMPUTE_LEVELS = 128


def _substages(layers, pp: np.ndarray, emb: bool, head: bool, pipe: PipelineSetting):
    """The sub-stages whose memory bounds a stage's (as :func:`~solver.cost.stage_costs.
    stage_costs` picks them): (layers, embedding, head, micro-batches held, present)."""
    first, second, last = split_layers(layers, pp)
    light, light_at, has_light = light_middle(layers, pp)
    only, no = pp == 1, np.zeros(np.shape(pp), dtype=bool)
    return [(first, np.asarray(emb), head & only, in_flight_of(pipe, pp, np.zeros_like(pp)),
             np.ones_like(only)),
            (second, no, no, in_flight_of(pipe, pp, np.ones_like(pp)), pp >= 3),
            (light, no, no, in_flight_of(pipe, pp, light_at), has_light),
            (last, no, np.asarray(head) & ~only, in_flight_of(pipe, pp, pp - 1), pp >= 2)]


def least_recompute_layers(model: ModelSpec, island: Island, seq_len: int, cfg: ConfigArrays,
                           layers, emb: bool, head: bool, pipe: PipelineSetting,
                           limit: float, calib: Calibration, runtime: Runtime) -> np.ndarray:
    """Per configuration (full recomputation of all layers, no offload), the least ``k`` whose
    block method keeps every sub-stage within ``limit`` bytes at ``pipe``'s in-flight count.

    A sub-stage of ``L`` layers holding ``h`` micro-batches needs
    ``L - floor((limit - M_full) / (h s))`` recomputed layers, ``M_full`` its memory with all
    recomputed and ``s`` :func:`~solver.cost.memory.recompute_saving`; the stage needs the
    largest over its sub-stages (a rank with fewer layers recomputes them all). Returns 0 where
    no recomputation is needed (memory without it fits), -1 where even full recomputation does
    not fit, and the least ``k >= 1`` otherwise (a ``k`` of at least the longest sub-stage's
    layers: only full recomputation fits). ``M_full`` holds one recomputed layer's working
    set, which no recomputation lacks: memory without it is ``M_full - working + L h s``, so
    0 is returned only where it fits (a ``k >= 1`` may come back where it fits too, by less
    than the working set; the search keeps the none row beside it anyway).
    """
    pp = np.asarray(cfg.pp)
    saving = recompute_saving(model, seq_len, cfg, attention_fused(island, calib, runtime),
                              calib.moe_capacity_factor)
    need = np.zeros(len(cfg), dtype=np.int64)
    fits = np.ones(len(cfg), dtype=bool)
    for count, e, h, held, present in _substages(layers, pp, emb, head, pipe):
        full = island_substage_memory(model, island, seq_len, cfg, count, e, h, held, calib,
                                      runtime).total
        room = limit - full
        with np.errstate(divide="ignore", invalid="ignore"):
            stored = np.floor(room / (saving * held) * (1.0 - 1e-12))
        k = np.where(saving * held > 0, count - np.minimum(stored, count), 0)
        need = np.where(present, np.maximum(need, k.astype(np.int64)), need)
        fits &= ~present | (room >= 0)
    return np.where(fits, np.maximum(need, 0), -1)


def partial_recompute_allowed(framework: Framework | None) -> bool:
    """Whether the search adds block-method rows for ``framework`` (its profile's
    ``recompute_layers``); never without a framework (priced as Megatron-Core but searched
    by the features alone, as before)."""
    return framework is not None and profile(framework).recompute_layers


def _affine(pipe: PipelineSetting, pp: np.ndarray) -> bool:
    """Whether every row is one sub-stage holding exactly its in-flight count (plain 1F1B, no
    cap below the levels): its memory is then affine in that count."""
    return bool(np.all(pp == 1)) and pipe.schedule is not Schedule.GPIPE and \
        (pipe.schedule is Schedule.ONE_F_ONE_B or pipe.virtual_stages == 1)


def _least_by_level(model: ModelSpec, island: Island, seq_len: int, cfg: ConfigArrays,
                    layers: np.ndarray, emb: bool, head: bool, pipe: PipelineSetting,
                    levels: np.ndarray, limit: float, calib: Calibration, runtime: Runtime
                    ) -> np.ndarray:
    """:func:`least_recompute_layers` at every in-flight count of ``levels`` (rows x levels).

    One sub-stage under plain 1F1B holds ``h`` micro-batches and its memory is affine in ``h``
    (:func:`~solver.cost.stage_costs.in_flight_capacity`): two evaluations price every level,
    by the same rule as :func:`least_recompute_layers` (which the tests hold it to)."""
    if not _affine(pipe, np.asarray(cfg.pp)) or levels.max() > pipe.n_micro:
        return np.column_stack([least_recompute_layers(
            model, island, seq_len, cfg, layers, emb, head,
            dataclasses.replace(pipe, in_flight=int(h)), limit, calib, runtime)
            for h in levels])
    one, two = (island_substage_memory(model, island, seq_len, cfg, layers, np.asarray(emb),
                                       np.asarray(head), np.asarray(float(h)), calib,
                                       runtime).total for h in (1, 2))
    h = levels[None, :].astype(float)
    room = limit - (one[:, None] + (h - 1.0) * (two - one)[:, None])
    saving = recompute_saving(model, seq_len, cfg, attention_fused(island, calib, runtime),
                              calib.moe_capacity_factor)[..., None] * h
    saving = np.broadcast_to(saving, room.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        stored = np.floor(room / saving * (1.0 - 1e-12))
    count = np.broadcast_to(np.asarray(layers)[..., None], room.shape)
    k = np.where(saving > 0, count - np.minimum(stored, count), 0).astype(np.int64)
    return np.where(room >= 0, np.maximum(k, 0), -1)


def with_partial_recompute(model: ModelSpec, island: Island, seq_len: int, cfg: ConfigArrays,
                           layers, emb: bool, head: bool, pipe: PipelineSetting,
                           levels: list[int], limit: float, calib: Calibration,
                           runtime: Runtime) -> tuple[ConfigArrays, np.ndarray]:
    """``cfg`` followed by its block-method rows, and for every row the index of the row of
    ``cfg`` it comes from.

    For every configuration with full recomputation of all layers (ZeRO ≤ 1, no offload) and
    every in-flight count ``h`` in ``levels``, the least ``k`` that fits at ``h``
    (:func:`least_recompute_layers`) when it is neither 0 (none fits) nor all the layers:
    the only block-method candidates worth searching (module docstring). ``layers`` is the
    slice length (a scalar, or one per row). Interleaved, ``k`` is rounded up to whole model
    chunks' worth (Megatron's ``recompute_num_layers`` counts the layers of one chunk).
    """
    n = len(cfg)
    layers_row = np.broadcast_to(np.asarray(layers), (n,))
    first, second, _ = split_layers(layers_row, np.asarray(cfg.pp))
    longest = np.maximum(first, second)
    base = np.flatnonzero((np.broadcast_to(cfg.recompute, (n,)) == 2)
                          & (np.broadcast_to(cfg.recompute_layers, (n,)) == 0)
                          & ~np.broadcast_to(cfg.offload, (n,))
                          & (np.broadcast_to(cfg.zero, (n,)) <= 1) & (longest >= 2))
    if base.size == 0 or not levels:
        return cfg, np.arange(n)
    k = _least_by_level(model, island, seq_len, cfg.take(base), layers_row[base], emb, head,
                        pipe, np.unique(np.asarray(levels)), limit, calib, runtime)
    if pipe.schedule is Schedule.INTERLEAVED and pipe.virtual_stages > 1:
        v = pipe.virtual_stages
        k = np.where(k >= 1, -(-k // v) * v, k)
    rows = np.broadcast_to(base[:, None], k.shape)
    ok = (k >= 1) & (k < longest[base][:, None])
    pairs = np.unique(np.column_stack([rows[ok], k[ok]]), axis=0)
    if pairs.size == 0:
        return cfg, np.arange(n)
    extra = dataclasses.replace(cfg.take(pairs[:, 0]), recompute_layers=pairs[:, 1])
    return cfg.joined(extra), np.concatenate([np.arange(n), pairs[:, 0]])
