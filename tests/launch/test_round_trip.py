"""Round trips: an export read back the way the runtime reads it runs exactly the plan.

For seeded random plans built by hand (odd layer counts, uneven first/last and middle stages,
interleaving, every recomputation choice, context and expert parallelism, several meshes of
alternating GPU types) and for the shipped jobs' plans (``test_flagscale_rules.py``), the
Megatron-LM launch parsed back (:func:`tests.launch.readback.megatron_read`) and the FlagScale
config read back (:func:`solver.launch.flagscale_check.read_back`) give the plan's layer split,
layouts, recomputation, virtual stages, micro-batches and batch (:func:`plan_truth`).
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import yaml

from solver.cost.stage import StageConfig
from solver.launch import flagscale_hostfile, flagscale_yaml, megatron_launch
from solver.launch.flagscale_check import problems
from solver.spec.domain import Recompute
from solver.spec.loaders import INSTANCES, load_catalog, load_job, load_model
from tests.launch.readback import (build_plan, flagscale_read, island, megatron_read,
                                   plan_truth, with_batch)

SEEDS = range(40)


@pytest.fixture(scope="module")
def base():
    catalog = load_catalog()
    job = load_job(INSTANCES / "jobs" / "homog-a100-llama2-13b.toml")
    dense = load_model(INSTANCES / "models" / "llama2-13b.toml")
    moe = load_model(INSTANCES / "models" / "mixtral-8x22b.toml")
    return job, dense, moe, catalog["A100-SXM-80GB"], catalog["H100-SXM-80GB"]


def _split(rng: random.Random, layers: int, stages: int, shape: str) -> list[int]:
    """``layers`` over ``stages``: equal-ish middle with uneven ends, or any composition."""
    if shape == "ends" and stages >= 3:
        middle = rng.randint(1, max(1, (layers - 2) // stages))
        rest = layers - middle * (stages - 2)
        first = rng.randint(1, rest - 1)
        return [first] + [middle] * (stages - 2) + [rest - first]
    cuts = sorted(rng.sample(range(1, layers), stages - 1))
    return [b - a for a, b in zip([0] + cuts, cuts + [layers])]


def _recompute(rng: random.Random, fewest: int, v: int = 1) -> dict:
    kind = rng.choice(["none", "selective", "full", "block"])
    if kind == "block":  # a rank of v chunks recomputes a multiple of v (one count per chunk)
        return {"recompute": Recompute.FULL,
                "recompute_layers": rng.randint(1, fewest // v + 1) * v}
    return {"recompute": {"none": Recompute.NONE, "selective": Recompute.SELECTIVE,
                          "full": Recompute.FULL}[kind]}


def _expert_grid(rng: random.Random, tp: int, cp: int, dp: int) -> dict:
    """An MoE stage's expert-TP (a divisor of tp) and EP on Megatron-Core's expert grid."""
    etp = rng.choice([d for d in (1, 2, 4, 8) if tp % d == 0])
    ep = rng.choice([e for e in (1, 2, 4, 8) if (tp * cp * dp // etp) % e == 0])
    return {"ep": ep, "expert_tp": None if etp == tp else etp}


def _layout(rng: random.Random, moe: bool) -> dict:
    tp, cp, dp = rng.choice([1, 2, 4, 8]), rng.choice([1, 1, 2]), rng.choice([1, 2, 4])
    grid = _expert_grid(rng, tp, cp, dp) if moe else {"ep": 1}
    return {"tp": tp, "cp": cp, "dp": dp, **grid}


def random_one_layout_plan(seed: int, base):
    """A plan Megatron-LM can run: one layout, one recomputation, any split or interleaving."""
    job, dense, moe_model, a100, h100 = base
    rng = random.Random(seed)
    moe = rng.random() < 0.3
    lay = _layout(rng, moe)
    stages = rng.randint(2, 6)
    v = rng.choice([1, 1, 2, 3])
    if v > 1:
        layers = stages * v * rng.randint(1, 2)
        split = [layers // stages] * stages
    else:
        layers = rng.choice([33, 35, 37, 41, 45])
        split = _split(rng, layers, stages, rng.choice(["ends", "any"]))
    model = replace(moe_model if moe else dense, layers=layers)
    mbs = rng.choice([1, 2])
    n = stages * rng.choice([1, 2, 4])
    c = StageConfig(**lay, micro_batch=mbs, **_recompute(rng, min(split), v))
    per_node = min(8, c.gpus)
    # Alternate two GPU types (one vendor) or keep one island.
    kinds = [a100, h100] if rng.random() < 0.5 else [a100]
    isls = [island(f"i{k}", g, stages * c.gpus // per_node, per_node)
            for k, g in enumerate(kinds)]
    spec = [(isls[i % len(isls)], layers_i, c) for i, layers_i in enumerate(split)]
    return build_plan(with_batch(job, model, n * mbs * lay["dp"]), spec, n, v)


@pytest.mark.parametrize("seed", SEEDS)
def test_megatron_round_trip_of_random_one_layout_plans(seed, base):
    plan = random_one_layout_plan(seed, base)
    assert megatron_read(megatron_launch(plan)) == plan_truth(plan)


@pytest.mark.parametrize("seed", SEEDS)
def test_flagscale_round_trip_of_random_one_layout_plans(seed, base):
    plan = random_one_layout_plan(seed, base)
    from solver.launch import NotExpressible
    try:
        text, hostfile = flagscale_yaml(plan, "p.hostfile"), flagscale_hostfile(plan)
    except NotExpressible as exc:
        # Only hetero mode's limits: several meshes (two GPU types) with cp or interleaving,
        # or selective recomputation beside others (not here: one setting).
        assert len({s.island.name for s in plan.stages}) > 1 and \
            (plan.virtual_stages > 1 or plan.stages[0].plan.config.cp > 1), str(exc)
        return
    doc = yaml.safe_load(text)
    assert problems(doc, hostfile) == []
    assert flagscale_read(doc, hostfile) == plan_truth(plan)


def random_hetero_plan(seed: int, base):
    """A plan of several meshes FlagScale runs: each stage its own (tp, dp, ep), micro-batches
    ``dp_i · mbs_i`` equal, cp 1, per-stage recomputation (full, block or none)."""
    job, dense, moe_model, a100, h100 = base
    rng = random.Random(1000 + seed)
    moe = rng.random() < 0.3
    stages = rng.randint(2, 5)
    layers = rng.choice([31, 33, 35, 37, 41])
    split = _split(rng, layers, stages, "any")
    model = replace(moe_model if moe else dense, layers=layers)
    micro = 8  # sequences per micro-batch, split over each stage's dp
    n = rng.choice([4, 8, 16])
    kinds = [a100, h100]
    spec = []
    for i, layers_i in enumerate(split):
        dp = rng.choice([1, 2, 4, 8])
        tp = rng.choice([1, 2, 4, 8])
        grid = _expert_grid(rng, tp, 1, dp) if moe else {"ep": 1}
        rc = rng.choice([{}, {"recompute": Recompute.FULL},
                         {"recompute": Recompute.FULL,
                          "recompute_layers": rng.randint(1, layers_i)}])
        c = StageConfig(tp=tp, dp=dp, **grid, micro_batch=micro // dp, **rc)
        per_node = min(8, c.gpus)
        spec.append((island(f"s{i}", kinds[rng.randint(0, 1)], 1, per_node)
                     if c.gpus <= 8 else island(f"s{i}", kinds[i % 2], c.gpus // 8), layers_i, c))
    return build_plan(with_batch(job, model, n * micro), spec, n)


@pytest.mark.parametrize("seed", SEEDS)
def test_flagscale_round_trip_of_random_hetero_plans(seed, base):
    plan = random_hetero_plan(seed, base)
    text, hostfile = flagscale_yaml(plan, "p.hostfile"), flagscale_hostfile(plan)
    doc = yaml.safe_load(text)
    assert problems(doc, hostfile) == []
    assert flagscale_read(doc, hostfile) == plan_truth(plan)
    # The hostfile: every stage's nodes in pipeline order, its GPUs per node, its GPU type.
    lines = [line.split() for line in hostfile.splitlines() if not line.startswith("#")]
    want = [(n.node_id, s.plan.config.gpus // len(s.nodes), s.island.gpu.name)
            for s in plan.stages for n in s.nodes]
    got = [(host, int(slots[6:]), kind[5:]) for host, slots, kind in lines]
    assert [g[:2] for g in got] == [w[:2] for w in want]
    assert all(g[2].startswith(w[2]) for g, w in zip(got, want))


def test_the_random_draws_cover_what_they_claim(base):
    """The seeds draw what the module promises (so the round trips above bind)."""
    plans = [random_one_layout_plan(s, base) for s in SEEDS]
    texts = [megatron_launch(p) for p in plans]
    assert any("--pipeline-model-parallel-layout" in t for t in texts)
    assert any("--decoder-first-pipeline-num-layers" in t for t in texts)
    assert any("--num-layers-per-virtual-pipeline-stage" in t for t in texts)
    for method in ("uniform", "block"):
        assert any(f"--recompute-method {method}" in t for t in texts)
    assert any("--recompute-granularity selective" in t for t in texts)
    assert any("--context-parallel-size 2" in t for t in texts)
    assert any("--expert-model-parallel-size 2" in t or "--expert-model-parallel-size 4" in t
               for t in texts)
    assert any(p.job.model.layers % 2 for p in plans)
    # Expert-TP below TP with EP beyond cp·dp (the expert grid), in both exports.
    assert any("--expert-tensor-parallel-size 1" in t and "--tensor-model-parallel-size 1" not in t
               for t in texts)
    hetero = [flagscale_yaml(random_hetero_plan(s, base)) for s in SEEDS]
    assert any("recompute_method_per_stage_micro_batch" in t for t in hetero)
    assert any("A100-SXM-80GB-2" in t or "H100-SXM-80GB-2" in t for t in hetero)
    assert any("expert_tensor_parallel_size_per_process_mesh" in t for t in hetero)
