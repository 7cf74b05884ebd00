"""The compute floor of a view (:func:`solver.planner.bounds.floors.view_floor`): no plan beats it, so a
view whose floor is not below the bar is dismissed without losing a plan."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import INSTANCES
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.cost.parallelizer import AnalyticParallelizer
from solver.cost.stage import ModelSlice
from solver.islands import group_island
from solver.planner.bounds.floors import compute_floor, kernel_floor, pipeline_floor, usable_nodes
from solver.planner.stages.interleaved import _context
from solver.planner.plan import interleaved_cycle_time
from solver.planner.stages.runs import cluster_islands
from solver.planner.stages.search import PlannerConfig, job_islands, search, view_floor, views
from solver.spec.domain import Precision
from solver.spec.loaders import load_job

JOBS = ["seed-llama3-70b", "odd-3h100-5a100-llama2-13b", "mixtral-a100-h100",
        "v100-a100-llama2-13b", "odd-7h100-16a100-llama3-70b"]


@pytest.mark.parametrize("n", [1, 2, 8])
@pytest.mark.parametrize("name", JOBS)
def test_no_plan_of_a_view_beats_its_floor(name, n):
    job = load_job(INSTANCES / "jobs" / f"{name}.toml")
    config = PlannerConfig()
    runs = views(job, config, n, AnalyticParallelizer(job.planner.features))
    assert len(runs) == 2  # the islands, then the whole cluster
    for run in runs:
        found = search(run)
        assert found is not None and found.result.feasible, run.view
        assert found.total >= view_floor(run), (run.view, found.total, view_floor(run))


def test_the_floor_of_one_island_is_its_compute_floor_and_more_gpus_lower_it():
    job = load_job(INSTANCES / "jobs" / "seed-llama3-70b.toml")
    n, par = 32, AnalyticParallelizer(job.planner.features)
    by_islands, whole = views(job, PlannerConfig(), n, par)
    calib = par.calibration  # the views' floors use their parallelizer's
    (one,) = whole.islands.islands
    # One island of 24 nodes whose groups (2, 4, 8 or 16 nodes, at the weakest node's figures)
    # cover them all: n − 1 micro-batches' work W / n spread over all 24 (floor F_24 per
    # iteration), one micro-batch on the largest group (F_16), T >= ((n − 1) F_24 + F_16) / n.
    sizes = whole.cache.sizes(one.name, whole.features)
    assert sizes == (2, 4, 8, 16) and usable_nodes(len(one.nodes), sizes) == len(one.nodes) == 24
    f24, f16 = (compute_floor(job, whole.cache.group(one.name, g), g, calib) for g in (24, 16))
    assert view_floor(whole) == pytest.approx(((n - 1) * f24 + f16) / n)
    # Two islands, c_k and h_k a layer's and the head's seconds on each: (n − 1) micro-batches
    # of the layers and the head spread over both (the head in layers of the island where it
    # costs fewest), one of the layers on the faster island and the head where it is cheapest;
    # below either island alone and above their summed capacity.
    isl = by_islands.islands.islands
    floors = [compute_floor(job, i, len(i.nodes), calib) for i in isl]
    assert len(floors) == 2
    (c1, h1), (c2, h2) = (kernel_floor(job, i, len(i.nodes), calib) for i in isl)
    layers, caps = job.model.layers, [1 / f for f in floors]
    spread = (layers + min(h1 / c1, h2 / c2)) / (1 / c1 + 1 / c2)
    expect = ((n - 1) * spread + layers * min(c1, c2) + min(h1, h2)) / n
    assert view_floor(by_islands) == pytest.approx(expect)
    assert 1 / sum(caps) < view_floor(by_islands) < min(floors)


def test_groups_that_cannot_cover_an_island_raise_its_floor():
    """The whole-cluster view of 7 H100 + 16 A100 nodes at n = 64 (micro-batch 8): groups of
    2, 4, 8 and 16 nodes (16: with context parallelism, which FlagScale runs in one mesh) admit
    a layout, so at most 22 of the 23 nodes work. With ``F`` the compute floor of the largest
    group (16 nodes) the view's floor is ``((n − 1) · F · 16/22 + F) / n``: the n − 1
    micro-batches spread over 22 nodes, one on the largest group."""
    job = load_job(INSTANCES / "jobs" / "odd-7h100-16a100-llama3-70b.toml")
    n, par = 64, AnalyticParallelizer(job.planner.features)
    _, whole = views(job, PlannerConfig(), n, par)
    (one,) = whole.islands.islands
    assert len(one.nodes) == 23 and whole.cache.sizes(one.name, whole.features) == (2, 4, 8, 16)
    floor = compute_floor(job, whole.cache.group(one.name, 16), 16, par.calibration)
    assert view_floor(whole) == pytest.approx(((n - 1) * floor * 16 / 22 + floor) / n)
    # All 23 nodes at the same rates would give a lower floor: the packing is what raised it.
    assert view_floor(whole) > pipeline_floor(job, [whole.cache.group(one.name, 23)], n,
                                              par.calibration)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 60), st.lists(st.integers(1, 70), max_size=4))
def test_usable_nodes_is_the_largest_subset_sum(nodes, sizes):
    """Against a brute force: the most nodes disjoint groups of the sizes cover."""
    reach = {0}
    for _ in range(nodes):
        reach |= {r + s for r in reach for s in sizes if r + s <= nodes}
    assert usable_nodes(nodes, sizes) == max(reach)


LONG_CONTEXT = """
model = "llama3-8b"
[cluster]
name = "h200-128"
[[cluster.nodes]]
gpu = "H200-SXM-141GB"
count = 16
name = "h200"
[training]
global_batch = 16
seq_len = 131072
n_micro = 1
"""


def test_the_floor_holds_where_attention_dominates(floor_jobs):
    """At 128k tokens the attention core is most of the FLOPs, and a fused kernel runs the
    causal half of the square Megatron counts: per counted FLOP up to 2 x 0.58 of the H200's
    peak, faster than any GEMM's ceiling. The floor charges it that rate and stays below the
    plan. (Charged at the GEMM ceiling, an earlier floor, 5.18 s, stood above this plan when
    the attention core ran at its stand-alone speed, 4.72 s; derated by Hopper's in-training
    fraction like the GEMMs, the plan takes longer than both.)"""
    from solver.cost.flops import model_flops_per_token
    from solver.planner.stages.search import plan_job
    job = floor_jobs[0]  # LONG_CONTEXT
    (island,) = job_islands(job).islands
    plan = plan_job(job)
    floor = compute_floor(job, island, len(island.nodes))
    assert floor < plan.iteration_time_s
    # The attention core's rate in the floor is above the GEMM ceiling: the floor is below the
    # one that charges every counted FLOP at the ceiling.
    gemm_rate = 128 * 989e12 * island.gpu.gemm_eff
    at_gemm_rate = model_flops_per_token(job.model, 131072) * job.training.tokens / gemm_rate
    assert floor < at_gemm_rate


@pytest.fixture(scope="module")
def floor_jobs(tmp_path_factory):
    path = tmp_path_factory.mktemp("floor") / "long.toml"
    path.write_text(LONG_CONTEXT)
    names = ("seed-llama3-70b", "long-context-llama3-8b", "v100-a100-llama2-13b",
             "mixtral-a100-h100")
    return [load_job(path)] + [load_job(INSTANCES / "jobs" / f"{x}.toml") for x in names]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_no_configuration_beats_the_compute_floor_of_its_group(floor_jobs, data):
    """The floor's premise on the cost model itself: every whole-model configuration the
    parallelizer prices on a group (any micro-batch, ``n``, sequence length up to 128k,
    BF16/FP16 or FP8) takes at least :func:`compute_floor` per iteration."""
    job = data.draw(st.sampled_from(floor_jobs))
    seq = data.draw(st.sampled_from(sorted({job.training.seq_len, 32768, 131072})))
    precision = data.draw(st.sampled_from([job.training.precision, Precision.FP8]))
    island = data.draw(st.sampled_from(cluster_islands(job).islands))
    nodes = data.draw(st.sampled_from(sorted({k for k in (1, 2, 4, len(island.nodes))
                                              if k <= len(island.nodes)})))
    n = data.draw(st.sampled_from([1, 2, 4, 8]))
    per_micro = data.draw(st.sampled_from([1, 2, 4, 16]))
    job = replace(job, training=replace(job.training, global_batch=n * per_micro, seq_len=seq,
                                        precision=precision, n_micro=n))
    par = AnalyticParallelizer(job.planner.features)
    # With the parallelizer's calibration (GEMMs at their widest shape's efficiency, the
    # memory-bound operators) the floor is higher, and still below every configuration.
    floor, tight = (compute_floor(job, island, nodes, c) for c in (None, par.calibration))
    assert tight > floor
    ctx = _context(job, job.planner.features, n, 1, nodes, island)
    for p in par.plan(ModelSlice.whole(job.model), group_island(island, nodes), ctx):
        t = interleaved_cycle_time(p.stage_latencies, n, 1) + p.iteration_s
        assert t >= tight * (1 - 1e-12), (p.config, t, tight)


def _h100_layer_by_hand(h, ffn, up, seq):
    """GPU-seconds per token of one layer on H100 (989 TFLOP/s, 3.35 TB/s, ceiling 0.803, its
    fitted half point 0.012 balances), each GEMM at the cost model's efficiency for unlimited
    rows and the layer's full width, ``0.605 · 0.803 · ξ / (ξ + 0.012 · 989/3.35)`` with
    ``ξ = 1 / (1/cols + 1/inner)`` (no GQA: q = kv = h; 0.605 Hopper's in-training fraction,
    the catalog's ``gemm_in_training`` for H100; the
    fixed cost per kernel left out), the memory-bound operators (16.61 bytes per hidden
    element) at 80% of HBM bandwidth, fused attention at 2 · 0.58."""
    peak, bw = 989e12, 3.35e12

    def seconds(flops, cols, inner):
        xi = 1 / (1 / cols + 1 / inner)
        return flops / (peak * 0.605 * 0.803 * xi / (xi + 0.012 * peak / bw))

    gemm = 3 * (seconds(2 * h * 3 * h, 3 * h, h) + seconds(2 * h * h, h, h)
                + seconds(2 * h * up * ffn, up * ffn, h) + seconds(2 * ffn * h, h, ffn))
    return gemm + 3 * 4 * seq * h / (peak * 2 * 0.58) + 3 * 16.61 * h / (bw * 0.80)


@pytest.mark.parametrize("name,ffn,up", [("small-7b-512", 11008, 2),
                                         ("gpt3-175b-three-gen-512", 49152, 1)])
def test_widest_gemm_floor_by_hand(name, ffn, up):
    """Llama 2 7B (gated MLP) and GPT-3 (plain MLP) on an H100 island: the layer's floor with
    the calibration, without it (every GEMM at the 0.803 ceiling) and the LM head's."""
    job = load_job(INSTANCES / "jobs" / f"{name}.toml")
    island = next(i for i in job_islands(job).islands if i.gpu.name == "H100-SXM-80GB")
    m, gpus, seq = job.model, island.gpus, job.training.seq_len
    per_gpu, peak = job.training.tokens / gpus, 989e12 * 0.803
    layer, head = kernel_floor(job, island, len(island.nodes), AnalyticParallelizer().calibration)
    assert layer == pytest.approx(per_gpu * _h100_layer_by_hand(m.hidden, ffn, up, seq), rel=1e-9)
    # The LM head: 6 · vocab · hidden FLOPs per token at the ceiling.
    assert head == pytest.approx(per_gpu * 6 * m.vocab * m.hidden / peak, rel=1e-9)
    # Without the calibration: 6 · (4 h² + (up + 1) h ffn) GEMM FLOPs per token at the ceiling.
    bare, _ = kernel_floor(job, island, len(island.nodes))
    gemm = 6 * (4 * m.hidden ** 2 + (up + 1) * m.hidden * ffn) / peak
    attention = 3 * 4 * seq * m.hidden / (989e12 * 2 * 0.58)
    assert bare == pytest.approx(per_gpu * (gemm + attention), rel=1e-9)
    assert bare < layer  # the widest shapes still fall short of the ceiling
