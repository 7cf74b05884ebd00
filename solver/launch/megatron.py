"""Megatron-LM: the arguments and the launch of a plan whose stages share one layout.

Flag names as Megatron-LM spells them (NVIDIA/Megatron-LM ``core_v0.14.0``,
``megatron/training/arguments.py``; the model block: :mod:`solver.launch.model_flags`):

* ``_add_distributed_args``: ``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``,
  ``--context-parallel-size`` (and ``_add_moe_args``: ``--expert-model-parallel-size``,
  ``--expert-tensor-parallel-size``);
  ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers`` (the layers
  of the first / last pipeline stage; the others split the rest evenly: ``TransformerConfig.
  __post_init__`` checks the middle divides); ``--pipeline-model-parallel-layout`` for any
  other split (parsed by ``PipelineParallelLayerLayout.parse_str_to_list`` in
  ``megatron/core/transformer/pipeline_parallel_layer_layout.py``: stages split by ``|``,
  ``E`` the embedding, ``t`` a decoder layer, ``L`` the loss, ``x*n`` repeats ``x``; the
  embedding must open the first stage and the loss close the last, ``validate_layer_layout``);
  ``--num-layers-per-virtual-pipeline-stage`` for the interleaved schedule (``validate_args``
  allows one of it, ``--num-virtual-stages-per-pipeline-rank`` and the layout, and rejects it
  with the first/last flags).
* ``_add_training_args``: ``--micro-batch-size``, ``--global-batch-size``,
  ``--sequence-parallel``, ``--tp-comm-overlap``, ``--use-flash-attn``,
  ``--no-gradient-accumulation-fusion`` (with Megatron-FSDP),
  ``--recompute-granularity`` (``full`` | ``selective``), ``--recompute-method``
  (``uniform``: the layers in chunks of ``--recompute-num-layers``, all recomputed with 1;
  ``block``: the first ``--recompute-num-layers`` layers of each pipeline stage);
  ``_add_distributed_args``: ``--use-distributed-optimizer``, ``--overlap-grad-reduce``,
  ``--overlap-param-gather``, ``--use-megatron-fsdp``, ``--data-parallel-sharding-strategy``
  (ZeRO-3: :func:`~solver.launch.meshes.optimizer_flags`); ``_add_checkpointing_args``:
  ``--ckpt-format``; ``_add_mixed_precision_args``: ``--bf16`` / ``--fp16``; ``_add_moe_args``:
  ``--overlap-moe-expert-parallel-comm``;
  ``_add_transformer_engine_args``: ``--transformer-impl``, ``--fp8-format``,
  ``--fp8-recipe``; ``_add_data_args``: ``--seq-length``.

Megatron runs one layout on every stage and one recomputation setting: a plan whose stages
differ in ``(tp, cp, ep, dp)`` or recomputation is not expressible (FlagScale is).
"""

from __future__ import annotations

import shlex

from solver.launch.meshes import (A2A_OVERLAP_NOTE, Mesh, NotExpressible, max_connections,
                                  meshes, micro_batch_size, model_flags, optimizer_flags,
                                  precision_flags, slots, vendor_check)
from solver.planner.plan import Plan
from solver.spec.domain import Framework, Recompute

__all__ = ["megatron_args", "megatron_launch", "layer_split_flags", "recompute_flags",
           "pipeline_layout", "to_argv"]


def megatron_args(plan: Plan) -> list[str]:
    """The arguments, one flag (with its value) per item, for ``pretrain_gpt.py``."""
    ms = meshes(plan)
    layouts = {(m.tp, m.cp, m.ep, m.dp, m.expert_tp) for m in ms}
    if len(layouts) > 1:
        detail = "; ".join(f"stages of {m.device}: tp {m.tp} cp {m.cp} ep {m.ep} dp {m.dp} "
                           f"expert-tp {m.expert_tp}"
                           for m in ms)
        raise NotExpressible(f"the stages' layouts differ ({detail}): Megatron-LM runs one "
                             "layout; export to flagscale")
    vendor_check(plan)
    recompute = {(r, k) for m in ms for r, k in zip(m.recompute, _ks(m))}
    if len(recompute) > 1:
        raise NotExpressible("the stages recompute differently: Megatron-LM sets one "
                             "recomputation; export to flagscale")
    m = ms[0]
    flags: dict[str, object] = {
        "tensor_model_parallel_size": m.tp,
        "pipeline_model_parallel_size": sum(x.pp for x in ms),
        "context_parallel_size": m.cp, "expert_model_parallel_size": m.ep,
        **({"expert_tensor_parallel_size": m.expert_tp} if plan.job.model.is_moe else {}),
        "micro_batch_size": micro_batch_size(plan, m.dp),
        "global_batch_size": plan.job.training.global_batch,
        "sequence_parallel": m.tp > 1, "tp_comm_overlap": m.tp > 1,
        "transformer_impl": "transformer_engine", "use_flash_attn": True,
        **layer_split_flags([x for mesh in ms for x in mesh.layers], plan.virtual_stages),
        **optimizer_flags(plan, Framework.MEGATRON_CORE),
        **recompute_flags(*recompute.pop(), plan.virtual_stages), **precision_flags(plan),
        **model_flags(plan, [m.tp]),
        **({"overlap_moe_expert_parallel_comm": True} if m.a2a_overlap else {}),
    }
    return to_argv(flags)


def _ks(m: Mesh) -> tuple[int | None, ...]:
    return m.recompute_layers or (None,) * m.pp


def layer_split_flags(layers: list[int], virtual_stages: int = 1) -> dict[str, object]:
    """Layer-split flags for per-stage layer counts ``layers`` (pipeline order).

    Equal stages need no flag; interleaving needs equal stages (``--num-layers-per-virtual-
    pipeline-stage``); otherwise the first/last flags when the middle stages are equal (each
    flag holds ITS stage's count), else ``--pipeline-model-parallel-layout``.
    """
    if virtual_stages > 1:
        if len(set(layers)) > 1 or layers[0] % virtual_stages:
            raise NotExpressible(f"interleaving ({virtual_stages} chunks) needs equal stages "
                                 f"divisible into chunks in Megatron-LM, got {layers}")
        return {"num_layers_per_virtual_pipeline_stage": layers[0] // virtual_stages}
    if len(set(layers)) == 1:
        return {}
    middle = layers[1:-1]
    if len(set(middle)) > 1:
        return {"pipeline_model_parallel_layout": pipeline_layout(layers)}
    out: dict[str, object] = {}
    if not middle or layers[0] != middle[0]:
        out["decoder_first_pipeline_num_layers"] = layers[0]
    if not middle or layers[-1] != middle[0]:
        out["decoder_last_pipeline_num_layers"] = layers[-1]
    return out


def pipeline_layout(layers: list[int]) -> str:
    """``--pipeline-model-parallel-layout`` of stages holding ``layers`` decoder layers:
    ``E`` opens the first stage, ``L`` closes the last (``[7, 9, 8]`` -> ``Et*7|t*9|t*8L``)."""
    stages = [f"t*{n}" if n else "" for n in layers]
    stages[0] = "E" + stages[0]
    stages[-1] += "L"
    return "|".join(stages)


def recompute_flags(rc: Recompute, k: int | None = None,
                    virtual_stages: int = 1) -> dict[str, object]:
    """Megatron's recomputation flags: full recomputation of every layer is the ``uniform``
    method in chunks of one layer; ``k`` recomputed layers per pipeline rank the ``block``
    method. ``--recompute-num-layers`` counts layers per model chunk (``checkpointed_forward``
    in ``megatron/core/recompute.py`` runs once per chunk), so an interleaved rank of
    ``virtual_stages`` chunks writes ``k / virtual_stages`` (the search keeps ``k`` a multiple).
    """
    if rc is Recompute.FULL:
        if k is None:
            return {"recompute_granularity": "full", "recompute_method": "uniform",
                    "recompute_num_layers": 1}
        if k % virtual_stages:
            raise NotExpressible(f"{k} recomputed layers per rank do not split into "
                                 f"{virtual_stages} model chunks")
        return {"recompute_granularity": "full", "recompute_method": "block",
                "recompute_num_layers": k // virtual_stages}
    if rc is Recompute.SELECTIVE:
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


def _shell(item: str) -> str:
    """One ``--flag value`` item for the shell (the layout holds ``|`` and ``*``)."""
    flag, _, value = item.partition(" ")
    return f"{flag} {shlex.quote(value)}" if value else flag


def megatron_launch(plan: Plan) -> str:
    """The launch script: a header (world size, the nodes in rank order, what to add), the
    ``torchrun`` line and the arguments. torchrun gives node rank ``r`` the ranks after those
    of nodes ``0..r-1`` (static rendezvous), and Megatron fills ranks tp-first, pipeline
    last, so the nodes in rank order are the stages' nodes in pipeline order."""
    args = megatron_args(plan)
    ms = meshes(plan)
    per_node = [(n, slots(m)) for m in ms for n in m.nodes]
    world = sum(m.gpus for m in ms)
    counts = {s for _, s in per_node}
    nproc = str(counts.pop()) if len(counts) == 1 else '"$NPROC_PER_NODE"'
    job = plan.job
    head = [f"# Megatron-LM launch written by tangram for job {job.name}: {job.model.name}, "
            f"world size {world} on {len(per_node)} nodes, {plan.tokens_per_s:,.0f} tokens/s "
            "planned.",
            "# Nodes in rank order (run the command on each with its NODE_RANK; MASTER_ADDR "
            "is node rank 0's address):"]
    head += [f"#   node_rank {r}: {n.node_id} nproc_per_node={s} ({n.gpu.name})"
             for r, (n, s) in enumerate(per_node)]
    vocab = next(a for a in args if a.startswith("--padded-vocab-size"))
    if int(vocab.split()[1]) != job.model.vocab:
        head.append(f"# {vocab}: the model's {job.model.vocab} tokens padded to a multiple of "
                    "the TP degree (the vocab-parallel embedding splits rows evenly).")
    if "--use-megatron-fsdp" in args:
        head.append("# Megatron-FSDP: leave CUDA_DEVICE_MAX_CONNECTIONS unset or above 1 "
                    "(validate_args asserts it is not 1 with --use-megatron-fsdp).")
    if "--overlap-moe-expert-parallel-comm" in args:
        head.append(f"# {A2A_OVERLAP_NOTE} {max_connections(ms)}.")
    head.append("# Add your data, tokenizer, optimizer and checkpoint arguments (--data-path, "
                "--tokenizer-type, --train-iters, --lr, --save, ...).")
    cmd = (f"torchrun --nnodes {len(per_node)} --nproc-per-node {nproc} --node-rank "
           f'"$NODE_RANK" --master-addr "$MASTER_ADDR" --master-port 6000 --rdzv-backend static '
           "pretrain_gpt.py")
    return "\n".join(head) + "\n" + " \\\n".join([cmd] + [_shell(a) for a in args]) + "\n"
