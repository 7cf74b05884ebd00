"""The per-iteration data-parallel sync under Megatron-Core's interleaved schedule, chunk by
chunk (``forward_backward_pipelining_with_interleaving`` in ``megatron/core/pipeline_parallel/
schedules.py``, Megatron-LM at 8479eb3): a chunk's gradients are reduced once its last
backward is done, aligned over the pipeline ranks; its parameters are gathered from the start of
the chunk before it. Backward runs the last micro-batches' chunks in reverse, ``pp`` micro-batches
per chunk, so after chunk ``c``'s last backward ``c·pp`` chunk passes remain.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from solver.cost.efficiency import DEFAULT_CALIBRATION
from solver.cost.estimating.estimate import EstimateSetup, estimate
from solver.cost.stage import StageConfig
from solver.cost.sync import hide, hide_interleaved
from solver.planner.check.time_check_sync import by_chunks
from solver.spec.domain import Framework, Island, ModelSpec, Schedule
from solver.spec.loaders import load_catalog


def _one(x) -> float:
    return float(np.asarray(x).reshape(-1)[0])


def test_gradient_backlog_by_hand():
    """8 s of reduce-scatter over 4 chunks of 2 s, a micro-batch's backward of 1 s (0.25 s per
    chunk), pp 2. Chunk 3 finishes 3·2 chunk passes (1.5 s) before the end, chunk 2 1 s,
    chunk 1 0.5 s, chunk 0 at the end: the link still has 8 - 1.5, 6 - 1, 4 - 0.5, 2 s to go
    then; 6.5 s are exposed."""
    out = hide_interleaved(np.array(8.0), np.array(1.0), np.array(4.0), 4, np.array(2), False)
    assert _one(out) == pytest.approx(6.5)
    assert by_chunks(8.0, 1.0, 4.0, 4, 2, False) == pytest.approx(6.5)


def test_a_short_sync_leaves_only_the_last_chunk():
    """1 s over 4 chunks behind 4 s of backward: every chunk but the last hides; the last one's
    0.25 s starts after its backward (the schedule launches it then). A parameter gather of
    the same size is waited for bucket by bucket over the chunk's 1 s forward, 8 buckets (2 per
    chunk): half of 0.25 s hides."""
    args = (np.array(1.0), np.array(4.0), np.array(8.0), 4, np.array(2))
    assert _one(hide_interleaved(*args, False)) == pytest.approx(0.25)
    assert _one(hide_interleaved(*args, True)) == pytest.approx(0.125)
    assert by_chunks(1.0, 4.0, 8.0, 4, 2, True) == pytest.approx(0.125)


def test_one_chunk_is_the_plain_rule():
    """With one chunk the backlog is the whole sync and the bucketed part is :func:`hide`."""
    comm, work, nb = np.array(3.0), np.array(2.0), np.array(5.0)
    assert _one(hide_interleaved(comm, work, nb, 1, np.array(4), True)) == _one(
        hide(comm, work, nb))


def test_validator_restates_it():
    """The validator's ``by_chunks`` (a maximum over every chunk) equals the cost model's
    closed form (the two ends of a linear function of the chunk) on seeded random inputs."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        comm, work = rng.uniform(0.01, 10.0, 2)
        nb, v, pp = int(rng.integers(1, 40)), int(rng.integers(2, 24)), int(rng.integers(1, 17))
        for bucketed in (False, True):
            model = _one(hide_interleaved(np.array(comm), np.array(work), np.array(float(nb)),
                                          v, np.array(pp), bucketed))
            assert by_chunks(comm, work, nb, v, pp, bucketed) == pytest.approx(model, rel=1e-12)


def test_interleaving_hides_what_one_chunk_exposed():
    """GPT 314B's layout on H100 (tp 8, pp 8, dp 48; Megatron-LM's table): with 12 chunks per
    rank the gradient and parameter syncs (about 0.5 s) hide behind the chunks before the last;
    priced as one chunk's worth of window they were exposed (0.46 s)."""
    gpu = load_catalog()["H100-SXM-80GB"]
    model = ModelSpec("gpt-314b", layers=96, hidden=16384, ffn=65536, heads=128, kv_heads=128,
                      vocab=131072, gated_mlp=False, tied_embeddings=False)
    island = Island.homogeneous("h100", gpu, 3072, 8, 400.0)
    setup = EstimateSetup(model, island, 1536, 4096,
                          StageConfig(tp=8, pp=8, dp=48, zero=1, micro_batch=1),
                          schedule=Schedule.INTERLEAVED, virtual_stages=12,
                          framework=Framework.MEGATRON_CORE)
    chunked = estimate(setup, DEFAULT_CALIBRATION).breakdown.dp_comm
    plain = estimate(dataclasses.replace(setup, schedule=Schedule.ONE_F_ONE_B, virtual_stages=1),
                     DEFAULT_CALIBRATION).breakdown.dp_comm
    assert chunked < 0.25 * plain
