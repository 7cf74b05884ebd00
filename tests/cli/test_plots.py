"""Pictures: files are produced, are PNGs and are not trivially small (pixels are not compared)."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from conftest import MINI_FIXED as MINI  # noqa: E402

from solver.cli.main import main  # noqa: E402
from solver.cli.plots import plot_schedule, plot_sweep  # noqa: E402
from solver.schedule.simulator import PipelineSpec, ScheduleKind, simulate  # noqa: E402


def png_size(path) -> tuple[int, int]:
    """Width and height from the PNG header (IHDR follows the 8-byte signature)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


@pytest.fixture(scope="module")
def mini_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("plots") / "mini.toml"
    path.write_text(MINI)
    return path


def test_gantt_of_a_hand_spec(tmp_path):
    r = simulate(PipelineSpec((1.0, 2.0, 1.0), (2.0, 4.0, 2.0), (0.5, 0.5), 6))
    out = plot_schedule(r, tmp_path / "g.png", ["a", "b", "c"],
                        [("a", 0, 10), ("b", 10, 30), ("c", 30, 40)], 40, "hand")
    width, height = png_size(out)
    assert width > 800 and height > 300 and out.stat().st_size > 20_000


def test_gantt_of_many_events_is_drawn_without_labels(tmp_path):
    # 64 micro-batches x 4 stages (+ sends) exceed the labelling limit; the file still appears.
    spec = PipelineSpec((1.0,) * 4, (2.0,) * 4, (0.1,) * 3, 64, ScheduleKind.ONE_F_ONE_B)
    out = plot_schedule(simulate(spec), tmp_path / "many.png", list("abcd"),
                        [("x", 0, 80)], 80)
    assert png_size(out)[0] > 800 and out.stat().st_size > 20_000


def test_sweep_plot_with_an_infeasible_point(tmp_path):
    out = plot_sweep([1, 2, 4, 8], [None, 5e4, 7e4, 6e4], [None, 0.3, 0.15, 0.08],
                     tmp_path / "s.png", [None, 5.5e4, 7e4, 5.9e4], best=4, title="t")
    width, height = png_size(out)
    assert width > 600 and height > 300 and out.stat().st_size > 15_000


def test_plan_plot_cli(mini_path, tmp_path, capsys):
    out = tmp_path / "plan.png"
    assert main(["plan", str(mini_path), "--plot", str(out)]) == 0
    assert f"plot: {out}" in capsys.readouterr().out
    assert png_size(out)[0] > 800 and out.stat().st_size > 20_000


def test_sweep_plot_cli(mini_path, tmp_path, capsys):
    out = tmp_path / "sweep.png"
    assert main(["sweep", str(mini_path), "--n-micro", "2,8", "--plot", str(out)]) == 0
    assert png_size(out)[0] > 600 and out.stat().st_size > 15_000


def test_unwritable_plot_path_is_an_input_error(mini_path, tmp_path, capsys):
    target = tmp_path / "missing-dir" / "p.png"
    assert main(["plan", str(mini_path), "--plot", str(target)]) == 2
    assert "--plot" in capsys.readouterr().err


def _gantt_axes(result, sync=None):
    from solver.cli.plots import schedule_figure
    fig = schedule_figure(result, [f"s{i}" for i in range(len(result.busy_s))],
                          [("x", 0, 8)], 8, "t", sync)
    return fig.axes[0]


def test_gantt_draws_every_transfer_and_the_sync():
    """Hand spec: 3 stages, 4 micro-batches -> 2 links x 4 activations and 4 gradients; each
    transfer is a tick at its start; the per-iteration sync is a bar after the makespan."""
    r = simulate(PipelineSpec((1.0, 1.0, 1.0), (2.0, 2.0, 2.0), (0.001, 0.002), 4))
    ax = _gantt_axes(r, [0.5, 0.25, 0.125])
    ticks = [line for line in ax.get_lines() if line.get_marker() == "|"]
    starts = sorted(x for line in ticks for x in line.get_xdata())
    assert starts == sorted(e.start for e in r.events if not e.kind.is_compute)
    assert len(starts) == 2 * 2 * 4
    from matplotlib.colors import to_rgba
    from solver.cli.plots import SYNC_COLOUR
    sync = [c.get_paths()[0].get_extents() for c in ax.collections
            if tuple(c.get_facecolor()[0]) == to_rgba(SYNC_COLOUR)]
    assert [b.x0 for b in sync] == pytest.approx([r.makespan_s] * 3)
    assert [b.width for b in sync] == pytest.approx([0.5, 0.25, 0.125])
    assert ax.get_xlim()[1] == pytest.approx(r.makespan_s + 0.5)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[0] == "s0" and labels[1].startswith("link 0\n") and "ms busy" in labels[1]


def test_gantt_labels_tell_gpu_models_apart(tmp_path):
    from solver.cli.plots import plan_rows
    from solver.planner.stages.search import plan_job
    from solver.spec.loaders import load_job
    job = MINI.replace('gpu = "A100-SXM-80GB"\ncount = 2\nname = "a100"',
                       'gpu = "A100-SXM-40GB"\ncount = 2\nname = "a100"')
    job = job.replace('gpu = "H100-SXM-80GB"\ncount = 1\nname = "h100"',
                      'gpu = "A100-SXM-80GB"\ncount = 2\nname = "big"')
    path = tmp_path / "two-a100.toml"
    path.write_text(job)
    plan = plan_job(load_job(path))
    labels, split, sync = plan_rows(plan)
    gpus = {n.gpu.name for s in plan.stages for n in s.nodes}
    assert gpus == {"A100-SXM-40GB", "A100-SXM-80GB"}
    for gpu in gpus:  # named in full, even where one island merged both
        assert any(gpu in label for label in labels) and any(gpu in x[0] for x in split)
    assert sum(s.plan.config.pp for s in plan.stages) == len(labels) == len(sync)
    assert max(sync) == pytest.approx(plan.iteration_extra_s)
