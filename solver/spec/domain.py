"""Domain objects: training settings, planner options and jobs, with the hardware
(:mod:`solver.spec.hardware`) and model (:mod:`solver.spec.model`) types they are made of.

All are frozen dataclasses. Loading and validation of user files lives in ``solver.spec.loaders``; the
objects here only derive values (parameter counts, node lists) from already-valid fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from solver.spec.constraints import Constraints
from solver.spec.enums import (CrossEntropyKernel, FeaturePreset, Framework, Precision, Pruning,
                               Recompute, Schedule, SolverKind)
from solver.spec.hardware import ClusterSpec, GPUSpec, Island, Node, NodeGroup
from solver.spec.model import ModelSpec

__all__ = ["ClusterSpec", "Constraints", "CrossEntropyKernel", "FeaturePreset", "Framework",
           "GPUSpec", "Island", "JobSpec", "ModelSpec", "Node", "NodeGroup", "PlannerOptions",
           "Precision", "Pruning", "Recompute", "Schedule", "SolverKind", "TrainingSpec"]


@dataclass(frozen=True)
class TrainingSpec:
    """Batch settings.

    Attributes
    ----------
    global_batch : int
        Sequences per iteration.
    seq_len : int
        Tokens per sequence.
    n_micro : int | None
        Micro-batches per iteration; ``None`` means ``"auto"`` (chosen by the planner).
    precision : Precision
        GEMM precision (``bf16`` default).
    grad_reduce_bf16 : bool
        ``grad_reduce = "bf16"``: gradient buffers in bf16 (``--grad-reduce-in-bf16``);
        default fp32, Megatron-LM's for bf16 training.
    fp8_param_gather : bool
        FP8 weights as the parameters (``--fp8-param-gather``; an FP8 precision, and the
        distributed optimizer on every stage).
    cross_entropy : CrossEntropyKernel
        The loss kernel: Megatron-LM's unfused default, or Transformer Engine's fused one
        (``--cross-entropy-loss-fusion --cross-entropy-fusion-impl te``).
    """

    global_batch: int
    seq_len: int
    n_micro: int | None = None
    precision: "Precision" = None  # type: ignore[assignment]
    grad_reduce_bf16: bool = False
    fp8_param_gather: bool = False
    cross_entropy: CrossEntropyKernel = CrossEntropyKernel.UNFUSED

    def __post_init__(self) -> None:
        if self.precision is None:
            object.__setattr__(self, "precision", Precision.BF16)

    @property
    def tokens(self) -> int:
        """Tokens per iteration."""
        return self.global_batch * self.seq_len


@dataclass(frozen=True)
class PlannerOptions:
    """The ``[planner]`` table of a job.

    Attributes
    ----------
    features : FeaturePreset
        Capabilities of the homogeneous parallelizer.
    beta : float
        Balance-rule tolerance (eq. 3), > 1.
    epsilon : float
        The user's memory margin: the share of every GPU's memory held back beyond the
        runtime's own reserves (CUDA context, NCCL buffers; the allocator's fragmentation is
        counted with the activations), for what the cost model does not count. 0 by default;
        before the reserves were named, 0.1 stood for all of them
        (:func:`~solver.cost.reserve.usable_bytes`).
    tau_c, tau_m, tau_b : float
        Island similarity thresholds on compute, HBM capacity and HBM bandwidth (relative).
    t_merge : float
        Largest relative throughput loss accepted when merging two islands.
    solver : SolverKind
        Composition algorithm.
    overlap : bool
        Count link transfers as overlapped with compute (eq. 9).
    time_limit_s : float
        Time limit for CP-SAT / MILP.
    max_usd_per_hour : float | None
        Budget: the fastest plan whose used GPUs cost at most this much per hour (None: no cap).
    min_tokens_per_s : float | None
        Deadline: the cheapest plan (per token) reaching this throughput (None: fastest plan).
    framework : Framework
        The training software plans are for (default FlagScale, which runs heterogeneous
        pipelines with a layout per mesh).
    pruning : Pruning
        The pruning rules (default the paper's, two of them heuristic; ``safe`` for a plan
        optimal over every plan).
    replicas : bool
        Also search plans of several pipeline replicas across islands (a research option:
        the plan says which runtime could train it; default off, one pipeline).
    """

    features: FeaturePreset = FeaturePreset.FULL
    beta: float = 2.0
    epsilon: float = 0.0
    tau_c: float = 0.2
    tau_m: float = 0.2
    tau_b: float = 0.2
    t_merge: float = 0.1
    solver: SolverKind = SolverKind.DP
    overlap: bool = False
    time_limit_s: float = 30.0
    max_usd_per_hour: float | None = None
    min_tokens_per_s: float | None = None
    framework: "Framework" = None  # type: ignore[assignment]
    pruning: Pruning = Pruning.PAPER
    replicas: bool = False

    def __post_init__(self) -> None:
        if self.framework is None:
            object.__setattr__(self, "framework", Framework.FLAGSCALE)


@dataclass(frozen=True)
class JobSpec:
    """A planning job: model × cluster × batch × options.

    Attributes
    ----------
    name : str
        Job name (file stem).
    model : ModelSpec
        The model.
    cluster : ClusterSpec
        The cluster.
    training : TrainingSpec
        Batch settings.
    planner : PlannerOptions
        Options.
    path : Path | None
        The job file, for error messages.
    constraints : Constraints
        The user's limits on the search.
    """

    name: str
    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    planner: PlannerOptions = field(default_factory=PlannerOptions)
    path: Path | None = None
    constraints: Constraints = field(default_factory=Constraints)
