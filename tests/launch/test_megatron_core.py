"""Megatron-Core judges the Megatron-LM export: its own configuration classes validate the
values, and its own GPT model counts the parameters.

Slow, and only where the ``megatron`` extra is installed (``pip install -e '.[test,megatron]'``;
megatron-core and a CPU build of torch): the exported flags are turned into
``megatron.core``'s ``TransformerConfig`` the way Megatron-LM does it
(``megatron/training/arguments.py``, ``core_transformer_config_from_args``: ``--norm-epsilon``
is ``layernorm_epsilon``, ``--swiglu`` is ``gated_linear_unit`` with ``F.silu``,
``--disable-bias-linear`` clears ``add_bias_linear``, ``validate_args`` sets ``add_qkv_bias``
with it, ``--decoder-first/last-pipeline-num-layers`` are ``num_layers_in_first/last_pipeline_
stage``, ``--num-layers-per-virtual-pipeline-stage`` gives ``virtual_pipeline_model_parallel_
size = num_layers / pp / that``). Its ``__post_init__`` checks sequence parallelism against TP,
query groups and heads against TP, uneven stages, the pipeline layout, virtual-pipeline
divisibility, recomputation, MoE with biases; its micro-batch calculator checks the batch.
A tiny ``GPTModel`` of each architecture (Llama-, GPT-, Qwen2- and Qwen3-style) built from the
exported model flags holds exactly :attr:`ModelSpec.total_params` parameters.
"""

from __future__ import annotations

import dataclasses

import pytest

from solver.launch import NotExpressible, megatron_args, meshes
from solver.spec.loaders import INSTANCES, load_job, load_model

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

#: A Qwen2 HuggingFace config (QKV biases, RoPE base 1e6, epsilon 1e-6) on 128 H100.
QWEN2_JOB = """model = "{config}"
cluster = "h100-128"
[training]
global_batch = 256
seq_len = 4096
[planner]
framework = "megatron-core"
"""


def _flags(args: list[str]) -> dict[str, str | bool]:
    out: dict[str, str | bool] = {}
    for item in args:
        flag, _, value = item.partition(" ")
        out[flag[2:].replace("-", "_")] = value or True
    return out


def _config_kwargs(flags: dict, torch) -> dict:
    """``TransformerConfig`` fields from the exported flags, as Megatron-LM maps them."""
    import torch.nn.functional as F
    i = lambda key: int(flags[key]) if key in flags else None  # noqa: E731
    pp, layers = int(flags["pipeline_model_parallel_size"]), int(flags["num_layers"])
    bias = not flags.get("disable_bias_linear")
    kw = dict(
        num_layers=layers, hidden_size=i("hidden_size"), ffn_hidden_size=i("ffn_hidden_size"),
        num_attention_heads=i("num_attention_heads"),
        num_query_groups=i("num_query_groups") if flags.get("group_query_attention") else None,
        kv_channels=i("kv_channels"), gated_linear_unit=bool(flags.get("swiglu")),
        add_bias_linear=bias, add_qkv_bias=bias or bool(flags.get("add_qkv_bias")),
        normalization=flags.get("normalization", "LayerNorm"),
        layernorm_epsilon=float(flags.get("norm_epsilon", 1e-5)),
        qk_layernorm=bool(flags.get("qk_layernorm")),
        tensor_model_parallel_size=int(flags["tensor_model_parallel_size"]),
        pipeline_model_parallel_size=pp,
        context_parallel_size=int(flags["context_parallel_size"]),
        expert_model_parallel_size=int(flags["expert_model_parallel_size"]),
        sequence_parallel=bool(flags.get("sequence_parallel")),
        num_layers_in_first_pipeline_stage=i("decoder_first_pipeline_num_layers"),
        num_layers_in_last_pipeline_stage=i("decoder_last_pipeline_num_layers"),
        pipeline_model_parallel_layout=flags.get("pipeline_model_parallel_layout"),
        recompute_granularity=flags.get("recompute_granularity"),
        recompute_method=flags.get("recompute_method"),
        recompute_num_layers=i("recompute_num_layers"),
        bf16=bool(flags.get("bf16")), fp16=bool(flags.get("fp16")),
        fp8=flags.get("fp8_format"),
        num_moe_experts=i("num_experts"), moe_ffn_hidden_size=i("moe_ffn_hidden_size"),
        moe_token_dispatcher_type=flags.get("moe_token_dispatcher_type", "allgather"),
        overlap_moe_expert_parallel_comm=bool(flags.get("overlap_moe_expert_parallel_comm")),
    )
    if flags.get("swiglu"):
        kw["activation_func"] = F.silu
    if "moe_router_topk" in flags:
        kw["moe_router_topk"] = int(flags["moe_router_topk"])
    if "num_layers_per_virtual_pipeline_stage" in flags:
        kw["virtual_pipeline_model_parallel_size"] = (
            layers // pp // int(flags["num_layers_per_virtual_pipeline_stage"]))
    dtype = torch.bfloat16 if kw["bf16"] else torch.float16
    kw.update(params_dtype=dtype, pipeline_dtype=dtype if pp > 1 else None)
    return kw


def _stage_layers(cfg) -> list[int]:
    """Layers per pipeline rank as Megatron-Core splits them (layout; or first/last given,
    the rest even)."""
    pp = cfg.pipeline_model_parallel_size
    layout = cfg.pipeline_model_parallel_layout
    if layout is not None:
        from megatron.core.transformer.enums import LayerType
        return [sum(chunk.count(LayerType.decoder) for chunk in layout.layout[r])
                for r in range(pp)]
    rest = cfg.num_layers
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
    from solver.planner.stages.search import plan_job
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
#: expressible): the worked example, MoE on A100 + H100, V100 in FP16, GPT-3 (LayerNorm,
#: learned positions, biases, GELU) on three generations.
CORE_JOBS = ["seed-llama3-70b", "mixtral-a100-h100", "v100-a100-llama2-13b",
             "gpt3-175b-three-gen-512"]


def _job(name, tmp_path):
    from pathlib import Path
    from solver.spec.domain import Framework
    if name in ("a2a", "a2a-vp"):  # the MoE all-to-all overlap: one stage, or interleaved
        from tests.planner.test_a2a_overlap_plan import INTERLEAVED, JOB
        path = tmp_path / f"{name}.toml"
        path.write_text(JOB % ("megatron-core", "") if name == "a2a" else INTERLEAVED % "")
        return load_job(path)
    if name in ("moe", "qwen2"):
        path = tmp_path / f"{name}.toml"
        config = Path(__file__).parent / "data" / "qwen2-7b-config.json"
        path.write_text(MOE_JOB if name == "moe" else QWEN2_JOB.format(config=config))
        return load_job(path)
    job = load_job(INSTANCES / "jobs" / f"{name.removeprefix('core:')}.toml")
    if name.startswith("core:"):
        job = dataclasses.replace(job, planner=dataclasses.replace(
            job.planner, framework=Framework.MEGATRON_CORE))
    return job


@pytest.mark.parametrize("name", JOBS + ["moe", "qwen2", "a2a", "a2a-vp"]
                         + [f"core:{n}" for n in CORE_JOBS])
def test_megatron_core_accepts_the_export(mcore, name, tmp_path):
    import torch
    from solver.planner.stages.search import plan_job
    plan = plan_job(_job(name, tmp_path))
    cfg, calc = _judge(plan, torch)
    assert cfg.overlap_moe_expert_parallel_comm == name.startswith("a2a")
    assert calc.get() == plan.n_micro
    assert _stage_layers(cfg) == [x for m in meshes(plan) for x in m.layers]
    v = cfg.virtual_pipeline_model_parallel_size or 1
    assert v == plan.virtual_stages
    if v > 1:  # Megatron's schedule groups micro-batches by pp (microbatch_group_size default)
        assert plan.n_micro % cfg.pipeline_model_parallel_size == 0
    m = plan.job.model
    assert cfg.normalization == {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}[m.normalization]
    assert (cfg.layernorm_epsilon, cfg.add_bias_linear, cfg.add_qkv_bias,
            cfg.gated_linear_unit) == (m.norm_epsilon, m.bias, m.has_qkv_bias, m.gated_mlp)


@pytest.mark.parametrize("seed", range(40))
def test_megatron_core_accepts_random_one_layout_plans(mcore, seed):
    """Uneven splits (first/last flags and the layout), interleaving, every recomputation,
    CP and EP, as the round-trip tests draw them."""
    import torch
    from tests.launch.readback import plan_truth
    from tests.launch.test_round_trip import random_one_layout_plan
    job = load_job(INSTANCES / "jobs" / "homog-a100-llama2-13b.toml")
    from solver.spec.loaders import load_catalog
    catalog = load_catalog()
    base = (job, load_model(INSTANCES / "models" / "llama2-13b.toml"),
            load_model(INSTANCES / "models" / "mixtral-8x22b.toml"),
            catalog["A100-SXM-80GB"], catalog["H100-SXM-80GB"])
    plan = random_one_layout_plan(seed, base)
    if plan.stages[0].plan.config.tp > 1 and plan.job.model.heads % plan.stages[0].plan.config.tp:
        pytest.skip("TP does not divide the heads (the planner never picks it)")
    cfg, calc = _judge(plan, torch)
    truth = plan_truth(plan)
    assert _stage_layers(cfg) == [row[0] for row in truth["stages"]]
    assert (cfg.virtual_pipeline_model_parallel_size or 1) == truth["v"]
    assert calc.get() == truth["n_micro"]


def test_megatron_core_rejects_a_wrong_export(mcore):
    """The judge can fail: sequence parallelism without TP, and TP not dividing the query
    groups, are what Megatron-Core refuses."""
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig
    from solver.planner.stages.search import plan_job
    plan = plan_job(load_job(INSTANCES / "jobs" / "homog-a100-llama2-13b.toml"))
    kw = _config_kwargs(_flags(megatron_args(plan)), torch)
    with pytest.raises(ValueError, match="sequence paral+elism"):  # 0.14 spells it "paralllelism"
        TransformerConfig(**{**kw, "tensor_model_parallel_size": 1, "sequence_parallel": True})
    with pytest.raises(ValueError):
        TransformerConfig(**{**kw, "num_query_groups": 5, "tensor_model_parallel_size": 4})


@pytest.fixture(scope="module")
def one_rank(mcore):
    """A one-process gloo group with model parallel sizes 1, to build models on the CPU."""
    import torch
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo", init_method="tcp://127.0.0.1:29517",
                                             rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    try:
        model_parallel_cuda_manual_seed(1)
    except Exception:  # noqa: BLE001 - no CUDA: the CPU initialization needs no tracker seed
        pass
    yield
    parallel_state.destroy_model_parallel()


def _tiny(name: str):
    """A small model of each architecture (its fields from the catalog or the HF config)."""
    from pathlib import Path
    data = Path(__file__).parent / "data"
    src = {"llama": INSTANCES / "models" / "llama3-8b.toml",
           "gpt": INSTANCES / "models" / "gpt3-175b.toml",
           "qwen2": data / "qwen2-7b-config.json",
           "qwen3": INSTANCES / "models" / "qwen3-235b-a22b.toml"}[name]
    m = load_model(src)
    shape = dict(layers=2, hidden=64, ffn=160, heads=4, kv_heads=2 if m.kv_heads < m.heads
                 else 4, vocab=256, head_dim=32 if m.head_dim else 0,
                 max_positions=128 if m.max_positions else 0)
    if m.is_moe:
        shape.update(experts=4, top_k=2, expert_ffn=48)
    return dataclasses.replace(m, **shape)


@pytest.mark.parametrize("name", ["llama", "gpt", "qwen2", "qwen3"])
def test_megatron_core_model_holds_the_counted_parameters(one_rank, name):
    """Megatron-Core's GPTModel, built from the exported flags, holds ModelSpec.total_params
    (biases, LayerNorm's bias vectors, the learned position table, QK norms, tied head)."""
    import torch
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig
    from tests.launch.readback import build_plan, island, with_batch
    from solver.cost.stage import StageConfig
    from solver.spec.loaders import load_catalog
    m = _tiny(name)
    job = load_job(INSTANCES / "jobs" / "homog-a100-llama2-13b.toml")
    job = with_batch(job, m, 8)
    job = dataclasses.replace(job, training=dataclasses.replace(job.training, seq_len=128))
    isl = island("a", load_catalog()["A100-SXM-80GB"], 1)
    plan = build_plan(job, [(isl, m.layers, StageConfig(tp=1, dp=8, micro_batch=1))], 1)
    flags = _flags(megatron_args(plan))
    kw = _config_kwargs(flags, torch)
    # The all-to-all dispatcher opens a CUDA stream when built (MoEAlltoAllTokenDispatcher);
    # the dispatcher holds no parameters, so the count is built with the CPU-safe default.
    kw.update(params_dtype=torch.float32, bf16=False, sequence_parallel=False,
              use_cpu_initialization=True, perform_initialization=False,
              moe_token_dispatcher_type="allgather")
    cfg = TransformerConfig(**kw)
    spec = get_gpt_layer_local_spec(num_experts=cfg.num_moe_experts,
                                    qk_layernorm=cfg.qk_layernorm,
                                    normalization=cfg.normalization)
    model = GPTModel(cfg, spec, vocab_size=int(flags["padded_vocab_size"]),
                     max_sequence_length=int(flags["max_position_embeddings"]),
                     position_embedding_type=flags["position_embedding_type"],
                     rotary_base=int(flags.get("rotary_base", 10000)),
                     share_embeddings_and_output_weights=not flags.get(
                         "untie_embeddings_and_output_weights"))
    held = sum(p.numel() for p in model.parameters())
    assert held == m.total_params


@pytest.mark.parametrize("ep, recompute, pp, v", [
    (2, "none", 1, 1), (1, "none", 1, 1), (2, "full", 1, 1), (2, "selective", 1, 1),
    (2, "none", 2, 1), (2, "none", 2, 2)])
def test_megatron_core_refuses_the_overlap_where_the_rules_do(mcore, ep, recompute, pp, v):
    """The MoE all-to-all overlap: Megatron-Core's ``TransformerConfig`` accepts a layout
    exactly when :func:`~solver.cost.runtime.runtime_rules.a2a_overlap_problem` does (with
    pipeline stages, only with virtual ones)."""
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig
    from solver.cost.runtime.frameworks import PROFILES, a2a_overlap_problem
    from solver.spec.domain import Framework, Recompute
    kw = dict(num_layers=4, hidden_size=64, num_attention_heads=4, num_moe_experts=8,
              moe_ffn_hidden_size=64, expert_model_parallel_size=ep, bf16=True,
              params_dtype=torch.bfloat16, moe_token_dispatcher_type="alltoall",
              overlap_moe_expert_parallel_comm=True, pipeline_model_parallel_size=pp,
              pipeline_dtype=torch.bfloat16 if pp > 1 else None,
              virtual_pipeline_model_parallel_size=v if v > 1 else None)
    if recompute == "full":
        kw.update(recompute_granularity="full", recompute_method="uniform",
                  recompute_num_layers=1)
    elif recompute == "selective":
        kw.update(recompute_granularity="selective")
    try:
        TransformerConfig(**kw)
        accepted = True
    except (AssertionError, ValueError):
        accepted = False
    ours = a2a_overlap_problem(PROFILES[Framework.MEGATRON_CORE], True, ep, Recompute(recompute),
                               pp > 1, virtual_stages=v)
    assert accepted == (ours is None)
