"""The options of the domain, as enums (one place for their names and values)."""

from __future__ import annotations

import enum


class Recompute(enum.Enum):
    """Activation recomputation strategy (Korthikanti et al. 2022)."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class Schedule(enum.Enum):
    """Pipeline schedule inside an island."""

    ONE_F_ONE_B = "1f1b"
    GPIPE = "gpipe"
    INTERLEAVED = "interleaved"


class Precision(enum.Enum):
    """Training precision of the GEMMs (``[training] precision``).

    ``fp8``: Transformer Engine FP8 GEMMs on GPUs that have FP8, BF16 elsewhere (FP16 on GPUs
    without BF16); ``bf16``: BF16 everywhere it exists (FP16 with loss scaling on V100);
    ``fp16``: FP16 everywhere.
    """

    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"


class Framework(enum.Enum):
    """The training software a plan is for (``[planner] framework``; see
    :mod:`solver.cost.frameworks` for what each runs and overlaps)."""

    FLAGSCALE = "flagscale"
    MEGATRON_CORE = "megatron-core"
    MEGATRON_2021 = "megatron-2021"
    DEEPSPEED = "deepspeed"
    FSDP = "fsdp"


class FeaturePreset(enum.Enum):
    """Capability sets of the homogeneous parallelizers in the seed note's comparison table."""

    FULL = "full"
    ALPA = "alpa"
    GALVATRON = "galvatron"
    ACESO = "aceso"
    MIST = "mist"
    METIS = "metis"


class Pruning(enum.Enum):
    """Which pruning rules the planner applies before it composes (``[planner] pruning``).

    ``PAPER``: the four rules as the Tangram paper states them; rules 2 (balance) and 4
    (interface) are heuristics, so the plan is optimal over the candidates they leave
    (``tangram verify`` checks whether they drop the optimum). ``SAFE``: rules 2 and 4 replaced
    by provably safe bounds, so the plan is optimal over every plan (slower: the bounds need a
    plan to bound with).
    """

    PAPER = "paper"
    SAFE = "safe"


class SolverKind(enum.Enum):
    """Composition algorithm."""

    DP = "dp"
    CPSAT = "cpsat"
    MILP = "milp"
    BRUTE = "brute"
