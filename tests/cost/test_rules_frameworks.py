"""The runtimes' job-level rules (:mod:`solver.cost.runtime.frameworks`), checked by hand against the
runtimes' own checks cited in the functions' docstrings, and their enforcement in the search
space (:func:`solver.cost.configs.enumerate_configs`)."""

from __future__ import annotations

import numpy as np
import pytest

from solver.cost.configs import FeatureSet, enumerate_configs
from solver.cost.runtime.frameworks import (cp_allowed, expert_parallel_sizes, megatron_interleaves,
                                    precision_problem,
                                    profile, tp_allowed, vendor_problem, violations)
from solver.cost.partial import PlanContext
from solver.cost.stage import ModelSlice, StageConfig
from solver.spec.domain import FeaturePreset, Framework, Island, ModelSpec, Precision

FS, MC = profile(Framework.FLAGSCALE), profile(Framework.MEGATRON_CORE)
DS = profile(Framework.DEEPSPEED)

# Qwen3-235B-A22B's attention: 64 query heads, 4 KV heads (query groups); 128 experts.
GQA4 = ModelSpec("gqa4", layers=8, hidden=4096, ffn=12288, heads=64, kv_heads=4, vocab=32000)
MOE = ModelSpec("moe", layers=8, hidden=4096, ffn=14336, heads=32, kv_heads=8, vocab=32000,
                experts=8, top_k=2, expert_ffn=14336)


def test_tp_divides_the_kv_heads_up_to_megatron_core_0_15():
    # TransformerConfig.__post_init__ (core <= 0.15): num_query_groups % tp == 0.
    assert [t for t in (1, 2, 4, 8) if tp_allowed(FS, 4, t)] == [1, 2, 4]
    assert [t for t in (1, 2, 4, 8) if tp_allowed(MC, 4, t)] == [1, 2, 4]
    # A runtime that replicates KV heads accepts a multiple of them, never a non-divisor.
    assert tp_allowed(DS, 4, 8) and not tp_allowed(DS, 6, 4)


def test_cp_runs_in_one_flagscale_mesh_only():
    # ParallelContext.__init__ (hetero) asserts cp == 1; one mesh is plain Megatron-LM.
    assert cp_allowed(FS, 1) and not cp_allowed(FS, 2)
    assert cp_allowed(MC, 1) and cp_allowed(MC, 3)
    assert not cp_allowed(DS, 1)


def test_expert_grid_by_hand():
    # EP divides the experts and tp·cp·dp / expert_tp (initialize_model_parallel).
    assert expert_parallel_sizes(MC, 8, tp=2, cp=1, dp=4) == [1, 2, 4]       # etp = tp
    assert expert_parallel_sizes(MC, 8, tp=2, cp=1, dp=4, expert_tp=1) == [1, 2, 4, 8]
    assert expert_parallel_sizes(MC, 8, tp=8, cp=2, dp=2) == [1, 2, 4]       # cp·dp = 4
    assert expert_parallel_sizes(MC, 6, tp=1, cp=1, dp=4) == [1, 2]          # 6 % 4 != 0
    assert expert_parallel_sizes(MC, 0, tp=1, cp=1, dp=8) == [1]             # dense model
    # validate_args: "Expert parallelism is not supported with fp16 training."
    assert expert_parallel_sizes(MC, 8, 1, 1, 8, Precision.FP16) == [1]
    assert expert_parallel_sizes(MC, 8, 1, 1, 8, Precision.BF16) == [1, 2, 4, 8]


def test_one_precision_per_job(catalog):
    v100, a100 = catalog["V100-SXM2-32GB"], catalog["A100-SXM-80GB"]
    assert "no BF16" in precision_problem(v100, Precision.BF16)
    assert 'precision = "fp16"' in precision_problem(v100, Precision.BF16)
    assert precision_problem(v100, Precision.FP8) is not None  # FP8 keeps BF16 weights
    assert precision_problem(v100, Precision.FP16) is None
    assert precision_problem(a100, Precision.BF16) is None


def test_one_vendor_per_job(catalog):
    h100, a100, mi300x = (catalog[k] for k in ("H100-SXM-80GB", "A100-SXM-80GB", "MI300X"))
    assert mi300x.vendor == "amd" and h100.vendor == "nvidia"
    assert vendor_problem([h100, a100]) is None
    assert "amd, nvidia" in vendor_problem([h100, mi300x])


def test_violations_read_every_rule(catalog):
    cfg = StageConfig(tp=8, dp=2, zero=1)
    found = violations([cfg], FS, True, model=GQA4)
    assert len(found) == 1 and "tp 8" in found[0] and "4 KV heads" in found[0]
    assert violations([StageConfig(tp=4, dp=4, zero=1)], FS, True, model=GQA4) == []
    ep8 = StageConfig(tp=1, dp=4, ep=8, zero=1)   # ep 8 > cp·dp = 4 with expert-TP = tp
    assert any("ep 8" in v for v in violations([ep8], MC, True, model=MOE))
    ep4 = StageConfig(tp=1, dp=4, ep=4, zero=1)
    assert violations([ep4], MC, True, model=MOE, precision=Precision.BF16) == []
    assert any("FP16" in v for v in violations([ep4], MC, True, model=MOE,
                                                precision=Precision.FP16))
    gpus = [{catalog["H100-SXM-80GB"]}, {catalog["MI300X"]}]
    assert any("vendors" in v for v in violations([cfg, cfg], FS, True, stage_gpus=gpus))
    old = [{catalog["A100-SXM-80GB"]}, {catalog["V100-SXM2-32GB"]}]
    assert any("V100" in v for v in violations([cfg, cfg], FS, True, precision=Precision.BF16,
                                                stage_gpus=old))
    assert violations([cfg, cfg], FS, True, precision=Precision.FP16, stage_gpus=old) == []


def _configs(model, slc_len, framework, precision=Precision.BF16, gpus=32):
    island = Island.homogeneous("h", _h100(), gpus)
    ctx = PlanContext(seq_len=8192, micro_batch=32, n_micro=8, framework=framework,
                      precision=precision)
    whole = slc_len == model.layers
    slc = ModelSlice(model, slc_len, True, whole)
    return enumerate_configs(slc, island, ctx, FeatureSet.of(FeaturePreset.FULL))


def _h100():
    from solver.spec.loaders import load_catalog
    return load_catalog()["H100-SXM-80GB"]


def test_search_space_reads_the_rules():
    # No TP 8 over 4 KV heads under the Megatron runtimes; without a runtime, replication.
    assert set(_configs(GQA4, 8, Framework.FLAGSCALE).tp) == {1, 2, 4}
    assert 8 in set(_configs(GQA4, 8, None).tp)
    # FlagScale: CP in the one-mesh (whole-model) slice, none in a stage of several meshes.
    assert set(_configs(GQA4, 8, Framework.FLAGSCALE).cp) > {1}
    assert set(_configs(GQA4, 4, Framework.FLAGSCALE).cp) == {1}
    # EP: every row on the expert grid; none in FP16.
    cfg = _configs(MOE, 4, Framework.FLAGSCALE)
    assert set(cfg.ep) > {1}
    etp = np.where(cfg.expert_tp > 0, cfg.expert_tp, cfg.tp)
    assert all(e in expert_parallel_sizes(FS, 8, t, c, d, expert_tp=x)
               for e, t, c, d, x in zip(cfg.ep, cfg.tp, cfg.cp, cfg.dp, etp))
    # Expert-TP below TP lets EP exceed cp·dp (Megatron-Core's expert grid); every expert-TP
    # searched divides TP.
    assert any(e > c * d for e, c, d in zip(cfg.ep, cfg.cp, cfg.dp))
    assert all(t % x == 0 for t, x in zip(cfg.tp, etp)) and set(etp) > {1}
    assert set(_configs(MOE, 4, Framework.FLAGSCALE, Precision.FP16).ep) == {1}


@pytest.mark.parametrize("framework", [Framework.FLAGSCALE, Framework.MEGATRON_CORE])
def test_every_enumerated_row_passes_violations(framework):
    for model, length in ((GQA4, 8), (GQA4, 3), (MOE, 8), (MOE, 5)):
        cfg = _configs(model, length, framework)
        rows = cfg.configs(list(range(len(cfg))))  # expert_tp included
        meshes = 1 if length == model.layers else 2
        for r in rows:
            piped = meshes > 1 or r.pp > 1
            assert not [v for v in violations([r] * meshes, profile(framework), piped,
                                                model=model, precision=Precision.BF16)
                        if "ZeRO" not in v and "recomputation" not in v], r
        if model.is_moe:  # the all-to-all overlap: only where a plan has no pipelining
            assert any(r.a2a_overlap for r in rows) == (meshes == 1)
            assert all(r.pp == 1 and r.ep > 1 for r in rows if r.a2a_overlap)


def test_tied_embedding_across_flagscale_meshes():
    # pre_validate_args: untied false -> tp[0] == tp[-1]; dp[0], dp[-1] divide one another.
    from dataclasses import replace

    from solver.cost.runtime.frameworks import shared_embedding_problems
    tied = replace(GQA4, tied_embeddings=True)
    a, b = StageConfig(tp=4, dp=4), StageConfig(tp=4, dp=2)
    assert shared_embedding_problems([a, b], FS, tied) == []
    assert shared_embedding_problems([a, StageConfig(tp=2, dp=8)], FS, tied)
    assert shared_embedding_problems([StageConfig(tp=4, dp=6), StageConfig(tp=4, dp=4)], FS,
                                     tied)
    assert shared_embedding_problems([a, StageConfig(tp=2, dp=8)], FS, GQA4) == []  # untied
    assert shared_embedding_problems([a], FS, tied) == []                           # one mesh


def test_megatron_interleaving_rule_by_hand():
    # Megatron-LM interleaves pp >= 2 ranks of v equal chunks: layers % (pp v) == 0 and whole
    # rounds of pp micro-batches (schedules.py, get_forward_backward_func; validate_args).
    assert megatron_interleaves(24, 2, 3, 4)          # 24 = 2 x 3 x 4 layers, 4 % 2 == 0
    assert not megatron_interleaves(24, 1, 3, 4)      # one rank: nothing to interleave
    assert megatron_interleaves(24, 2, 2, 2)          # pp = 2 is enough
    assert not megatron_interleaves(20, 2, 3, 4)      # 20 % 6 != 0
    assert not megatron_interleaves(24, 2, 3, 3)      # 3 % 2 != 0
    assert not megatron_interleaves(12, 3, 2, 4)      # 12 % 6 == 0 but 4 % 3 != 0
    assert megatron_interleaves(12, 3, 2, 6)
