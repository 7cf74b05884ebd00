"""The runtimes' job-level rules: what a plan's meshes, layouts and GPUs must satisfy for the
job's runtime to launch it, each citing where the runtime enforces it.

Read through :func:`solver.cost.runtime.frameworks.violations` (the one place the planner's search, its
validator and the exporters take the rules from) and by the search space
(:mod:`solver.cost.configs`, :mod:`solver.planner.stages.runs`). The profile fields they read are
:class:`~solver.cost.runtime.frameworks.FrameworkProfile`'s.
"""

from __future__ import annotations

from solver.cost.runtime.profile import FrameworkProfile
from solver.spec.domain import CrossEntropyKernel, Precision, Recompute

__all__ = ["a2a_overlap_problem", "cp_allowed", "expert_parallel_sizes", "job_rules",
           "loss_kernel_problem", "mixed_kinds_note", "precision_problem",
           "shared_embedding_problems", "tp_allowed", "vendor_problem"]


def job_rules(configs, prof: "FrameworkProfile", model=None, precision=None,
              stage_gpus=None) -> list[str]:
    """The job-level rules :func:`~solver.cost.runtime.frameworks.violations` checks when it is given
    the model, the precision or the stages' GPU types."""
    out = [v for i, c in enumerate(configs) for v in _model_rules(i, c, prof, model, precision)]
    out += _hardware_rules(prof, precision, stage_gpus)
    if model is not None:
        out += shared_embedding_problems(configs, prof, model)
    return out


def _model_rules(i: int, c, prof: FrameworkProfile, model, precision) -> list[str]:
    """The rules of stage ``i`` that read the model (and the precision)."""
    if model is None:
        return []
    out = []
    if not tp_allowed(prof, model.kv_heads, c.tp):
        out.append(f"stage {i}: tp {c.tp} does not divide the {model.kv_heads} KV heads (query "
                   f"groups), which {prof.framework.value}'s Megatron-Core requires")
    etp = c.tp if c.expert_tp is None else c.expert_tp
    if etp != c.tp and not (prof.expert_grid and model.is_moe):
        out.append(f"stage {i}: expert-tp {etp}: {prof.framework.value} has no expert grid "
                   f"for this model (expert-tp must equal tp {c.tp})")
    elif c.ep > 1 and c.ep not in expert_parallel_sizes(prof, model.experts, c.tp, c.cp, c.dp,
                                                        precision, expert_tp=etp):
        why = ("expert parallelism does not run in FP16 training"
               if precision is Precision.FP16 and not prof.ep_fp16 else
               f"ep must divide the {model.experts} experts and tp·cp·dp / expert-tp "
               f"= {c.tp * c.cp * c.dp}/{etp}")
        out.append(f"stage {i}: ep {c.ep}: {why}")
    elif (c.tp * c.cp * c.dp) % (etp * c.ep):
        out.append(f"stage {i}: expert-tp {etp} x ep {c.ep} does not divide the stage's "
                   f"tp·cp·dp = {c.tp * c.cp * c.dp} GPUs per pipeline rank")
    return out


def _hardware_rules(prof: FrameworkProfile, precision, stage_gpus) -> list[str]:
    """One vendor for the job's meshes, and every GPU in the job's one precision."""
    if stage_gpus is None:
        return []
    out = []
    for i, gpus in enumerate(stage_gpus):
        for gpu in sorted(gpus, key=lambda g: g.name):
            why = None if precision is None else precision_problem(gpu, precision)
            if why:
                out.append(f"stage {i}: {why}")
    why = vendor_problem([g for gpus in stage_gpus for g in gpus])
    return out + ([why] if why else [])


def tp_allowed(prof: FrameworkProfile, kv_heads: int, tp: int) -> bool:
    """Whether ``prof``'s runtime splits ``kv_heads`` KV heads (query groups) over ``tp`` ranks.

    Megatron-Core's ``TransformerConfig.__post_init__``
    (``megatron/core/transformer/transformer_config.py``) raises unless ``num_query_groups %
    tensor_model_parallel_size == 0`` up to Megatron-Core 0.15 (core_v0.14.0, core_v0.15.0, and
    the 0.15.0rc5 that FlagScale pins); from core_v0.16.0 (commit f7dfb99, "Support TP greater
    than num_kv_heads", Megatron-LM #2565, 2025-12) ``tp`` may also be a multiple of the query
    groups (the KV heads are replicated). The Megatron profiles follow the versions they cite
    (``tp_divides_kv_heads``); DeepSpeed and FSDP shard no heads by these rules.
    """
    if kv_heads % tp == 0:
        return True
    return not prof.tp_divides_kv_heads and tp % kv_heads == 0


def cp_allowed(prof: FrameworkProfile, meshes: int) -> bool:
    """Whether a plan of ``meshes`` meshes may use context parallelism under ``prof``.

    FlagScale's hetero mode asserts ``args.context_parallel_size == 1`` ("Context parallelism
    is not supported.", ``flagscale/train/hetero/parallel_context.py``,
    ``ParallelContext.__init__``; ``flagscale/train/arguments.py``
    ``FSTrainArguments.pre_validate_args`` also requires one cp for all meshes). One mesh runs
    without hetero, as plain Megatron-LM, whose ``validate_args`` accepts ``cp > 1``.
    """
    return prof.cp and (meshes <= 1 or prof.cp_across_meshes)


def expert_parallel_sizes(prof: FrameworkProfile, experts: int, tp: int, cp: int, dp: int,
                          precision: Precision | None = None,
                          expert_tp: int | None = None) -> list[int]:
    """The EP degrees ``prof``'s runtime runs on a stage of ``tp·cp·dp`` GPUs per pipeline rank.

    Megatron-Core's expert grid (``megatron/core/parallel_state.py``,
    ``initialize_model_parallel``; FlagScale's per-mesh ``ProcessMesh`` in
    ``flagscale/train/hetero/parallel_context.py`` builds the same grid per mesh, with
    ``expert_tensor_parallel_size_per_process_mesh``) lays expert-TP × EP × expert-DP over the
    same GPUs as TP × CP × DP, and raises unless ``expert_tensor_parallel_size ×
    expert_model_parallel_size × pp`` divides the world size; ``expert_tensor_parallel_size``
    defaults to ``tp``. Megatron-LM's ``validate_args`` (``megatron/training/arguments.py``)
    asserts ``num_experts % expert_model_parallel_size == 0`` and ``not args.fp16`` with EP.
    So EP divides the experts and ``tp·cp·dp / expert_tp``: with ``expert_tp = tp`` (the
    default) that is ``cp·dp``; with ``expert_tp = 1``, EP may reach ``tp·cp·dp``. [1] for a dense model, without EP, or in FP16 where forbidden.
    FlagScale's hetero mode takes ep per mesh (``hetero_process_meshes`` [tp, cp, ep, dp, pp]);
    its check that the meshes' ep are "all 1 or none 1" (``pre_validate_args``) is written as
    ``all(ep == 1) or any(ep != 1)``, which always holds, so meshes may mix EP 1 and EP > 1.
    """
    etp = tp if expert_tp is None else expert_tp
    if not experts or not prof.ep or (precision is Precision.FP16 and not prof.ep_fp16):
        return [1]
    span = tp * cp * dp
    if span % etp:
        return [1]
    return [e for e in range(1, experts + 1) if experts % e == 0 and (span // etp) % e == 0]


def a2a_overlap_problem(prof: FrameworkProfile, moe: bool, ep: int, recompute: Recompute,
                        pipelined: bool, fsdp: bool = False,
                        virtual_stages: int = 1) -> str | None:
    """Why ``prof``'s runtime cannot overlap the MoE all-to-alls of a stage (None: it can).

    Megatron-Core's ``TransformerConfig.__post_init__`` (``megatron/core/transformer/
    transformer_config.py``, core_v0.14.0 to core_v0.15.0) asserts, with
    ``overlap_moe_expert_parallel_comm``: ``expert_model_parallel_size > 1``; the ``alltoall``
    or ``flex`` dispatcher (the exporters set ``alltoall``); no full recomputation and no
    recomputation method (selective recomputation runs); ``bf16`` or ``fp16`` weights (every
    precision here is one of them, FP8 included); no ``moe_shared_expert_overlap`` (never
    set); torch ≥ 2.6 (the launch environment's). With ``pp > 1`` it needs virtual pipeline
    stages (``virtual_stages``) and runs ``combined_1f1b_schedule_for_interleaved_pipelining``
    (``megatron/core/pipeline_parallel/combined_1f1b.py``), which the cost model prices
    (:mod:`solver.cost.a2a_overlap`). The planner does not price Megatron-FSDP (``fsdp``), which
    Megatron-Core does not refuse with it: the combined schedule runs forward layer ``i``
    beside backward layer ``L - 1 - i``, two layers' gathered weights at once, which the
    ZeRO-3 memory term does not count.
    """
    name = prof.framework.value
    if not prof.moe_a2a_overlap:
        return f"{name} does not overlap the MoE all-to-alls"
    if not moe or ep <= 1:
        return "the MoE all-to-all overlap needs expert parallelism (ep > 1)"
    if recompute is Recompute.FULL:
        return "the MoE all-to-all overlap runs without full recomputation"
    if pipelined and virtual_stages < 2:
        return ("the MoE all-to-all overlap with pipeline stages needs virtual ones "
                "(TransformerConfig.__post_init__)")
    if fsdp:
        return ("the MoE all-to-all overlap is priced without Megatron-FSDP only (two layers' "
                "gathered weights at once are not counted)")
    return None


def loss_kernel_problem(prof: FrameworkProfile, kernel: CrossEntropyKernel) -> str | None:
    """Why the job's framework cannot run the loss ``kernel`` (None: it can).

    Transformer Engine's fused cross entropy is a Megatron-Core option: ``--cross-entropy-loss-
    fusion`` with ``--cross-entropy-fusion-impl te`` (``megatron/training/arguments.py``) makes
    ``LanguageModule.compute_language_model_loss`` call ``te_parallel_cross_entropy``, and raises
    when Transformer Engine is absent (:attr:`FrameworkProfile.fused_loss`).
    """
    if kernel is CrossEntropyKernel.UNFUSED or prof.fused_loss:
        return None
    return (f"cross_entropy \"{kernel.value}\" (Transformer Engine's fused loss) is a "
            f"Megatron-Core option; {prof.framework.value} computes the loss unfused")


def precision_problem(gpu, precision: Precision) -> str | None:
    """Why ``gpu`` cannot train in the job's ``precision`` (None: it can).

    A Megatron-LM job has one training precision: ``validate_args``
    (``megatron/training/arguments.py``) sets one ``params_dtype`` from ``--fp16`` / ``--bf16``
    (asserting not both), and FlagScale's hetero meshes share the job's arguments (only the
    parallel sizes are per mesh: ``FSTrainArguments.pre_validate_args``). A GPU without BF16
    (V100) cannot run a BF16 (or FP8, which keeps BF16 parameters) job; the job asks for
    ``[training] precision = "fp16"`` to use it.
    """
    if precision is Precision.FP16 or gpu.bf16:
        return None
    return (f"{gpu.name} has no BF16 and the job trains in {precision.value} (one precision per "
            f"job: Megatron-LM's --bf16/--fp16); set [training] precision = \"fp16\" to use it")


def vendor_problem(gpus) -> str | None:
    """Why ``gpus`` cannot be the meshes of one job (None: they can): they are of two vendors.

    Megatron-LM opens one ``torch.distributed`` process group per job with one backend
    (``--distributed-backend``, default ``nccl``; ``megatron/training/initialize.py``
    ``_initialize_distributed``), and NCCL (NVIDIA) and RCCL (AMD) cannot join one
    communicator; the pipeline's point-to-point transfers and the embedding all-reduce cross
    meshes. FlagScale's only cross-vendor paths are ``distributed_backend = "flagcx"`` (FlagCX,
    whose RCCL adaptor dates from v0.5, 2025-09) and ``hetero_use_cpu_communication`` (gloo on
    the CPU; ``flagscale/train/arguments.py``, ``_initialize_distributed``); the exports here
    launch NCCL, so a plan is one vendor and the other vendors' nodes stay idle, said why.
    """
    found = sorted({g.vendor for g in gpus})
    if len(found) <= 1:
        return None
    return (f"the plan mixes GPU vendors {', '.join(found)}: one communicator (NCCL or RCCL) "
            f"cannot span them")


def mixed_kinds_note(gpus) -> str | None:
    """What a mesh of several GPU types of one vendor means (None: one type). Allowed, and
    reported: FlagScale labels each mesh with one device type (``hetero_device_types``, one per
    mesh, ``FSTrainArguments.pre_validate_args``; the hostfile's ``type=`` assigns nodes to
    meshes), a label, not a check of the hardware; Megatron-LM has no device type at all. The
    mesh runs at its weakest member's pace, which is how the planner prices it (an island's
    effective figures), and exports as the weakest type's label."""
    kinds = sorted({g.name for g in gpus})
    if len(kinds) <= 1:
        return None
    weakest = min(gpus, key=lambda g: (g.bf16_tflops, g.hbm_gb, g.name)).name
    return (f"mixes GPU types {', '.join(kinds)}: planned at its weakest member's figures "
            f"and run as one device type ({weakest})")


def shared_embedding_problems(configs, prof: FrameworkProfile, model) -> list[str]:
    """FlagScale's rule on a tied embedding across meshes: with
    ``untie_embeddings_and_output_weights`` false, the first and last meshes have one TP degree,
    and under the distributed optimizer one of their DP degrees divides the other
    (``FSTrainArguments.pre_validate_args``, ``flagscale/train/arguments.py``; the export also
    sets ``use_partial_reduce_for_shared_embedding``, which it asserts then). One mesh, or an
    untied model, has no such rule."""
    tied = getattr(model, "tied_embeddings", False)
    if prof.uniform_layout or not tied or len(configs) < 2:
        return []
    a, b = configs[0], configs[-1]
    out = []
    if a.tp != b.tp:
        out.append(f"tied embeddings: the first and last meshes need one tp ({a.tp} != {b.tp})")
    if a.dp % b.dp and b.dp % a.dp:
        out.append(f"tied embeddings: the first and last meshes' dp ({a.dp}, {b.dp}) must "
                   f"divide one another")
    return out
