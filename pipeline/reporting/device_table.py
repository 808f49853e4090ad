"""The report's per-device memory table: one row per device of each strategy, so it grows in
rows, never in columns, however many GPUs a strategy spans (the main table, table.py, shows
only the busiest device's peak). Pure functions over table.comparison_rows' rows."""

from __future__ import annotations

from typing import Optional

from pipeline.reporting.row import Row
from pipeline.reporting.table import html_rows, markdown


def headers(memory_kind: str) -> list[str]:
    if memory_kind == "gpu":
        return [
            "strategy",
            "GPU",
            "training peak allocated MiB",
            "training peak reserved MiB",
            "eval peak allocated MiB",
            "eval peak reserved MiB",
            "training max/mean",
        ]
    rss = ["training peak RSS MiB", "eval peak RSS MiB"]
    return ["strategy", "process", *rss, "training max/mean"]


def _mib(figures: Optional[dict[str, float] | str], label: str) -> str:
    """One device's figure; a phase that has no figure says why (results.NOT_SEPARABLE), one
    not measured (results from before it was) reads n/a."""
    if isinstance(figures, str):
        return figures
    value = (figures or {}).get(label)
    return "n/a" if value is None else f"{value:.0f}"


def cells(rows: list[Row]) -> tuple[list[str], list[list[str]]]:
    """The strategy's name and its imbalance on its first device's row only."""
    head = headers(rows[0]["memory_kind"])
    gpu = rows[0]["memory_kind"] == "gpu"
    body = []
    for row in rows:
        peaks = row.get("peak_memory_mib") or {}
        for i, label in enumerate(peaks):
            first = i == 0
            imbalance = row.get("mem_imbalance")
            line = [row["strategy"] if first else "", label, _mib(peaks, label)]
            if gpu:
                line.append(_mib(row.get("peak_reserved_mib"), label))
            line.append(_mib(row.get("eval_peak_memory_mib"), label))
            if gpu:
                line.append(_mib(row.get("eval_peak_reserved_mib"), label))
            line.append(f"{imbalance:.2f}" if first and imbalance is not None else "")
            body.append(line)
        if not peaks:  # results from before memory was measured
            body.append([row["strategy"], "not measured", *[""] * (len(head) - 2)])
    return head, body


def markdown_table(rows: list[Row]) -> str:
    return markdown(*cells(rows))


def html_table(rows: list[Row]) -> str:
    return html_rows(*cells(rows), css="devices")
