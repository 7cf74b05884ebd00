"""The validator's independent time recomputation equals the vectorized cost model, term by
term on random stages and stage by stage on shipped plans, and parts from it when a bug is
planted in the model."""

from __future__ import annotations

import dataclasses
import importlib
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import REFERENCE_MODELS
from solver.cost.efficiency import DEFAULT_CALIBRATION, AttentionKernel
from solver.cost.runtime.frameworks import PROFILES, Runtime
from solver.cost.stage import ConfigArrays, ModelSlice, StageConfig
from solver.cost.stage_costs import PipelineSetting, stage_costs, substage_latencies
from solver.planner.check.time_check import plan_stage_seconds, stage_seconds, substage_seconds
from solver.spec.domain import Island, ModelSpec, Node, Precision, Recompute, Schedule
from solver.spec.loaders import INSTANCES, load_catalog, load_job

MODELS = REFERENCE_MODELS + [
    ModelSpec("qwen-like", layers=10, hidden=2048, ffn=6144, heads=32, kv_heads=4, vocab=151936,
              experts=16, top_k=4, expert_ffn=768, head_dim=128),
]


def _islands():
    """A100 (4 or 8 to a node), H100 (FP8), V100 (FP16, unfused), L40S (no NVLink) and a mixed
    island whose members differ in NVLink, clock and FP8 ceiling."""
    cat = load_catalog()
    mixed = Island("mix", (Node("m-0", cat["H100-SXM-80GB"], 8, 400.0, 0.95),
                           Node("m-1", cat["H100-NVL-94GB"], 8, 200.0),
                           Node("m-2", cat["H200-SXM-141GB"], 8, 400.0)))
    return [Island.homogeneous("a", cat["A100-SXM-80GB"], 32),
            Island.homogeneous("a4", cat["A100-SXM-40GB"], 16, gpus_per_node=4),
            Island.homogeneous("h", cat["H100-SXM-80GB"], 32),
            Island.homogeneous("v", cat["V100-SXM2-32GB"], 16),
            Island.homogeneous("l", cat["L40S"], 16, perf=0.9),
            mixed]


def _pick(rng, values):
    return values[int(rng.integers(len(values)))]


def _random_config(rng, m: ModelSpec) -> StageConfig:
    dp, cp, tp = _pick(rng, [1, 2, 4, 8]), _pick(rng, [1, 2, 4]), _pick(rng, [1, 2, 4, 8])
    # MoE: any expert-TP dividing tp, EP on the expert grid (tp·cp·dp / expert-TP).
    etp = _pick(rng, [d for d in (1, 2, 4, 8) if tp % d == 0]) if m.is_moe else tp
    ep = _pick(rng, [e for e in (1, 2, 4, 8, 16) if (tp * cp * dp // etp) % e == 0
                     and m.experts % e == 0]) if m.is_moe else 1
    recompute = _pick(rng, list(Recompute))
    # The MoE all-to-all overlap, priced wherever it runs without full recomputation.
    a2a = m.is_moe and recompute is not Recompute.FULL and bool(rng.integers(2))
    return StageConfig(tp=tp, cp=cp, ep=ep, pp=_pick(rng, [1, 1, 2, 3, 4, 5]),
                       dp=dp, zero=int(rng.integers(4)), recompute=recompute,
                       offload=bool(rng.integers(2)), micro_batch=int(rng.integers(1, 5)),
                       expert_tp=None if etp == tp else etp, a2a_overlap=a2a)


def _random_case(rng, islands):
    """(model slice, island, seq_len, config, pipeline setting, calibration, runtime)."""
    m = _pick(rng, MODELS)
    cfg = _random_config(rng, m)
    layers = int(rng.integers(1, m.layers + 1))
    slc = ModelSlice(m, layers, bool(rng.integers(2)), bool(rng.integers(2)))
    v = _pick(rng, [2, 3]) if cfg.pp > 1 and rng.integers(2) else 1
    schedule = Schedule.INTERLEAVED if v > 1 else _pick(rng, [Schedule.ONE_F_ONE_B,
                                                              Schedule.GPIPE])
    n_micro = int(rng.integers(1, 17))
    pipe = PipelineSetting(n_micro, int(rng.integers(1, n_micro + 1)), schedule, v)
    calib = _pick(rng, [DEFAULT_CALIBRATION, DEFAULT_CALIBRATION,
                        dataclasses.replace(DEFAULT_CALIBRATION, attention=AttentionKernel.UNFUSED,
                                            moe_capacity_factor=1.0)])
    runtime = Runtime(_pick(rng, list(PROFILES)), _pick(rng, [Precision.BF16, Precision.FP8,
                                                             Precision.FP16]),
                      bool(rng.integers(4)), grad_reduce_bf16=bool(rng.integers(2)),
                      fp8_param_gather=bool(rng.integers(2)))
    seq = _pick(rng, [1024, 2048, 4096])
    return slc, _pick(rng, islands), seq, cfg, pipe, calib, runtime


def _reference(slc, island, seq, cfg, pipe, calib, runtime):
    factor = float(pipe.virtual_stages) if pipe.schedule is Schedule.INTERLEAVED else 1.0
    return stage_seconds(slc.model, seq, island, cfg, slc.layers, slc.has_embedding,
                         slc.has_head, calib=calib, profile=runtime.profile,
                         precision=runtime.precision, overlap=runtime.overlap, p2p_factor=factor,
                         grad_bytes=runtime.grad_bytes, fp8_params=runtime.fp8_param_gather)


def _vectorized(slc, island, seq, cfg, pipe, calib, runtime):
    arrays = ConfigArrays.of([cfg])
    subs = substage_latencies(slc, island, seq, arrays, pipe, calib, runtime)[0]
    costs = stage_costs(slc, island, seq, arrays, pipe, calib, runtime)
    return list(subs), float(costs.iteration_s[0]), float(costs.latency_s[0])


@pytest.mark.parametrize("seed", range(5))
def test_reference_equals_the_vectorized_model(seed):
    rng, islands = np.random.default_rng(seed), _islands()
    for _ in range(60):
        case = _random_case(rng, islands)
        subs, per_iteration = _reference(*case)
        model_subs, model_iteration, model_latency = _vectorized(*case)
        where = (case[0], case[1].name, case[2], case[3], case[4], case[6])
        assert subs == pytest.approx(model_subs, rel=1e-9), where
        assert per_iteration == pytest.approx(model_iteration, rel=1e-9), where
        assert max(subs) == pytest.approx(model_latency, rel=1e-9), where


def test_one_substage_by_hand():
    """An embedding-only sub-stage on two A100 nodes, tp 8, dp 2, ZeRO-0, Megatron-Core: its
    latency is the vocab-parallel reduce-scatter (fwd) and all-gather (bwd) of the ``n h 2``-byte
    activation on NVLink; its sync the all-reduce of the fp32 embedding gradient between the two
    nodes, one rail (the two replicas sit 8 ranks apart), nothing to hide behind; its optimizer
    step 30 HBM bytes per local parameter."""
    a100 = Island.homogeneous("a", load_catalog()["A100-SXM-80GB"], 16)
    m = MODELS[0]
    lat, sync, opt = substage_seconds(m, 2048, a100, StageConfig(tp=8, dp=2), 0, True, False,
                                      profile=PROFILES[Runtime().framework])
    nvlink = 600e9 / 2 * 0.78                             # 234 GB/s per direction
    ring = 7 / 8 * 2048 * 4096 * 2 / nvlink + 7 * 3e-6    # 62.735 us + 21 us = 83.735 us
    assert lat == pytest.approx(2 * ring, rel=1e-12)
    assert lat == pytest.approx(167.4706e-6, rel=1e-6)
    grads = 128256 * 4096 / 8 * 4.0                       # 262,668,288 fp32 bytes per GPU
    nic = 200e9 / 8 * 0.85                                # 21.25 GB/s, one rail
    # A dense model runs no expert collective (the model once charged an empty one its
    # 2 (q - 1) step latencies: 16 us more, a bug this test found).
    assert sync == pytest.approx(2 * (2 - 1) / 2 * grads / nic + 2 * 8e-6, rel=1e-12)
    assert sync == pytest.approx(12.37686e-3, rel=1e-6)
    assert opt == pytest.approx(30.0 * 128256 * 4096 / 8 / (2039e9 * 0.8), rel=1e-12)
    assert opt == pytest.approx(1.207707e-3, rel=1e-6)


def test_overlap_formulas_by_hand():
    """TP overlap ``max(c - g, c / tp)`` and bucket hiding ``max(c - w (1 - 1/nb), c / nb)``,
    the same numbers through the vectorized model's helpers and the reference's."""
    from solver.cost import sync, timing
    from solver.planner.check import time_check
    mc = time_check._Setup(MODELS[0], 2048, None, DEFAULT_CALIBRATION, True,
                           PROFILES[Runtime().framework])
    ti = SimpleNamespace(profile=mc.profile)
    # 10 ms of TP traffic beside 4 ms of GEMMs at tp 4: 6 ms exposed; beside 9 ms: 10 / 4.
    for gemm, exposed in ((4.0, 6.0), (9.0, 2.5)):
        assert time_check._tp_exposed(mc, 10.0, gemm, 4) == exposed
        assert float(timing.tp_exposed(ti, np.asarray(10.0), np.asarray(gemm), 4)) == exposed
    # 10 ms in 4 buckets behind an 8 ms pass: 10 - 8 * 3/4 = 4 ms; behind 20 ms: 10 / 4.
    for window, exposed in ((8.0, 4.0), (20.0, 2.5)):
        assert time_check._hide(10.0, window, 4.0) == exposed
        assert float(sync.hide(np.asarray(10.0), np.asarray(window), np.asarray(4.0))) == exposed


def _halved_backward(real):
    def layer_times(ti, cfg, share=1.0):
        fwd, bwd = real(ti, cfg, share)
        return fwd, dataclasses.replace(bwd, compute=bwd.compute / 2)
    return layer_times


def _ring_without_share(bytes_, group, bw, lat, factor=1.0):
    q = np.asarray(group, dtype=float)
    steps = factor * (q - 1.0)
    return np.where(q > 1, factor * bytes_ / bw + steps * lat, 0.0)


@pytest.mark.parametrize("bug", ["backward compute x1", "ring ignores (q-1)/q"])
def test_planted_bug_is_caught(monkeypatch, bug):
    """With a bug planted in the vectorized model, the reference disagrees with it."""
    sc, sync, timing = (importlib.import_module(f"solver.cost.{name}")
                        for name in ("stage_costs", "sync", "timing"))
    case = (ModelSlice(MODELS[0], 8, True, False), _islands()[0], 2048,
            StageConfig(tp=4, dp=8, pp=2, zero=1), PipelineSetting(8, 2), DEFAULT_CALIBRATION,
            Runtime())
    subs, per_iteration = _reference(*case)
    assert _vectorized(*case)[0] == pytest.approx(subs, rel=1e-9)
    if bug == "backward compute x1":
        monkeypatch.setattr(sc, "layer_times", _halved_backward(timing.layer_times))
    else:
        monkeypatch.setattr(timing, "ring_time", _ring_without_share)
        monkeypatch.setattr(sync, "ring_time", _ring_without_share)
    model_subs, model_iteration, _ = _vectorized(*case)
    assert model_subs != pytest.approx(subs, rel=1e-3)
    if bug != "backward compute x1":
        assert model_iteration != pytest.approx(per_iteration, rel=1e-3)


def _variant(job, **planner):
    return dataclasses.replace(job, planner=dataclasses.replace(job.planner, **planner))


@pytest.mark.parametrize("name, change", [
    ("seed-llama3-70b", {}),                      # node groups
    ("homog-h100-llama3-70b", {}),                # internal pipelining, interleaved
    ("mixtral-a100-h100", {}),                    # MoE, expert parallelism
    ("v100-a100-llama2-13b", {}),                 # V100: FP16, unfused attention
    ("extreme-l40s-h100-llama3-8b", {"fp8": True}),  # L40S without NVLink; FP8
    ("long-context-llama3-8b", {"framework": "megatron-core"}),
])
def test_reference_equals_the_model_on_shipped_plans(name, change):
    """The validator's recomputation equals the latencies and per-iteration terms the planner
    stored (from the vectorized model), stage by stage."""
    from solver.planner.stages.search import plan_job
    from solver.spec.domain import Framework
    job = load_job(INSTANCES / "jobs" / f"{name}.toml")
    if change.get("fp8"):
        job = dataclasses.replace(job, training=dataclasses.replace(
            job.training, precision=Precision.FP8))
    if "framework" in change:
        job = _variant(job, framework=Framework(change["framework"]))
    plan = plan_job(job)
    got = plan_stage_seconds(plan)
    for s, (subs, per_iteration) in zip(plan.stages, got):
        assert subs == pytest.approx(list(s.plan.stage_latencies), rel=1e-9)
        assert per_iteration == pytest.approx(s.plan.iteration_s, rel=1e-9)


def test_every_substage_is_weighed():
    """A whole 17-layer model in 4 sub-stages ([4, 5, 4, 4] layers) under Megatron-Core ZeRO-1:
    sub-stage 2's 4 layers fit one 40M-parameter gradient bucket, which hides nothing, while
    sub-stage 1's 5 layers take two, so sub-stage 2 has the larger exposed sync. The model once
    weighed sub-stages 0, 1 and the last only and reported 13 % less (a bug this test found)."""
    m = ModelSpec("small", layers=17, hidden=1024, ffn=4096, heads=16, kv_heads=16, vocab=32000)
    a100, cfg = _islands()[0], StageConfig(tp=2, dp=4, pp=4, zero=1)
    terms = [substage_seconds(m, 2048, a100, cfg, k, j == 0, j == 3, profile=Runtime().profile)
             for j, k in enumerate([4, 5, 4, 4])]
    costs = stage_costs(ModelSlice.whole(m), a100, 2048, ConfigArrays.of([cfg]))
    assert float(costs.iteration_s[0]) == pytest.approx(max(d + o for _, d, o in terms), rel=1e-9)
