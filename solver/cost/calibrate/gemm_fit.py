"""The GEMM curve's shape, fitted on measured stand-alone GEMMs.

The cost model times a GEMM of ``F = 2 m n k`` FLOPs as (:class:`~solver.cost.efficiency.
GemmKernel`, stand-alone: ``gemm_in_training`` = 1)

    t = F / (ceiling · peak) · (1 + c · B / xi) + t0,    xi = 1 / (1/m + 1/n + 1/k),

its FLOPs at the GPU's max-achievable-matmul ceiling, plus ``c / ceiling`` times its operand
traffic at HBM speed (``B``: peak FLOP/s over HBM bytes/s), plus a fixed ``t0`` per kernel.
Given the ceiling, ``t`` is linear in ``(c, t0)``, so the fit is a linear least squares of the
relative time error over the measured shapes, ``c, t0 >= 0``: deterministic, no start point.

Data: ``instances/calibration/gemm-openxla.csv`` (OpenXLA's default GEMM table: H100, B200,
MI300X; single BF16 GEMMs, every side 256-4096). Shapes with a side below :data:`MIN_SIDE` are
left out: a training step's GEMMs have at least ``hidden / tp`` >= 512 on two sides and
thousands of token rows, and the smallest kernels are launch-bound in ways one fixed cost does
not follow. Each GPU with a table gets its own ``(c, t0)`` (``gemm_half_balance``,
``gemm_latency_us`` in ``instances/gpus.toml``; a GPU of the same silicon, e.g. H200 for H100,
shares it); the GPUs without one take the fit pooled over the NVIDIA tables (the
calibration's defaults). ``python -m solver.cost.calibrate.gemm_fit`` prints the fits;
``tests/cost/test_gemm_fit.py`` holds the catalog and the defaults to them.
"""

from __future__ import annotations

import argparse
import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from solver.cost.efficiency import GemmKernel
from solver.spec.domain import GPUSpec
from solver.spec.loaders import INSTANCES, load_catalog

CSV_PATH = INSTANCES / "calibration" / "gemm-openxla.csv"
#: Smallest side of a fitted shape (see the module docstring).
MIN_SIDE = 512
#: The tables pooled for the default curve: NVIDIA's (XLA names them by SM version).
POOLED_PREFIX = "sm_"


@dataclass(frozen=True)
class GemmMeasurement:
    """One measured GEMM.

    Attributes
    ----------
    table_key : str
        The source's device key (``sm_90``, ``sm_100_B200``, ``gfx942``).
    gpu : str
        The catalog GPU it was measured on.
    m, n, k : int
        Shape: ``C[m, n] = A[m, k] B[k, n]``.
    flops_per_s : float
        Measured throughput, ``2 m n k`` per GEMM.
    """

    table_key: str
    gpu: str
    m: int
    n: int
    k: int
    flops_per_s: float

    @property
    def seconds(self) -> float:
        """Measured seconds of the GEMM."""
        return 2.0 * self.m * self.n * self.k / self.flops_per_s


@dataclass(frozen=True)
class CurveFit:
    """A fitted ``(c, t0)`` and how well it reproduces its measurements.

    Attributes
    ----------
    label : str
        The GPU (or ``pooled``) fitted.
    half_balance : float
        ``c``: half-ceiling intensity in machine balances.
    latency_us : float
        ``t0``: fixed microseconds per kernel.
    rms : float
        Root mean square of ``log(predicted / measured)`` time over the fitted shapes.
    worst : float
        Largest ``|log(predicted / measured)|``.
    shapes : int
        Shapes fitted.
    """

    label: str
    half_balance: float
    latency_us: float
    rms: float
    worst: float
    shapes: int


def load_measurements(path: Path | str = CSV_PATH) -> list[GemmMeasurement]:
    """Every measured GEMM of the table (``#`` lines are comments)."""
    with open(path, encoding="utf-8") as fh:
        lines = [line for line in fh if not line.startswith("#")]
    return [GemmMeasurement(r["table_key"], r["gpu"], int(r["m"]), int(r["n"]), int(r["k"]),
                            float(r["flops_per_s"])) for r in csv.DictReader(lines)]


def _terms(rows: list[GemmMeasurement], catalog: dict[str, GPUSpec]
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: seconds at the ceiling, the traffic term per unit ``c``, the measured seconds."""
    at_ceiling, traffic, measured = [], [], []
    for r in rows:
        gpu = catalog[r.gpu]
        peak = gpu.bf16_tflops * 1e12
        balance = peak / (gpu.hbm_bw_gbs * 1e9)
        xi = 1.0 / (1.0 / r.m + 1.0 / r.n + 1.0 / r.k)
        base = 2.0 * r.m * r.n * r.k / (gpu.gemm_eff * peak)
        at_ceiling.append(base)
        traffic.append(base * balance / xi)
        measured.append(r.seconds)
    return np.array(at_ceiling), np.array(traffic), np.array(measured)


def predicted_seconds(rows: list[GemmMeasurement], catalog: dict[str, GPUSpec],
                      half_balance: float, latency_us: float) -> np.ndarray:
    """Stand-alone seconds the cost model's GEMM time (:class:`GemmKernel`, in-training
    fraction 1) gives each measured shape with the curve ``(c, t0)``."""
    out = []
    for r in rows:
        gpu = catalog[r.gpu]
        peak = gpu.bf16_tflops * 1e12
        kernel = GemmKernel(gpu.gemm_eff, half_balance * peak / (gpu.hbm_bw_gbs * 1e9),
                            latency_us * 1e-6, 1.0)
        out.append(float(kernel.seconds(2.0 * r.m * r.n * r.k, r.m, r.n, r.k, peak)))
    return np.array(out)


def _least_squares(base: np.ndarray, traffic: np.ndarray, measured: np.ndarray
                   ) -> tuple[float, float]:
    """``(c, t0) >= 0`` minimizing the squared relative time error (exact: the unconstrained
    optimum when it is feasible, else the better of the two edges ``c = 0`` and ``t0 = 0``)."""
    w = 1.0 / measured
    design = np.column_stack([traffic * w, w])
    target = 1.0 - base * w
    c, t0 = np.linalg.lstsq(design, target, rcond=None)[0]
    if c >= 0 and t0 >= 0:
        return float(c), float(t0)

    def edge(column: int) -> tuple[float, tuple[float, float]]:
        x = design[:, column]
        value = max(0.0, float(x @ target / (x @ x)))
        loss = float(np.sum((target - value * x) ** 2))
        return loss, ((value, 0.0) if column == 0 else (0.0, value))

    return min(edge(0), edge(1))[1]


def fit_curve(rows: list[GemmMeasurement], catalog: dict[str, GPUSpec], label: str,
              min_side: int = MIN_SIDE) -> CurveFit:
    """The least-squares ``(c, t0)`` over ``rows`` with every side at least ``min_side``."""
    rows = [r for r in rows if min(r.m, r.n, r.k) >= min_side]
    c, t0 = _least_squares(*_terms(rows, catalog))
    rms, worst = curve_error(rows, catalog, c, t0 * 1e6, min_side)
    return CurveFit(label, c, t0 * 1e6, rms, worst, len(rows))


def all_fits(path: Path | str = CSV_PATH) -> list[CurveFit]:
    """One fit per measured GPU, then the pooled fit over the NVIDIA tables (label ``pooled``)."""
    rows, catalog = load_measurements(path), load_catalog()
    gpus = list(dict.fromkeys(r.gpu for r in rows))
    fits = [fit_curve([r for r in rows if r.gpu == g], catalog, g) for g in gpus]
    pooled = [r for r in rows if r.table_key.startswith(POOLED_PREFIX)]
    return fits + [fit_curve(pooled, catalog, "pooled")]


def curve_error(rows: list[GemmMeasurement], catalog: dict[str, GPUSpec], half_balance: float,
                latency_us: float, min_side: int = MIN_SIDE) -> tuple[float, float]:
    """(rms, worst) ``|log(predicted / measured)|`` of a given curve over the fitted shapes."""
    rows = [r for r in rows if min(r.m, r.n, r.k) >= min_side]
    err = np.log(predicted_seconds(rows, catalog, half_balance, latency_us)
                 / np.array([r.seconds for r in rows]))
    return float(np.sqrt(np.mean(err ** 2))), float(np.abs(err).max())


def markdown_table(fits: list[CurveFit]) -> str:
    """The fits as a Markdown table."""
    lines = ["| GPU | c (balances) | t0 (µs) | shapes | rms error | worst error |",
             "|---|---:|---:|---:|---:|---:|"]
    for f in fits:
        lines.append(f"| {f.label} | {f.half_balance:.3f} | {f.latency_us:.2f} | {f.shapes} "
                     f"| {math.expm1(f.rms):.1%} | {math.expm1(f.worst):.1%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the per-GPU and pooled fits."""
    argparse.ArgumentParser(prog="python -m solver.cost.calibrate.gemm_fit",
                            description=__doc__.splitlines()[0]).parse_args(argv)
    print(markdown_table(all_fits()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
