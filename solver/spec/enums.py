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
    without BF16), with per-tensor scaling (exported as Megatron's ``--fp8-recipe delayed``);
    ``fp8-cs``: the same GEMMs with per-tensor *current* scaling (``--fp8-recipe tensorwise``);
    ``fp8-mx``: MXFP8 block scaling, one scale per 32 elements (``--fp8-recipe mxfp8``), which
    Transformer Engine runs on Blackwell only (BF16 elsewhere). ``fp8`` is priced exactly as
    ``fp8-cs`` (both per-tensor); it stays its own name so that today's jobs keep printing and
    exporting what they did. ``bf16``: BF16 everywhere it exists (FP16 with loss scaling on
    V100); ``fp16``: FP16 everywhere. Recipe names: Megatron-Core ``megatron/core/enums.py``,
    ``Fp8Recipe``.
    """

    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    FP8_CS = "fp8-cs"
    FP8_MX = "fp8-mx"

    @property
    def is_fp8(self) -> bool:
        """An FP8 recipe (per-tensor or MXFP8)."""
        return self in (Precision.FP8, Precision.FP8_CS, Precision.FP8_MX)

    @property
    def fp8_recipe(self) -> str | None:
        """Megatron-Core's ``--fp8-recipe`` for this precision (None: not FP8)."""
        if self is Precision.FP8_CS:
            return "tensorwise"
        if self is Precision.FP8_MX:
            return "mxfp8"
        return "delayed" if self is Precision.FP8 else None


class Framework(enum.Enum):
    """The training software a plan is for (``[planner] framework``; see
    :mod:`solver.cost.runtime.frameworks` for what each runs and overlaps)."""

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


class CrossEntropyKernel(enum.Enum):
    """How the loss runs over the vocabulary-parallel logits (``[training] cross_entropy``, a
    property of the training software), with the HBM bytes per logit it moves in the forward and
    the backward pass and holds at the loss.

    ``UNFUSED``: Megatron-LM's default, ``vocab_parallel_cross_entropy``
    (``megatron/core/tensor_parallel/cross_entropy.py``, ``VocabParallelCrossEntropy``; the
    same sequence in 2021's ``megatron/mpu/cross_entropy.py``), one PyTorch kernel per step.
    Forward: cast the 16-bit logits to fp32 (read 2, write 4), max (read 4), subtract it in place
    (read 4, write 4), ``exp`` in place (4 + 4), sum (4), divide in place (4 + 4): 38 bytes.
    Backward: scale the saved softmax by the incoming gradient in place (4 + 4) and cast it back
    to 16 bits for the head's GEMMs (4 + 2): 14 bytes.
    ``TE``: Transformer Engine's fused ``parallel_cross_entropy`` (Megatron-Core
    ``--cross-entropy-loss-fusion --cross-entropy-fusion-impl te``; Triton kernels of
    ``transformer_engine/pytorch/triton/cross_entropy.py``, v2.9): an online-softmax pass reading
    the 16-bit logits (2), a second pass reading them again and writing the 16-bit gradient in
    their place (2 + 2): 6 bytes; backward, the gradient scaled in place (2 + 2): 4 bytes.
    """

    UNFUSED = "unfused"
    TE = "te"

    @property
    def bytes_per_logit(self) -> tuple[float, float]:
        """HBM bytes per logit, (forward, backward)."""
        return (38.0, 14.0) if self is CrossEntropyKernel.UNFUSED else (6.0, 4.0)

    @property
    def held_bytes_per_logit(self) -> float:
        """Bytes per logit held at the loss. Unfused: the fp32 copy ``calculate_logits_max``
        makes and keeps as the softmax for backward, beside the 16-bit logits that
        ``GPTModel.forward`` still holds while the loss runs, 6. Transformer Engine: the
        gradient written over the 16-bit logits, 2."""
        return 6.0 if self is CrossEntropyKernel.UNFUSED else 2.0
