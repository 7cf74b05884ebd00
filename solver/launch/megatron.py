"""Megatron-LM command-line arguments for a plan whose stages share one layout.

Flag names as Megatron-LM spells them (NVIDIA/Megatron-LM core_v0.14, ``megatron/training/
arguments.py``): ``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``,
``--context-parallel-size``, ``--expert-model-parallel-size``, ``--micro-batch-size``,
``--global-batch-size``, ``--sequence-parallel``, ``--use-distributed-optimizer``,
``--overlap-grad-reduce``, ``--overlap-param-gather``, ``--recompute-granularity`` /
``--recompute-method`` / ``--recompute-num-layers``, ``--bf16`` / ``--fp16`` / ``--fp8-format``.
Uneven first and last stages use ``--decoder-first-pipeline-num-layers`` /
``--decoder-last-pipeline-num-layers`` (the middle stages must be equal); the interleaved
schedule ``--num-layers-per-virtual-pipeline-stage`` (which Megatron does not combine with the
uneven-stage flags). Megatron runs one layout on every stage: a plan whose stages differ in
``(tp, cp, ep, dp)``, device type or recomputation is not expressible (FlagScale is).
"""

from __future__ import annotations

from solver.launch.meshes import (NotExpressible, meshes, micro_batch_size, model_flags,
                                  optimizer_flags, precision_flags)
from solver.planner.plan import Plan
from solver.spec.domain import Recompute


def megatron_args(plan: Plan) -> list[str]:
    """The arguments, one flag (with its value) per item, for ``pretrain_gpt.py``."""
    ms = meshes(plan)
    layouts = {(m.tp, m.cp, m.ep, m.dp) for m in ms}
    if len(layouts) > 1 or len({m.device for m in ms}) > 1:
        detail = "; ".join(f"stages of {m.device}: tp {m.tp} cp {m.cp} ep {m.ep} dp {m.dp}"
                           for m in ms)
        raise NotExpressible(f"the stages' layouts differ ({detail}): Megatron-LM runs one "
                             "layout; export to flagscale")
    recompute = {r for m in ms for r in m.recompute}
    if len(recompute) > 1:
        raise NotExpressible("the stages recompute differently: Megatron-LM sets one "
                             "recomputation; export to flagscale")
    m = ms[0]
    flags: dict[str, object] = {
        "tensor_model_parallel_size": m.tp,
        "pipeline_model_parallel_size": sum(x.pp for x in ms),
        "context_parallel_size": m.cp, "expert_model_parallel_size": m.ep,
        "micro_batch_size": micro_batch_size(plan, m.dp),
        "global_batch_size": plan.job.training.global_batch,
        "sequence_parallel": m.tp > 1, "tp_comm_overlap": m.tp > 1,
        "transformer_impl": "transformer_engine", "use_flash_attn": True,
        **_split(plan, [x for mesh in ms for x in mesh.layers]),
        **optimizer_flags(plan), **_recompute(recompute.pop()), **precision_flags(plan),
        **model_flags(plan),
    }
    return to_argv(flags)


def _split(plan: Plan, layers: list[int]) -> dict[str, object]:
    """Layer-split flags for per-stage layer counts ``layers``."""
    if plan.virtual_stages > 1:
        if len(set(layers)) > 1:
            raise NotExpressible("interleaving needs equal stages in Megatron-LM")
        return {"num_layers_per_virtual_pipeline_stage": layers[0] // plan.virtual_stages}
    if len(set(layers)) == 1:
        return {}
    middle = layers[1:-1]
    if len(set(middle)) > 1:
        raise NotExpressible(f"the middle pipeline stages hold {middle} layers: Megatron-LM "
                             "needs them equal (only the first and last may differ)")
    out: dict[str, object] = {}
    if not middle or layers[0] != middle[0]:
        out["decoder_first_pipeline_num_layers"] = layers[0]
    if not middle or layers[-1] != middle[0]:
        out["decoder_last_pipeline_num_layers"] = layers[-1]
    return out


def _recompute(r: Recompute) -> dict[str, object]:
    if r is Recompute.FULL:
        return {"recompute_granularity": "full", "recompute_method": "uniform",
                "recompute_num_layers": 1}
    if r is Recompute.SELECTIVE:
        return {"recompute_granularity": "selective"}
    return {}


def to_argv(flags: dict[str, object]) -> list[str]:
    """``{"a_b": 3, "c": True, "d": False}`` -> ``["--a-b 3", "--c"]`` (False flags omitted)."""
    out = []
    for key, value in flags.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is not False and value is not None:
            out.append(f"{flag} {value}")
    return out
