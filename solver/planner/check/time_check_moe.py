"""The validator's time check, MoE routing terms: the routed rows a rank's experts receive,
their sort by local expert, the experts' second bias and one all-to-all. Scalar restatements
of :mod:`solver.cost.timing`'s (:mod:`solver.planner.check.time_check` reads them; ``st`` is
its setup: model, calibration, machine).
"""

from __future__ import annotations

from solver.cost.stage import StageConfig
from solver.planner.check.time_check_machine import all_to_all

__all__ = ["expert_bias", "expert_sort", "one_all_to_all", "routed_rows"]

_SORT_BYTES = 8.0      # per token a rank's experts receive (sort by local expert, unsort)
_BIAS_BYTES = 12.0     # per routed hidden element and pass: the experts' second bias (16-bit)


def routed_rows(st, c: StageConfig, n: float) -> float:
    """Routed token copies a rank's experts receive: each expert-TP group gathers those of its
    ``etp`` sequence shards (``n / tp`` tokens each), ``k`` per token, times the capacity
    factor on the busiest rank."""
    return c.etp * n / c.tp * st.model.top_k * st.calib.moe_capacity_factor


def expert_sort(st, c: StageConfig, n: float) -> float:
    """Seconds of sorting the received tokens by local expert and back (several of them)."""
    if st.model.experts <= c.ep:
        return 0.0
    return _SORT_BYTES * routed_rows(st, c, n) * st.model.hidden / st.gpu.hbm


def one_all_to_all(st, c: StageConfig, n: float) -> float:
    """Seconds of one dispatch or combine all-to-all (EP ranks ``etp`` apart)."""
    m = st.model
    sent = 2.0 * n * m.top_k * m.hidden / c.tp * st.calib.moe_capacity_factor
    return all_to_all(st.gpu, sent, c.etp, c.ep)


def expert_bias(st, c: StageConfig, n: float) -> tuple[float, float]:
    """Seconds (forward, backward) of the routed experts' second bias where the model has
    biases: Megatron-Core adds it after the grouped GEMM as ``t + b * p`` per expert, joined
    by ``torch.cat`` (``TEGroupedMLP._apply_bias``): forward 2 + 6 + 4 bytes per routed
    hidden element in 16 bits, backward the products for the gradients of ``b`` and ``p``,
    6 each."""
    m = st.model
    if not (m.is_moe and m.bias):
        return 0.0, 0.0
    seconds = _BIAS_BYTES * routed_rows(st, c, n) * m.hidden / st.gpu.hbm
    return seconds, seconds
