"""Composition speed on the shipped tables (run with ``-m benchmark --benchmark-enable``).

Targets: DP at (L, K) = (80, 3) under 5 ms and at (128, 8) under 2 s on 2 cores. CP-SAT and the
MILPs are measured at (80, 3) only. Every benchmark also checks the answer, so a fast wrong
solver fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from formulations.assignment_cpsat import solve_cpsat
from formulations.assignment_milp import MilpBackend, solve_milp
from formulations.scaling import objective_tolerance
from solver.compose.dp import compose_dp
from solver.compose.table import load_table

pytestmark = pytest.mark.benchmark

TABLES = Path(__file__).resolve().parent.parent.parent / "instances" / "tables"
# Optima pinned from the DP and confirmed by CP-SAT, CBC and HiGHS (all proved optimal).
DP_CASES = {"paper_80x3": 5.4614, "mixed_128x6": 10.1836, "mixed_128x8": 7.8935}


@pytest.mark.parametrize("name", list(DP_CASES))
def test_bench_dp(benchmark, name):
    table = load_table(TABLES / f"{name}.json")
    result = benchmark(compose_dp, table)
    assert result.optimal and result.objective == pytest.approx(DP_CASES[name], abs=1e-9)


def test_bench_cpsat_80x3(benchmark):
    table = load_table(TABLES / "paper_80x3.json")
    result = benchmark.pedantic(solve_cpsat, args=(table,), kwargs={"time_limit_s": 60},
                                rounds=3, iterations=1)
    assert result.optimal
    assert abs(result.objective - DP_CASES["paper_80x3"]) <= objective_tolerance(table)


@pytest.mark.parametrize("backend", list(MilpBackend), ids=lambda b: b.value)
def test_bench_milp_80x3(benchmark, backend):
    table = load_table(TABLES / "paper_80x3.json")
    result = benchmark.pedantic(solve_milp, args=(table,),
                                kwargs={"time_limit_s": 60, "backend": backend},
                                rounds=3, iterations=1)
    assert result.optimal and result.objective == pytest.approx(DP_CASES["paper_80x3"], abs=1e-9)
