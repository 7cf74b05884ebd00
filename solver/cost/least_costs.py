"""The least a stage can cost over a group's layouts: the cost model's own floors.

:mod:`solver.planner.bounds.floor_table` prices its entries from these instead of from every
configuration: the least per-micro-batch latency of one layer, the LM head and the embedding
(:func:`least_latencies`), and per slice length the least per-iteration time
(:func:`least_iterations`). Both read :mod:`solver.cost.stage_costs`' sums term by term, which
is why every configuration's stage takes at least as long
(``tests/cost/test_least_latencies.py``).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from solver.cost.a2a_overlap import a2a_overlap_hidden
from solver.cost.efficiency import DEFAULT_CALIBRATION, Calibration
from solver.cost.runtime.frameworks import Runtime
from solver.cost.stage import ConfigArrays
from solver.cost.stage_costs import _time_inputs
from solver.cost.sync import _zero_and_sync
from solver.cost.timing import embedding_times, head_times, layer_times, tokens_per_gpu
from solver.spec.domain import Island, ModelSpec

__all__ = ["a2a_ceiling", "layer_latencies", "least_latencies", "least_iterations"]


def layer_latencies(model: ModelSpec, island: Island, seq_len: int, cfg: ConfigArrays,
                    calib: Calibration = DEFAULT_CALIBRATION,
                    runtime: Runtime = Runtime()) -> np.ndarray:
    """Per configuration of ``cfg``, the per-micro-batch seconds, forward and backward, of one
    layer without recomputation: no sub-stage of ``d`` layers under that layout (internal
    pipeline stage or not, any recomputation) is faster than ``d`` times it
    (:func:`least_latencies`)."""
    ti, plain = _without_recomputation(model, island, seq_len, cfg, calib, runtime)
    return _overlapped_layer(ti, plain)


def a2a_ceiling(model: ModelSpec, island: Island, seq_len: int, cfg: ConfigArrays,
                calib: Calibration = DEFAULT_CALIBRATION,
                runtime: Runtime = Runtime()) -> np.ndarray:
    """Per configuration, the most the MoE all-to-all overlap can hide per layer and
    micro-batch: its four all-to-alls (:mod:`solver.cost.a2a_overlap`, ``H <= 4 e``), the same
    for every recomputation and chunk count of the layout (0 for a dense model)."""
    ti, plain = _without_recomputation(model, island, seq_len, cfg, calib, runtime)
    return 2.0 * layer_times(ti, plain)[0].ep


def _overlapped_layer(ti, cfg: ConfigArrays) -> np.ndarray:
    """One layer's forward plus backward seconds, less what the MoE all-to-all overlap hides
    where a row has it (:mod:`solver.cost.a2a_overlap`: the layer pair's period, which only
    grows with recomputation)."""
    fwd, bwd = layer_times(ti, cfg)
    n = tokens_per_gpu(cfg, ti.seq_len)
    return fwd.total + bwd.total - a2a_overlap_hidden(ti, cfg, n, fwd, bwd)


def _without_recomputation(model: ModelSpec, island: Island, seq_len: int, cfg: ConfigArrays,
                           calib: Calibration, runtime: Runtime):
    """The timing inputs of ``island`` and ``cfg`` with recomputation set to none."""
    return (_time_inputs(model, island, seq_len, calib, runtime),
            dataclasses.replace(cfg, recompute=np.zeros_like(np.asarray(cfg.recompute))))


def least_latencies(model: ModelSpec, island: Island, seq_len: int, cfg: ConfigArrays,
                    calib: Calibration = DEFAULT_CALIBRATION,
                    runtime: Runtime = Runtime()) -> tuple[float, float, float]:
    """Least per-micro-batch seconds, forward and backward, of one layer, of the LM head and
    of the input embedding over the configurations ``cfg`` (their recomputation set to none).

    A stage without internal pipelining runs ``d`` layers, its embedding and head, in
    :func:`substage_costs`'s ``fwd.total + bwd.total``: ``d`` times the layer's components
    plus the embedding's and the head's, plus ZeRO, offload and point-to-point terms that are
    never negative; recomputation only adds (compute, TP and EP traffic, a third CP ring). So
    any configuration of these layouts takes at least ``d`` times the first value plus the
    others it holds; with the MoE all-to-all overlap, a layer's share is the overlapped pair's
    period. ``inf`` each when ``cfg`` is empty."""
    if len(cfg) == 0:
        return math.inf, math.inf, math.inf
    ti, plain = _without_recomputation(model, island, seq_len, cfg, calib, runtime)
    return (float(np.min(_overlapped_layer(ti, plain))),
            *(float(np.min(f.total + b.total))
              for f, b in (head_times(ti, plain), embedding_times(ti, plain))))


def least_iterations(model: ModelSpec, island: Island, seq_len: int, cfg: ConfigArrays,
                     lengths: np.ndarray, has_embedding: bool | np.ndarray,
                     has_head: bool | np.ndarray,
                     calib: Calibration = DEFAULT_CALIBRATION,
                     runtime: Runtime = Runtime()) -> np.ndarray:
    """Per length, the least per-iteration seconds (exposed gradient sync and optimizer step)
    of a stage without internal pipelining over the configurations ``cfg`` (their ZeRO stages
    as given; recomputation and offload at any setting). ``has_embedding`` and ``has_head``:
    one flag for every length, or one per length (several positions priced in one call, each
    value as when priced alone).

    :func:`substage_costs` hides the sync behind the pass's compute (:func:`~solver.cost.sync.
    hide`, non-increasing in that window), and recomputation only lengthens the backward
    window, so each configuration is evaluated with full recomputation's backward window and
    no recomputation's forward one: no setting of either exposes less. ``inf`` when ``cfg`` is
    empty."""
    lengths = np.asarray(lengths)
    m = len(cfg)
    if m == 0:
        return np.full(lengths.shape, math.inf)
    ti = _time_inputs(model, island, seq_len, calib, runtime)
    rows = np.tile(np.arange(m), lengths.size)  # configuration of each (length, config) row
    d = np.repeat(lengths, m).astype(float)
    emb, head = (np.repeat(np.broadcast_to(np.asarray(flag), lengths.shape), m)
                 for flag in (has_embedding, has_head))
    codes = np.asarray(cfg.recompute)
    # The per-micro-batch times depend on the configuration, not the length: once per
    # configuration, then spread over the lengths (the same sums as for every row).
    lf, _ = layer_times(ti, dataclasses.replace(cfg, recompute=np.zeros_like(codes)))
    _, lb = layer_times(ti, dataclasses.replace(cfg, recompute=np.full_like(codes, 2)))
    (ef, eb), (hf, hb) = embedding_times(ti, cfg), head_times(ti, cfg)

    def per_row(x) -> np.ndarray:
        return np.broadcast_to(x, (m,))[rows]

    def work(layer: float, embedding: float, lm_head: float) -> np.ndarray:
        return per_row(layer) * d + per_row(embedding) * emb + per_row(lm_head) * head
    fwd = work(lf.compute, ef.compute, hf.compute)
    bwd = work(lb.compute, eb.compute, hb.compute) + work(lb.recompute, eb.recompute,
                                                          hb.recompute)
    _, _, dp_s, optimizer = _zero_and_sync(ti, cfg.take(rows), d, emb, head, fwd, bwd)
    return (dp_s + optimizer).reshape(lengths.size, m).min(axis=1)
