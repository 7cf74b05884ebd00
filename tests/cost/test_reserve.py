"""Memory as the runtime allocates it: device bytes, the runtime's named reserves, the
allocator's fragmentation, and the user's margin, each against a value checked by hand."""

from __future__ import annotations

import dataclasses

import pytest

from solver.cost.estimating.estimate import EstimateSetup, estimate
from solver.cost.reserve import (CUDA_CONTEXT_BYTES, FRAGMENTATION, NCCL_COMMUNICATOR_BYTES,
                                 NCCL_LL128_BYTES, NCCL_LL_BYTES, NCCL_RESERVE_BYTES,
                                 NCCL_SIMPLE_BYTES, RUNTIME_RESERVE_BYTES, device_bytes,
                                 gpu_usable_bytes, usable_bytes)
from solver.cost.runtime.frameworks import Runtime
from solver.cost.stage import ConfigArrays, ModelSlice, StageConfig
from solver.cost.stage_costs import stage_costs
from solver.spec.domain import Framework, Island, Precision, Recompute, Schedule
from solver.spec.loaders import INSTANCES, load_model


def _island(catalog, name: str, gpus: int = 8) -> Island:
    return Island.homogeneous(f"{gpus}x{name}", catalog[name], gpus)


def test_nccl_buffers_by_hand():
    # NCCL src/init.cc: LL = 8 lines/thread x 512 threads x 8 steps x 16 B = 524,288;
    # LL128 = 120 x 640 x 8 x 8 B = 4,915,200; Simple = NCCL_BUFFSIZE = 4 MiB = 4,194,304.
    assert (NCCL_LL_BYTES, NCCL_LL128_BYTES, NCCL_SIMPLE_BYTES) == (524_288, 4_915_200, 4_194_304)
    # One ring: 32 channels x (one peer in + one out) x 9,633,792 B = 616,562,688 B (588 MiB).
    assert NCCL_COMMUNICATOR_BYTES == 616_562_688
    # TP, PP and DP rings: 1,849,688,064 B; with the 1 GiB context 2,923,429,888 B (2.72 GiB).
    assert NCCL_RESERVE_BYTES == 1_849_688_064
    assert CUDA_CONTEXT_BYTES == 1_073_741_824
    assert RUNTIME_RESERVE_BYTES == 2_923_429_888


def test_device_bytes_in_binary_units(catalog):
    # nvidia-smi's 81,559 MiB for the H100 80GB: 81,559 x 1,048,576 = 85,520,809,984 B.
    assert device_bytes(_island(catalog, "H100-SXM-80GB")) == 85_520_809_984
    # The A100 80GB's 81,920 MiB is its datasheet's 80 GiB: 85,899,345,920 B.
    assert device_bytes(_island(catalog, "A100-SXM-80GB")) == 80 * 2 ** 30 == 85_899_345_920
    # ECC on GDDR: the L40S's "48 GB" is 46,068 MiB = 48,305,799,168 B, not 48 GiB.
    assert device_bytes(_island(catalog, "L40S")) == 48_305_799_168
    # The B200's "180 GB" is 183,359 MiB = 192,265,846,784 B as nvidia-smi reports it.
    assert device_bytes(_island(catalog, "B200")) == 192_265_846_784
    # No memory_mib in the catalog: hbm_gb read as GiB (V100 16GB: 17,179,869,184 B).
    assert catalog["V100-SXM2-16GB"].memory_mib is None
    assert device_bytes(_island(catalog, "V100-SXM2-16GB")) == 17_179_869_184


def test_usable_bytes_by_hand(catalog):
    h100 = _island(catalog, "H100-SXM-80GB")
    # 85,520,809,984 - 2,923,429,888 = 82,597,380,096 B (was 0.9 x 80e9 = 72e9).
    assert usable_bytes(h100, 0.0) == 82_597_380_096
    # The user's margin takes its share of the device first: 0.9 x 80 GiB - reserves.
    a100 = _island(catalog, "A100-SXM-80GB")
    assert usable_bytes(a100, 0.1) == pytest.approx(74_385_981_440, abs=1e-3)
    assert gpu_usable_bytes(catalog["A100-SXM-80GB"], 0.1) == usable_bytes(a100, 0.1)


def test_union_island_plans_with_the_smallest_device(catalog):
    a, b = _island(catalog, "A100-SXM-80GB"), _island(catalog, "L40S")
    union = Island("mixed", a.nodes + b.nodes)
    assert union.device_mib == 46_068
    assert union.effective_node.gpu.memory_mib == 46_068
    assert device_bytes(Island("eff", union.effective_nodes)) == device_bytes(b)


def test_fragmentation_is_five_percent_of_the_activations(catalog):
    # The llama2-13b layer of test_costmodel (tp 2, full recomputation, s = 4096): activations
    # 20,971,520 + 337,969,152 = 358,940,672 B, fragmentation 0.05 x that = 17,947,033.6 B.
    model = load_model(INSTANCES / "models" / "llama2-13b.toml")
    cfg = ConfigArrays.of([StageConfig(tp=2, recompute=Recompute.FULL, micro_batch=1)])
    mem = stage_costs(ModelSlice(model, 1), _island(catalog, "A100-SXM-80GB", 2), 4096, cfg,
                      runtime=Runtime(Framework.MEGATRON_CORE)).memory
    assert FRAGMENTATION == 0.05 and mem.activations[0] == 358_940_672
    assert mem.fragmentation[0] == pytest.approx(17_947_033.6, rel=1e-15)
    assert mem.total[0] == pytest.approx(mem.params[0] + mem.grads[0] + mem.optimizer[0]
                                         + 1.05 * mem.activations[0], rel=1e-15)


def test_nvidia_llama3_70b_fp8_layout_on_h100_fits(catalog):
    """NVIDIA's published layout (Megatron-Bridge / NeMo: TP 4, PP 8, VP 5, micro-batch 1,
    global batch 128, 8k, FP8) runs on 64 H100; the old flat cap (0.9 x 80e9 = 72 GB) refused
    its 79.4 GB. Counted with the allocator's fragmentation it is 81.7 GB within 82.6 GB."""
    setup = EstimateSetup(load_model(INSTANCES / "models" / "llama3-70b.toml"),
                          _island(catalog, "H100-SXM-80GB", 64), 128, 8192,
                          StageConfig(tp=4, pp=8, dp=2, zero=1, micro_batch=1),
                          schedule=Schedule.INTERLEAVED, virtual_stages=5,
                          framework=Framework.MEGATRON_CORE, precision=Precision.FP8_CS)
    e = estimate(setup)
    assert e.fits
    assert e.memory.total - e.memory.fragmentation > 72.0  # the old cap's refusal
    assert e.memory.total <= usable_bytes(setup.island, 0.0) / 1e9
    # With the old 10 % margin on top of the reserves it does not fit.
    assert not estimate(dataclasses.replace(setup, epsilon=0.1)).fits
