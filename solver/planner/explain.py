"""What each stage of a plan holds and computes: ``tangram plan --explain``.

Per stage (what llm-analysis shows for one GPU, here for every stage): the parameters it holds
(in total and per GPU after TP/EP sharding), the FLOPs of one micro-batch through it (forward and
backward, plus the recomputed forward under full recomputation; Narayanan et al.'s count:
``2 x`` active matmul weights per token and pass, ``4 s a d_head`` for the attention core, the
backward pass twice the forward) and its per-GPU memory by part as the planner sized it.
"""

from __future__ import annotations

from dataclasses import dataclass

from solver.cost.stage import substage_layers
from solver.planner.plan import Plan


@dataclass(frozen=True)
class StageReport:
    """One stage's parameters, work and memory.

    Attributes
    ----------
    stage : int
        Position in the pipeline.
    params : float
        Weights the stage holds (all its GPUs together, one copy).
    params_per_gpu : float
        Weights per GPU before ZeRO (after TP and EP sharding).
    tflop_per_micro_batch : float
        TFLOPs of one micro-batch (forward, backward and recomputation) through the stage.
    weights_gb, grads_gb, optimizer_gb, activations_gb, fragmentation_gb, total_gb : float
        Per-GPU memory by part (weights include ZeRO-3 buffers and FP8 copies; fragmentation:
        what the caching allocator holds beyond the activations).
    """

    stage: int
    params: float
    params_per_gpu: float
    tflop_per_micro_batch: float
    weights_gb: float
    grads_gb: float
    optimizer_gb: float
    activations_gb: float
    fragmentation_gb: float
    total_gb: float


def explain(plan: Plan) -> list[StageReport]:
    """A :class:`StageReport` per stage of ``plan``."""
    m, t = plan.job.model, plan.job.training
    tokens = t.global_batch // plan.n_micro * t.seq_len
    out = []
    for i, s in enumerate(plan.stages):
        c, layers = s.plan.config, s.end - s.start
        dense = layers * m.params_per_layer
        expert = layers * m.experts * m.expert_params if m.is_moe else 0
        dense -= expert
        if s.start == 0:
            dense += m.embedding_params
        if s.end == m.layers:
            dense += m.head_params
        per_layer = 2.0 * (m.active_params_per_layer - m.norm_params) \
            + 4.0 * t.seq_len * m.heads * m.d_head
        fwd = per_layer * layers + (2.0 * m.vocab * m.hidden if s.end == m.layers else 0.0)
        # Full recomputation repeats the forward of its recomputed layers (all, or k per rank).
        redone = sum(c.recomputed_layers(int(n)) for n in substage_layers(layers, c.pp))
        passes = 3.0 + redone / layers
        mem = s.plan.memory
        out.append(StageReport(i, float(dense + expert), dense / c.tp + expert / (c.tp * c.ep),
                               passes * fwd * tokens / 1e12, mem.params, mem.grads,
                               mem.optimizer, mem.activations, mem.fragmentation, mem.total))
    return out
