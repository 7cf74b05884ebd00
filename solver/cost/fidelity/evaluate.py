"""Each development-set row through the cost model ``tangram estimate`` uses, and the summary.

A row becomes an :class:`~solver.cost.estimating.estimate.EstimateSetup` with its own model shape, GPU,
layout, precision and framework. What the source does not state is chosen the way the
runtime's user would tune it, by the model itself and the same for every row: an empty
``micro_batch`` is the fastest fitting one (``estimate``'s automatic micro-batch), an empty
``vp`` with ``pp > 1`` the fastest fitting number of virtual stages (``virtual_stages =
"auto"``), an empty or ``per recipe`` ``recompute`` the fastest fitting recomputation the
framework runs (with Megatron-Core's block method, every number of recomputed layers per
rank). Megatron-Core with ``zero = 3`` is Megatron-FSDP; it is priced with the FSDP
profile where Megatron-Core's own profile does not run ZeRO-3 (said in the row's ``priced_as``).
A row the model cannot represent is refused with one line (multi-head latent attention, a GPU
missing from the catalog, a layout the framework profile rejects).
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass

from solver.cost.efficiency import DEFAULT_CALIBRATION, AttentionKernel, Calibration
from solver.cost.estimating.estimate import Estimate, EstimateSetup, estimate
from solver.cost.fidelity.rows import RunRow
from solver.cost.runtime.frameworks import megatron_fsdp, profile, violations
from solver.cost.stage import StageConfig
from solver.spec.domain import (CrossEntropyKernel, Framework, GPUSpec, Island, ModelSpec,
                                Precision, Recompute, Schedule)

WITHIN = 0.15  # the band: a row is "within" when |predicted / measured - 1| <= 15 %


@dataclass(frozen=True)
class RowResult:
    """One row evaluated (or refused).

    Attributes
    ----------
    id : str
        Row id.
    measured_s : float
        Measured seconds per iteration (converted, :meth:`RunRow.measured_iteration_s`).
    predicted_s : float | None
        Predicted seconds per iteration (None: refused).
    memory_gb : float | None
        Predicted peak memory of the most loaded GPU, GB.
    fits : bool | None
        Predicted to fit in memory.
    priced_as : str
        Framework, precision and the choices made for unstated settings.
    refused : str
        Why the row is not evaluated ("" when it is).
    breakdown : tuple[tuple[str, float], ...]
        The predicted seconds per iteration by cause, in
        :class:`~solver.cost.estimating.estimate.Breakdown`'s order (compute, recompute, TP, CP,
        EP, pipeline bubble, data parallel, optimizer, offload); they sum to ``predicted_s``.
        Empty when refused.
    """

    id: str
    measured_s: float
    predicted_s: float | None = None
    memory_gb: float | None = None
    fits: bool | None = None
    priced_as: str = ""
    refused: str = ""
    breakdown: tuple[tuple[str, float], ...] = ()

    @property
    def ratio(self) -> float | None:
        """Predicted over measured time (None: refused)."""
        return None if self.predicted_s is None else self.predicted_s / self.measured_s

    @property
    def missed_s(self) -> float | None:
        """Measured minus predicted seconds: what the runtime spent that the model does not
        (negative: the model charges more than the run took; None: refused)."""
        return None if self.predicted_s is None else self.measured_s - self.predicted_s

    def to_json(self) -> dict:
        """Public ``--json`` object of the row (``breakdown``: seconds by cause, null when
        refused)."""
        out = {**dataclasses.asdict(self), "ratio": self.ratio}
        out["breakdown"] = dict(self.breakdown) if self.breakdown else None
        return out


@dataclass(frozen=True)
class Summary:
    """The development-set figures the issue's targets are stated in.

    Attributes
    ----------
    rows, evaluated : int
        Rows in the set; rows evaluated.
    median_abs_error : float
        Median of ``|ratio - 1|`` over the evaluated rows.
    within_15 : float
        Share of evaluated rows with ``|ratio - 1| <= 0.15``.
    worst_id : str
        The row with the largest ``|ratio - 1|``.
    worst_abs_error : float
        Its ``|ratio - 1|``.
    not_fitting : tuple[str, ...]
        Evaluated rows predicted not to fit in memory.
    refused : tuple[tuple[str, str], ...]
        (row id, reason) of every refused row.
    """

    rows: int
    evaluated: int
    median_abs_error: float
    within_15: float
    worst_id: str
    worst_abs_error: float
    not_fitting: tuple[str, ...]
    refused: tuple[tuple[str, str], ...]

    def to_json(self) -> dict:
        """Public ``--json`` object of the summary."""
        out = dataclasses.asdict(self)
        out["refused"] = [{"id": i, "reason": r} for i, r in self.refused]
        out["not_fitting"] = list(self.not_fitting)
        return out


#: Model names whose linear layers carry biases: Megatron-LM's GPT models (``--add-bias-linear``
#: is its default; SC'21's, Korthikanti's and the H100 table's GPTs) and GPT-OSS (its config's
#: ``attention_bias`` and expert biases; Megatron-Bridge ``GPTOSSProvider.add_bias_linear``).
#: Llama 3, Qwen3 and DeepSeek-V3 have none.
BIASED_MODELS = ("GPT",)


def model_of(row: RunRow) -> ModelSpec:
    """The row's model shape (shared experts as whole experts of ``expert_ffn`` width; linear
    biases for :data:`BIASED_MODELS`)."""
    shared = 0
    if row.experts and row.shared_expert_ffn:
        shared = max(1, round(row.shared_expert_ffn / row.expert_ffn))
    return ModelSpec(row.model, row.layers, row.hidden, row.ffn, row.heads, row.kv_heads,
                     row.vocab, row.gated_mlp, row.tied_embeddings, row.experts or 0,
                     row.top_k or 0, row.expert_ffn or 0, shared, row.head_dim,
                     bias=row.model.startswith(BIASED_MODELS))


def precision_of(name: str) -> Precision:
    """The row's precision (``fp8-cs``, ``fp8-mx``, ``bf16``, ``fp16``)."""
    return Precision(name)


def framework_of(row: RunRow, config: StageConfig) -> tuple[Framework, str]:
    """The framework profile that prices the row, and a note when it is not the row's own: a
    Megatron-FSDP layout that Megatron-Core's profile does not reach (with pipeline stages)
    is priced with PyTorch FSDP's."""
    fw = Framework(row.framework)
    if fw is Framework.MEGATRON_CORE and row.zero == 3 and violations(
            [config], profile(fw), row.pp > 1):
        return Framework.FSDP, "Megatron-FSDP priced with the fsdp profile"
    return fw, ""


def _recomputes(row: RunRow, fw: Framework) -> list[tuple[Recompute, int | None]]:
    """The stated recomputation, or every one the framework runs when the source is silent:
    none, selective, full, and where the framework has it the block method recomputing the
    first ``k`` layers of each pipeline rank (``--recompute-method block
    --recompute-num-layers k``), ``k`` below the rank's layers."""
    if row.recompute in ("full", "selective", "none"):
        return [(Recompute(row.recompute), None)]
    prof = profile(fw)
    out = [(rc, None) for rc in prof.recompute]
    if getattr(prof, "recompute_layers", False) and Recompute.FULL in prof.recompute:
        per_rank = -(-row.layers // row.pp)
        out += [(Recompute.FULL, k) for k in range(1, per_rank)]
    return out


def refusal(row: RunRow, catalog: dict[str, GPUSpec]) -> str:
    """Why the row cannot be evaluated, or ""."""
    if "multi-head latent attention" in row.architecture_note:
        return "multi-head latent attention (DeepSeek-V3) is not modelled"
    if row.gpu not in catalog:
        return f"GPU {row.gpu!r} is not in the catalog"
    if row.tp * row.pp * row.dp * row.cp != row.gpus:
        return f"tp*pp*dp*cp = {row.tp * row.pp * row.dp * row.cp} != gpus {row.gpus}"
    if row.global_batch % row.dp:
        return f"dp {row.dp} does not divide the global batch {row.global_batch}"
    return ""


def setups(row: RunRow, catalog: dict[str, GPUSpec], epsilon: float
           ) -> tuple[list[EstimateSetup], str]:
    """Every setup to try for the row (one per unstated recomputation), and how it is priced."""
    gpu = catalog[row.gpu]
    island = Island.homogeneous(f"{row.gpus}x{row.gpu}", gpu, row.gpus, row.gpus_per_node,
                                row.nic_gbits_per_gpu)
    base = StageConfig(tp=row.tp, cp=row.cp, ep=row.ep, pp=row.pp, dp=row.dp, zero=row.zero,
                       micro_batch=row.micro_batch or 1)
    fw, note = framework_of(row, base)
    interleaved = row.vp is not None and row.vp > 1
    out = [EstimateSetup(model_of(row), island, row.global_batch, row.seq_len,
                         dataclasses.replace(base, recompute=rc, **_block(k)),
                         auto_micro_batch=row.micro_batch is None,
                         schedule=Schedule.INTERLEAVED if interleaved else Schedule.ONE_F_ONE_B,
                         virtual_stages=row.vp if interleaved else 1, epsilon=epsilon,
                         framework=fw, precision=precision_of(row.precision),
                         auto_virtual_stages=row.vp is None and row.pp > 1,
                         **_state_types(row))
           for rc, k in _recomputes(row, fw)]
    return out, note


def _block(k: int | None) -> dict:
    """``recompute_layers`` for the block method (only where the stage type has it)."""
    return {} if k is None else {"recompute_layers": k}


#: The source of the rows measured with Megatron-Bridge's performance scripts.
BRIDGE_SOURCE = "Megatron-Bridge docs/performance-summary.md"


def _state_types(row: RunRow) -> dict:
    """The gradient buffers, weights and loss kernel the row's software ran. Megatron-Bridge's
    performance summary ran its performance scripts (``scripts/performance``, at 97ad8cc6 for
    the 25.11 table): every model's common settings set ``ddp.grad_reduce_in_fp32 = False``
    (bf16 gradient buffers) and ``recipe.model.cross_entropy_fusion_impl = "te"``
    (``_set_common_perf_overrides``, ``utils/overrides.py``, with Bridge's default
    ``cross_entropy_loss_fusion = True``: Transformer Engine's fused loss), and its FP8
    precisions (``utils/precision.py``: ``bf16_with_fp8_current_scaling_mixed``,
    ``bf16_with_mxfp8_mixed``) set ``fp8_param_gather = True``. Every other source ran
    Megatron-LM's defaults (the unfused loss)."""
    if BRIDGE_SOURCE not in row.source:
        return {}
    return {"grad_reduce_bf16": True,
            "fp8_param_gather": precision_of(row.precision).is_fp8,
            "cross_entropy": CrossEntropyKernel.TE}


def calibration_of(row: RunRow) -> Calibration:
    """What the row's own text fixes about the software it ran, the same rule for every row.

    - Runs published before FlashAttention (Dao et al., May 2022), the SC'21 rows, ran unfused
      attention whatever the framework (``megatron-2021`` already does; DeepSpeed's rows too).
    - Runs published before DeepSpeed v0.5.6 (November 2021), the SC'21 rows, ran ZeRO-3 whose
      gathers synchronized the device one by one (PR #1188): none of them hid behind compute;
      and each gather and reduce-scatter passed one tensor per rank to ``torch.distributed``
      (list-based collectives, the same PR): host work per rank of the group.
    - Benchmarks that state force-balanced, dropless routing send every expert rank exactly its
      balanced share: the busiest rank's load factor is 1, not the capacity factor of a
      learned router.
    """
    calib = DEFAULT_CALIBRATION
    if "SC'21" in row.source:
        calib = dataclasses.replace(calib, attention=AttentionKernel.UNFUSED,
                                    zero3_prefetch=False, zero3_list_collectives=True)
    if row.experts and "force-balanced" in row.notes:
        calib = dataclasses.replace(calib, moe_capacity_factor=1.0)
    return calib


def _best(tries: list[Estimate]) -> Estimate:
    return min(tries, key=lambda e: (not e.fits, e.iteration_time_s, e.memory.total))


def evaluate_row(row: RunRow, catalog: dict[str, GPUSpec], epsilon: float = 0.0,
                 calibration: Calibration | None = None) -> RowResult:
    """The row through :func:`~solver.cost.estimating.estimate.estimate` (or its refusal);
    ``calibration`` replaces :func:`calibration_of`'s (for the fits)."""
    measured = row.measured_iteration_s()
    reason = refusal(row, catalog)
    if reason:
        return RowResult(row.id, measured, refused=reason)
    tries, note = setups(row, catalog, epsilon)
    found = violations([tries[0].parallel], profile(tries[0].framework), row.pp > 1)
    if found:
        return RowResult(row.id, measured, refused=found[0].removeprefix("stage 0: "))
    calib = calibration_of(row) if calibration is None else calibration
    est = _best([estimate(s, calib) for s in tries])
    chosen = [f"{tries[0].framework.value}", row.precision, f"mb {est.config.micro_batch}",
              f"v {est.virtual_stages}", f"recompute {est.config.recompute.value}"
              + (f" of {est.config.recompute_layers} layers per rank"
                 if getattr(est.config, "recompute_layers", None) else "")]
    if calib.attention is AttentionKernel.UNFUSED:
        chosen.append("unfused attention (2021)")
    if calib.zero3_list_collectives and row.zero == 3:
        chosen.append("list collectives (2021)")
    if megatron_fsdp(tries[0].framework, est.config):
        chosen.append("Megatron-FSDP")
    if tries[0].grad_reduce_bf16:
        chosen.append("bf16 gradients")
    if tries[0].fp8_param_gather:
        chosen.append("FP8 weights")
    if tries[0].cross_entropy is CrossEntropyKernel.TE:
        chosen.append("TE cross entropy")
    priced = ", ".join(chosen + ([note] if note else []))
    return RowResult(row.id, measured, est.iteration_time_s, est.memory.total, est.fits, priced,
                     breakdown=tuple(dataclasses.asdict(est.breakdown).items()))


def summarize(results: list[RowResult]) -> Summary:
    """The summary of evaluated rows (see :class:`Summary`)."""
    done = [r for r in results if r.ratio is not None]
    errors = [abs(r.ratio - 1.0) for r in done]
    worst = max(done, key=lambda r: abs(r.ratio - 1.0)) if done else None
    return Summary(
        rows=len(results), evaluated=len(done),
        median_abs_error=statistics.median(errors) if errors else float("nan"),
        within_15=sum(e <= WITHIN for e in errors) / len(errors) if errors else float("nan"),
        worst_id=worst.id if worst else "",
        worst_abs_error=abs(worst.ratio - 1.0) if worst else float("nan"),
        not_fitting=tuple(r.id for r in done if not r.fits),
        refused=tuple((r.id, r.refused) for r in results if r.refused))
