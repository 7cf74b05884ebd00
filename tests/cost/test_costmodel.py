"""Cost model: hand-computed memory and FLOPs, monotonicity, vectorized == scalar."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from solver.cost.runtime.frameworks import Runtime
from solver.cost.efficiency import (
    Calibration,
    GemmKernel,
    Links,
    machine_balance,
    ring_time,
)
from solver.cost.flops import model_flops_per_token
from solver.cost.memory import activation_bytes_per_token
from solver.cost.stage import ConfigArrays, ModelSlice, StageConfig
from solver.cost.stage_costs import (
    PipelineSetting,
    in_flight_of,
    split_layers,
    stage_costs,
    substage_latencies,
    substage_layers,
)
from solver.spec.domain import Framework, Island, ModelSpec, Precision, Recompute, Schedule

LLAMA2_13B = ModelSpec("llama2-13b", layers=40, hidden=5120, ffn=13824, heads=40, kv_heads=40,
                       vocab=32000, gated_mlp=True)
GPT_1_7B = ModelSpec("gpt-1.7b", layers=24, hidden=2304, ffn=4 * 2304, heads=24, kv_heads=24,
                     vocab=51200, gated_mlp=False, tied_embeddings=True)
MOE = ModelSpec("moe", layers=8, hidden=2048, ffn=8192, heads=16, kv_heads=4, vocab=32000,
                experts=8, top_k=2, expert_ffn=4096)
CALIB = Calibration(gemm_half_balance=3.0)


@pytest.fixture()
def a100(catalog):
    return Island.homogeneous("a100", catalog["A100-SXM-80GB"], 8)


#: Megatron-LM 2021 overlaps nothing, so its exposed communication is the by-hand collective time.
NO_OVERLAP = Runtime(Framework.MEGATRON_2021)


def costs_of(slc, island, configs, seq=4096, pipe=PipelineSetting(), calib=CALIB,
             runtime=NO_OVERLAP):
    return stage_costs(slc, island, seq, ConfigArrays.of(configs), pipe, calib, runtime)


def test_one_llama_layer_tp2_full_recompute_memory_by_hand(a100):
    # Parameters of one llama2-13b layer (h = 5120, f = 13824, 40 heads of 128, MHA):
    #   attention Q,K,V,O = 4 h^2 = 104,857,600; SwiGLU MLP 3 h f = 212,336,640; norms 2h = 10,240
    #   total 317,204,480, i.e. 158,602,240 per GPU with tp = 2 (ZeRO 0, dp = 1).
    per_gpu = 158_602_240
    assert LLAMA2_13B.params_per_layer == 2 * per_gpu
    # Activations, s = 4096, b = 1, full recomputation, SP divides by tp = 2:
    #   stored layer input 2h = 10,240 B/token -> 10,240 * 4096 / 2 = 20,971,520 B
    #   one layer's working set (recomputed in backward), per token without recomputation:
    #     attention: norm in 2h + QKV in 2h + Q 2h + K,V 4h + attn out 2h + fp32 LSE 4a = 12h + 160
    #     MLP: norm in 2h + MLP in 2h + SwiGLU 6f = 4h + 82,944
    #     = 61,600 + 103,424 = 165,024 B/token -> 165,024 * 4096 / 2 = 337,969,152 B
    cfg = StageConfig(tp=2, recompute=Recompute.FULL, micro_batch=1)
    mem = costs_of(ModelSlice(LLAMA2_13B, 1), a100, [cfg],
                   runtime=Runtime(Framework.MEGATRON_CORE)).memory  # FlashAttention
    assert mem.params[0] == 2 * per_gpu           # bf16
    assert mem.grads[0] == 4 * per_gpu            # fp32 main gradients
    assert mem.optimizer[0] == 12 * per_gpu       # fp32 master + m + v
    assert mem.activations[0] == 20_971_520 + 337_969_152


def test_korthikanti_count_reproduced_for_gpt():
    # Korthikanti et al. 2022: s b h (34 + 5 a s / h) per layer for a GPT layer with dropout,
    # without FlashAttention; selective recomputation removes the 5 a s / h term.
    s, h, a = 2048, GPT_1_7B.hidden, GPT_1_7B.heads
    full = activation_bytes_per_token(GPT_1_7B, s, Recompute.NONE, flash=False, dropout=True)
    assert full == 34 * h + 5 * a * s
    sel = activation_bytes_per_token(GPT_1_7B, s, Recompute.SELECTIVE, flash=False, dropout=True)
    assert sel == 34 * h
    assert activation_bytes_per_token(GPT_1_7B, s, Recompute.FULL) == 2 * h


def test_model_flops_per_token_by_hand():
    # 6 N + 12 l s h with N = matmul weights of the layers and the LM head:
    #   layers 40 * (317,204,480 - 10,240 norms) = 12,687,769,600; head 32000 * 5120 = 163,840,000
    #   6 N = 77,109,657,600; 12 * 40 * 4096 * 5120 = 10,066,329,600; sum 87,175,987,200
    assert model_flops_per_token(LLAMA2_13B, 4096) == 87_175_987_200


def test_gemm_efficiency_curve_by_hand(a100):
    # A100-80GB balance 312e12 / 2039e9 = 153.02 FLOP/B; no curve of its own in the catalog, so
    # the calibration's half point: 3 x 153.02 = 459.05 FLOP/B; ceiling 0.869 (MAMF).
    # 4096^3: xi = 1 / (3 / 4096) = 1365.33; 0.869 * 1365.33 / (1365.33 + 459.05) = 0.65035,
    # times the in-training fraction.
    curve = GemmKernel.of(a100, Precision.BF16, CALIB)
    assert machine_balance(a100) == pytest.approx(312e12 / 2039e9)
    assert curve.half_intensity == pytest.approx(3 * 312e12 / 2039e9)
    assert (curve.ceiling, curve.latency_s) == (0.869, CALIB.gemm_latency_s)
    eff = curve.efficiency(np.array([4096]), 4096, 4096)[0]
    assert eff == pytest.approx(CALIB.gemm_in_training * 0.65035, abs=1e-5)
    assert curve.efficiency(np.array([512]), 4096, 4096)[0] < eff
    # One kernel: its FLOPs at that fraction of peak, plus the fixed cost.
    flops = 2 * 4096 ** 3
    assert curve.seconds(np.array([flops]), 4096, 4096, 4096, 312e12)[0] == pytest.approx(
        flops / (312e12 * eff) + CALIB.gemm_latency_s)
    # With no calibrated half point a larger balance lowers the fraction (a larger ridge).
    assert dataclasses.replace(curve, half_intensity=2 * curve.half_intensity).efficiency(
        np.array([4096]), 4096, 4096)[0] < eff


def test_gemm_curve_is_the_gpus_own_where_measured(catalog):
    # H100 has a fitted curve in the catalog (c = 0.012 balances, t0 = 6.18 us): balance
    # 989e12 / 3350e9 = 295.22 FLOP/B, half point 3.54 FLOP/B; the calibration's c is not used.
    h100 = Island.homogeneous("h100", catalog["H100-SXM-80GB"], 8)
    curve = GemmKernel.of(h100, Precision.BF16, CALIB)
    assert curve.half_intensity == pytest.approx(0.012 * 989e12 / 3350e9)
    assert curve.latency_s == pytest.approx(6.18e-6)
    # FP8 reads the FP8 ceiling (70.9 %), the curve's shape stays.
    fp8 = GemmKernel.of(h100, Precision.FP8, CALIB)
    assert (fp8.ceiling, fp8.half_intensity) == (0.709, curve.half_intensity)


def test_tp_collectives_by_hand(a100):
    # One layer, tp = 2 inside a node, cp = 1: forward TP traffic is 4 collectives of
    # n h 2 bytes with ring factor (2-1)/2 on NVLink (600/2 GB/s x 0.78) plus one step latency each.
    cfg = StageConfig(tp=2, micro_batch=1)
    fwd = costs_of(ModelSlice(LLAMA2_13B, 1), a100, [cfg]).fwd
    bw = 300e9 * CALIB.nvlink_eff
    expected = 4 * (0.5 * 4096 * 5120 * 2 / bw + CALIB.nvlink_latency_s)
    assert fwd.tp[0] == pytest.approx(expected)
    links = Links.of(a100, CALIB)
    assert ring_time(np.array(1e9), 8, links.inter_bw, links.inter_lat, 2.0) == pytest.approx(
        2 * 7 / 8 * 1e9 / (25e9 * CALIB.nic_eff) + 14 * CALIB.nic_latency_s)


def test_tp_comm_overlap_by_hand(a100):
    # Megatron-Core's --tp-comm-overlap: each collective is split in tp chunks pipelined with
    # its GEMM; exposed = max(c - g, c / tp). A tp = 2 layer of 13B has GEMMs far longer than
    # its NVLink traffic, so exactly half (the first chunk) of the collectives stays exposed.
    cfg = [StageConfig(tp=2, micro_batch=1)]
    slc = ModelSlice(LLAMA2_13B, 1)
    raw = costs_of(slc, a100, cfg).fwd.tp[0]
    core = costs_of(slc, a100, cfg, runtime=Runtime(Framework.MEGATRON_CORE))
    assert core.fwd.tp[0] == pytest.approx(raw / 2)
    assert core.bwd.tp[0] == pytest.approx(raw / 2)
    assert core.fwd.compute[0] > raw  # the condition max(c - g, c/tp) = c/tp rests on


def test_data_parallel_rails_by_hand(a100):
    # 4 nodes of 8 A100, tp = 2: each node holds 4 members of a DP group of 16, one per rail,
    # so the group moves 4 NICs' worth (4 x 25 GB/s x 0.85) across nodes, below NVLink's.
    island = Island.homogeneous("a", a100.gpu, 32)
    links = Links.of(island, CALIB)
    bw, _ = links.data_parallel(np.array([2]), np.array([16]))
    assert bw[0] == pytest.approx(4 * 25e9 * CALIB.nic_eff)
    bw, _ = links.data_parallel(np.array([8]), np.array([4]))  # tp 8: one member per node
    assert bw[0] == pytest.approx(25e9 * CALIB.nic_eff)
    bw, _ = links.data_parallel(np.array([1]), np.array([8]))  # inside one node: NVLink
    assert bw[0] == pytest.approx(links.intra_bw)


def test_expert_all_to_all_by_hand(a100):
    # 2 nodes of 8, tp 1, ep 16: each GPU keeps 1/16, sends 7/16 over NVLink and 8/16 over its
    # NIC at the same time; the NIC part (25 GB/s x 0.85) is slower. ep 8 inside a node: NVLink.
    island = Island.homogeneous("a", a100.gpu, 16)
    links = Links.of(island, CALIB)
    one_gb = np.array(1e9)
    t = links.all_to_all(one_gb, np.array([1]), np.array([16]))
    assert t == pytest.approx(8 / 16 * 1e9 / (25e9 * CALIB.nic_eff) + 15 * CALIB.nic_latency_s)
    t = links.all_to_all(one_gb, np.array([1]), np.array([8]))
    assert t == pytest.approx(7 / 8 * 1e9 / links.intra_bw + 7 * CALIB.nvlink_latency_s)
    assert links.all_to_all(one_gb, np.array([1]), np.array([1])) == 0


def test_capacity_factor_slows_and_grows_only_the_moe_parts(catalog):
    island = Island.homogeneous("h", catalog["H100-SXM-80GB"], 32)
    cfg = [StageConfig(tp=2, dp=16, ep=8, micro_batch=1)]
    slc = ModelSlice(MOE, 2)
    flat = dataclasses.replace(CALIB, moe_capacity_factor=1.0)
    skew = dataclasses.replace(CALIB, moe_capacity_factor=1.5)
    a, b = costs_of(slc, island, cfg, calib=flat), costs_of(slc, island, cfg, calib=skew)
    # tp 2: 4 EP ranks per node, so the group of 8 spans two nodes; 2 layers x (dispatch +
    # combine) x 7 peers of step latency, the rest scales with the routed bytes.
    lat = 2 * 2 * 7 * CALIB.nic_latency_s
    assert b.fwd.ep[0] - lat == pytest.approx(1.5 * (a.fwd.ep[0] - lat))
    assert b.fwd.compute[0] > a.fwd.compute[0] and b.memory.activations[0] > a.memory.activations[0]
    dense = ModelSlice(LLAMA2_13B, 2)
    assert costs_of(dense, island, [StageConfig(tp=2, dp=16, micro_batch=1)], calib=skew
                    ).latency_s[0] == costs_of(dense, island, [StageConfig(tp=2, dp=16,
                                                micro_batch=1)], calib=flat).latency_s[0]


def test_backward_is_twice_forward_and_full_recompute_adds_a_forward(a100):
    cfgs = [StageConfig(tp=1, micro_batch=1), StageConfig(tp=1, micro_batch=1,
                                                          recompute=Recompute.FULL)]
    c = costs_of(ModelSlice(LLAMA2_13B, 2), a100, cfgs)
    assert c.bwd.compute[0] == pytest.approx(2 * c.fwd.compute[0])
    assert c.bwd.recompute[0] == 0
    assert c.bwd.recompute[1] == pytest.approx(c.fwd.compute[1])
    assert c.latency_s[1] > c.latency_s[0]
    assert c.memory.activations[1] < c.memory.activations[0]


def test_more_tp_means_less_memory_per_gpu(catalog):
    island = Island.homogeneous("h", catalog["H100-SXM-80GB"], 16)
    cfgs = [StageConfig(tp=t, dp=16 // t, micro_batch=1) for t in (1, 2, 4, 8)]
    mem = costs_of(ModelSlice(LLAMA2_13B, 10, True, True), island, cfgs).memory
    for part in (mem.params, mem.grads, mem.optimizer, mem.activations):
        assert np.all(np.diff(part) < 0)


def test_zero_stages_shard_what_they_say(a100):
    dp = 8
    cfgs = [StageConfig(dp=dp, zero=z, micro_batch=1) for z in range(4)]
    mem = costs_of(ModelSlice(LLAMA2_13B, 8), a100, cfgs).memory
    assert np.all(np.diff(mem.total) < 0)
    assert mem.optimizer[1] == pytest.approx(mem.optimizer[0] / dp)
    assert mem.grads[1] == mem.grads[0] and mem.grads[2] == pytest.approx(mem.grads[0] / dp)
    assert mem.params[2] == mem.params[0]
    # ZeRO-3 shards the weights but keeps two gathered layers as a prefetch buffer.
    per_layer = 2 * LLAMA2_13B.params_per_layer
    assert mem.params[3] == pytest.approx(mem.params[0] / dp + 2 * per_layer)


def test_experts_are_divided_by_ep(catalog):
    island = Island.homogeneous("h", catalog["H100-SXM-80GB"], 8)
    cfgs = [StageConfig(dp=8, ep=e, micro_batch=8) for e in (1, 2, 4, 8)]
    mem = costs_of(ModelSlice(MOE, 4), island, cfgs).memory
    dense = MOE.params_per_layer - MOE.experts * MOE.expert_params
    expected = [2 * 4 * (dense + MOE.experts * MOE.expert_params / e) for e in (1, 2, 4, 8)]
    assert mem.params == pytest.approx(expected)


def test_offload_moves_in_flight_activations_to_host(a100):
    cfgs = [StageConfig(tp=8, micro_batch=1, offload=o) for o in (False, True)]
    c = costs_of(ModelSlice(LLAMA2_13B, 4), a100, cfgs, pipe=PipelineSetting(8, 4))
    assert c.memory.activations[1] == pytest.approx(c.memory.activations[0] / 4)
    assert c.host_bytes[1] == pytest.approx(c.memory.activations[0] * 3 / 4)
    assert c.latency_s[1] >= c.latency_s[0]


def random_configs(rng, n):
    out = []
    for _ in range(n):
        tp, cp, pp = (int(rng.choice(v)) for v in ([1, 2, 4, 8], [1, 2], [1, 2, 3, 4]))
        dp = int(rng.choice([1, 2, 4]))
        out.append(StageConfig(tp=tp, cp=cp, ep=int(rng.choice([e for e in (1, 2) if (dp * cp) % e == 0])),
                               pp=pp, dp=dp, zero=int(rng.integers(0, 4)),
                               recompute=Recompute(rng.choice(["none", "selective", "full"])),
                               offload=bool(rng.integers(0, 2)), micro_batch=int(rng.integers(1, 5))))
    return out


@pytest.mark.parametrize("schedule", list(Schedule))
def test_vectorized_equals_scalar(catalog, schedule):
    rng = np.random.default_rng(0)
    island = Island.homogeneous("h", catalog["H100-SXM-80GB"], 32)
    slc = ModelSlice(MOE, 7, True, True)
    configs = random_configs(rng, 40)
    pipe = PipelineSetting(8, 2, schedule, 2)
    together = costs_of(slc, island, configs, pipe=pipe)
    assert np.all(np.isfinite(together.latency_s)) and np.all(together.latency_s > 0)
    assert np.all(together.iteration_s >= 0) and np.all(together.memory.total > 0)
    for i, cfg in enumerate(configs):
        alone = costs_of(slc, island, [cfg], pipe=pipe)
        assert alone.latency_s[0] == pytest.approx(together.latency_s[i], rel=1e-12)
        assert alone.memory.total[0] == pytest.approx(together.memory.total[i], rel=1e-12)
        assert alone.iteration_s[0] == pytest.approx(together.iteration_s[i], rel=1e-12)
    subs = substage_latencies(slc, island, 4096, ConfigArrays.of(configs), pipe, CALIB,
                              NO_OVERLAP)
    for i, cfg in enumerate(configs):
        assert len(subs[i]) == cfg.pp
        assert max(subs[i]) == pytest.approx(together.latency_s[i], rel=1e-12)


def test_layer_split_and_in_flight():
    assert list(substage_layers(10, 4)) == [2, 3, 3, 2]
    assert list(substage_layers(11, 4)) == [3, 3, 3, 2]
    assert list(substage_layers(5, 1)) == [5]
    first, second, last = split_layers(11, np.array([1, 2, 4]))
    assert list(first) == [11, 6, 3] and list(last) == [11, 5, 2] and second[2] == 3
    pipe = PipelineSetting(n_micro=3, in_flight=1)
    assert list(in_flight_of(pipe, np.full(4, 4), np.arange(4))) == [3, 3, 2, 1]
    inter = dataclasses.replace(pipe, n_micro=16, schedule=Schedule.INTERLEAVED, virtual_stages=2)
    # Megatron's warm-up, P = 4, v = 2: 2 (P - j - 1) + (v - 1) P + 1 chunks of 1/2 micro-batch
    # (the simulator's peaks 11, 9, 7, 5 chunks).
    assert list(in_flight_of(inter, np.full(4, 4), np.arange(4))) == [5.5, 4.5, 3.5, 2.5]
    assert math.isclose(in_flight_of(dataclasses.replace(pipe, schedule=Schedule.GPIPE),
                                     np.array([4]), np.array([3]))[0], 3)


def _capacity_cases(catalog):
    """Configurations whose memory binds somewhere between 1 and n micro-batches: dense and MoE,
    FlashAttention and unfused (V100), DeepSpeed's per-module ZeRO-3 buffer, offload."""
    a100 = Island.homogeneous("a100", catalog["A100-SXM-40GB"], 8)
    v100 = Island.homogeneous("v100", catalog["V100-SXM2-32GB"], 8)
    base = [StageConfig(tp=t, dp=8 // t, micro_batch=b, zero=z, recompute=r, offload=o)
            for t in (1, 2, 8) for b in (1, 4) for z in (0, 1) for r in Recompute
            for o in (False, True)]
    moe = [StageConfig(tp=1, dp=8, ep=e, micro_batch=2, zero=1) for e in (2, 8)]
    return [(ModelSlice(LLAMA2_13B, 8, True, False), a100, base, Runtime()),
            (ModelSlice(LLAMA2_13B, 6, False, True), v100, base[:24], Runtime()),
            (ModelSlice(MOE, 8, True, True), a100, moe, Runtime(Framework.DEEPSPEED)),
            (ModelSlice(GPT_1_7B, 24, True, True), a100,
             [dataclasses.replace(c, zero=3) for c in base[:8]], Runtime(Framework.DEEPSPEED))]


def test_in_flight_capacity_equals_the_most_that_fits(catalog):
    """The two-evaluation shortcut (memory affine in the in-flight count) equals the largest
    ``h`` for which the stage, priced at ``h`` micro-batches in flight, fits the usable bytes and
    the host budget — found here by pricing every ``h``."""
    from solver.cost.reserve import usable_bytes
    from solver.cost.stage_costs import in_flight_capacity
    n, eps, seen = 12, 0.1, set()
    for slc, island, configs, runtime in _capacity_cases(catalog):
        cfg = ConfigArrays.of(configs)
        one = stage_costs(slc, island, 4096, cfg, PipelineSetting(n, 1), runtime=runtime)
        cap = usable_bytes(island, eps)
        got = in_flight_capacity(slc, island, 4096, cfg, one, n, cap, runtime=runtime)
        for i in range(len(configs)):
            most = 0
            for h in range(1, n + 1):
                c = stage_costs(slc, island, 4096, cfg.take(np.array([i])),
                                PipelineSetting(n, h), runtime=runtime)
                if c.fits(cap, CALIB)[0]:
                    most = h
            assert got[i] == most, (slc.model.name, configs[i])
            seen.add(min(most, 2) if most < n else n)
    assert seen == {0, 1, 2, n}  # never fits, fits one, fits some, fits all: every branch


def _exactly(total: float) -> float:
    """The float ``x`` with ``x * 1e9 == total`` (a limit met to the byte)."""
    x = total / 1e9
    for _ in range(8):
        if x * 1e9 == total:
            return x
        x = float(np.nextafter(x, np.inf if x * 1e9 < total else -np.inf))
    raise AssertionError("no exact limit")


def test_fits_is_inclusive_at_both_limits(a100):
    """The usable bytes and the host budget are allowed exactly, not a byte more."""
    slc = ModelSlice(LLAMA2_13B, 2, False, False)
    c = costs_of(slc, a100, [StageConfig(tp=8, offload=True)], pipe=PipelineSetting(4, 4))
    total, host = float(c.memory.total[0]), float(c.host_bytes[0])
    assert host > 0
    budget = _exactly(host)
    at = dataclasses.replace(CALIB, host_offload_gb=budget)
    assert c.fits(total, at)[0]                                     # both met exactly
    assert not c.fits(total * (1 - 1e-10), at)[0]                   # the device a little short
    assert not c.fits(total, dataclasses.replace(at, host_offload_gb=budget * (1 - 1e-10)))[0]


def test_all_to_all_with_a_stride_that_does_not_divide_the_node_by_hand():
    """8 GPUs per node, EP ranks 3 apart: 8 // 3 = 2 members share a node (not 8/3); a group of
    4 sends 1/4 of 1 GB over NVLink (1 peer) and 2/4 over the NIC, plus 3 step latencies."""
    links = Links(intra_bw=200e9, inter_bw=20e9, intra_lat=1e-6, inter_lat=5e-6, pcie_bw=1e9,
                  hbm_bw=1e12, gpus_per_node=8)
    t = float(links.all_to_all(np.asarray(1e9), np.asarray(3), np.asarray(4)))
    assert t == pytest.approx(max(1 / 4 * 1e9 / 200e9, 2 / 4 * 1e9 / 20e9) + 3 * 5e-6, rel=1e-12)
    assert float(links.all_to_all(np.asarray(1e9), np.asarray(1), np.asarray(1))) == 0.0


def test_components_names_are_its_fields():
    """``Components.NAMES`` stands in for ``dataclasses.fields`` on the hot path: a field added
    without its name would drop out of every total."""
    from dataclasses import fields

    from solver.cost.timing import Components
    assert Components.NAMES == tuple(f.name for f in fields(Components))
    c = Components(*range(1, 9))
    assert c.total == 36 and c.scaled(2).total == 72 and c.plus(c).p2p == 16
