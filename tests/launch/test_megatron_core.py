"""Megatron-Core judges the Megatron-LM export: its own configuration classes validate the values.

Slow, and only where the ``megatron`` extra is installed (``pip install -e '.[test,megatron]'``;
megatron-core and a CPU build of torch): the exported flags are turned into
``megatron.core``'s ``TransformerConfig`` (its ``__post_init__`` checks sequence parallelism
against TP, query groups against TP, uneven first/last stages and virtual-pipeline divisibility,
recomputation settings, expert parallelism) and its micro-batch calculator (global batch against
micro-batch size x data-parallel size). The mapping from flags to fields is Megatron-LM's own
(``megatron/training/arguments.py``: ``--num-layers-per-virtual-pipeline-stage`` gives
``virtual_pipeline_model_parallel_size = num_layers / pp / that``; the ``--decoder-first/last-
pipeline-num-layers`` flags are the config's ``num_layers_in_first/last_pipeline_stage``).
"""

from __future__ import annotations

import pytest

from solver.launch import NotExpressible, megatron_args, meshes
from solver.spec.loaders import INSTANCES, load_job

pytestmark = pytest.mark.slow

#: Shipped jobs whose plans run one layout (Megatron-LM can express them), planned in seconds:
#: plain 1F1B, and interleaved schedules with TP 8 (long context) and on 128 H100 (70B).
JOBS = ["homog-a100-llama2-13b", "h100-sxm-nvl-llama2-13b", "long-context-llama3-8b",
        "homog-h100-llama3-70b"]

#: MoE with expert parallelism and an uneven last stage: Mixtral on 128 H100, planned for
#: Megatron-Core (one mesh, one layout), three stages by constraint (56 layers: 19, 19, 18).
MOE_JOB = """model = "mixtral-8x22b"
cluster = "h100-128"
[training]
global_batch = 512
seq_len = 4096
n_micro = 32
[planner]
framework = "megatron-core"
[constraints]
tp = [2]
ep = [8]
pp = [3]
"""


def _flags(args: list[str]) -> dict[str, str | bool]:
    out: dict[str, str | bool] = {}
    for item in args:
        flag, _, value = item.partition(" ")
        out[flag[2:].replace("-", "_")] = value or True
    return out


def _config_kwargs(flags: dict, torch) -> dict:
    """``TransformerConfig`` fields from the exported flags, as Megatron-LM's arguments.py
    maps them."""
    i = lambda key: int(flags[key]) if key in flags else None  # noqa: E731
    pp, layers = int(flags["pipeline_model_parallel_size"]), int(flags["num_layers"])
    kw = dict(
        num_layers=layers, hidden_size=i("hidden_size"), ffn_hidden_size=i("ffn_hidden_size"),
        num_attention_heads=i("num_attention_heads"), num_query_groups=i("num_query_groups"),
        kv_channels=i("kv_channels"), gated_linear_unit=bool(flags.get("swiglu")),
        add_bias_linear=not flags.get("disable_bias_linear"),
        normalization=flags.get("normalization", "LayerNorm"),
        tensor_model_parallel_size=int(flags["tensor_model_parallel_size"]),
        pipeline_model_parallel_size=pp,
        context_parallel_size=int(flags["context_parallel_size"]),
        expert_model_parallel_size=int(flags["expert_model_parallel_size"]),
        sequence_parallel=bool(flags.get("sequence_parallel")),
        num_layers_in_first_pipeline_stage=i("decoder_first_pipeline_num_layers"),
        num_layers_in_last_pipeline_stage=i("decoder_last_pipeline_num_layers"),
        recompute_granularity=flags.get("recompute_granularity"),
        recompute_method=flags.get("recompute_method"),
        recompute_num_layers=i("recompute_num_layers"),
        bf16=bool(flags.get("bf16")), fp16=bool(flags.get("fp16")),
        fp8=flags.get("fp8_format"),
        num_moe_experts=i("num_experts"), moe_ffn_hidden_size=i("moe_ffn_hidden_size"),
    )
    if "moe_router_topk" in flags:
        kw["moe_router_topk"] = int(flags["moe_router_topk"])
    if "num_layers_per_virtual_pipeline_stage" in flags:
        kw["virtual_pipeline_model_parallel_size"] = (
            layers // pp // int(flags["num_layers_per_virtual_pipeline_stage"]))
    dtype = torch.bfloat16 if kw["bf16"] else torch.float16
    kw.update(params_dtype=dtype, pipeline_dtype=dtype if pp > 1 else None)
    return kw


def _stage_layers(cfg) -> list[int]:
    """Layers per pipeline rank as Megatron-Core splits them (first/last given, rest even)."""
    pp, rest = cfg.pipeline_model_parallel_size, cfg.num_layers
    first, last = cfg.num_layers_in_first_pipeline_stage, cfg.num_layers_in_last_pipeline_stage
    inner = pp - (first is not None) - (last is not None)
    rest -= (first or 0) + (last or 0)
    even = [rest // inner] * inner if inner else []
    return ([first] if first is not None else []) + even + ([last] if last is not None else [])


@pytest.fixture(scope="module")
def mcore():
    pytest.importorskip("torch")
    return pytest.importorskip("megatron.core")


def test_a_plan_of_several_layouts_says_why_in_one_line():
    from solver.planner.search import plan_job
    # The worked example's FlagScale plan: H100 stages at dp 8, A100 stages at dp 16.
    plan = plan_job(load_job(INSTANCES / "jobs" / "seed-llama3-70b.toml"))
    with pytest.raises(NotExpressible, match="export to flagscale") as exc:
        megatron_args(plan)
    assert "\n" not in str(exc.value)


def _judge(plan, torch):
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
    from megatron.core.transformer.transformer_config import TransformerConfig
    flags = _flags(megatron_args(plan))
    cfg = TransformerConfig(**_config_kwargs(flags, torch))
    dp = meshes(plan)[0].dp
    calc = ConstantNumMicroBatchesCalculator(
        int(flags["global_batch_size"]), int(flags["micro_batch_size"]), dp, None, 0)
    return cfg, calc


#: Mixed clusters planned for ``framework = "megatron-core"`` (one-mesh plans: always
#: expressible): the worked example, MoE on A100 + H100, V100 in FP16.
CORE_JOBS = ["seed-llama3-70b", "mixtral-a100-h100", "v100-a100-llama2-13b"]


def _job(name, tmp_path):
    import dataclasses
    from solver.spec.domain import Framework
    if name == "moe":
        path = tmp_path / "moe.toml"
        path.write_text(MOE_JOB)
        return load_job(path)
    job = load_job(INSTANCES / "jobs" / f"{name.removeprefix('core:')}.toml")
    if name.startswith("core:"):
        job = dataclasses.replace(job, planner=dataclasses.replace(
            job.planner, framework=Framework.MEGATRON_CORE))
    return job


@pytest.mark.parametrize("name", JOBS + ["moe"] + [f"core:{n}" for n in CORE_JOBS])
def test_megatron_core_accepts_the_export(mcore, name, tmp_path):
    import torch
    from solver.planner.search import plan_job
    plan = plan_job(_job(name, tmp_path))
    cfg, calc = _judge(plan, torch)
    assert calc.get() == plan.n_micro
    assert _stage_layers(cfg) == [x for m in meshes(plan) for x in m.layers]
    v = cfg.virtual_pipeline_model_parallel_size or 1
    assert v == plan.virtual_stages
    if v > 1:  # Megatron's schedule groups micro-batches by pp (microbatch_group_size default)
        assert plan.n_micro % cfg.pipeline_model_parallel_size == 0


def test_megatron_core_rejects_a_wrong_export(mcore):
    """The judge can fail: sequence parallelism without TP, and TP not dividing the query
    groups, are what Megatron-Core refuses."""
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig
    from solver.planner.search import plan_job
    plan = plan_job(load_job(INSTANCES / "jobs" / "homog-a100-llama2-13b.toml"))
    kw = _config_kwargs(_flags(megatron_args(plan)), torch)
    with pytest.raises(ValueError, match="sequence parallelism"):
        TransformerConfig(**{**kw, "tensor_model_parallel_size": 1, "sequence_parallel": True})
    with pytest.raises(ValueError):
        TransformerConfig(**{**kw, "num_query_groups": 5, "tensor_model_parallel_size": 4})
