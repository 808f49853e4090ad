"""The comparison's arithmetic and its table, as pure functions (no files, no plotting).

Speed is judged on the steady state (pipeline.results.steady_seconds: the median of the
epochs not marked warm-up, i.e. neither epoch 1 nor the first epoch of a resumed process; epoch
1's one-off work is reported apart as the warm-up). Where every epoch is a warm-up the whole
ones stand in, their cells marked "(warm-up)"; a run left without any has empty speed cells
and its `speed_note` among the notes, which say why. Speedup and accuracy deltas are against
`single` when it ran; scaling efficiency is speedup / devices. Memory columns: the peak and
imbalance are the training steps' (pipeline.memory), evaluation's peak is a column of its own.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any, Optional

from pipeline.results import WARMUP_STANDS_IN, EpochRow, RunSummary, steady_spread

BASELINE = "single"


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


def delta(value: float, base: Optional[float]) -> Optional[float]:
    return None if base is None else value - base


def comparison_rows(
    results: list[RunSummary], histories: dict[str, list[EpochRow]], target: Optional[float]
) -> list[dict[str, Any]]:
    """One row per strategy: its metrics.json figures plus the cross-strategy columns."""
    base = next((r for r in results if r.strategy == BASELINE), None)
    rows = []
    for r in results:
        up = speedup(base.steady_epoch_seconds if base else None, r.steady_epoch_seconds)
        epoch, seconds = time_to_target(histories[r.strategy], target)
        rows.append(
            {
                "strategy": r.strategy,
                "world_size": r.world_size,
                "devices": r.devices,
                "n_devices": len(r.devices),
                "batch_split": r.batch_split,
                "warmup_epoch_s": r.warmup_epoch_seconds,
                "steady_epoch_s": r.steady_epoch_seconds,
                "steady_samples_per_s": r.steady_samples_per_s,
                # max - min of the steady epochs' samples/s: a smaller difference is a tie
                "steady_samples_per_s_spread": steady_spread(histories[r.strategy]),
                "speed_features": r.speed_features,  # what ran: precision, compile, graphs
                "steady_basis": r.steady_basis,
                "speed_note": r.speed_note,  # why a speed figure is empty or includes warm-up
                "speedup_vs_single": up,
                "scaling_efficiency": scaling_efficiency(up, len(r.devices)),
                "test_acc": r.test_acc,
                "best_test_acc": r.best_test_acc,
                "acc_delta_vs_single": delta(r.test_acc, base.test_acc if base else None),
                "epoch_to_target": epoch,
                "time_to_target_s": seconds,
                # evaluation's peaks: absent from results written before they were measured
                "eval_peak_memory_mib": {},
                # memory_kind, peak_memory_mib, peak_reserved_mib, mem_imbalance and device 0's
                # share of the peak memory ("gpu0_share", or "cpu0_share" on the CPU), of the
                # training steps; the same of evaluation prefixed "eval_"
                **r.memory,
                "mlflow_run_id": None,  # the compare stage looks it up (tracking/publish.py)
                "notes": [*r.notes, *([f"speed: {r.speed_note}"] if r.speed_note else [])],
            }
        )
    return rows


def _num(spec: str, suffix: str = "") -> Callable:
    return lambda v, row: "n/a" if v is None else f"{v:{spec}}{suffix}"


def _speed(spec: str, steady: bool = True) -> Callable:
    """A speed cell: empty where the run has no honest figure, pointing at the notes that say
    why; a steady figure taken over warm-up epochs is marked so."""

    def cell(v: Optional[float], row: dict[str, Any]) -> str:
        if v is None:
            return "none (see notes)" if row.get("speed_note") else "n/a"
        marked = steady and row.get("steady_basis") == WARMUP_STANDS_IN
        return f"{v:{spec}}" + (" (warm-up)" if marked else "")

    return cell


def features_text(features: dict[str, Any]) -> str:
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


def _target_cell(v: Optional[float], row: dict[str, Any]) -> str:
    return "not reached" if v is None else f"{v:.1f} s (epoch {row['epoch_to_target']})"


def _memory_cell(v: dict | str, row: dict[str, Any]) -> str:
    """Each device's MiB; a figure that cannot be measured says why (memory.NOT_SEPARABLE)."""
    if isinstance(v, str):
        return v
    return ", ".join(f"{label} {mib:.0f}" for label, mib in v.items()) or "n/a"


def columns(target: Optional[float], memory_kind: str) -> list[tuple[str, str, Callable]]:
    """(row key, header, cell text) for every column of the table."""
    memory = (
        "peak allocated MiB per GPU" if memory_kind == "gpu" else "peak RSS (CPU) MiB per process"
    )
    return [
        ("strategy", "strategy", lambda v, row: v),
        ("world_size", "processes", lambda v, row: str(v)),
        ("devices", "devices", lambda v, row: ", ".join(v)),
        ("batch_split", "per-device batch", lambda v, row: "+".join(map(str, v))),
        ("warmup_epoch_s", "warm-up s (epoch 1)", _speed(".2f", steady=False)),
        ("steady_epoch_s", "steady s/epoch", _speed(".2f")),
        ("steady_samples_per_s", "steady samples/s", _speed(".0f")),
        ("speedup_vs_single", f"speedup vs {BASELINE}", _num(".2f", "x")),
        ("scaling_efficiency", "scaling efficiency", _num(".0%")),
        ("test_acc", "final test acc", _num(".4f")),
        ("best_test_acc", "best test acc", _num(".4f")),
        ("acc_delta_vs_single", f"acc delta vs {BASELINE}", _num("+.4f")),
        (
            "time_to_target_s",
            "time to target" if target is None else f"time to acc {target:g}",
            _target_cell if target is not None else lambda v, row: "no target set",
        ),
        ("peak_memory_mib", f"training {memory}", _memory_cell),
        ("mem_imbalance", "training mem imbalance (max/mean)", _num(".2f")),
        ("eval_peak_memory_mib", f"eval {memory}", _memory_cell),
        ("speed_features", "speed features", lambda v, row: features_text(v)),
    ]


def table_cells(rows: list[dict], target: Optional[float]) -> tuple[list[str], list[list[str]]]:
    cols = columns(target, rows[0]["memory_kind"])
    return [h for _, h, _ in cols], [[fmt(row[k], row) for k, _, fmt in cols] for row in rows]


def markdown_table(rows: list[dict], target: Optional[float]) -> str:
    head, body = table_cells(rows, target)
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines) + "\n"


def html_table(rows: list[dict], target: Optional[float]) -> str:
    head, body = table_cells(rows, target)
    esc = html.escape
    out = ["<table>", "<tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>"]
    out += ["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>" for cells in body]
    return "\n".join(out + ["</table>"])


def summary_json(rows: list[dict]) -> dict:
    """reports/summary.json (DVC metrics): every column, keyed by strategy."""
    skip = {"strategy", "notes"}
    return {row["strategy"]: {k: v for k, v in row.items() if k not in skip} for row in rows}


def accuracy_wide(histories: dict[str, list[EpochRow]], names: list[str]) -> str:
    """CSV of test accuracy by epoch, one column per strategy in `names` (blank where a
    strategy did not run): DVC can only plot columns it is told about in dvc.yaml, so the file
    always has a column for every strategy the project knows."""
    epochs = sorted({r.epoch for h in histories.values() for r in h})
    by = {s: {r.epoch: r.test_acc for r in h} for s, h in histories.items()}
    lines = [",".join(["epoch", *names])]
    for e in epochs:
        cells = [f"{by[s][e]:.6g}" if s in by and e in by[s] else "" for s in names]
        lines.append(",".join([str(e), *cells]))
    return "\n".join(lines) + "\n"
