"""Framework profiles: what each training runtime runs, overlaps and keeps in memory.

One table per framework (:data:`PROFILES`). The parallelizer only enumerates configurations a
profile runs, the composition only combines stages it can express (one layout for every stage
where it requires that), and the cost model prices communication the way the runtime schedules
it. Sources (read in the projects' own code, versions named):

* **Megatron-Core** (NVIDIA/Megatron-LM, core_v0.14): ``--use-distributed-optimizer`` is ZeRO-1 —
  every rank keeps a full fp32 ``main_grad`` buffer, only the fp32 master weights and Adam
  states are sharded, and gradients are reduce-scattered once per iteration (all micro-batches
  but the last run under ``no_sync``; ``megatron/core/distributed/``,
  ``optimizer/distrib_optimizer.py``). ``--overlap-grad-reduce`` launches each gradient bucket's
  collective as soon as its gradients are final during the last micro-batch's backward pass
  (bucket size ``max(40M, 1M·dp)`` parameters); ``--overlap-param-gather`` (needs the
  distributed optimizer and ``--overlap-grad-reduce``) gathers the updated weights bucket by
  bucket during the next forward pass; ``--tp-comm-overlap`` (needs sequence parallelism and
  Transformer Engine) pipelines the TP all-gathers / reduce-scatters with the GEMMs that consume
  or produce them. One layout (tp, cp, ep, dp) for every pipeline stage; uneven first/last stages
  (``--decoder-first/last-pipeline-num-layers``); the interleaved schedule needs pp > 1 and
  ``n_micro % pp == 0`` (the default ``--microbatch-group-size-per-virtual-pipeline-stage``).
  ZeRO-3 is Megatron-FSDP (``--use-megatron-fsdp --data-parallel-sharding-strategy
  optim_grads_params``, ``_add_distributed_args``; ``validate_args`` requires ``--ckpt-format
  fsdp_dtensor`` and refuses ``CUDA_DEVICE_MAX_CONNECTIONS=1``): one FSDP unit per
  ``TransformerLayer`` (``FullyShardedDataParallel.__init__`` in
  ``megatron/core/distributed/fsdp/mcore_fsdp_adapter.py``), each gathered before its forward
  and backward, and its gradients reduce-scattered after every backward, not once per
  iteration (``grad_reduce_every_bprop`` for ``optim_grads_params`` in ``MegatronFSDP``'s
  post-backward hook, ``megatron_fsdp.py``): the cost model's per-layer ZeRO-3. The planner
  reaches it for single-stage plans only: the sources read here (Megatron-Bridge's FSDP
  recipes, Megatron-LM's FSDP functional tests) run it without pipeline parallelism.
* **FlagScale** (FlagOpen/FlagScale at da4935e, 2025-11-13, built on Megatron-LM pinned at
  8479eb3 = Megatron-Core 0.15.0rc5): heterogeneous training (``hetero_process_meshes``) gives
  every mesh its own [tp, cp, ep, dp, pp] and device type, with Megatron-Core's kernels and
  overlaps; cp must be equal in all meshes and is asserted to be 1; the interleaved (virtual)
  pipeline is rejected with hetero on; ``use_distributed_optimizer`` is one flag for the whole
  job; per-stage recomputation exists only at full granularity
  (``recompute_granularity_per_stage_micro_batch``). A plan of one mesh runs without the
  ``hetero`` block: plain Megatron-LM, with context parallelism and interleaving.

The search, the validator (:mod:`solver.planner.check.validate`) and the exporter
(:mod:`solver.launch`) all read the rules through :func:`violations`; the job-level ones live in
:mod:`solver.cost.runtime.runtime_rules` (re-exported here: :func:`tp_allowed`, :func:`cp_allowed`,
:func:`expert_parallel_sizes`, :func:`precision_problem`, :func:`vendor_problem`,
:func:`shared_embedding_problems`), each citing where the runtime enforces it.
A mesh may mix GPU types of one vendor (:func:`mixed_kinds_note`: reported, not refused).
* **Megatron-LM 2021** (Narayanan et al., SC'21, the calibration data): no distributed
  optimizer, no CP, no overlap of the data-parallel all-reduce or of TP communication, unfused
  attention; interleaved schedule.
* **DeepSpeed** (deepspeedai/DeepSpeed v0.19): ``PipelineEngine`` asserts ZeRO < 2 with pipeline
  parallelism (``runtime/pipe/engine.py``); ZeRO-2 reduces gradients every micro-step in buckets
  of ``reduce_bucket_size`` (5e8) overlapped with backward (``overlap_comm``); ZeRO-3 gathers
  parameters per submodule with ``stage3_max_live_parameters`` = 1e9 and prefetch; CPU offload of
  activation checkpoints (``cpu_checkpointing``). One topology for the whole pipeline.
* **FSDP** (PyTorch): ``SHARD_GRAD_OP`` (ZeRO-2) or ``FULL_SHARD`` (ZeRO-3), no pipeline
  parallelism; gradients are reduce-scattered every backward (accumulation outside
  ``no_sync``), parameters prefetched one module ahead.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from solver.cost.memory import GRAD_BF16_BYTES, GRAD_BYTES
from solver.cost.runtime.profile import FrameworkProfile
from solver.cost.runtime.runtime_rules import (a2a_overlap_problem, cp_allowed,
                                               expert_parallel_sizes, job_rules,
                                               loss_kernel_problem, mixed_kinds_note,
                                               precision_problem, shared_embedding_problems,
                                               tp_allowed, vendor_problem)
from solver.spec.domain import CrossEntropyKernel, Framework, Precision, Recompute

__all__ = ["PROFILES", "FrameworkProfile", "Runtime", "a2a_overlap_problem", "cp_allowed",
           "megatron_fsdp", "expert_parallel_sizes", "interleaving_allowed", "job_runtime",
           "loss_kernel_problem", "megatron_interleaves", "mixed_kinds_note", "precision_problem",
           "profile", "shared_embedding_problems", "tp_allowed", "vendor_problem", "violations",
           "zero_choices"]


_ALL_RC = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
_MEGATRON = dict(zero_pipelined=(0, 1), zero_single=(0, 1), uniform_zero=True, offload=False,
                 ep=True, overlap_grad_reduce=True, overlap_param_gather=True,
                 tp_comm_overlap=True, zero2_per_microbatch=False, grad_bucket_params=4e7,
                 zero3_live_params=0.0, unfused_attention=False, fused_loss=True,
                 overlap_p2p=True, moe_a2a_overlap=True)

PROFILES = MappingProxyType({
    Framework.FLAGSCALE: FrameworkProfile(
        Framework.FLAGSCALE, recompute=(Recompute.NONE, Recompute.FULL), uniform_recompute=False,
        cp=True, uniform_layout=False, interleaving=False, cp_across_meshes=False,
        recompute_layers=True, expert_grid=True, **_MEGATRON),
    # ZeRO-3 is Megatron-FSDP (module docstring); reached here for a single pipeline stage.
    Framework.MEGATRON_CORE: FrameworkProfile(
        Framework.MEGATRON_CORE, recompute=_ALL_RC, uniform_recompute=True, cp=True,
        uniform_layout=True, interleaving=True, recompute_layers=True, expert_grid=True,
        **(_MEGATRON | {"zero_single": (0, 1, 3)})),
    Framework.MEGATRON_2021: FrameworkProfile(
        Framework.MEGATRON_2021, zero_pipelined=(0,), zero_single=(0,), uniform_zero=True,
        recompute=_ALL_RC, uniform_recompute=True, offload=False, cp=False, ep=False,
        uniform_layout=True, interleaving=True, overlap_grad_reduce=False,
        overlap_param_gather=False, tp_comm_overlap=False, zero2_per_microbatch=False,
        grad_bucket_params=4e7, zero3_live_params=0.0, unfused_attention=True),
    Framework.DEEPSPEED: FrameworkProfile(
        Framework.DEEPSPEED, zero_pipelined=(0, 1), zero_single=(0, 1, 2, 3), uniform_zero=True,
        recompute=(Recompute.NONE, Recompute.FULL), uniform_recompute=True, offload=True,
        cp=False, ep=True, uniform_layout=True, interleaving=False, overlap_grad_reduce=True,
        overlap_param_gather=True, tp_comm_overlap=False, zero2_per_microbatch=True,
        grad_bucket_params=5e8, zero3_live_params=1e9, unfused_attention=False,
        tp_divides_kv_heads=False, ep_fp16=True, zero3_per_matrix=True,
        zero3_reuse_params=1e9),
    Framework.FSDP: FrameworkProfile(
        Framework.FSDP, zero_pipelined=(), zero_single=(2, 3), uniform_zero=True,
        recompute=(Recompute.NONE, Recompute.FULL), uniform_recompute=True, offload=False,
        cp=False, ep=False, uniform_layout=True, interleaving=False, overlap_grad_reduce=True,
        overlap_param_gather=True, tp_comm_overlap=False, zero2_per_microbatch=True,
        grad_bucket_params=2.5e7, zero3_live_params=0.0, unfused_attention=False,
        tp_divides_kv_heads=False),
})


@dataclass(frozen=True)
class Runtime:
    """The software a stage runs under: what the cost model prices.

    Attributes
    ----------
    framework : Framework
        Training runtime (its profile decides what is overlapped).
    precision : Precision
        GEMM precision the job asks for; a GPU without it runs 16-bit
        (:meth:`~solver.spec.domain.GPUSpec.runs_in`).
    overlap : bool
        Price overlap as the framework schedules it; False exposes every transfer (what
        ``tangram estimate`` reports as each term's total).
    grad_reduce_bf16 : bool
        Gradient buffers accumulated and reduced in bf16 (``--grad-reduce-in-bf16``; Megatron-
        Bridge's ``ddp.grad_reduce_in_fp32 = False``): 2 bytes per parameter instead of the
        fp32 4 that Megatron-LM sets for bf16 (``validate_args`` in
        ``megatron/training/arguments.py`` turns on ``accumulate_allreduce_grads_in_fp32``).
    cross_entropy : CrossEntropyKernel
        The loss kernel (``[training] cross_entropy``): what the LM head's loss moves through
        HBM and holds (:class:`~solver.spec.enums.CrossEntropyKernel`).
    fp8_param_gather : bool
        Under FP8, the weights are stored as Transformer Engine FP8 tensors
        (``--fp8-param-gather``, which Megatron-LM allows only with the distributed optimizer or
        an FSDP, ``validate_args``): 1 byte per parameter instead of the 16-bit weight and its
        FP8 cache, gathered in FP8 (:func:`~solver.cost.memory.weight_bytes`).
    """

    framework: Framework = Framework.MEGATRON_CORE
    precision: Precision = Precision.BF16
    overlap: bool = True
    grad_reduce_bf16: bool = False
    fp8_param_gather: bool = False
    cross_entropy: CrossEntropyKernel = CrossEntropyKernel.UNFUSED

    @property
    def grad_bytes(self) -> float:
        """Bytes per parameter of the gradient buffer (2 in bf16, else 4: fp32)."""
        return GRAD_BF16_BYTES if self.grad_reduce_bf16 else GRAD_BYTES

    @property
    def profile(self) -> FrameworkProfile:
        """The framework's profile (with every overlap off when ``overlap`` is False)."""
        prof = PROFILES[self.framework]
        if self.overlap:
            return prof
        return dataclasses.replace(prof, overlap_grad_reduce=False, overlap_param_gather=False,
                                   tp_comm_overlap=False, overlap_p2p=False)


def state_types(job) -> dict:
    """A job's gradient-buffer type, FP8 weights and loss kernel (``[training] grad_reduce``,
    ``fp8_param_gather``, ``cross_entropy``) as keywords of :class:`Runtime` and
    :class:`~solver.cost.partial.PlanContext`."""
    return {"grad_reduce_bf16": job.training.grad_reduce_bf16,
            "fp8_param_gather": job.training.fp8_param_gather,
            "cross_entropy": job.training.cross_entropy}


def job_runtime(job) -> Runtime:
    """The runtime a job's plans are priced under (``[planner] framework``, ``[training]
    precision``, ``grad_reduce`` and ``fp8_param_gather``)."""
    return Runtime(job.planner.framework, job.training.precision, **state_types(job))


def profile(framework: Framework) -> FrameworkProfile:
    """The profile of ``framework``."""
    return PROFILES[framework]


def megatron_fsdp(framework: Framework, config):
    """Whether ``config`` (a :class:`~solver.cost.stage.StageConfig`, or a
    :class:`~solver.cost.stage.ConfigArrays`: row by row) runs as Megatron-FSDP: ZeRO-3 under
    Megatron-Core, with replicas to shard over (module docstring)."""
    return ((framework is Framework.MEGATRON_CORE) & (np.asarray(config.zero) == 3)
            & (np.asarray(config.dp * config.cp) > 1))


def zero_choices(prof: FrameworkProfile, pipelined: bool,
                 allowed: tuple[int, ...] = (0, 1, 2, 3)) -> tuple[int, ...]:
    """ZeRO stages the planner enumerates for a stage under ``prof``.

    Provably safe: where the profile sets one ZeRO stage for the whole job and allows ZeRO-0
    and ZeRO-1 (Megatron's ``--use-distributed-optimizer`` is one flag), and besides them at
    most ZeRO-3 (Megatron-FSDP, a separate flag), ZeRO-0 is not enumerated. In this cost
    model ZeRO-1 weakly dominates ZeRO-0 term by term — the same per-micro-batch time, a
    reduce-scatter of the gradients plus an all-gather of the 16-bit weights (6 bytes per
    parameter) instead of an all-reduce of the gradients (8), an optimizer step over ``1/dp``
    of the parameters, and less memory — so the best all-ZeRO-1 plan is never worse than the
    best all-ZeRO-0 plan (``tests/cost/test_frameworks.py`` checks the dominance).
    Stages without replicas (``dp·cp = 1``) are ZeRO-0 whatever the flag. ``allowed``: the ZeRO
    stages the job's features allow (met first).
    """
    stages = tuple(z for z in prof.zero_stages(pipelined) if z in allowed)
    if prof.uniform_zero and {0, 1} <= set(stages) <= {0, 1, 3}:
        return tuple(z for z in stages if z != 0)
    return stages


def violations(configs, prof: FrameworkProfile, pipelined: bool, *, model=None,
               precision: Precision | None = None, stage_gpus=None,
               virtual_stages: int = 1) -> list[str]:
    """What of a plan ``prof``'s runtime cannot run ([] if nothing), one line per problem: the
    one place the planner's search, its validator and the exporters read the rules from.

    ``configs`` are the stages' :class:`~solver.cost.stage.StageConfig` in pipeline order (a
    stage is one mesh); ``pipelined`` whether the plan has more than one pipeline stage (across
    or inside stages). The job-level rules are checked when their data is given: ``model``
    (:func:`tp_allowed`, :func:`expert_parallel_sizes`), ``precision`` (one training precision:
    :func:`precision_problem`; EP in FP16), ``stage_gpus`` (per stage, the GPU types of its
    nodes: :func:`precision_problem`, :func:`vendor_problem`), ``virtual_stages`` (model chunks
    per GPU: the MoE all-to-all overlap's rule with pipeline stages).
    """
    name, out = prof.framework.value, []
    allowed = prof.zero_stages(pipelined)
    for i, c in enumerate(configs):
        if c.dp * c.cp > 1 and c.zero not in allowed:
            out.append(f"stage {i}: {name} runs ZeRO {list(allowed)} "
                       f"{'with' if pipelined else 'without'} pipelining, not ZeRO-{c.zero}")
        if c.recompute not in prof.recompute:
            out.append(f"stage {i}: {name} has no {c.recompute.value} recomputation")
        if c.recompute_layers is not None and not prof.recompute_layers:
            out.append(f"stage {i}: {name} recomputes all layers or none, not "
                       f"{c.recompute_layers} of them")
        if c.offload and not prof.offload:
            out.append(f"stage {i}: {name} does not offload activations")
        if c.cp > 1 and not cp_allowed(prof, len(configs)):
            out.append(f"stage {i}: {name} runs no context parallelism (cp {c.cp})"
                       + (f" in a plan of {len(configs)} meshes" if prof.cp else ""))
        if c.ep > 1 and not prof.ep:
            out.append(f"stage {i}: {name} runs no expert parallelism (ep {c.ep})")
        why = c.a2a_overlap and a2a_overlap_problem(prof, model is None or model.is_moe, c.ep,
                                                    c.recompute, pipelined,
                                                    megatron_fsdp(prof.framework, c),
                                                    virtual_stages)
        if why:
            out.append(f"stage {i}: {why}")
    return out + _uniformity(configs, prof) + job_rules(configs, prof, model, precision,
                                                       stage_gpus)


def megatron_interleaves(layers: int, pp: int, v: int, n_micro: int) -> bool:
    """Whether Megatron-LM runs ``pp`` stages of ``v`` model chunks each: ``pp >= 2``, every
    chunk the same number of layers (``layers % (pp v) = 0``) and whole rounds of micro-batches
    (``n_micro % pp = 0``)."""
    return pp >= 2 and layers % (pp * v) == 0 and n_micro % pp == 0


def interleaving_allowed(prof: FrameworkProfile, meshes: int) -> bool:
    """Whether a plan of ``meshes`` meshes may use virtual pipeline stages under ``prof``.

    FlagScale asserts that virtual stages are off with heterogeneous meshes ("virtual pipeline
    not support now!", ``FSTrainArguments.pre_validate_args`` in ``flagscale/train/arguments.py``
    with ``enable_hetero``); one mesh is plain Megatron-LM (no ``hetero`` block), which
    interleaves (``validate_args``: ``--num-layers-per-virtual-pipeline-stage`` with pp > 1), and
    so does ``tangram estimate``, whose configuration is one mesh.
    """
    if prof.framework is Framework.FLAGSCALE:
        return meshes == 1
    return prof.interleaving


def _uniformity(configs, prof: FrameworkProfile) -> list[str]:
    """Settings the runtime fixes for the whole job that differ between stages."""
    name, out = prof.framework.value, []
    sharded = {c.zero for c in configs if c.dp * c.cp > 1}
    if prof.uniform_zero and len(sharded) > 1:
        out.append(f"{name} sets one ZeRO stage for the job, the stages use {sorted(sharded)}")
    if prof.uniform_recompute and len({(c.recompute, c.recompute_layers)
                                       for c in configs}) > 1:
        out.append(f"{name} sets one recomputation for the job, the stages differ")
    if prof.uniform_layout and len({(c.tp, c.cp, c.ep, c.dp) for c in configs}) > 1:
        out.append(f"{name} runs one (tp, cp, ep, dp) on every stage, the stages differ")
    return out
