"""The development set of published runs: reading its rows and converting each measurement.

``instances/calibration/published-runs-dev.csv`` (provenance and rules of use:
``instances/calibration/README.md``) holds 43 measured training runs with their layouts. A
:class:`RunRow` is one row, typed; :meth:`RunRow.measured_iteration_s` turns its measurement into
seconds per iteration with the FLOP count its source used (the row's ``notes`` give each formula).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from solver.spec.errors import InputError
from solver.spec.loaders import INSTANCES

DEV_SET = INSTANCES / "calibration" / "published-runs-dev.csv"

_INTS = ("layers", "hidden", "ffn", "heads", "kv_heads", "head_dim", "vocab", "gpus",
         "gpus_per_node", "seq_len", "global_batch", "tp", "pp", "cp", "ep", "dp", "zero")
_OPTIONAL_INTS = ("experts", "top_k", "expert_ffn", "shared_expert_ffn", "micro_batch", "vp")


@dataclass(frozen=True)
class RunRow:
    """One published run (the CSV's columns, typed; ``None`` where the source is silent).

    Attributes
    ----------
    id, source, model, architecture_note, gpu, precision, recompute, framework, measured, notes
        As in the CSV (``recompute`` may be ``""`` or ``"per recipe"``: not stated).
    layers, hidden, ffn, heads, kv_heads, head_dim, vocab : int
        Model shape.
    gated_mlp, tied_embeddings : bool
        Model shape.
    experts, top_k, expert_ffn, shared_expert_ffn : int | None
        MoE shape (None: dense).
    gpus, gpus_per_node : int
        GPUs in the run and per server.
    nic_gbits_per_gpu : float
        Network bandwidth per GPU.
    seq_len, global_batch : int
        Tokens per sequence, sequences per iteration.
    micro_batch, vp : int | None
        Micro-batch and virtual stages (None: not stated).
    tp, pp, cp, ep, dp, zero : int
        Layout.
    measured_value : float
        The measurement, in the unit ``measured`` names.
    """

    id: str
    source: str
    model: str
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    gated_mlp: bool
    tied_embeddings: bool
    experts: int | None
    top_k: int | None
    expert_ffn: int | None
    shared_expert_ffn: int | None
    architecture_note: str
    gpu: str
    gpus: int
    gpus_per_node: int
    nic_gbits_per_gpu: float
    precision: str
    seq_len: int
    global_batch: int
    micro_batch: int | None
    tp: int
    pp: int
    vp: int | None
    cp: int
    ep: int
    dp: int
    zero: int
    recompute: str
    framework: str
    measured: str
    measured_value: float
    notes: str

    @property
    def tokens(self) -> int:
        """Tokens per iteration."""
        return self.global_batch * self.seq_len

    def measured_iteration_s(self) -> float:
        """Seconds per iteration the measurement implies (the notes' formulas).

        - ``iteration_time_s``: as measured.
        - ``tokens_per_s_per_gpu``: ``B s / (x * gpus)``.
        - ``tflops_per_gpu_sc21``: SC'21 eq. 3, ``F = 96 B s l h^2 (1 + s/6h + V/16lh)`` (counts
          the recompute forward) over ``x * gpus``.
        - ``tflops_per_gpu_mcore``: Megatron-Core's ``num_floating_point_operations``,
          ``12 B s l h^2 ((1 + g/a + s/h) + f/h (1.5 gated, else 1) + V/2lh)``.
        """
        x, b, s = self.measured_value, self.global_batch, self.seq_len
        l, h, v = self.layers, self.hidden, self.vocab
        if self.measured == "iteration_time_s":
            return x
        if self.measured == "tokens_per_s_per_gpu":
            return self.tokens / (x * self.gpus)
        if self.measured == "tflops_per_gpu_sc21":
            flops = 96.0 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
        elif self.measured == "tflops_per_gpu_mcore":
            mlp = self.ffn / h * (1.5 if self.gated_mlp else 1.0)
            flops = 12.0 * b * s * l * h * h * ((1 + self.kv_heads / self.heads + s / h) + mlp
                                                + v / (2 * l * h))
        else:
            raise InputError(str(DEV_SET), f"{self.id}.measured",
                             f"unknown measurement kind {self.measured!r}")
        return flops / (x * 1e12 * self.gpus)


def _bool(text: str) -> bool:
    return text.strip().lower() == "true"


def _row(raw: dict[str, str], file: str) -> RunRow:
    """One CSV record, typed; a malformed cell is an :class:`InputError` naming it."""
    values: dict[str, object] = dict(raw)
    try:
        for key in _INTS:
            values[key] = int(raw[key])
        for key in _OPTIONAL_INTS:
            values[key] = int(raw[key]) if raw[key].strip() else None
        values["nic_gbits_per_gpu"] = float(raw["nic_gbits_per_gpu"])
        values["measured_value"] = float(raw["measured_value"])
    except (KeyError, ValueError) as exc:
        raise InputError(file, f"{raw.get('id', '?')}", f"malformed row: {exc}") from None
    values["gated_mlp"] = _bool(raw["gated_mlp"])
    values["tied_embeddings"] = _bool(raw["tied_embeddings"])
    return RunRow(**values)


def load_rows(path: Path | str = DEV_SET) -> list[RunRow]:
    """Every row of the development set (or of another file in its format), in file order."""
    path = Path(path)
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            return [_row(raw, str(path)) for raw in csv.DictReader(fh)]
    except FileNotFoundError:
        raise InputError(str(path), "<file>", "cannot read: no such file") from None
