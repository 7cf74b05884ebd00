"""GPU islands: hand-checked answers (Algorithm 1) and the CLI contract."""

from __future__ import annotations

import json

import pytest
from conftest import SHIPPED_CLUSTERS, make_cluster

from solver.cli.main import main
from solver.islands import Thresholds, build_islands, merge_loss, similar
from solver.spec.loaders import load_cluster


def test_h100_sxm_and_nvl_form_one_island_with_80gb(catalog):
    # 989 vs 835 TFLOP/s: 15.6% apart; 80 vs 94 GB: 14.9%; 3350 vs 3900 GB/s: 14.1% — all ≤ 20%.
    result = build_islands(make_cluster(catalog, ("H100-SXM-80GB", 2), ("H100-NVL-94GB", 2)))
    assert len(result.islands) == 1
    island = result.islands[0]
    assert island.hbm_gb == 80.0
    assert island.tflops_per_gpu == 835.0
    assert island.gpus == 32


def test_a100_and_h100_stay_apart(catalog):
    # |989 − 312| / 989 = 68% > 20%, and merging would lose 1 − 32·312/(16·989 + 16·312) = 52%.
    cluster = make_cluster(catalog, ("H100-SXM-80GB", 8), ("A100-SXM-80GB", 16))
    result = build_islands(cluster)
    assert [i.gpu.name for i in result.islands] == ["H100-SXM-80GB", "A100-SXM-80GB"]
    assert [i.gpus for i in result.islands] == [64, 128]
    assert result.merges == ()


def test_throttled_node_leaves_its_island(catalog):
    # perf 0.7: 692 vs 989 TFLOP/s is 30% apart > τ_C = 0.2; merging would lose more than t_merge.
    cluster = make_cluster(catalog, ("H100-SXM-80GB", 3), ("H100-SXM-80GB", 1, 0.7))
    result = build_islands(cluster)
    assert [i.gpus for i in result.islands] == [24, 8]
    assert result.islands[1].tflops_per_gpu == pytest.approx(989 * 0.7)


def test_mild_throttling_stays_and_lowers_effective_compute(catalog):
    cluster = make_cluster(catalog, ("H100-SXM-80GB", 3), ("H100-SXM-80GB", 1, 0.9))
    (island,) = build_islands(cluster).islands
    assert island.tflops_per_gpu == pytest.approx(890.1)


def test_chain_of_small_differences_is_split(catalog):
    # 989 → 0.85 → 0.72 of it: each step is ≤ 20% but the ends are 28% apart; t_merge = 0 stops
    # phase 2 from undoing the split.
    cluster = make_cluster(catalog, ("H100-SXM-80GB", 1), ("H100-SXM-80GB", 1, 0.85),
                           ("H100-SXM-80GB", 1, 0.72))
    th = Thresholds(t_merge=0.0)
    islands = build_islands(cluster, th).islands
    assert len(islands) == 2
    for island in islands:
        assert all(similar(a, b, th) for a in island.nodes for b in island.nodes)


def test_greedy_merge_joins_when_loss_is_small(catalog):
    # τ_C = 0.05 splits 989 from 890 (10% apart); merging 16+16 GPUs loses
    # 1 − 32·890.1/(16·989 + 16·890.1) = 5.3% ≤ t_merge 0.1, so phase 2 joins them.
    cluster = make_cluster(catalog, ("H100-SXM-80GB", 2), ("H100-SXM-80GB", 2, 0.9))
    result = build_islands(cluster, Thresholds(tau_c=0.05, t_merge=0.1))
    assert len(result.components) == 2 and len(result.islands) == 1
    (merge,) = result.merges
    assert merge.loss == pytest.approx(1 - 32 * 890.1 / (16 * 989 + 16 * 890.1))
    assert merge_loss(*result.components) == pytest.approx(merge.loss)


def test_gpu_field_names_weakest_member(catalog):
    cluster = make_cluster(catalog, ("H100-SXM-80GB", 1), ("H100-NVL-94GB", 1))
    (island,) = build_islands(cluster).islands
    assert island.gpu.name == "H100-NVL-94GB"


@pytest.mark.parametrize("path", SHIPPED_CLUSTERS, ids=lambda p: p.stem)
def test_islands_cli_json_contract(path, capsys):
    assert main(["islands", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"islands", "merges", "gpu_types"}  # gpu_types: the catalog entries used
    keys = {"name", "gpu", "nodes", "gpus", "gpus_per_node", "tflops_per_gpu", "hbm_gb",
            "total_tflops"}
    for isl in out["islands"]:
        assert set(isl) == keys
        assert isl["total_tflops"] == pytest.approx(isl["gpus"] * isl["tflops_per_gpu"])
    for m in out["merges"]:
        assert set(m) == {"members", "into", "loss"}
    cluster = load_cluster(path)
    assert sum(i["gpus"] for i in out["islands"]) == cluster.total_gpus
    ids = [n for i in out["islands"] for n in i["nodes"]]
    assert sorted(ids) == sorted(n.node_id for n in cluster.nodes)


def test_islands_cli_table(capsys):
    assert main(["islands", "seed-h100-a100"]) == 0
    out = capsys.readouterr().out
    assert "i0-H100-SXM-80GB" in out and "i1-A100-SXM-80GB" in out
