"""DVC stage `compare`: the strategy comparison report, from results/<strategy>/.

    python -m pipeline.compare [key=value ...]

Writes into reports/:
  summary.md, index.html  the table (pipeline/report.py) and the plots; index.html embeds
                          the plots, so it opens from disk and can be mailed on its own
  summary.json            every column, keyed by strategy (DVC metrics)
  accuracy.csv            test accuracy by epoch, one column per strategy (DVC plots)
  accuracy_vs_epoch.png, accuracy_vs_time.png, throughput.png, memory.png
and groups the strategy runs in MLflow under a parent run "comparison" holding the report.
"""
from __future__ import annotations

import base64
import csv
import html
import json
import os
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and in DVC stages
import matplotlib.pyplot as plt  # noqa: E402

from pipeline import report  # noqa: E402
from pipeline.config import STRATEGY_NAMES, load_config  # noqa: E402
from pipeline.errors import UserError, exit_on_user_error  # noqa: E402
from pipeline.tracking import base_tags, close_comparison, open_comparison  # noqa: E402

RESULTS = Path("results")
REPORTS = Path("reports")
PLOTS = ("accuracy_vs_epoch.png", "accuracy_vs_time.png", "throughput.png", "memory.png")
# the figures MLflow gets per strategy run, beside its per-epoch metrics
CHILD_METRICS = ("warmup_epoch_s", "steady_epoch_s", "steady_samples_per_s",
                 "speedup_vs_single", "scaling_efficiency", "acc_delta_vs_single",
                 "time_to_target_s")
# device 0 near-black, the others light: no strategy colour, and GPU 0's excess stands out
DEVICE0_COLOUR, OTHER_COLOUR = "#222222", "#8fb3de"


def read_results(strategies: list[str], results: Path = RESULTS) -> list[dict]:
    rows = []
    for name in strategies:
        path = results / name / "metrics.json"
        try:
            rows.append(json.loads(path.read_text()))
        except FileNotFoundError:
            raise UserError(f"{path}: not found; run its train stage first "
                            f"(dvc repro train@{name})") from None
        except json.JSONDecodeError as err:
            raise UserError(f"{path}: not valid JSON ({err})") from None
    return rows


def read_history(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return [{k: int(v) if k == "epoch" else float(v) for k, v in row.items()}
                for row in csv.DictReader(f)]


def write_atomic(path: Path, data: str | bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)


def colours(names: list[str]) -> dict[str, str]:
    """One colour per strategy, the same in every plot (fixed by the project's list)."""
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {n: cycle[STRATEGY_NAMES.index(n) % len(cycle)] for n in names}


def save(fig, path: Path) -> None:
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


def plot_accuracy(histories: dict[str, list[dict]], x: str, xlabel: str, target, path: Path):
    fig, ax = plt.subplots(figsize=(7, 4.2))
    colour = colours(list(histories))
    # strategies that train identically (dp on one device is single) draw the same line:
    # a marker and dash of their own, drawn ever thinner, keep each of them visible
    for i, (name, history) in enumerate(histories.items()):
        ax.plot([r[x] for r in history], [r["test_acc"] for r in history], label=name,
                color=colour[name], marker="osD^vP"[i % 6], markersize=9 - i,
                linewidth=max(3.0 - 0.4 * i, 1.0), linestyle=("-", "--", "-.", ":")[i % 4])
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1,
                   label=f"target {target:g}")
    if x == "epoch":
        ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set(xlabel=xlabel, ylabel="test accuracy", title=f"Test accuracy vs {xlabel.lower()}")
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, path)


def plot_throughput(rows: list[dict], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    names = [r["strategy"] for r in rows]
    colour = colours(names)
    bars = ax.bar(names, [r["steady_samples_per_s"] for r in rows],
                  color=[colour[n] for n in names])
    for bar, r in zip(bars, rows):
        text = "" if r["speedup_vs_single"] is None else \
            f"{r['speedup_vs_single']:.2f}x, eff {r['scaling_efficiency']:.0%}"
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8, xytext=(0, 2),
                    textcoords="offset points")
    ax.set(ylabel="samples/s (median of epochs 2..n)",
           title=f"Steady-state throughput (speedup vs {report.BASELINE}, scaling efficiency)")
    ax.margins(y=0.15)
    ax.grid(axis="y", alpha=0.3)
    save(fig, path)


def plot_memory(rows: list[dict], path: Path) -> None:
    """Grouped bars, one group per strategy, one bar per device in device order; device 0
    in its own colour, so DataParallel's heavier GPU 0 stands out."""
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
            ax.annotate(label, (x, 0), ha="center", va="bottom", fontsize=7,
                        color="white" if j == 0 else "black", rotation=90, xytext=(0, 3),
                        textcoords="offset points")
        top = max([m for _, m in peaks] + list(r["peak_reserved_mib"].values()))
        if r["mem_imbalance"] is not None:
            ax.annotate(f"max/mean {r['mem_imbalance']:.2f}", (i, top), ha="center",
                        va="bottom", fontsize=8, xytext=(0, 3), textcoords="offset points")
    ax.set_xticks(range(len(rows)), [r["strategy"] for r in rows])
    what = "peak allocated per GPU (MiB)" if gpu else "peak RSS per process, CPU (MiB)"
    ax.set(ylabel=what, title="Per-device peak memory" if gpu else
           "Per-process peak memory (CPU run: resident set size)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=DEVICE0_COLOUR),
               plt.Rectangle((0, 0), 1, 1, color=OTHER_COLOUR)]
    labels = ["device 0" if gpu else "rank 0", "other devices" if gpu else "other ranks"]
    if gpu:
        handles.append(plt.Rectangle((0, 0), 1, 1, fill=False, edgecolor="grey"))
        labels.append("reserved (caching allocator)")
    ax.legend(handles, labels, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1),
              ncol=len(labels), frameon=False)
    ax.margins(y=0.15)
    ax.grid(axis="y", alpha=0.3)
    save(fig, path)


def markdown_page(rows: list[dict], target, parent_id: str | None) -> str:
    parts = ["# parallel-lab: strategy comparison\n", report.markdown_table(rows, target),
             _legend(rows, target, parent_id) + "\n"]
    parts += [f"![{name}]({name})\n" for name in PLOTS]
    parts += ["## Notes\n"] + [f"- {r['strategy']}: {n}" for r in rows for n in r["notes"]]
    return "\n".join(parts) + "\n"


def html_page(rows: list[dict], target, parent_id: str | None, directory: Path) -> str:
    images = "\n".join(
        f'<img alt="{name}" src="data:image/png;base64,'
        f'{base64.b64encode((directory / name).read_bytes()).decode()}">' for name in PLOTS)
    notes = "".join(f"<li><b>{html.escape(r['strategy'])}</b>: {html.escape(n)}</li>"
                    for r in rows for n in r["notes"])
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>parallel-lab: strategy comparison</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; font-size: 13px; }}
th, td {{ border: 1px solid #ccc; padding: 4px 8px; text-align: right; }}
td {{ white-space: nowrap; }}
th {{ background: #f3f3f3; }} td:first-child, th:first-child {{ text-align: left; }}
img {{ max-width: 48%; margin: 1em 1% 0 0; border: 1px solid #eee; }}
p.legend {{ max-width: 70em; font-size: 13px; color: #555; }}
</style></head><body>
<h1>parallel-lab: strategy comparison</h1>
{report.html_table(rows, target)}
<p class="legend">{html.escape(_legend(rows, target, parent_id))}</p>
{images}
<h2>Notes</h2><ul>{notes}</ul>
</body></html>
"""


def _legend(rows: list[dict], target, parent_id: str | None) -> str:
    memory = ("peak memory allocated by tensors per GPU (physical id), highest epoch; "
              "max/mean over devices is the imbalance" if rows[0]["memory_kind"] == "gpu" else
              "CPU run: peak resident set size per process (rank), highest epoch, in place of "
              "GPU memory")
    return (f"Steady s/epoch is the median of epochs 2..n (epoch 1 is the warm-up, shown "
            f"apart); speedup and accuracy delta are against {report.BASELINE}; scaling "
            f"efficiency = speedup / devices. Time to target = wall time until test accuracy "
            f"first reached {target if target is not None else '(none set)'}. Memory: "
            f"{memory}. MLflow parent run: {parent_id or 'none (MLflow unreachable)'}.")


def child_metrics(row: dict) -> dict[str, float]:
    return {k: row[k] for k in CHILD_METRICS if row[k] is not None}


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    cfg = load_config("params.yaml", sys.argv[1:] if argv is None else argv)
    target = cfg.report.target_accuracy
    results = read_results(cfg.strategies)
    histories = {r["strategy"]: read_history(RESULTS / r["strategy"] / "history.csv")
                 for r in results}
    rows = report.comparison_rows(results, histories, target)
    REPORTS.mkdir(exist_ok=True)
    parent_id = open_comparison(cfg.mlflow.experiment, {
        **base_tags(), "dvc_stage": "compare", "strategies": ",".join(cfg.strategies)},
        {"strategies": ",".join(cfg.strategies), "report.target_accuracy": target})

    write_atomic(REPORTS / "summary.json",
                 json.dumps(report.summary_json(rows), indent=2) + "\n")
    write_atomic(REPORTS / "accuracy.csv", report.accuracy_wide(histories, list(STRATEGY_NAMES)))
    plot_accuracy(histories, "epoch", "Epoch", target, REPORTS / PLOTS[0])
    plot_accuracy(histories, "wall_seconds", "Wall time (s)", target, REPORTS / PLOTS[1])
    plot_throughput(rows, REPORTS / PLOTS[2])
    plot_memory(rows, REPORTS / PLOTS[3])
    write_atomic(REPORTS / "summary.md", markdown_page(rows, target, parent_id))
    write_atomic(REPORTS / "index.html", html_page(rows, target, parent_id, REPORTS))

    if parent_id is not None:
        close_comparison(parent_id, {r["mlflow_run_id"]: child_metrics(r) for r in rows
                                     if r["mlflow_run_id"]},
                         [REPORTS / n for n in ("index.html", "summary.md", "summary.json",
                                                "accuracy.csv", *PLOTS)])
    print(report.markdown_table(rows, target), end="")


if __name__ == "__main__":
    main()
