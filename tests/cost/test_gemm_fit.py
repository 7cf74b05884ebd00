"""The GEMM curve against measured GEMMs (OpenXLA's table): the catalog holds the fit, the fit
is the least-squares optimum, and one measurement checked by hand."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from solver.cost.efficiency import DEFAULT_CALIBRATION
from solver.cost.calibrate.gemm_fit import (
    GemmMeasurement,
    all_fits,
    curve_error,
    fit_curve,
    load_measurements,
    predicted_seconds,
)

#: The catalog's GPUs of the same silicon as a measured one take its curve.
SAME_SILICON = {"H100-SXM-80GB": ("H100-NVL-94GB", "H100-PCIe-80GB", "H200-SXM-141GB"),
                "B200": (), "MI300X": ()}


@pytest.fixture(scope="module")
def fits():
    return {f.label: f for f in all_fits()}


@pytest.fixture(scope="module")
def rows():
    return load_measurements()


def test_table_holds_three_gpus_of_125_shapes(rows):
    by_gpu = {g: [r for r in rows if r.gpu == g] for g in SAME_SILICON}
    assert {g: len(v) for g, v in by_gpu.items()} == {g: 125 for g in SAME_SILICON}
    assert all(len({(r.m, r.n, r.k) for r in v}) == 125 for v in by_gpu.values())


def test_catalog_holds_each_measured_gpus_fit(fits, catalog):
    for gpu, siblings in SAME_SILICON.items():
        fit = fits[gpu]
        for name in (gpu, *siblings):
            assert catalog[name].gemm_half_balance == round(fit.half_balance, 3), name
            assert catalog[name].gemm_latency_us == round(fit.latency_us, 2), name


def test_calibration_defaults_are_the_pooled_nvidia_fit(fits):
    pooled = fits["pooled"]
    assert pooled.shapes == 128  # H100 and B200, every side >= 512
    assert DEFAULT_CALIBRATION.gemm_half_balance == round(pooled.half_balance, 3)
    assert DEFAULT_CALIBRATION.gemm_latency_s == pytest.approx(round(pooled.latency_us, 2) * 1e-6)
    # A GPU without a curve of its own (A100, V100, L40S, A10) takes the defaults.


def test_fit_is_the_least_squares_optimum(rows, catalog):
    h100 = [r for r in rows if r.gpu == "H100-SXM-80GB" and min(r.m, r.n, r.k) >= 512]
    fit = fit_curve(h100, catalog, "h100")
    measured = np.array([r.seconds for r in h100])

    def loss(c: float, t0_us: float) -> float:
        return float(np.sum((predicted_seconds(h100, catalog, c, t0_us) / measured - 1) ** 2))

    best = loss(fit.half_balance, fit.latency_us)
    for dc, dt in ((0.01, 0), (-0.01, 0), (0, 0.05), (0, -0.05), (0.01, 0.05), (-0.01, -0.05)):
        c, t0 = max(fit.half_balance + dc, 0.0), fit.latency_us + dt
        assert loss(c, t0) >= best - 1e-12, (c, t0)


def test_fit_recovers_a_planted_curve(catalog):
    # Times written from c = 0.3 balances and t0 = 5 us exactly come back as (0.3, 5).
    shapes = [(m, n, k) for m in (512, 2048, 4096) for n in (512, 1024, 4096)
              for k in (1024, 4096)]
    stub = [GemmMeasurement("sm_x", "H100-SXM-80GB", m, n, k, 1.0) for m, n, k in shapes]
    seconds = predicted_seconds(stub, catalog, 0.3, 5.0)
    planted = [dataclasses.replace(r, flops_per_s=2.0 * r.m * r.n * r.k / t)
               for r, t in zip(stub, seconds)]
    fit = fit_curve(planted, catalog, "planted")
    assert fit.half_balance == pytest.approx(0.3, rel=1e-9)
    assert fit.latency_us == pytest.approx(5.0, rel=1e-9)
    assert fit.rms == pytest.approx(0.0, abs=1e-12)


def test_h100_4096_cubed_by_hand(rows, catalog):
    # Measured (OpenXLA, sm_90): 780.19 TFLOP/s. By hand with the catalog's H100 curve:
    # F = 2 * 4096^3 = 1.3744e11 FLOPs at 0.803 * 989e12 = 794.2e12 FLOP/s: 173.05 us;
    # traffic 0.012 * (989e12 / 3350e9) / (4096 / 3) = 0.0026 of that: 0.45 us; t0 6.18 us;
    # total 179.68 us = 764.9 TFLOP/s, 2.0 % below the measurement.
    gpu = catalog["H100-SXM-80GB"]
    (row,) = [r for r in rows if r.gpu == gpu.name and (r.m, r.n, r.k) == (4096,) * 3]
    assert row.flops_per_s == pytest.approx(780.19e12, rel=1e-4)
    t = predicted_seconds([row], catalog, gpu.gemm_half_balance, gpu.gemm_latency_us)[0]
    assert t == pytest.approx(179.68e-6, rel=1e-3)
    assert 2 * 4096 ** 3 / t / row.flops_per_s == pytest.approx(0.980, abs=0.002)


def test_the_fitted_curves_beat_the_balance_scaled_one(fits, rows, catalog):
    # The curve before (half point 4.5 machine balances, no fixed cost; fitted end to end on
    # A100 runs) misprices measured H100 and B200 GEMMs several times worse than the fits.
    for gpu in ("H100-SXM-80GB", "B200"):
        mine = [r for r in rows if r.gpu == gpu]
        old_rms, _ = curve_error(mine, catalog, 4.5, 0.0)
        assert fits[gpu].rms < 0.1 < 0.4 < old_rms, (gpu, fits[gpu].rms, old_rms)


def test_fit_stays_non_negative_and_is_the_best_feasible_point(catalog):
    # Times written from a negative traffic multiple (c = -0.2: larger GEMMs relatively faster
    # than the ceiling allows) have their unconstrained optimum outside c >= 0: the fit takes
    # the best point of the feasible quadrant, which no grid point beats.
    shapes = [(m, n, k) for m in (512, 1024, 4096) for n in (512, 2048) for k in (512, 4096)]
    stub = [GemmMeasurement("sm_x", "H100-SXM-80GB", m, n, k, 1.0) for m, n, k in shapes]
    seconds = predicted_seconds(stub, catalog, -0.2, 5.0)
    planted = [dataclasses.replace(r, flops_per_s=2.0 * r.m * r.n * r.k / t)
               for r, t in zip(stub, seconds)]
    fit = fit_curve(planted, catalog, "planted")
    assert fit.half_balance == 0.0 and fit.latency_us >= 0.0

    def loss(c: float, t0_us: float) -> float:
        return float(np.sum((predicted_seconds(planted, catalog, c, t0_us) / seconds - 1) ** 2))

    best = loss(fit.half_balance, fit.latency_us)
    grid = [(c, t) for c in np.linspace(0.0, 0.5, 26) for t in np.linspace(0.0, 10.0, 101)]
    assert all(loss(c, t) >= best - 1e-12 for c, t in grid)
