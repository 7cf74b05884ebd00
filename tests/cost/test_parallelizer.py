"""Homogeneous parallelizer: Pareto sets, presets, feasibility."""

from __future__ import annotations

import numpy as np
import pytest

from solver.cost.parallelizer import (
    AnalyticParallelizer,
    FeatureSet,
    PlanContext,
    best_plan,
    pareto_mask,
    pipeline_time,
)
from solver.cost.reserve import usable_bytes
from solver.cost.stage import ModelSlice
from solver.spec.domain import FeaturePreset, Island, ModelSpec, Recompute, Schedule

LLAMA3_70B = ModelSpec("llama3-70b", layers=80, hidden=8192, ffn=28672, heads=64, kv_heads=8,
                       vocab=128256)
MIXTRAL_LIKE = ModelSpec("mixtral-like", layers=56, hidden=6144, ffn=16384, heads=48, kv_heads=8,
                         vocab=32768, experts=8, top_k=2, expert_ffn=16384)
HUGE = ModelSpec("huge", layers=126, hidden=16384, ffn=53248, heads=128, kv_heads=8,
                 vocab=128256)
CTX = PlanContext(seq_len=4096, micro_batch=32, n_micro=16, in_flight=2, max_pp=4)
SLICES = {"dense": ModelSlice(LLAMA3_70B, 10, True, False),
          "moe": ModelSlice(MIXTRAL_LIKE, 4, False, True)}


@pytest.fixture(scope="module")
def island(catalog):
    return Island.homogeneous("h100", catalog["H100-SXM-80GB"], 32)


@pytest.fixture(scope="module")
def plans(island):
    return {(kind, preset): AnalyticParallelizer(preset).plan(slc, island, CTX)
            for kind, slc in SLICES.items() for preset in FeaturePreset}


@pytest.mark.parametrize("preset", list(FeaturePreset))
@pytest.mark.parametrize("kind", sorted(SLICES))
def test_pareto_sets_non_empty_and_valid(plans, island, kind, preset):
    got = plans[(kind, preset)]
    assert got, f"{kind} / {preset.value}: no plan"
    limit = usable_bytes(island, CTX.epsilon) / 1e9  # device memory less the runtime's reserves
    for p in got:
        c = p.config
        assert c.tp * c.cp * c.pp * c.dp == island.gpus
        assert c.micro_batch * c.dp == CTX.micro_batch
        assert p.memory_gb <= limit + 1e-9
        assert p.memory.total == pytest.approx(p.memory_gb)
        assert p.layout == (c.tp, c.cp, c.dp)
        assert len(p.stage_latencies) == c.pp
        assert max(p.stage_latencies) == pytest.approx(p.latency_s)
        assert p.latency_s == pytest.approx(p.fwd_s + p.bwd_s)


@pytest.mark.parametrize("preset", list(FeaturePreset))
def test_presets_restrict_the_space(plans, preset):
    feats = FeatureSet.of(preset)
    for kind in SLICES:
        for p in plans[(kind, preset)]:
            c = p.config
            assert c.zero in feats.zero and c.recompute in feats.recompute
            assert feats.cp or c.cp == 1
            assert feats.ep or c.ep == 1
            assert feats.offload or not c.offload


def test_named_presets():
    metis, alpa = FeatureSet.of(FeaturePreset.METIS), FeatureSet.of(FeaturePreset.ALPA)
    assert metis.recompute == (Recompute.NONE,) and metis.zero == (0,)
    assert not (alpa.cp or alpa.ep or alpa.offload) and alpa.zero == (0,)
    assert FeatureSet.of(FeaturePreset.GALVATRON).cp and not FeatureSet.of(FeaturePreset.GALVATRON).ep
    assert FeatureSet.of(FeaturePreset.MIST).offload
    assert FeatureSet.of(FeaturePreset.FULL).ep


def test_full_preset_uses_expert_parallelism_for_moe(plans):
    assert any(p.config.ep > 1 for p in plans[("moe", FeaturePreset.FULL)])


@pytest.mark.parametrize("key", [("dense", FeaturePreset.FULL), ("moe", FeaturePreset.FULL),
                                 ("dense", FeaturePreset.ACESO)])
def test_pareto_property(plans, key):
    got = plans[key]
    for a in got:
        for b in got:
            if a is b or a.layout != b.layout:
                continue
            va = (a.latency_s, a.iteration_s, a.memory_gb)
            vb = (b.latency_s, b.iteration_s, b.memory_gb)
            assert not (all(x <= y for x, y in zip(vb, va)) and vb != va), (a.config, b.config)


def test_pareto_mask_small():
    groups = np.array([0, 0, 0, 1, 0])
    obj = np.array([[1, 5], [2, 2], [3, 3], [9, 9], [1, 5]], dtype=float)
    assert list(pareto_mask(groups, obj)) == [True, True, False, True, False]


def test_infeasible_slice_returns_empty(catalog):
    one = Island.homogeneous("one", catalog["A100-SXM-80GB"], 1)
    ctx = PlanContext(seq_len=4096, micro_batch=1, n_micro=8, max_pp=8)
    assert AnalyticParallelizer().plan(ModelSlice(HUGE, 126, True, True), one, ctx) == []


def test_micro_batch_not_divisible_skips_dp(island):
    ctx = PlanContext(seq_len=4096, micro_batch=3, n_micro=4, max_pp=1)
    got = AnalyticParallelizer().plan(SLICES["dense"], island, ctx)
    assert got and all(p.config.dp in (1, 3) for p in got)


def test_best_plan_is_fastest(plans):
    got = plans[("dense", FeaturePreset.FULL)]
    best = best_plan(got, CTX.n_micro)
    assert pipeline_time(best, CTX.n_micro) == min(pipeline_time(p, CTX.n_micro) for p in got)
    assert best_plan([], 4) is None
    inter = pipeline_time(best, 16, Schedule.INTERLEAVED, 2)
    assert inter <= pipeline_time(best, 16)


def test_more_memory_pressure_never_helps(island):
    loose = AnalyticParallelizer().plan(SLICES["dense"], island, CTX)
    tight = AnalyticParallelizer().plan(SLICES["dense"], island,
                                        PlanContext(4096, 32, 16, 2, epsilon=0.6, max_pp=4))
    assert min(p.latency_s for p in tight) >= min(p.latency_s for p in loose) - 1e-12


@pytest.mark.parametrize("emb,head", [(True, False), (False, False), (False, True)])
def test_plan_many_equals_plan_per_length(emb, head):
    from solver.spec.loaders import INSTANCES, load_catalog, load_model
    model = load_model(INSTANCES / "models" / "llama2-13b.toml")
    island = Island.homogeneous("a", load_catalog()["A100-SXM-80GB"], 32)
    ctx = PlanContext(seq_len=4096, micro_batch=8, n_micro=8, in_flight=2)
    par = AnalyticParallelizer()
    lengths = [1, 5, 17, 38]
    many = par.plan_many(model, lengths, emb, head, island, ctx)
    for n, batch in zip(lengths, many):
        single = par.plan(ModelSlice(model, n, emb, head), island, ctx)
        assert [(p.config, p.latency_s, p.memory_gb) for p in batch] == \
            [(p.config, p.latency_s, p.memory_gb) for p in single]


def test_interleaved_layouts_are_the_ones_megatron_runs(island):
    # Llama 3 70B (80 layers), v = 5 chunks of 16 layers, n_micro = 12 on 32 H100: Megatron
    # interleaves pp stages only when pp >= 2, 80 % (5 pp) == 0 and 12 % pp == 0, i.e.
    # pp in {2, 4}; pp = 1, 8 and 16 (16 layers per chunk allow them) are not runnable.
    ctx = PlanContext(seq_len=4096, micro_batch=32, n_micro=12, max_pp=16,
                      schedule=Schedule.INTERLEAVED, virtual_stages=5)
    plans = AnalyticParallelizer(FeaturePreset.FULL).plan(ModelSlice.whole(LLAMA3_70B), island,
                                                          ctx)
    assert plans and {p.config.pp for p in plans} <= {2, 4}
    plain = AnalyticParallelizer(FeaturePreset.FULL).plan(
        ModelSlice.whole(LLAMA3_70B), island,
        PlanContext(seq_len=4096, micro_batch=32, n_micro=12, max_pp=16))
    assert {p.config.pp for p in plain} - {2, 4}  # 1F1B keeps the other depths
