"""Reading a job's ``[training]`` table (public format, ``docs/formats.md``): the batch, the
precision and the state types (gradient buffers, FP8 weights), each checked through
:class:`~solver.spec.fields.Fields`. ``tangram estimate`` reads the same state types."""

from __future__ import annotations

from solver.spec.domain import CrossEntropyKernel, Precision, TrainingSpec
from solver.spec.fields import Fields


def read_training(f: Fields) -> TrainingSpec:
    """A job's ``[training]`` table: batch, sequence, micro-batches, precision, state types."""
    gb = f.get("global_batch", int, lo=1, hi=10**7)
    seq = f.get("seq_len", int, lo=1, hi=10**7)
    raw = f.get("n_micro", object, "auto")
    if raw == "auto":
        n = None
    elif isinstance(raw, int) and not isinstance(raw, bool) and 1 <= raw <= gb:
        n = raw
        f.check("n_micro", gb % n == 0, f"n_micro {n} must divide global_batch {gb}")
    else:
        raise f.error("n_micro", f"must be \"auto\" or an integer in 1..global_batch ({gb}), got {raw!r}")
    precision = f.get_enum("precision", Precision, Precision.BF16)
    grads_bf16, fp8_params, loss = read_state_types(f, precision)
    f.done()
    return TrainingSpec(gb, seq, n, precision, grads_bf16, fp8_params, loss)


def read_state_types(f: Fields, precision: Precision
                     ) -> tuple[bool, bool, CrossEntropyKernel]:
    """``grad_reduce`` ("fp32" | "bf16"), ``fp8_param_gather`` and ``cross_entropy``
    ("unfused" | "te") of a ``[training]`` table: Megatron-LM's ``--grad-reduce-in-bf16``,
    ``--fp8-param-gather`` and ``--cross-entropy-loss-fusion --cross-entropy-fusion-impl te``;
    FP8 weights need an FP8 precision (``validate_args`` in ``megatron/training/arguments.py``).
    Which frameworks run the fused loss is the runtime's rule
    (:func:`~solver.cost.runtime.runtime_rules.loss_kernel_problem`)."""
    grads = f.get("grad_reduce", str, "fp32")
    f.check("grad_reduce", grads in ("fp32", "bf16"), f'one of fp32, bf16, got "{grads}"')
    f.check("grad_reduce", grads == "fp32" or precision is not Precision.FP16,
            "bf16 gradient buffers need bf16 training (Megatron reads --grad-reduce-in-bf16 "
            "only with --bf16)")
    fp8_params = f.get("fp8_param_gather", bool, False)
    f.check("fp8_param_gather", not fp8_params or precision.is_fp8,
            f"FP8 weights need an FP8 precision, got {precision.value}")
    loss = f.get_enum("cross_entropy", CrossEntropyKernel, CrossEntropyKernel.UNFUSED)
    return grads == "bf16", fp8_params, loss
