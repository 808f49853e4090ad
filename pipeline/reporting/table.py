"""The comparison's arithmetic and its table, as pure functions (no files, no plotting).

Speed is judged on the steady state (pipeline.results.steady_seconds: the median of the
epochs not marked warm-up, i.e. neither epoch 1 nor the first epoch of a resumed process; epoch
1's one-off work is reported apart as the warm-up). Where every epoch is a warm-up the whole
ones stand in, their cells marked "(warm-up)"; a run left without any has empty speed cells
and its `speed_note` among the notes, which say why. Speedup and accuracy deltas are against
`single` when it ran; scaling efficiency is speedup / devices. Memory: the main table shows
the busiest device's training peak; every device's training and evaluation peaks are the
per-device table's (device_table.py). Each row also carries how much its memory figures moved
from epoch to epoch (summary.json's peak_memory_spread_mib, mem_imbalance_spread:
pipeline.memory `spreads`), which the answer's memory rankings take as their noise.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from typing import Any, Literal, Optional, cast

from pipeline.core_wait import BUSY_WAIT, busy
from pipeline.reporting.row import MemoryFigures, Row
from pipeline.results import (
    WARMUP_STANDS_IN,
    EpochRow,
    RunSummary,
    SpeedFeatures,
    core_wait,
    steady_rows,
    steady_spread,
)

BASELINE = "single"
Cell = Callable[[Any, Row], str]  # (the row's value under the column's key, the row) -> text
# the row keys the main and the printed tables have a column of
ColumnKey = Literal[
    "strategy",
    "n_devices",
    "batch_split",
    "steady_epoch_s",
    "steady_samples_per_s",
    "speedup_vs_single",
    "test_acc",
    "time_to_target_s",
    "peak_memory_mib",
    "speed_features",
]
Column = tuple[ColumnKey, str, Cell]  # (row key, header, cell text)
# how a speed cell says it has no figure, and that it is taken over warm-up epochs: in the
# report, and in the printed table (which a footnote explains)
SPELLED, TERSE = ("none (see notes)", " (warm-up)"), ("none", "*")


def time_to_target(
    history: list[EpochRow], target: Optional[float]
) -> tuple[Optional[int], Optional[float]]:
    """(epoch, wall seconds since training began) of the first epoch whose test accuracy
    reached `target`; (None, None) if none did or there is no target."""
    if target is None:
        return None, None
    for row in history:
        if row.test_acc >= target:
            return row.epoch, row.wall_seconds
    return None, None


def speedup(base_seconds: Optional[float], seconds: Optional[float]) -> Optional[float]:
    """None where either run has no steady figure (or there is no baseline)."""
    return None if base_seconds is None or seconds is None else base_seconds / seconds


def scaling_efficiency(speedup_value: Optional[float], n_devices: int) -> Optional[float]:
    """1.0 = perfect linear scaling over the devices (processes on the CPU) the run used."""
    return None if speedup_value is None else speedup_value / n_devices


def above_linear(
    efficiency: Optional[float],
    wait: Optional[float],
    base_wait: Optional[float],
    n_devices: int,
) -> Optional[str]:
    """Where a scaling efficiency is above 100% (more than N times single's speed on N
    devices, which splitting the work cannot give), its likely cause in a few words; None at
    or below 100%. `wait`, `base_wait`: the core-wait shares of this run's and single's
    steady epochs (core_wait.py)."""
    if efficiency is None or efficiency <= 1:
        return None
    if wait is not None and base_wait is not None and base_wait > wait:
        return (
            f"above 100%: likely the machine's load ({BASELINE} waited {base_wait:.0%} for a "
            f"core, this run {wait:.0%})"
        )
    if n_devices == 1:  # the same device, the whole batch: nothing but chance differs
        return f"above 100%: one device, as {BASELINE}: a difference of the runs, not scaling"
    return (
        "above 100%: likely each device's smaller share of the batch running faster per "
        f"sample (caches), or a slowed {BASELINE} run"
    )


def delta(value: float, base: Optional[float]) -> Optional[float]:
    return None if base is None else value - base


def comparison_rows(
    results: list[RunSummary], histories: dict[str, list[EpochRow]], target: Optional[float]
) -> list[Row]:
    """One row per strategy: its summary.json figures plus the cross-strategy columns."""
    base = next((r for r in results if r.strategy == BASELINE), None)
    rows: list[Row] = []
    for r in results:
        # ranks that took turns on one GPU ran no faster or slower for it: no speedup
        up = (
            None
            if r.shared_devices
            else speedup(base.steady_epoch_seconds if base else None, r.steady_epoch_seconds)
        )
        n_devices = len(r.devices) - sum(n - 1 for n in r.shared_devices.values())
        epoch, seconds = time_to_target(histories[r.strategy], target)
        wait = core_wait(steady_rows(histories[r.strategy]))
        base_wait = core_wait(steady_rows(histories[base.strategy])) if base else None
        rows.append(
            {
                "strategy": r.strategy,
                "world_size": r.world_size,
                "devices": r.devices,
                "n_devices": n_devices,
                "shared_devices": r.shared_devices,
                "batch_split": r.batch_split,
                "warmup_epoch_s": r.warmup_epoch_seconds,
                "steady_epoch_s": r.steady_epoch_seconds,
                "steady_samples_per_s": r.steady_samples_per_s,
                # max - min of the steady epochs' samples/s: a smaller difference is a tie
                "steady_samples_per_s_spread": steady_spread(histories[r.strategy]),
                # the share of the training steps' runnable time spent waiting for a CPU core
                # (the machine's load: core_wait.py), over the epochs each speed figure is
                # taken over; the noise floor allows for its differences (speed_noise.py)
                "steady_core_wait": wait,
                "core_wait": core_wait(histories[r.strategy]),
                "speed_features": r.speed_features,  # what ran: precision, compile, graphs
                "steady_basis": r.steady_basis,
                "speed_note": r.speed_note,  # why a speed figure is empty or includes warm-up
                "speedup_vs_single": up,
                "scaling_efficiency": scaling_efficiency(up, n_devices),
                # beyond 100%: why, likely (a flag beside the figure wherever it is shown)
                "above_linear": above_linear(
                    scaling_efficiency(up, n_devices), wait, base_wait, n_devices
                ),
                "test_acc": r.test_acc,
                "best_test_acc": r.best_test_acc,
                # what the notes' dp accuracy is read against (notes_accuracy.py)
                "test_acc_by_epoch": [h.test_acc for h in histories[r.strategy]],
                "acc_delta_vs_single": delta(r.test_acc, base.test_acc if base else None),
                "total_seconds": r.total_seconds,
                "epoch_to_target": epoch,
                "time_to_target_s": seconds,
                # evaluation's peaks: absent from results written before they were measured
                "eval_peak_memory_mib": {},
                # memory_kind, peak_memory_mib, peak_reserved_mib, mem_imbalance and device 0's
                # share of the peak memory ("gpu0_share", or "cpu0_share" on the CPU), of the
                # training steps; the same of evaluation prefixed "eval_". The ignore: mypy
                # cannot tell that they never hold speedup_within_noise (report.py sets it)
                **memory_figures(r.memory),  # type: ignore[typeddict-item]
                "mlflow_run_id": None,  # the compare stage looks it up (tracking/kept_runs.py)
                "notes": [*r.notes, *([f"speed: {r.speed_note}"] if r.speed_note else [])],
            }
        )
    return rows


def memory_figures(memory: dict[str, Any]) -> MemoryFigures:
    """RunSummary.memory as the row types it: summary.json's JSON, which
    pipeline.memory.run_summary wrote with these keys (row.MemoryFigures), taken as it is,
    every key in its order (comparison.json writes them so)."""
    return cast(MemoryFigures, memory)


def _num(spec: str, suffix: str = "") -> Cell:
    return lambda v, row: "n/a" if v is None else f"{v:{spec}}{suffix}"


def _speed(spec: str, steady: bool = True, marks: tuple[str, str] = SPELLED) -> Cell:
    """A speed cell: empty where the run has no honest figure, pointing at the notes that say
    why; a steady figure taken over warm-up epochs is marked so (`marks`: the two words)."""
    empty, warm = marks

    def cell(v: Optional[float], row: Row) -> str:
        if v is None:
            return empty if row.get("speed_note") else "n/a"
        marked = steady and row.get("steady_basis") == WARMUP_STANDS_IN
        return f"{v:{spec}}" + (warm if marked else "")

    return cell


def features_text(features: SpeedFeatures) -> str:
    """A run's speed options as they applied (RunSummary.speed_features), in a few words:
    "bf16, channels_last, compile (reduce-overhead), CUDA graphs of compile"; "n/a" for
    results written before they were recorded."""
    if not features:
        return "n/a"
    parts = [features["precision"]]
    if features.get("channels_last"):
        parts.append("channels_last")
    mode = features.get("compile", "off")
    if mode != "off":
        parts.append("compile" if mode == "default" else f"compile ({mode})")
    graphs = {"compile": "CUDA graphs of compile", "step": "CUDA graph of the whole step"}
    if features.get("cuda_graphs") in graphs:
        parts.append(graphs[features["cuda_graphs"]])
    return ", ".join(parts)


def _target_cell(v: Optional[float], row: Row) -> str:
    return "not reached" if v is None else f"{v:.1f} s (epoch {row['epoch_to_target']})"


_steady_s, _warmup_s = _speed(".2f"), _speed(".2f", steady=False)


def _epoch_seconds_cell(v: Optional[float], row: Row) -> str:
    """The steady epoch and, in brackets, epoch 1's (its one-off start costs): one column."""
    steady, warmup = _steady_s(v, row), _warmup_s(row["warmup_epoch_s"], row)
    return steady if warmup == steady and v is None else f"{steady} ({warmup})"


def _speedup_cell(v: Optional[float], row: Row) -> str:
    if v is None:
        return "n/a (shared-device)" if row.get("shared_devices") else "n/a"
    # within the A/A noise floor (the compare stage sets it; speed_noise.py): no real speedup
    noise = ", within noise" if row.get("speedup_within_noise") else ""
    flags = [f for f in (row.get("above_linear"), _busy_flag(row)) if f]
    return f"{v:.2f}x ({row['scaling_efficiency']:.0%}{noise}{''.join(', ' + f for f in flags)})"


def _busy_flag(row: Row) -> Optional[str]:
    """ "machine busy: not ranked" where this run's steady epochs waited beyond
    core_wait.BUSY_WAIT for a core: its speed is shown, the answer ranks it in no speed
    objective."""
    return "machine busy: not ranked" if busy(row.get("steady_core_wait")) else None


def _accuracy_cell(v: float, row: Row) -> str:
    delta = row["acc_delta_vs_single"]
    return f"{v:.4f}" + ("" if delta is None else f" ({delta:+.4f})")


def busiest(row: Row) -> Optional[tuple[str, float]]:
    """(device, MiB) of the strategy's highest training peak; None when not measured."""
    peaks = row.get("peak_memory_mib") or {}
    if not isinstance(peaks, dict) or not peaks:
        return None
    label = max(peaks, key=peaks.__getitem__)
    return label, peaks[label]


def _busiest_mib(row: Row) -> Optional[float]:
    top = busiest(row)
    return None if top is None else top[1]


def _busiest_cell(v: Any, row: Row) -> str:
    top = busiest(row)
    return "n/a" if top is None else f"{top[1]:.0f} ({top[0]})"


def _devices_cell(v: int, row: Row) -> str:
    """ "2 (2)": devices (processes); "1 (2, shared-device)" where ranks shared a GPU."""
    return f"{v} ({row['world_size']}{', shared-device' if row.get('shared_devices') else ''})"


def columns(target: Optional[float], memory_kind: str) -> list[Column]:
    """(row key, header, cell text) for every column of the main table: one row per strategy,
    a bounded number of columns whatever the devices (each device's memory is the per-device
    table's, reporting/device_table.py)."""
    peak = (
        "peak MiB (busiest GPU)" if memory_kind == "gpu" else "peak RSS MiB (busiest process, CPU)"
    )
    return [
        ("strategy", "strategy", lambda v, row: v),
        ("n_devices", "devices (processes)", _devices_cell),
        ("batch_split", "per-device batch", lambda v, row: "+".join(map(str, v))),
        ("steady_epoch_s", "steady s/epoch (warm-up epoch 1)", _epoch_seconds_cell),
        ("steady_samples_per_s", "steady samples/s", _speed(".0f")),
        ("speedup_vs_single", f"speedup vs {BASELINE} (scaling efficiency)", _speedup_cell),
        ("test_acc", f"final test acc (delta vs {BASELINE})", _accuracy_cell),
        (
            "time_to_target_s",
            "time to target" if target is None else f"time to acc {target:g}",
            _target_cell if target is not None else lambda v, row: "no target set",
        ),
        ("peak_memory_mib", f"training {peak}", _busiest_cell),
        ("speed_features", "speed features", lambda v, row: features_text(v)),
    ]


def table_cells(rows: list[Row], target: Optional[float]) -> tuple[list[str], list[list[str]]]:
    cols = columns(target, rows[0]["memory_kind"])
    return [h for _, h, _ in cols], [[fmt(row[k], row) for k, _, fmt in cols] for row in rows]


def markdown_table(rows: list[Row], target: Optional[float]) -> str:
    return markdown(*table_cells(rows, target))


def markdown(head: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines) + "\n"


def html_table(rows: list[Row], target: Optional[float]) -> str:
    return html_rows(*table_cells(rows, target), css="main")


def html_rows(head: list[str], body: list[list[str]], css: str) -> str:
    """A <table>; a batch split ("32+32+...") may break after a "+", however many GPUs."""

    def cell(text: str) -> str:
        if not re.fullmatch(r"\d+(\+\d+)+", text):
            return f"<td>{html.escape(text)}</td>"
        return f'<td class="wrap">{text.replace("+", "+<wbr>")}</td>'

    heads = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    out = [f'<table class="{css}">', f"<tr>{heads}</tr>"]
    out += ["<tr>" + "".join(cell(c) for c in cells) + "</tr>" for cells in body]
    return "\n".join(out + ["</table>"])


# The table as the compare stage prints it: the same rows, short headers, aligned plain text
# that fits a terminal (TEXT_WIDTH); the report has the full table and the per-device one.
TEXT_WIDTH = 120


def _terse_speedup(v: Optional[float], row: Row) -> str:
    """The printed table's speedup: "8.86x!" above 100% efficiency, "busy" beside it where
    the machine was too busy to rank the run (footnotes say so)."""
    if v is None:
        return "n/a"
    marks = ("!" if row.get("above_linear") else "") + (" busy" if _busy_flag(row) else "")
    return f"{v:.2f}x{marks}"


def text_table(rows: list[Row], target: Optional[float]) -> str:
    """Fixed columns, none of them per device, so the width stays bounded: about 105
    characters for 8 GPUs on 2 nodes (tests/unit/test_report_fits.py checks it)."""
    reach = "to target" if target is None else f"to acc {target:g}"
    marked = _speed(".2f", marks=TERSE), _speed(".0f", marks=TERSE)
    cols: list[Column] = [
        ("strategy", "strategy", lambda v, row: v),
        ("n_devices", "devices", _devices_cell),
        ("steady_epoch_s", "s/epoch", marked[0]),
        ("steady_samples_per_s", "samples/s", marked[1]),
        ("speedup_vs_single", "speedup", _terse_speedup),
        ("test_acc", f"test acc (vs {BASELINE})", _accuracy_cell),
        ("time_to_target_s", reach, _target_cell if target is not None else _num(".1f")),
        ("peak_memory_mib", "peak MiB", _busiest_cell),
    ]
    grid = [[h for _, h, _ in cols]] + [[fmt(r[k], r) for k, _, fmt in cols] for r in rows]
    widths = [max(len(line[i]) for line in grid) for i in range(len(cols))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in grid]
    if any(r.get("steady_basis") == WARMUP_STANDS_IN for r in rows):
        lines.append("* taken over warm-up epochs (no epoch free of one)")
    if any(r.get("speed_note") and r.get("steady_epoch_s") is None for r in rows):
        lines.append("none: no steady epoch (the report's notes say why)")
    if any(r.get("above_linear") and r.get("speedup_vs_single") is not None for r in rows):
        lines.append("!: scaling efficiency above 100% (the report says its likely cause)")
    if any(_busy_flag(r) for r in rows):
        lines.append(
            f"busy: machine busy, not ranked (waited over {BUSY_WAIT:.0%} of its time for a core)"
        )
    return "\n".join(lines) + "\n"


def summary_json(rows: list[Row]) -> dict[str, dict[str, Optional[float]]]:
    """reports/summary.json, the project's one DVC metrics file: four figures per strategy,
    each keyed by strategy: final test accuracy ("acc"), steady samples/s ("sps"), the run's
    wall seconds ("total_s") and the busiest device's training peak in MiB ("peak_mib").
    Short keys that no params file has, so `dvc exp show` heads its columns "acc.ddp" and one
    screen holds them (docs/configuration.md "Changing parameters"); every other figure is in
    results/<strategy>/summary.json and reports/comparison.json."""
    return {
        "acc": {row["strategy"]: row["test_acc"] for row in rows},
        "sps": {row["strategy"]: row["steady_samples_per_s"] for row in rows},
        "total_s": {row["strategy"]: row["total_seconds"] for row in rows},
        "peak_mib": {row["strategy"]: _busiest_mib(row) for row in rows},
    }


def comparison_json(rows: list[Row]) -> dict[str, dict[str, object]]:
    """reports/comparison.json (a plain output): every column of every row, keyed by
    strategy, for tools."""
    skip = {"strategy", "notes"}
    return {row["strategy"]: {k: v for k, v in row.items() if k not in skip} for row in rows}


def wide_csv(histories: dict[str, list[EpochRow]], names: list[str], field: str) -> str:
    """CSV of one per-epoch figure (EpochRow `field`: test_acc, train_loss, samples_per_s) by
    epoch, one column per strategy in `names` (blank where a strategy did not run): DVC can
    only plot columns it is told about in dvc.yaml, so the file always has a column for every
    strategy the project knows."""
    epochs = sorted({r.epoch for h in histories.values() for r in h})
    by = {s: {r.epoch: getattr(r, field) for r in h} for s, h in histories.items()}
    lines = [",".join(["epoch", *names])]
    for e in epochs:
        cells = [f"{by[s][e]:.6g}" if s in by and e in by[s] else "" for s in names]
        lines.append(",".join([str(e), *cells]))
    return "\n".join(lines) + "\n"


# reports/<file>: the EpochRow field it plots per strategy (dvc.yaml's top-level plots)
WIDE_PLOTS = {
    "accuracy.csv": "test_acc",
    "loss.csv": "train_loss",
    "throughput.csv": "samples_per_s",
}
