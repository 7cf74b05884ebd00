"""Each Megatron-LM flag's meaning pinned on a case worked out by hand (and FlagScale's
counterpart where it has one). Megatron-LM core_v0.14.0, ``megatron/training/arguments.py``:
``--decoder-first-pipeline-num-layers`` is the FIRST stage's layer count and
``--decoder-last-pipeline-num-layers`` the LAST stage's, the middle stages split the rest
evenly; ``--recompute-method uniform --recompute-num-layers 1`` recomputes every layer (chunks
of one layer), ``block k`` only the first k layers of each stage."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from solver.cost.stage import StageConfig
from solver.launch import NotExpressible, flagscale_hostfile, flagscale_yaml, megatron_args
from solver.launch import megatron_launch
from solver.launch.flagscale_check import problems
from solver.launch.megatron import pipeline_layout
from solver.spec.domain import Recompute
from solver.spec.loaders import INSTANCES, load_catalog, load_job, load_model
from tests.launch.readback import (build_plan, island, megatron_flags, megatron_read, plan_truth,
                                   with_batch)


@pytest.fixture(scope="module")
def a100():
    return load_catalog()["A100-SXM-80GB"]


def _job(layers: int, global_batch: int = 64):
    job = load_job(INSTANCES / "jobs" / "homog-a100-llama2-13b.toml")
    model = replace(load_model(INSTANCES / "models" / "llama2-13b.toml"), layers=layers)
    return with_batch(job, model, global_batch)


def _plan(a100, split, config=StageConfig(tp=8, dp=1, micro_batch=1), n_micro=64, v=1):
    """One island of 8-GPU A100 nodes; a stage of ``split[i]`` layers per node group."""
    isl = island("a", a100, len(split) * config.gpus // 8)
    return build_plan(_job(sum(split), n_micro * config.dp * config.micro_batch),
                      [(isl, n, config) for n in split], n_micro, v)


def _f(plan) -> dict:
    return {a.partition(" ")[0][2:]: a.partition(" ")[2] or True for a in megatron_args(plan)}


def test_first_stage_flag_holds_first_stage_layers(a100):
    # 41 layers on four stages of 12, 10, 10, 9: the first flag is 12 (the first stage), the
    # last 9; Megatron gives the two middle stages (41 - 12 - 9) / 2 = 10 each.
    plan = _plan(a100, [12, 10, 10, 9])
    f = _f(plan)
    assert f["decoder-first-pipeline-num-layers"] == "12"
    assert f["decoder-last-pipeline-num-layers"] == "9"
    assert "pipeline-model-parallel-layout" not in f
    read = megatron_read(megatron_launch(plan))
    assert [row[0] for row in read["stages"]] == [12, 10, 10, 9]
    assert sum(row[0] for row in read["stages"]) == 41


def test_only_the_uneven_end_gets_a_flag(a100):
    # 9, 8, 8: the last stage is like the middle ones, so only the first flag (9); 8, 8, 9:
    # only the last; 2 stages of 20 and 21: both.
    assert {k: v for k, v in _f(_plan(a100, [9, 8, 8])).items() if k.startswith("decoder")} \
        == {"decoder-first-pipeline-num-layers": "9"}
    assert {k: v for k, v in _f(_plan(a100, [8, 8, 9])).items() if k.startswith("decoder")} \
        == {"decoder-last-pipeline-num-layers": "9"}
    f = _f(_plan(a100, [20, 21]))
    assert (f["decoder-first-pipeline-num-layers"], f["decoder-last-pipeline-num-layers"]) == \
        ("20", "21")


def test_unequal_middle_stages_use_the_layout(a100):
    # 7, 9, 8, 9: the middle stages differ (9 vs 8), beyond the first/last flags.
    plan = _plan(a100, [7, 9, 8, 9])
    f = _f(plan)
    assert f["pipeline-model-parallel-layout"] == "Et*7|t*9|t*8|t*9L"
    assert not any(k.startswith("decoder") for k in f)
    assert pipeline_layout([1, 2]) == "Et*1|t*2L"
    assert [r[0] for r in megatron_read(megatron_launch(plan))["stages"]] == [7, 9, 8, 9]
    # In the launch script the layout is quoted for the shell (| and * are shell syntax).
    assert "'Et*7|t*9|t*8|t*9L'" in megatron_launch(plan)


def test_full_recompute_exports_uniform_method(a100):
    full = StageConfig(tp=8, dp=1, micro_batch=1, recompute=Recompute.FULL)
    f = _f(_plan(a100, [10, 10], full))
    assert (f["recompute-granularity"], f["recompute-method"], f["recompute-num-layers"]) == \
        ("full", "uniform", "1")
    # FlagScale, one setting for the job: the same three keys.
    text = flagscale_yaml(_plan(a100, [10, 10], full))
    rc = yaml.safe_load(text)["train"]["system"]["recompute"]
    assert rc == {"recompute_granularity": "full", "recompute_method": "uniform",
                  "recompute_num_layers": 1}


def test_block_recompute_exports_its_layer_count(a100):
    block = StageConfig(tp=8, dp=1, micro_batch=1, recompute=Recompute.FULL, recompute_layers=3)
    f = _f(_plan(a100, [10, 10], block))
    assert (f["recompute-granularity"], f["recompute-method"], f["recompute-num-layers"]) == \
        ("full", "block", "3")
    sel = StageConfig(tp=8, dp=1, micro_batch=1, recompute=Recompute.SELECTIVE)
    f = _f(_plan(a100, [10, 10], sel))
    assert f["recompute-granularity"] == "selective" and "recompute-method" not in f
    assert "recompute-granularity" not in _f(_plan(a100, [10, 10]))


def test_block_recompute_counts_layers_per_model_chunk(a100):
    # Interleaved, v = 2: a rank of 12 layers is two chunks of 6; recomputing 4 layers of the
    # rank is block 2 in each chunk (checkpointed_forward runs once per chunk), so the flag is 2.
    block = StageConfig(tp=8, dp=1, micro_batch=1, recompute=Recompute.FULL, recompute_layers=4)
    plan = _plan(a100, [12, 12], block, v=2)
    f = _f(plan)
    assert (f["recompute-method"], f["recompute-num-layers"]) == ("block", "2")
    assert megatron_read(megatron_launch(plan)) == plan_truth(plan)
    odd = StageConfig(tp=8, dp=1, micro_batch=1, recompute=Recompute.FULL, recompute_layers=3)
    with pytest.raises(NotExpressible, match="model chunks"):
        megatron_args(_plan(a100, [12, 12], odd, v=2))


def test_per_stage_recompute_in_flagscale(a100):
    # Three stages on two islands: all layers (uniform), 4 of 12 layers (block), none; 16
    # micro-batches. FlagScale: granularity 1/1/0, method 0 (uniform) / 1 (block) / 0, layers
    # 1 / 4 / 0, each as [1 stage, 16 micro-batches, value].
    job = _job(36, 16 * 8)
    h100 = load_catalog()["H100-SXM-80GB"]
    a, h = island("a", a100, 2), island("h", h100, 1)
    c = StageConfig(tp=8, dp=1, micro_batch=8)
    plan = build_plan(job, [(a, 12, replace(c, recompute=Recompute.FULL)),
                            (h, 12, replace(c, recompute=Recompute.FULL, recompute_layers=4)),
                            (a, 12, c)], 16)
    text = flagscale_yaml(plan, "x.hostfile")
    rc = yaml.safe_load(text)["train"]["system"]["recompute"]
    assert rc["recompute_granularity_per_stage_micro_batch"] == [[1, 16, 1], [1, 16, 1],
                                                                 [1, 16, 0]]
    assert rc["recompute_method_per_stage_micro_batch"] == [[1, 16, 0], [1, 16, 1], [1, 16, 0]]
    assert rc["recompute_num_layers_per_stage_micro_batch"] == [[1, 16, 1], [1, 16, 4],
                                                                [1, 16, 0]]
    assert problems(yaml.safe_load(text), flagscale_hostfile(plan)) == []
    with pytest.raises(NotExpressible, match="recompute differently"):
        megatron_args(plan)


def test_interleaving_flag_and_batch(a100):
    # 32 layers on 4 stages, v = 2: 4 layers per chunk; 64 micro-batches of 1 per rank at dp 1.
    plan = _plan(a100, [8, 8, 8, 8], v=2)
    f = _f(plan)
    assert f["num-layers-per-virtual-pipeline-stage"] == "4"
    assert (f["micro-batch-size"], f["global-batch-size"]) == ("1", "64")
    assert megatron_read(megatron_launch(plan)) == plan_truth(plan)
    with pytest.raises(NotExpressible, match="equal stages"):
        megatron_args(_plan(a100, [9, 8, 8, 7], v=2))
    # FlagScale, one mesh: plain Megatron mode, the same key, no hetero block.
    system = yaml.safe_load(flagscale_yaml(plan))["train"]["system"]
    assert system["num_layers_per_virtual_pipeline_stage"] == 4 and "hetero" not in system


def test_world_size_and_nodes_in_rank_order(a100):
    plan = _plan(a100, [10, 10, 10], StageConfig(tp=8, dp=2, micro_batch=1))
    text = megatron_launch(plan)
    flags, nodes = megatron_flags(text)
    assert nodes == [8] * 6 and "world size 48 on 6 nodes" in text
    ids = [line.split()[3] for line in text.splitlines() if "node_rank" in line and
           "nproc_per_node" in line]
    assert ids == [n.node_id for s in plan.stages for n in s.nodes] == \
        [f"a-{i}" for i in range(6)]
    assert "--nnodes 6 --nproc-per-node 8" in text and flags["pipeline_model_parallel_size"] \
        == "3"


def test_zero3_exports_megatron_fsdp(a100):
    # One stage of tp 8, dp 2 under ZeRO-3: Megatron-FSDP with its optimizer and the checkpoint
    # format validate_args requires; the header warns against CUDA_DEVICE_MAX_CONNECTIONS=1.
    fsdp = StageConfig(tp=8, dp=2, zero=3, micro_batch=1, recompute=Recompute.FULL,
                       recompute_layers=5)
    plan = _plan(a100, [40], fsdp)
    f = _f(plan)
    assert (f["use-megatron-fsdp"], f["data-parallel-sharding-strategy"], f["ckpt-format"]) == \
        (True, "optim_grads_params", "fsdp_dtensor")
    assert f["use-distributed-optimizer"] is True and f["overlap-param-gather"] is True
    assert f["no-gradient-accumulation-fusion"] is True  # as Megatron-FSDP's guide asks
    assert (f["recompute-method"], f["recompute-num-layers"]) == ("block", "5")
    assert "CUDA_DEVICE_MAX_CONNECTIONS" in megatron_launch(plan)
    assert megatron_read(megatron_launch(plan)) == plan_truth(plan)
    # ZeRO-1 stays the distributed optimizer alone; FlagScale's profile has no ZeRO-3.
    z1 = _f(_plan(a100, [40], replace(fsdp, zero=1)))
    assert "use-megatron-fsdp" not in z1 and z1["use-distributed-optimizer"] is True
    with pytest.raises(NotExpressible, match="--emit megatron"):
        flagscale_yaml(plan)
