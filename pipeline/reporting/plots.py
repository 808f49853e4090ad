"""The report's plots: test accuracy against epoch and wall time, steady throughput, per-device
peak memory of the training steps. Each strategy keeps one colour in every plot."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and in DVC stages
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from pipeline.files import atomic_write  # noqa: E402
from pipeline.reporting.row import Row  # noqa: E402
from pipeline.reporting.table import BASELINE  # noqa: E402
from pipeline.results import WARMUP_STANDS_IN, EpochRow  # noqa: E402
from pipeline.strategies import KNOWN  # noqa: E402

PLOTS = ("accuracy_vs_epoch.png", "accuracy_vs_time.png", "throughput.png", "memory.png")
# device 0 near-black, the others light: no strategy colour, and GPU 0's excess stands out
DEVICE0_COLOUR, OTHER_COLOUR = "#222222", "#8fb3de"


def write_plots(
    rows: list[Row], histories: dict[str, list[EpochRow]], target: float | None, directory: Path
) -> None:
    """The four PNGs of PLOTS into `directory`."""
    plot_accuracy(histories, "epoch", "Epoch", target, directory / PLOTS[0])
    plot_accuracy(histories, "wall_seconds", "Wall time (s)", target, directory / PLOTS[1])
    plot_throughput(rows, directory / PLOTS[2])
    plot_memory(rows, directory / PLOTS[3])


def colours(names: list[str]) -> dict[str, str]:
    """One colour per strategy, the same in every plot (fixed by the project's list)."""
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {n: cycle[KNOWN.index(n) % len(cycle)] for n in names}


def save(fig: Figure, path: Path) -> None:
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)


def plot_accuracy(
    histories: dict[str, list[EpochRow]], x: str, xlabel: str, target: float | None, path: Path
) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    colour = colours(list(histories))
    # strategies that train identically (dp on one device is single) draw the same line:
    # a marker and dash of their own, drawn ever thinner, keep each of them visible
    for i, (name, history) in enumerate(histories.items()):
        ax.plot(
            [getattr(r, x) for r in history],
            [r.test_acc for r in history],
            label=name,
            color=colour[name],
            marker="osD^vP"[i % 6],
            markersize=9 - i,
            linewidth=max(3.0 - 0.4 * i, 1.0),
            linestyle=("-", "--", "-.", ":")[i % 4],
        )
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}")
    if x == "epoch":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel=xlabel, ylabel="test accuracy", title=f"Test accuracy vs {xlabel.lower()}")
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, path)


def slanted(ax: Axes) -> None:
    """Strategy names under bars, slanted: eight of them (pipeline_parallel,
    channel_parallel) overlap when level in the throughput plot's width (the memory plot is
    wider, its legend below the names)."""
    ax.tick_params(axis="x", labelrotation=30)
    for label in ax.get_xticklabels():
        label.set_horizontalalignment("right")


def plot_throughput(rows: list[Row], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    names = [r["strategy"] for r in rows]
    colour = colours(names)
    # a run without a steady figure gets an empty bar saying so (its notes say why)
    heights = [r["steady_samples_per_s"] or 0.0 for r in rows]
    bars = ax.bar(names, heights, color=[colour[n] for n in names])
    for bar, r in zip(bars, rows):
        ax.annotate(
            bar_label(r),
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
            xytext=(0, 2),
            textcoords="offset points",
        )
    ax.set(
        ylabel="samples/s (steady epochs)",  # a bar taken over warm-up ones says so
        title=f"Steady-state throughput (speedup vs {BASELINE}, scaling efficiency)",
    )
    ax.margins(y=0.15)
    ax.grid(axis="y", alpha=0.3)
    slanted(ax)
    save(fig, path)


def bar_label(row: Row) -> str:
    """The throughput bar's caption: its speedup and efficiency, then what it must be read
    with, a line each, as the table's cells say it."""
    if row["steady_samples_per_s"] is None:
        return "no steady epoch"
    up = row["speedup_vs_single"]
    parts = [] if up is None else [f"{up:.2f}x, eff {row['scaling_efficiency']:.0%}"]
    if row.get("speedup_within_noise"):  # as the table says it: no real speedup
        parts.append("within noise")
    if row.get("steady_basis") == WARMUP_STANDS_IN:
        parts.append("incl. warm-up")
    if row.get("shared_devices"):
        parts.append("shared-device: no speed")
    return "\n".join(parts)


def plot_memory(rows: list[Row], path: Path) -> None:
    """Grouped bars, one group per strategy, one bar per device in device order; device 0
    in its own colour, so DataParallel's heavier GPU 0 stands out. The training steps' peaks
    (evaluation's are in the table)."""
    gpu = rows[0]["memory_kind"] == "gpu"
    fig, ax = plt.subplots(figsize=(max(7.0, 1.1 * len(rows)), 4.2))
    widest = max(len(r["peak_memory_mib"]) for r in rows) or 1
    width = 0.8 / widest
    for i, r in enumerate(rows):
        peaks = list(r["peak_memory_mib"].items())
        for j, (label, mib) in enumerate(peaks):
            x = i + width * (j - (len(peaks) - 1) / 2)  # the group centred on its tick
            reserved = r["peak_reserved_mib"].get(label)
            if reserved is not None:  # what the caching allocator held: an outline behind
                ax.bar(x, reserved, width * 0.9, fill=False, edgecolor="grey", linewidth=1)
            ax.bar(x, mib, width * 0.9, color=DEVICE0_COLOUR if j == 0 else OTHER_COLOUR)
            ax.annotate(
                label,
                (x, 0),
                ha="center",
                va="bottom",
                fontsize=7,
                color="white" if j == 0 else "black",
                rotation=90,
                xytext=(0, 3),
                textcoords="offset points",
            )
        top = max([m for _, m in peaks] + list(r["peak_reserved_mib"].values()))
        if r["mem_imbalance"] is not None:
            ax.annotate(
                f"max/mean {r['mem_imbalance']:.2f}",
                (i, top),
                ha="center",
                va="bottom",
                fontsize=8,
                xytext=(0, 3),
                textcoords="offset points",
            )
    ax.set_xticks(range(len(rows)), [r["strategy"] for r in rows])
    what = "peak allocated per GPU (MiB)" if gpu else "peak RSS per process, CPU (MiB)"
    ax.set(
        ylabel=what,
        title="Per-device peak memory, training steps"
        if gpu
        else "Per-process peak memory, training steps (CPU run: resident set size)",
    )
    handles = [
        Rectangle((0, 0), 1, 1, color=DEVICE0_COLOUR),
        Rectangle((0, 0), 1, 1, color=OTHER_COLOUR),
    ]
    labels = ["device 0" if gpu else "rank 0", "other devices" if gpu else "other ranks"]
    if gpu:
        handles.append(Rectangle((0, 0), 1, 1, fill=False, edgecolor="grey"))
        labels.append("reserved (caching allocator)")
    ax.legend(
        handles,
        labels,
        fontsize=8,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.1),
        ncol=len(labels),
        frameon=False,
    )
    ax.margins(y=0.15)
    ax.grid(axis="y", alpha=0.3)
    save(fig, path)
