"""The validator's independent memory count equals the vectorized model's, and catches a bug
planted in the model (the one a review found: the in-flight multiplier dropped)."""

from __future__ import annotations

import numpy as np
import pytest

from solver.cost.memory import substage_memory
from solver.cost.stage import ConfigArrays, StageConfig
from solver.planner.check.memory_check import held_micro_batches, layer_counts, substage_bytes
from conftest import REFERENCE_MODELS
from solver.spec.domain import Framework, Recompute

MODELS = REFERENCE_MODELS


def _random_case(rng):
    m = MODELS[int(rng.integers(len(MODELS)))]
    tp = int(rng.choice([1, 2, 4]))
    dp = int(rng.choice([1, 2, 4, 8]))
    cp = int(rng.choice([1, 2]))
    # MoE: any expert-TP dividing tp, EP on the expert grid (tp·cp·dp / expert-TP).
    etp = int(rng.choice([d for d in (1, 2, 4) if tp % d == 0])) if m.is_moe else tp
    ep = int(rng.choice([e for e in (1, 2, 4, 8, 16) if (tp * cp * dp // etp) % e == 0
                         and m.experts % e == 0])) if m.is_moe else 1
    c = StageConfig(tp=tp, cp=cp, ep=ep, dp=dp, zero=int(rng.integers(4)),
                    recompute=list(Recompute)[int(rng.integers(3))],
                    offload=bool(rng.integers(2)), micro_batch=int(rng.integers(1, 4)),
                    expert_tp=None if etp == tp else etp)
    layers = int(rng.integers(1, m.layers + 1))
    return m, c, layers, bool(rng.integers(2)), bool(rng.integers(2)), float(rng.integers(1, 9))


@pytest.mark.parametrize("seed", range(4))
def test_independent_count_equals_the_vectorized_model(seed):
    rng = np.random.default_rng(seed)
    for _ in range(60):
        m, c, layers, emb, head, held = _random_case(rng)
        flash, fp8 = bool(rng.integers(2)), bool(rng.integers(2))
        framework = Framework.DEEPSPEED if rng.integers(2) else Framework.MEGATRON_CORE
        cf = float(rng.choice([1.0, 1.25]))
        grads, fp8_params = float(rng.choice([2.0, 4.0])), bool(rng.integers(2))
        mine = substage_bytes(m, 4096, c, layers, emb, head, held, flash=flash,
                              framework=framework, fp8=fp8, cf=cf, grad_bytes=grads,
                              fp8_params=fp8_params)
        model = substage_memory(m, 4096, ConfigArrays.of([c]), np.asarray(layers),
                                np.asarray(emb), np.asarray(head), np.asarray(held), 1.0, flash,
                                framework is Framework.DEEPSPEED, fp8, cf, grads,
                                fp8_params).total[0]
        assert mine == pytest.approx(model, rel=1e-12), (m.name, c, layers, emb, head, held)


def test_positions_and_splits_by_hand():
    assert layer_counts(10, 4) == [2, 3, 3, 2] and layer_counts(11, 4) == [3, 3, 3, 2]
    assert [held_micro_batches(j, 4, 3, 1) for j in range(4)] == [3, 3, 2, 1]
    assert [held_micro_batches(j, 4, 8, 2) for j in range(4)] == [5.5, 4.5, 3.5, 2.5]


def test_planted_in_flight_bug_is_caught(monkeypatch):
    """With the model's activation memory blind to the in-flight count (the planted bug), the
    planner emits a plan whose first stages do not fit; the independent count rejects it, while
    a check with the planner's own model would pass it."""
    import importlib
    from solver.planner.stages.search import plan_job
    from solver.planner.check.validate import PlanInvalid
    from solver.spec.loaders import INSTANCES, load_job
    memory = importlib.import_module("solver.cost.memory")
    job = load_job(INSTANCES / "jobs" / "homog-h100-llama3-70b.toml")  # activations bind
    plan_job(job)  # valid without the bug
    real = memory.activation_bytes

    def blind(model, seq_len, cfg, layers, head, in_flight, *rest, **kw):
        return real(model, seq_len, cfg, layers, head, np.ones_like(in_flight), *rest, **kw)
    monkeypatch.setattr(memory, "activation_bytes", blind)
    with pytest.raises(PlanInvalid, match="independent count"):
        plan_job(job)


def test_largest_weight_matrix_by_hand():
    from dataclasses import replace
    from solver.cost.memory import largest_matrix
    from solver.spec.loaders import INSTANCES, load_model
    m = load_model(INSTANCES / "models" / "llama2-7b.toml")
    # Gated MLP up-projection: 2 * 4096 * 11008 = 90,177,536 (QKV is 4096 * 12288 = 50,331,648).
    assert largest_matrix(m) == 90_177_536
    # A narrow plain MLP leaves QKV the largest: 4096 * (4096 + 2 * 4096).
    assert largest_matrix(replace(m, ffn=1024, gated_mlp=False)) == 50_331_648
    # With GQA (8 KV heads of 128): 4096 * (4096 + 2 * 1024) = 25,165,824 > 4096 * 4096.
    assert largest_matrix(replace(m, ffn=1024, gated_mlp=False, kv_heads=8)) == 25_165_824
    # Experts wider than the dense MLP set the width: 2 * 4096 * 20000.
    moe = replace(m, experts=8, top_k=2, expert_ffn=20000)
    assert largest_matrix(moe) == 163_840_000
    assert largest_matrix(replace(m, expert_ffn=20000)) == 90_177_536  # not MoE: ignored


@pytest.mark.parametrize("name", ["seed-llama3-70b", "homog-a100-llama2-13b", "mixtral-a100-h100",
                                  "v100-a100-llama2-13b", "extreme-l40s-h100-llama3-8b"])
def test_independent_count_equals_the_model_on_shipped_plans(name):
    """Node groups, internal pipelining with interleaving, MoE, V100 (fp16, unfused attention)
    and L40S: the validator's own count equals the vectorized model stage by stage."""
    from solver.cost.efficiency import DEFAULT_CALIBRATION
    from solver.planner.check.memory_check import plan_memory_gb
    from solver.planner.stages.search import plan_job
    from solver.planner.check.validate import _flash
    from solver.spec.loaders import INSTANCES, load_job
    job = load_job(INSTANCES / "jobs" / f"{name}.toml")
    plan = plan_job(job)
    got = plan_memory_gb(plan, DEFAULT_CALIBRATION.moe_capacity_factor,
                         [_flash(s, job) for s in plan.stages])
    assert got == pytest.approx([s.plan.memory_gb for s in plan.stages], rel=1e-9)


@pytest.mark.parametrize("epsilon", [0.0, 0.05, 0.1, 0.3])
def test_independent_cap_equals_the_model_cap(catalog, epsilon):
    """The validator re-derives the usable bytes (device memory as CUDA reports it, less the
    CUDA context and NCCL's buffers, less the user's margin) apart from
    :mod:`solver.cost.reserve`; the two agree on every catalog GPU and on a mixed island."""
    from solver.cost.reserve import usable_bytes
    from solver.planner.check.memory_check import usable_gb
    from solver.spec.domain import Island
    islands = [Island.homogeneous(name, gpu, 8) for name, gpu in sorted(catalog.items())]
    islands.append(Island("mixed", islands[0].nodes + islands[-1].nodes))
    for isl in islands:
        assert usable_gb(isl, epsilon) == pytest.approx(usable_bytes(isl, epsilon) / 1e9,
                                                        rel=1e-12), isl.name


def test_independent_cap_by_hand(catalog):
    """H100 80GB: 81,559 MiB = 85,520,809,984 B less 1 GiB and 3 x 588 MiB of NCCL rings
    (2,923,429,888 B) is 82,597,380,096 B; with ε = 0.1, 0.9 x 85,520,809,984 - 2,923,429,888
    = 76,968,728,985.6 - 2,923,429,888 = 74,045,299,097.6 B."""
    from solver.planner.check.memory_check import usable_gb
    from solver.spec.domain import Island
    h100 = Island.homogeneous("h", catalog["H100-SXM-80GB"], 8)
    assert usable_gb(h100, 0.0) == pytest.approx(82.597380096, abs=1e-12)
    assert usable_gb(h100, 0.1) == pytest.approx(74.0452990976, abs=1e-9)
