"""The experiments table: one row per DVC experiment x strategy, from `dvc exp show --json`,
with the params that tell the experiments apart and each strategy's final figures.

An experiment's metrics are the reports/summary.json DVC committed into it (each figure keyed
by strategy); an experiment that has none (still queued, failed, or its metrics kept out of
git by .gitignore) is named under the table instead of getting a row.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.errors import UserError

OUT = Path("reports/experiments.md")
Json = dict[str, Any]  # an object of `dvc exp show --json`, or a row of the table built from it
# always shown, for context; any other param whose value differs between rows is added
BASE_PARAMS = ("train.batch_size", "train.lr", "train.epochs")
SUMMARY = "reports/summary.json"  # the DVC metrics: figure -> strategy -> value
METRICS = (  # (key in reports/summary.json, column, format): all of its keys
    ("acc", "final test acc", "{:.4f}"),
    ("sps", "steady samples/s", "{:.0f}"),
    ("total_s", "total s", "{:.1f}"),
    ("peak_mib", "peak MiB (busiest device)", "{:.0f}"),
)


def revisions(shown: list[Json]) -> Iterator[tuple[str, str, Json]]:
    """(name, state, data) of the workspace, each baseline commit and each experiment."""
    for baseline in shown:
        name = (
            "workspace"
            if baseline["rev"] == "workspace"
            else (baseline.get("name") or baseline["rev"][:7])
        )
        yield name, "baseline", baseline.get("data") or {}
        for exp in baseline.get("experiments") or []:
            latest = exp["revs"][0]  # newest first
            state = (exp.get("executor") or {}).get("state") or "success"
            yield exp.get("name") or latest["rev"][:7], state, latest.get("data") or {}


def flat_params(data: Json) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            out[prefix[:-1]] = node

    for source in (data.get("params") or {}).values():
        walk(source.get("data") or {}, "")
    return out


def strategy_metrics(data: Json) -> dict[str, Json]:
    """strategy -> its figures (key -> value) in this revision's reports/summary.json."""
    figures = ((data.get("metrics") or {}).get(SUMMARY) or {}).get("data") or {}
    out: dict[str, Json] = {}
    for key, by_strategy in figures.items():
        for strategy, value in (by_strategy if isinstance(by_strategy, dict) else {}).items():
            out.setdefault(strategy, {})[key] = value
    return out


def build_rows(shown: list[Json]) -> tuple[list[Json], list[str], list[str]]:
    """Rows (experiment, strategy, params, metrics), the param columns, and notes on the
    revisions that have no metrics."""
    rows: list[dict[str, Any]] = []
    without: list[str] = []
    for name, state, data in revisions(shown):
        found = strategy_metrics(data)
        if not found:
            if state != "baseline":
                without.append(f"{name} ({state})")
            continue
        params = flat_params(data)
        for strategy, metrics in sorted(found.items()):
            rows.append(
                {"experiment": name, "strategy": strategy, "params": params, "metrics": metrics}
            )
    keys = sorted({k for r in rows for k in r["params"]})
    varying = [
        k for k in keys if len({json.dumps(r["params"].get(k), sort_keys=True) for r in rows}) > 1
    ]
    columns = [k for k in BASE_PARAMS if k in keys] + [k for k in varying if k not in BASE_PARAMS]
    return rows, columns, without


def _cell(value: Any, fmt: str = "{}") -> str:
    if value is None:
        return "—"
    if isinstance(value, (list, dict)):
        return json.dumps(value).replace("|", "\\|")
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def markdown(rows: list[Json], columns: list[str], without: list[str]) -> str:
    head = ["experiment", "strategy", *columns, *(c for _, c, _ in METRICS)]
    lines = [
        "# Experiments",
        "",
        "One row per DVC experiment x strategy (`dvc exp show`), with the params that "
        "differ between experiments.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in rows:
        cells = [
            r["experiment"],
            r["strategy"],
            *(_cell(r["params"].get(c)) for c in columns),
            *(_cell(r["metrics"].get(k), fmt) for k, _, fmt in METRICS),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if without:
        lines += [
            "",
            "No metrics (queued, running, failed, or reports/summary.json not committed "
            "to git): " + ", ".join(without),
        ]
    return "\n".join(lines) + "\n"


def exp_show() -> list[Json]:
    proc = subprocess.run(
        [sys.executable, "-m", "dvc", "exp", "show", "--json"], capture_output=True, text=True
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(
            f"dvc exp show --json failed ({last}); expected to run in the project's DVC repository"
        )
    shown: list[Json] = json.loads(proc.stdout)  # a list of revisions (dvc 3.67)
    return shown
