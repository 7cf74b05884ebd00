"""The cost model against reality: every row of Narayanan et al., SC'21, Table 1 within 10%,
no bias, and the shipped constants the fit's optimum (``python -m solver.cost.calibrate.calibration --fit``).

Setup of the paper: A100-SXM-80GB, 8 per node, 200 Gb/s per GPU, interleaved 1F1B, full
recomputation, tp/pp/dp from the row, unfused attention (2021). Micro-batch and model chunks are
not given: the fastest fitting pair is chosen (solver.cost.calibrate.calibration). The prediction is converted to
the paper's accounting F = 96 B s l h^2 (1 + s/6h + V/16lh), which counts the recomputation.
"""

from __future__ import annotations

import pytest

from solver.cost.calibrate.calibration import (
    CSV_PATH,
    calibration_points,
    chunk_candidates,
    load_rows,
    markdown_table,
)
from solver.cost.estimating.estimate import Estimate

TOLERANCE = 0.10   # issue target: calibration rows within ±10% (fitted: largest 5.7%)
MAX_MEAN_BIAS = 0.03  # fitted: +1.0%


@pytest.fixture(scope="module")
def points():
    return calibration_points()


def test_every_row_within_tolerance(points):
    assert len(points) == len(load_rows()) == 10
    bad = [(p.row.params_b, f"{p.error:+.1%}") for p in points if abs(p.error) > TOLERANCE]
    assert not bad, f"rows outside +-{TOLERANCE:.0%}: {bad}\n{markdown_table(points)}"
    bias = sum(p.error for p in points) / len(points)
    assert abs(bias) <= MAX_MEAN_BIAS, f"mean error {bias:+.1%}"


def test_shipped_constants_are_a_minimax_optimum():
    """No single move of a fitted constant by ±2% lowers the largest log error."""
    import dataclasses

    from solver.cost.calibrate.calibration import BOUNDS, FITTED, worst_log_error
    from solver.cost.efficiency import DEFAULT_CALIBRATION as calib
    here = worst_log_error(calib)[0]
    for name in FITTED:
        for factor in (1.02, 1 / 1.02):
            value = getattr(calib, name) * factor
            if BOUNDS[name][0] <= value <= BOUNDS[name][1]:
                trial = worst_log_error(dataclasses.replace(calib, **{name: value}))[0]
                assert trial >= here - 1e-4, (name, factor, trial, here)


def test_every_prediction_fits_and_is_consistent(points):
    for p in points:
        est: Estimate = p.estimate
        assert est.fits
        assert est.config.recompute.value == "full"
        assert (est.config.tp, est.config.pp, est.config.dp) == (p.row.tp, p.row.pp, p.row.dp)
        assert p.virtual_stages in chunk_candidates(p.row)
        parts = sum(vars(est.breakdown).values())
        assert parts == pytest.approx(est.iteration_time_s, rel=1e-9)
        # The paper's accounting counts the recompute forward: 4/3 of model FLOPs, roughly.
        assert 1.25 < p.predicted_tflops / est.tflops_per_gpu < 1.40


def test_csv_is_the_shipped_copy():
    assert CSV_PATH.is_file() and CSV_PATH.parent.name == "calibration"
