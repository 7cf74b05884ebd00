"""τ_C sensitivity: the islands are a step function of τ_C with steps at the compute gaps.

Hand numbers: H100-SXM 989 and H100-NVL 835 TFLOP/s are ``1 − 835/989 = 15.57 %`` apart; their
HBM (80 vs 94 GB, 14.9 %) and bandwidth (3350 vs 3900 GB/s, 14.1 %) are within τ_M = τ_B = 0.2.
Merging one node of each loses ``1 − 16·835 / (8·989 + 8·835) = 8.44 %`` of compute, within the
default t_merge = 0.1, so with the default the two always end up in one island.
"""

from __future__ import annotations

import json

import pytest

from solver.cli.main import main
from solver.planner.stages.search import plan_job
from solver.spec.errors import InputError
from solver.spec.loaders import INSTANCES, load_cluster, load_job
from solver.studies.island_sweep import (
    compute_gaps,
    parse_range,
    sample_values,
    sweep_tau_c,
    with_tau_c,
)

GAP = 1 - 835 / 989
JOB = """model = "llama2-7b"
[cluster]
name = "sxm-nvl"
[[cluster.nodes]]
gpu = "H100-SXM-80GB"
count = 1
name = "sxm"
[[cluster.nodes]]
gpu = "H100-NVL-94GB"
count = 1
name = "nvl"
[training]
global_batch = 32
seq_len = 2048
n_micro = 8
[planner]
t_merge = {t_merge}
"""


def job_file(tmp_path, t_merge=0.0):
    path = tmp_path / f"sxm-nvl-{t_merge}.toml"
    path.write_text(JOB.format(t_merge=t_merge))
    return path


@pytest.mark.parametrize("text", ["0.4..0.05", "a..b", "0.5", "0.1..1.5", "-0.1..0.2"])
def test_bad_ranges(text):
    with pytest.raises(InputError, match="--tau-c"):
        parse_range(text)


def test_gaps_of_the_shipped_clusters():
    sxm_nvl = compute_gaps(load_cluster(INSTANCES / "clusters" / "h100-sxm-nvl.toml"))
    assert [(round(g.tau_c, 6), g.kinds) for g in sxm_nvl] == \
        [(round(GAP, 6), ("H100-NVL-94GB", "H100-SXM-80GB"))]
    # A100 312 vs H100/H200 989: 68.45 %; H100 vs H200: equal compute (HBM tells them apart).
    three = compute_gaps(load_cluster(INSTANCES / "clusters" / "three-gen-224.toml"))
    assert [round(g.tau_c, 4) for g in three] == [0.6845, 0.6845]
    assert compute_gaps(load_cluster(INSTANCES / "clusters" / "three-gen-224.toml"), 0.05, 0.4) == []


def test_samples_include_every_gap():
    gaps = compute_gaps(load_cluster(INSTANCES / "clusters" / "h100-sxm-nvl.toml"))
    values = sample_values(0.05, 0.4, 3, gaps)
    assert values == [0.05, GAP, 0.225, 0.4]
    with pytest.raises(InputError, match="--steps"):
        sample_values(0.05, 0.4, 0, gaps)


def test_islands_step_at_the_gap_and_each_partition_is_planned_once(tmp_path):
    job = load_job(job_file(tmp_path))
    points = sweep_tau_c(job, [0.05, 0.15, GAP, 0.3])
    assert [len(p.islands) for p in points] == [2, 2, 1, 1]
    assert points[0].plan is points[1].plan and points[2].plan is points[3].plan
    assert points[0].compute_loss == 0.0
    assert points[2].compute_loss == pytest.approx(1 - 16 * 835 / (8 * 989 + 8 * 835))
    for p in (points[0], points[3]):
        fresh = plan_job(with_tau_c(job, p.tau_c))
        assert p.plan.iteration_time_s == fresh.iteration_time_s


def test_default_merge_threshold_hides_tau_c(tmp_path):
    job = load_job(job_file(tmp_path, t_merge=0.1))
    points = sweep_tau_c(job, [0.05, 0.3])
    assert [len(p.islands) for p in points] == [1, 1]
    assert points[0].plan is points[1].plan


def test_cli_json_text_and_plot(tmp_path, capsys):
    path = job_file(tmp_path)
    plot = tmp_path / "sweep.png"
    assert main(["sweep-islands", str(path), "--tau-c", "0.1..0.2", "--steps", "3", "--json",
                 "--plot", str(plot)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [p["tau_c"] for p in out["points"]] == [0.1, 0.15, round(GAP, 9), 0.2]
    assert [len(p["islands"]) for p in out["points"]] == [2, 2, 1, 1]
    assert out["changes"] == [round(GAP, 9)] and out["thresholds"]["t_merge"] == 0.0
    assert all(p["tokens_per_s"] > 0 for p in out["points"])
    assert plot.stat().st_size > 10_000
    assert main(["sweep-islands", str(path), "--tau-c", "0.1..0.2", "--steps", "2",
                 "--t-merge", "0.1"]) == 0
    text = capsys.readouterr().out
    assert "t_merge 0.1" in text and "nowhere in the range" in text


def test_cli_bad_override(tmp_path, capsys):
    assert main(["sweep-islands", str(job_file(tmp_path)), "--t-merge", "2"]) == 2
    assert "--t-merge" in capsys.readouterr().err


def test_a_grid_value_at_a_gap_is_the_gap():
    # perf 0.85 vs 1.0: the gap is 1 − 0.85 = 0.15000000000000002 in floats, next to grid 0.15.
    gaps = compute_gaps(load_cluster(INSTANCES / "clusters" / "throttled-h100.toml"))
    assert [round(g.tau_c, 4) for g in gaps] == [0.15, 0.1765, 0.3]
    values = sample_values(0.05, 0.4, 15, gaps)
    assert len([v for v in values if abs(v - 0.15) < 1e-6]) == 1
    assert gaps[0].tau_c in values and len(values) == 16  # 15 grid points, 0.15 -> gap, +0.1765
