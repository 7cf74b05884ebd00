"""A runtime's profile: what one training framework runs, overlaps and stores, as the fields the
rule book (:mod:`solver.cost.runtime.runtime_rules`, :mod:`solver.cost.runtime.frameworks`) and
the cost model read. The profiles themselves, with the runtime code each field comes from, are
:data:`solver.cost.runtime.frameworks.PROFILES`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solver.spec.domain import Framework, Recompute

__all__ = ["FrameworkProfile"]


@dataclass(frozen=True)
class FrameworkProfile:
    """What one training runtime runs and how it overlaps.

    Attributes
    ----------
    framework : Framework
        Which runtime.
    zero_pipelined, zero_single : tuple[int, ...]
        ZeRO stages it runs with pipeline parallelism / with a single stage.
    uniform_zero : bool
        One ZeRO stage for the whole job (a global flag).
    recompute : tuple[Recompute, ...]
        Recomputation it runs.
    uniform_recompute : bool
        One recomputation setting for every stage.
    offload : bool
        Activation (checkpoint) offload to host memory.
    cp, ep : bool
        Context / expert parallelism.
    uniform_layout : bool
        Every pipeline stage has the same (tp, cp, ep, dp) (and so the same GPU count).
    interleaving : bool
        Runs the interleaved 1F1B schedule (virtual pipeline stages).
    overlap_grad_reduce, overlap_param_gather, tp_comm_overlap : bool
        Overlaps it schedules (see the module docstring).
    zero2_per_microbatch : bool
        ZeRO-2 reduce-scatters gradients every micro-batch (else once per iteration).
    grad_bucket_params : float
        Parameters per gradient bucket of the overlapped reduction (at least; Megatron scales it
        with dp).
    zero3_live_params : float
        Parameters ZeRO-3 holds gathered at once (at most).
    zero3_per_matrix : bool
        ZeRO-3 gathers and reduce-scatters every weight matrix with its own collective
        (DeepSpeed: ``fetch_sub_module`` per submodule, ``deepspeed/runtime/zero/
        partitioned_param_coordinator.py``; v0.3 issued one ``all_gather`` per parameter in
        ``partition_parameters.py`` ``_allgather_param``); False: one per layer (FSDP's
        per-block units). Each pays the ring's step latencies (:mod:`solver.cost.sync`).
    zero3_reuse_params : float
        ZeRO-3 keeps a gathered module for its next use only within this many parameters
        (DeepSpeed ``stage3_max_reuse_distance``, 1e9); beyond it full recomputation gathers
        it a third time (:func:`solver.cost.sync.regathered_share`). 0: never (FSDP recomputes
        inside the unit's unsharded backward).
    unfused_attention : bool
        Runs unfused attention whatever the GPU (2021 software).
    tp_divides_kv_heads : bool
        ``tp`` must divide the KV heads (query groups); False: ``tp`` may also be a multiple of
        them (KV heads replicated). See :func:`tp_allowed`.
    cp_across_meshes : bool
        Runs context parallelism in a plan of several meshes (FlagScale's hetero mode does not:
        :func:`cp_allowed`).
    ep_fp16 : bool
        Runs expert parallelism in FP16 training (Megatron-LM does not:
        :func:`expert_parallel_sizes`).
    recompute_layers : bool
        Recomputes ``k`` of a pipeline rank's layers (full granularity, the ``block`` method;
        :attr:`~solver.cost.stage.StageConfig.recompute_layers`). Megatron-Core:
        ``--recompute-method block --recompute-num-layers k``, one for the job, checkpointing
        the first ``k`` layers of each rank (``megatron/core/recompute.py``,
        ``checkpointed_forward``; ``TransformerConfig.__post_init__`` requires a method and
        ``recompute_num_layers`` with full granularity). FlagScale: per stage and micro-batch
        (``recompute_method_per_stage_micro_batch`` 1 = block,
        ``recompute_num_layers_per_stage_micro_batch``; ``flagscale/train/arguments.py``
        ``FSTrainArguments.post_validate_args``, applied in its ``transformer_block.py``
        patch). Megatron-LM 2021 (``--checkpoint-num-layers``: uniform chunks), DeepSpeed
        (``PipelineModule.forward``, ``deepspeed/runtime/pipe/module.py``: chunks of
        ``activation_checkpoint_interval`` layers over all of them) and FSDP as profiled here
        recompute every layer or none. :mod:`solver.cost.recompute_layers` searches it.
    expert_grid : bool
        Lays the experts on Megatron-Core's expert grid with its own expert-TP degree
        (``--expert-tensor-parallel-size``, ``megatron/core/parallel_state.py``
        ``initialize_model_parallel``; FlagScale per mesh,
        ``expert_tensor_parallel_size_per_process_mesh``), searched over the divisors of
        ``tp`` (:func:`~solver.cost.runtime.runtime_rules.expert_parallel_sizes`). False: expert
        TP equals TP, as priced for DeepSpeed-MoE with ``enable_expert_tensor_parallelism``
        (its EP groups span data-parallel ranks only, ``deepspeed/utils/groups.py``
        ``_create_expert_and_data_parallel``); DeepSpeed's default, experts replicated over
        the TP ranks, is not priced.
    fused_loss : bool
        Runs Transformer Engine's fused cross entropy (``[training] cross_entropy = "te"``):
        Megatron-Core's ``LanguageModule.compute_language_model_loss``
        (``megatron/core/models/common/language_module/language_module.py``, Megatron-LM at
        8479eb3, FlagScale's pin) calls ``te_parallel_cross_entropy`` under
        ``--cross-entropy-loss-fusion --cross-entropy-fusion-impl te``. Megatron-LM 2021,
        DeepSpeed and FSDP as profiled here compute the loss outside it
        (:func:`~solver.cost.runtime.runtime_rules.loss_kernel_problem`).
    overlap_p2p : bool
        Overlaps the interleaved schedule's pipeline transfers with compute: Megatron-LM's
        ``overlap_p2p_comm`` (on unless ``--no-overlap-p2p-communication``;
        ``validate_args`` in ``megatron/training/arguments.py`` turns it off without virtual
        stages; Megatron-Bridge's ``CommOverlapConfig`` sets it for ``vp > 1``). In
        ``forward_backward_pipelining_with_interleaving`` (``megatron/core/pipeline_parallel/
        schedules.py``) a forward chunk posts its send and the next receive asynchronously
        and the backward chunk that follows runs before the wait, and the other way round, so
        a transfer is exposed only beyond the other pass's compute. Plain 1F1B sends in
        blocking batches (``batch_p2p_comm``); Megatron-LM 2021 waited on every transfer.
    moe_a2a_overlap : bool
        Overlaps one micro-batch's MoE all-to-alls with another's compute: Megatron-Core's
        ``--overlap-moe-expert-parallel-comm`` (``_add_moe_args`` in ``megatron/training/
        arguments.py`` from core_v0.14.0; FlagScale's pin 8479eb3 has it). Its rules:
        :func:`~solver.cost.runtime.runtime_rules.a2a_overlap_problems`; its price:
        :func:`~solver.cost.a2a_overlap.a2a_overlap_hidden`.
    """

    framework: Framework
    zero_pipelined: tuple[int, ...]
    zero_single: tuple[int, ...]
    uniform_zero: bool
    recompute: tuple[Recompute, ...]
    uniform_recompute: bool
    offload: bool
    cp: bool
    ep: bool
    uniform_layout: bool
    interleaving: bool
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    tp_comm_overlap: bool
    zero2_per_microbatch: bool
    grad_bucket_params: float
    zero3_live_params: float
    unfused_attention: bool
    tp_divides_kv_heads: bool = True
    cp_across_meshes: bool = True
    ep_fp16: bool = False
    recompute_layers: bool = False
    expert_grid: bool = False
    zero3_per_matrix: bool = False
    zero3_reuse_params: float = 0.0
    fused_loss: bool = False
    overlap_p2p: bool = False
    moe_a2a_overlap: bool = False

    def zero_stages(self, pipelined: bool) -> tuple[int, ...]:
        """ZeRO stages allowed for a stage of a multi-stage pipeline or a single stage."""
        return self.zero_pipelined if pipelined else self.zero_single

    def bucket_params(self, dp):
        """Parameters per gradient bucket at data-parallel degree ``dp`` (int or array)."""
        if self.framework in (Framework.MEGATRON_CORE, Framework.FLAGSCALE):
            return np.maximum(self.grad_bucket_params, 1e6 * np.asarray(dp))
        return self.grad_bucket_params
