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
    from solver.planner.plan import Plan
    from solver.schedule.report import SimulatedPlan

#: Colours by event kind (read-only), and of idle time (the bubbles).
COLOURS = MappingProxyType({EventKind.FORWARD: "#4C72B0", EventKind.BACKWARD: "#DD8452",
                            EventKind.SEND_ACTIVATION: "#55A868",
                            EventKind.SEND_GRADIENT: "#8172B3"})
IDLE_COLOUR = "#F4CCCC"
SYNC_COLOUR = "#937860"
SYNC_LABEL = "gradient sync + optimizer step (per iteration)"
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


def _rows(result: SimResult) -> dict[tuple[str, int], int]:
    """Row of every stage and of every boundary that carries a transfer (stage ``i`` on row
    ``2i``, boundary ``k`` between them on ``2k + 1``; the interleaved wrap-around from the last
    stage back to the first, boundary ``P − 1``, on the row below the last stage)."""
    p = len(result.busy_s)
    links = set(range(len(result.link_busy_s)))
    links |= {e.stage for e in result.events if not e.kind.is_compute}
    rows = {("stage", i): 2 * i for i in range(p)}
    rows.update({("link", k): 2 * k + 1 for k in sorted(links)})
    return rows


def _link_label(result: SimResult, k: int, p: int) -> str:
    busy = sum(e.end - e.start for e in result.events if not e.kind.is_compute and e.stage == k)
    name = "wrap link (last -> first)" if k == p - 1 else f"link {k}"
    if not any(not e.kind.is_compute and e.stage == k for e in result.events):
        return f"{name}\nno transfer of its own\n(p2p in the stage times)"
    return f"{name}\n{1e3 * busy:,.1f} ms busy"


def _transfers(ax: Any, result: SimResult, rows: dict) -> None:
    """Every transfer as a bar of its duration and a tick at its start: most last a few ms of
    a many-second iteration, too thin to see as bars alone."""
    for kind in (EventKind.SEND_ACTIVATION, EventKind.SEND_GRADIENT):
        sends = [e for e in result.events if e.kind is kind]
        if not sends:
            continue
        ys = [rows[("link", e.stage)] for e in sends]
        for y in sorted(set(ys)):
            ax.broken_barh([(e.start, e.end - e.start) for e, row in zip(sends, ys) if row == y],
                           (y - 0.22, 0.45), facecolors=COLOURS[kind])
        ax.plot([e.start for e in sends], ys, linestyle="none", marker="|", markersize=9,
                color=COLOURS[kind], label=f"{LABELS[kind]} ({len(sends)})")


def _compute(ax: Any, result: SimResult, rows: dict) -> None:
    spans: dict[tuple[int, EventKind], list[tuple[float, float]]] = {}
    for e in result.events:
        if e.kind.is_compute:
            spans.setdefault((rows[("stage", e.stage)], e.kind), []).append(
                (e.start, e.end - e.start))
    few = len(result.events) <= MAX_LABELLED_EVENTS
    seen: set[EventKind] = set()
    for (row, kind), bars in sorted(spans.items(), key=lambda kv: (kv[0][0], kv[0][1].value)):
        # White separators only while bars are wide enough; they would swallow thin ones.
        ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=COLOURS[kind],
                       edgecolors="white" if few else "none", linewidth=0.4,
                       label=None if kind in seen else LABELS[kind])
        seen.add(kind)
    if few:
        for e in result.events:
            if e.kind.is_compute:
                ax.text((e.start + e.end) / 2, rows[("stage", e.stage)], str(e.micro),
                        ha="center", va="center", fontsize=6, color="white")


def _gantt(ax: Any, result: SimResult, labels: Sequence[str],
           sync_s: Sequence[float] | None = None) -> None:
    """Stages and the links between them as rows; idle stage time shaded as bubbles; every
    transfer; each stage's per-iteration gradient sync and optimizer step after the pipeline."""
    p = len(result.busy_s)
    rows = _rows(result)
    end = result.makespan_s + max(sync_s or [0.0])
    for i in range(p):
        ax.broken_barh([(0.0, result.makespan_s)], (rows[("stage", i)] - 0.4, 0.8),
                       facecolors=IDLE_COLOUR, label="idle (bubble)" if i == 0 else None)
    _compute(ax, result, rows)
    _transfers(ax, result, rows)
    for i, t in enumerate(sync_s or []):
        ax.broken_barh([(result.makespan_s, t)], (rows[("stage", i)] - 0.4, 0.8),
                       facecolors=SYNC_COLOUR, label=SYNC_LABEL if i == 0 else None)
    if sync_s:  # often a few ms of a many-second iteration: mark where it starts
        ax.axvline(result.makespan_s, color=SYNC_COLOUR, linestyle=":", linewidth=1.0)
    ticks = sorted(rows.items(), key=lambda kv: kv[1])
    ax.set_yticks([y for _, y in ticks])
    ax.set_yticklabels([labels[k[1]] if k[0] == "stage" else _link_label(result, k[1], p)
                        for k, _ in ticks], fontsize=8)
    ax.set_ylim(max(rows.values()) + 0.5, -0.5)
    ax.set_xlim(0.0, end)
    ax.set_xlabel("time in the iteration (s)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=6, fontsize=8, frameon=False)


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
                  title: str = "", sync_s: Sequence[float] | None = None) -> Path:
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
    sync_s : Sequence[float] | None
        Per stage row: its per-iteration gradient sync and optimizer step, drawn after the
        pipeline (the iteration ends when the longest of them does).
    """
    return _save(schedule_figure(result, stage_labels, layer_split, layers, title, sync_s), path)


def schedule_figure(result: SimResult, stage_labels: Sequence[str],
                    layer_split: Sequence[tuple[str, int, int]], layers: int, title: str = "",
                    sync_s: Sequence[float] | None = None) -> Any:
    """The figure :func:`plot_schedule` writes (same parameters, no file): Gantt axes first."""
    fig = _figure(13.0, 2.2 + 0.55 * (2 * len(result.busy_s) - 1))
    grid = fig.add_gridspec(1, 2, width_ratios=[5, 1])
    _gantt(fig.add_subplot(grid[0, 0]), result, stage_labels, sync_s)
    _layer_split(fig.add_subplot(grid[0, 1]), layer_split, layers)
    fig.suptitle(title, fontsize=10)
    return fig


def plot_plan_schedule(sim: "SimulatedPlan", path: str | Path) -> Path:
    """:func:`plot_schedule` of a simulated plan, labelled with its islands and GPU models (the
    full catalog name: A100-SXM-40GB and A100-SXM-80GB are told apart)."""
    plan = sim.plan
    labels, split, sync = plan_rows(plan)
    title = (f"{plan.job.name}: {sim.spec.schedule.value}, n_micro {plan.n_micro}, pipeline "
             f"{sim.result.makespan_s:.3f} s simulated vs {plan.pipeline_time_s:.3f} s closed "
             f"form, bubble {sim.result.bubble_ratio:.1%}, then "
             f"{1e3 * plan.iteration_extra_s:,.0f} ms per-iteration sync")
    return plot_schedule(sim.result, path, labels, split, plan.job.model.layers, title, sync)


def plan_rows(plan: "Plan") -> tuple[list[str], list[tuple[str, int, int]], list[float]]:
    """Row labels (one per pipeline sub-stage), the layer split (one per stage) and each row's
    per-iteration sync + optimizer seconds, with GPU models by their full catalog names."""
    labels, split, sync = [], [], []
    for s in plan.stages:
        pp = len(s.plan.stage_latencies)
        # The stage's own nodes: a merged island may mix models its weakest name hides.
        gpu = " + ".join(sorted({n.gpu.name for n in (s.nodes or s.island.nodes)}))
        name = s.island.name if gpu in s.island.name else f"{s.island.name} ({gpu})"
        labels += [name if pp == 1 else f"{name} [{j}]" for j in range(pp)]
        sync += [s.plan.iteration_s] * pp
        split.append((f"{s.gpus} x {gpu}", s.start, s.end))
    return labels, split, sync


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
