"""Speed of one homogeneous plan() call: 80-layer llama3-70b slice on a 128-GPU A100 island
(target: well under 50 ms)."""

from __future__ import annotations

import pytest

from solver.cost.parallelizer import AnalyticParallelizer, PlanContext
from solver.cost.stage import ModelSlice
from solver.spec.domain import Island, ModelSpec

LLAMA3_70B = ModelSpec("llama3-70b", layers=80, hidden=8192, ffn=28672, heads=64, kv_heads=8,
                       vocab=128256)


@pytest.mark.benchmark
@pytest.mark.parametrize("max_pp", [1, 16])
def test_plan_llama3_70b_128_a100(benchmark, catalog, max_pp):
    island = Island.homogeneous("a100", catalog["A100-SXM-80GB"], 128)
    ctx = PlanContext(seq_len=4096, micro_batch=128, n_micro=16, in_flight=1, max_pp=max_pp)
    slc = ModelSlice(LLAMA3_70B, 80, True, True)
    plans = benchmark(AnalyticParallelizer().plan, slc, island, ctx)
    assert plans
