"""Pictures (optional ``plot`` extra): the simulated schedule as a Gantt chart, and the n_micro sweep.

matplotlib is imported inside the functions, and figures are drawn on a bare
:class:`matplotlib.figure.Figure` (Agg canvas), so importing this module costs nothing and no
global pyplot state or backend is touched.
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Sequence

from solver.schedule.simulator import EventKind, SimResult
from solver.spec.errors import InputError

if TYPE_CHECKING:
    from solver.schedule.report import SimulatedPlan

#: Colours by event kind (read-only), and of idle time (the bubbles).
COLOURS = MappingProxyType({EventKind.FORWARD: "#4C72B0", EventKind.BACKWARD: "#DD8452",
                            EventKind.SEND_ACTIVATION: "#55A868",
                            EventKind.SEND_GRADIENT: "#8172B3"})
IDLE_COLOUR = "#F4CCCC"
LABELS = MappingProxyType({EventKind.FORWARD: "forward", EventKind.BACKWARD: "backward",
                           EventKind.SEND_ACTIVATION: "send activation",
                           EventKind.SEND_GRADIENT: "send gradient"})
MAX_LABELLED_EVENTS = 240   # beyond this, micro-batch numbers in the bars are unreadable


def _figure(width: float, height: float) -> Any:
    """A figure on the Agg canvas, or InputError when matplotlib is missing."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise InputError("<cli>", "--plot",
                         "needs matplotlib (pip install 'tangram-planner[plot]')") from None
    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def _save(fig: Any, path: str | Path) -> Path:
    """Write ``fig`` as PNG, reporting an unwritable path as InputError."""
    path = Path(path)
    try:
        fig.savefig(path, format="png")
    except OSError as exc:
        raise InputError("<cli>", "--plot", f"cannot write {path}: {exc.strerror}") from None
    return path


def _gantt(ax: Any, result: SimResult, labels: Sequence[str]) -> None:
    """Stages (and the links between them) as rows; idle stage time shaded as bubbles."""
    p = len(result.busy_s)
    rows = {("stage", i): 2 * i for i in range(p)}
    rows.update({("link", k): 2 * k + 1 for k in range(len(result.link_busy_s))})
    for i in range(p):
        ax.broken_barh([(0.0, result.makespan_s)], (rows[("stage", i)] - 0.4, 0.8),
                       facecolors=IDLE_COLOUR, label="idle (bubble)" if i == 0 else None)
    spans: dict[tuple[int, EventKind], list[tuple[float, float]]] = {}
    for e in result.events:
        row = rows[("stage" if e.kind.is_compute else "link", e.stage)]
        spans.setdefault((row, e.kind), []).append((e.start, e.end - e.start))
    seen: set[EventKind] = set()
    few = len(result.events) <= MAX_LABELLED_EVENTS
    for (row, kind), bars in sorted(spans.items(), key=lambda kv: (kv[0][0], kv[0][1].value)):
        height = 0.8 if kind.is_compute else 0.45
        # White separators only while bars are wide enough; they would swallow thin ones.
        ax.broken_barh(bars, (row - height / 2, height), facecolors=COLOURS[kind],
                       edgecolors="white" if few and kind.is_compute else "none",
                       linewidth=0.4, label=None if kind in seen else LABELS[kind])
        seen.add(kind)
    if few:
        for e in result.events:
            if e.kind.is_compute:
                ax.text((e.start + e.end) / 2, rows[("stage", e.stage)], str(e.micro),
                        ha="center", va="center", fontsize=6, color="white")
    ticks = sorted(rows.items(), key=lambda kv: kv[1])
    ax.set_yticks([y for _, y in ticks])
    # Transfers are often too short to see at this scale: the label says how busy the link is.
    ax.set_yticklabels([labels[k[1]] if k[0] == "stage" else
                        f"link {k[1]}\n{1e3 * result.link_busy_s[k[1]]:,.0f} ms busy"
                        for k, _ in ticks], fontsize=8)
    ax.set_ylim(2 * p - 1.5, -0.5)
    ax.set_xlim(0.0, result.makespan_s)
    ax.set_xlabel("time in the iteration (s)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=5, fontsize=8, frameon=False)


def _layer_split(ax: Any, split: Sequence[tuple[str, int, int]], layers: int) -> None:
    """One vertical bar of the model's layers, coloured by the stage that runs them."""
    # Neutral shades: the event colours mean forward/backward/send in the chart beside it.
    palette = ("#5F6B73", "#8C9A5B", "#3E8E94", "#A67C52", "#7A6A8F", "#9A9A9A", "#4F7A5A")
    for i, (label, start, end) in enumerate(split):
        ax.bar(0, end - start, bottom=start, width=1.0, color=palette[i % len(palette)],
               edgecolor="white")
        ax.text(0, (start + end) / 2, f"{label}\n[{start}, {end})", ha="center", va="center",
                fontsize=7, color="white")
    ax.set_ylim(layers, 0)
    ax.set_xlim(-0.5, 0.5)
    ax.set_xticks([])
    ax.set_ylabel("layer")
    ax.set_title("layers per island", fontsize=9)


def plot_schedule(result: SimResult, path: str | Path, stage_labels: Sequence[str],
                  layer_split: Sequence[tuple[str, int, int]], layers: int,
                  title: str = "") -> Path:
    """Gantt chart of a simulated schedule with the layer split beside it; returns ``path``.

    Parameters
    ----------
    result : SimResult
        The simulation.
    path : str | Path
        PNG file to write.
    stage_labels : Sequence[str]
        One row label per pipeline stage.
    layer_split : Sequence[tuple[str, int, int]]
        ``(label, start, end)`` per island stage, half-open layer ranges.
    layers : int
        Layers of the model.
    title : str
        Figure title.
    """
    p = len(result.busy_s)
    fig = _figure(13.0, 2.2 + 0.55 * (2 * p - 1))
    grid = fig.add_gridspec(1, 2, width_ratios=[5, 1])
    _gantt(fig.add_subplot(grid[0, 0]), result, stage_labels)
    _layer_split(fig.add_subplot(grid[0, 1]), layer_split, layers)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def plot_plan_schedule(sim: "SimulatedPlan", path: str | Path) -> Path:
    """:func:`plot_schedule` of a simulated plan, labelled with its islands."""
    plan = sim.plan
    labels, split = [], []
    for s in plan.stages:
        pp = len(s.plan.stage_latencies)
        labels += [s.island.name if pp == 1 else f"{s.island.name} [{j}]" for j in range(pp)]
        split.append((f"{s.island.gpus} x {s.island.gpu.name.split('-')[0]}", s.start, s.end))
    title = (f"{plan.job.name}: {sim.spec.schedule.value}, n_micro {plan.n_micro}, pipeline "
             f"{sim.result.makespan_s:.3f} s simulated vs {plan.pipeline_time_s:.3f} s closed "
             f"form, bubble {sim.result.bubble_ratio:.1%}")
    return plot_schedule(sim.result, path, labels, split, plan.job.model.layers, title)


def plot_sweep(n_micro: Sequence[int], tokens_per_s: Sequence[float | None],
               bubble_ratio: Sequence[float | None], path: str | Path,
               simulated_tokens_per_s: Sequence[float | None] | None = None,
               best: int | None = None, title: str = "") -> Path:
    """Throughput and bubble ratio against n_micro (log2 axis); infeasible points as crosses."""
    fig = _figure(8.0, 5.0)
    ax = fig.add_subplot()
    ok = [i for i, t in enumerate(tokens_per_s) if t is not None]
    ax.plot([n_micro[i] for i in ok], [tokens_per_s[i] for i in ok], "o-", color="#4C72B0",
            label="tokens/s (closed form)")
    if simulated_tokens_per_s is not None:
        ax.plot([n_micro[i] for i in ok], [simulated_tokens_per_s[i] for i in ok], "s--",
                color="#55A868", label="tokens/s (simulated 1F1B)")
    bad = [n for n, t in zip(n_micro, tokens_per_s) if t is None]
    if bad:
        ax.plot(bad, [0.0] * len(bad), "x", color="#C44E52", markersize=9, clip_on=False,
                label="infeasible")
    if best is not None:
        ax.axvline(best, color="grey", linestyle=":", label=f"best n_micro = {best}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(n_micro))
    ax.set_xticklabels([str(n) for n in n_micro])
    ax.set_xlabel("micro-batches per iteration (n_micro)")
    ax.set_ylabel("tokens/s")
    ax.set_ylim(bottom=0.0)
    twin = ax.twinx()
    twin.plot([n_micro[i] for i in ok], [100 * bubble_ratio[i] for i in ok], "^-",
              color="#DD8452", label="bubble ratio (eq. 7)")
    twin.set_ylabel("bubble ratio (%)")
    twin.set_ylim(bottom=0.0)
    lines = ax.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="upper center",
              bbox_to_anchor=(0.5, -0.14), ncol=3, frameon=False)
    ax.set_title(title, fontsize=10)
    return _save(fig, path)
