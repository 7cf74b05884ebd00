"""FlagScale heterogeneous training: the ``train`` YAML of a plan.

Key names and semantics as FlagScale reads them (FlagOpen/FlagScale, 2025-11:
``flagscale/train/arguments.py::pre_validate_args`` and the Megatron-LM patch
``_add_hetero_args``). Every key of ``system`` and ``model`` becomes a Megatron flag (nested block
names only group). ``hetero_process_meshes`` is one flat list of ``[tp, cp, ep, dp, pp]`` per mesh
in pipeline order; ``hetero_pipeline_layer_split`` the layers of every pipeline stage, summing to
the model's; ``hetero_device_types`` one per mesh. ``micro_batch_size`` is the per-rank
micro-batch of the first mesh (FlagScale gives mesh ``i`` ``dp_0 · mbs / dp_i``), and every mesh
sees the same number of micro-batches. Per-stage recomputation uses
``recompute_granularity_per_stage_micro_batch``: one ``[1, n_micro, on]`` entry per stage with
``recompute_granularity: full`` set. FlagScale rejects virtual pipeline stages and context
parallelism with hetero on, and needs the first and last meshes to share ``tp`` when the
embedding is tied.
"""

from __future__ import annotations

from typing import Any

from solver.launch.meshes import (Mesh, NotExpressible, meshes, micro_batch_size, model_flags,
                                  optimizer_flags, precision_flags)
from solver.launch.yaml_text import dump
from solver.planner.plan import Plan
from solver.spec.domain import Recompute


def flagscale_config(plan: Plan) -> dict[str, Any]:
    """The ``train`` document (``system`` and ``model`` blocks) for ``plan``."""
    ms = meshes(plan)
    _check(plan, ms)
    first = ms[0]
    system: dict[str, Any] = {
        "tensor_model_parallel_size": first.tp,
        "pipeline_model_parallel_size": sum(m.pp for m in ms),
        "context_parallel_size": 1,
        "expert_model_parallel_size": first.ep,
        "sequence_parallel": any(m.tp > 1 for m in ms),
        "use_flash_attn": True, "transformer_impl": "transformer_engine",
        "use_mcore_models": True,
        **optimizer_flags(plan),
        **_recompute(plan, ms),
        "precision": precision_flags(plan),
        "hetero": _hetero(plan, ms),
    }
    model = {**model_flags(plan),
             "micro_batch_size": micro_batch_size(plan, first.dp),
             "global_batch_size": plan.job.training.global_batch}
    return {"system": system, "model": model}


def flagscale_yaml(plan: Plan) -> str:
    """:func:`flagscale_config` as YAML text."""
    head = (f"# FlagScale heterogeneous training config written by tangram for job "
            f"{plan.job.name}: {len(meshes(plan))} meshes, "
            f"{plan.tokens_per_s:,.0f} tokens/s planned\n")
    return head + dump(flagscale_config(plan))


def _check(plan: Plan, ms: list[Mesh]) -> None:
    if plan.virtual_stages > 1 and len(ms) > 1:
        raise NotExpressible("FlagScale rejects virtual pipeline stages with hetero meshes")
    if any(m.cp > 1 for m in ms):
        raise NotExpressible("FlagScale's hetero mode asserts context parallelism is 1")
    if plan.job.model.tied_embeddings and ms[0].tp != ms[-1].tp:
        raise NotExpressible(f"a tied embedding needs the first and last meshes to share tp "
                             f"({ms[0].tp} vs {ms[-1].tp})")


def _hetero(plan: Plan, ms: list[Mesh]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "enable_hetero": True,
        "hetero_process_meshes": [x for m in ms for x in (m.tp, m.cp, m.ep, m.dp, m.pp)],
        "hetero_pipeline_layer_split": [x for m in ms for x in m.layers],
        "hetero_device_types": [m.device for m in ms],
        "standalone_embedding_stage": False,
    }
    if plan.job.model.tied_embeddings and ms[0].dp != ms[-1].dp:
        out["use_partial_reduce_for_shared_embedding"] = True
    return out


def _recompute(plan: Plan, ms: list[Mesh]) -> dict[str, Any]:
    per_stage = [r for m in ms for r in m.recompute]
    if Recompute.SELECTIVE in per_stage:
        raise NotExpressible("FlagScale's per-stage recomputation is full or none")
    if Recompute.FULL not in per_stage:
        return {}
    return {"recompute_granularity": "full", "recompute_method": "uniform",
            "recompute_num_layers": 1,
            "recompute_granularity_per_stage_micro_batch": [
                [1, plan.n_micro, int(r is Recompute.FULL)] for r in per_stage]}
