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
