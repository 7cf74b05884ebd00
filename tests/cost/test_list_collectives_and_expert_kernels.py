"""2021 DeepSpeed's list-based ZeRO-3 collectives (host work per rank) and the routed experts'
one GEMM kernel per expert.

Sources: DeepSpeed ``deepspeed/runtime/zero/partition_parameters.py`` before PR #1188
(``_allgather_param`` and ``_reduce_scatter_gradient`` pass ``world_size`` tensors to
``torch.distributed.all_gather`` / ``reduce_scatter``); PyTorch's ``ProcessGroupNCCL::allgather``
(copies each rank's output out of the flat buffer) and ``reduce_scatter``
(``flatten_for_scatter_gather``); Transformer Engine ``multi_stream_cublas_gemm``
(``transformer_engine/common/gemm/cublaslt_gemm.cu``: one cuBLAS GEMM per expert).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from solver.cost.efficiency import DEFAULT_CALIBRATION
from solver.cost.fidelity.fit import fit_list_collective
from solver.cost.runtime.frameworks import Runtime
from solver.cost.stage import ConfigArrays, ModelSlice, StageConfig
from solver.cost.stage_costs import PipelineSetting, _time_inputs, stage_costs
from solver.cost.sync import _zero_and_sync
from solver.cost.timing import _routed_gemm_fwd
from solver.planner.check.time_check import stage_seconds
from solver.spec.domain import Framework, Island, ModelSpec
from solver.spec.loaders import load_catalog

CAT = load_catalog()
SMALL = ModelSpec("small", layers=4, hidden=1024, ffn=4096, heads=16, kv_heads=16, vocab=32000,
                  gated_mlp=False)
MOE = ModelSpec("moe", layers=4, hidden=2048, ffn=6144, heads=32, kv_heads=4, vocab=151936,
                experts=128, top_k=8, expert_ffn=768, head_dim=128)
LIST = dataclasses.replace(DEFAULT_CALIBRATION, zero3_prefetch=False, zero3_list_collectives=True)


def test_list_collective_host_work_by_hand():
    """Two layers of a small dense model, DeepSpeed ZeRO-3 over 16 A100: 2 x 4 weight matrices
    + embedding + head = 10 collectives per pass, each building 16 per-rank tensors at 15 us:
    2.4 ms more on every gather pass and every reduce-scatter pass."""
    island = Island.homogeneous("a", CAT["A100-SXM-80GB"], 16)
    cfg = ConfigArrays.of([StageConfig(tp=1, dp=16, zero=3)])
    args = (cfg, np.array([2]), np.array([True]), np.array([True]), np.array([1.0]),
            np.array([1.0]))
    runtime = Runtime(Framework.DEEPSPEED, overlap=False)
    flat = _time_inputs(SMALL, island, 1024, dataclasses.replace(LIST,
                        zero3_list_collectives=False), runtime)
    listed = _time_inputs(SMALL, island, 1024, LIST, runtime)
    assert LIST.list_collective_rank_s == 15e-6
    fwd_flat, bwd_flat = (x[0] for x in _zero_and_sync(flat, *args)[:2])
    fwd_list, bwd_list = (x[0] for x in _zero_and_sync(listed, *args)[:2])
    assert fwd_list - fwd_flat == pytest.approx(10 * 16 * 15e-6, rel=1e-9)
    # Backward: one gather pass and one reduce-scatter pass (no recomputation here).
    assert bwd_list - bwd_flat == pytest.approx(2 * 10 * 16 * 15e-6, rel=1e-9)


def test_validator_agrees_on_list_collectives_of_experts():
    """The independent time check restates the host work of the experts' collectives too (a
    dense layout: ``test_validator_agrees_on_zero3``): 128 experts over EP 8, 64 A100."""
    island = Island.homogeneous("a", CAT["A100-SXM-80GB"], 64)
    runtime = Runtime(Framework.DEEPSPEED)
    c = StageConfig(tp=1, dp=64, ep=8, zero=3, micro_batch=2)
    costs = stage_costs(ModelSlice(MOE, 2, True, True), island, 1024, ConfigArrays.of([c]),
                        PipelineSetting(2, 1), LIST, runtime)
    subs, per_iter = stage_seconds(MOE, 1024, island, c, 2, True, True, calib=LIST,
                                   profile=runtime.profile)
    assert (subs[0], per_iter) == pytest.approx(
        (float(costs.latency_s[0]), float(costs.iteration_s[0])), rel=1e-9)


def test_fit_reproduces_the_constant():
    """``scripts/fit_list_collective.py`` finds the value the calibration carries, balancing
    the two rows the constant moves most (175B on 1,536 GPUs over, 530B on 2,240 under)."""
    rank_s, err, rows = fit_list_collective()
    assert rank_s == pytest.approx(DEFAULT_CALIBRATION.list_collective_rank_s, abs=0.05e-6)
    assert len(rows) == 4 and err < 0.15


def test_one_gemm_kernel_per_local_expert():
    """16 local experts (128 over EP 8) cost what 16 separate GEMMs of a sixteenth of the
    FLOPs each cost at the same per-expert shape: the FLOP time once, the fixed cost 16 times
    per projection. One local expert (EP 128) pays it once."""
    island = Island.homogeneous("g", CAT["GB200"], 128)
    ti = _time_inputs(MOE, island, 4096, dataclasses.replace(DEFAULT_CALIBRATION,
                      moe_capacity_factor=1.0), Runtime())
    n = np.array([16384.0])
    h, f = MOE.hidden, MOE.expert_ffn
    for ep in (8, 128):
        local = 128 // ep
        tokens = 16384 * 8 * ep / 128  # received routed copies per expert
        one = (ti.gemm.seconds(2 * tokens * h * 2 * f, tokens, 2 * f, h, ti.peak_flops)
               + ti.gemm.seconds(2 * tokens * h * f, tokens, h, f, ti.peak_flops))
        cfg = ConfigArrays.of([StageConfig(tp=1, dp=ep, ep=ep)])
        assert _routed_gemm_fwd(ti, cfg, n)[0] == pytest.approx(local * float(one), rel=1e-9)

