"""The report as pages: summary.md (plots linked) and index.html (plots embedded, so it opens
from disk and can be mailed on its own)."""

from __future__ import annotations

import base64
import html
from pathlib import Path

from pipeline.reporting import table
from pipeline.reporting.plots import PLOTS
from pipeline.tracking.comparison import Comparison

UNREACHABLE = "not grouped in MLflow: it was unreachable (`python -m pipeline.compare` again later)"


def markdown_page(rows: list[dict], target: float | None, mlflow: Comparison | None) -> str:
    link = (
        f"**[Open these {len(mlflow.runs)} runs side by side in MLflow]({mlflow.url})** "
        f"(parent run `{mlflow.parent_id}`)"
        if mlflow
        else UNREACHABLE
    )
    parts = [
        "# parallel-lab: strategy comparison\n",
        link + "\n",
        table.markdown_table(rows, target),
        _legend(rows, target) + "\n",
    ]
    parts += [f"![{name}]({name})\n" for name in PLOTS]
    parts += ["## Notes\n"] + [f"- {r['strategy']}: {n}" for r in rows for n in r["notes"]]
    return "\n".join(parts) + "\n"


def html_page(
    rows: list[dict], target: float | None, mlflow: Comparison | None, directory: Path
) -> str:
    link = (
        f'<p class="mlflow"><a href="{html.escape(mlflow.url)}">Open these '
        f"{len(mlflow.runs)} runs side by side in MLflow</a> (parent run "
        f"<code>{html.escape(mlflow.parent_id)}</code>)</p>"
        if mlflow
        else f'<p class="mlflow">{html.escape(UNREACHABLE)}</p>'
    )
    images = "\n".join(
        f'<img alt="{name}" src="data:image/png;base64,'
        f'{base64.b64encode((directory / name).read_bytes()).decode()}">'
        for name in PLOTS
    )
    notes = "".join(
        f"<li><b>{html.escape(r['strategy'])}</b>: {html.escape(n)}</li>"
        for r in rows
        for n in r["notes"]
    )
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
p.mlflow {{ font-size: 15px; }}
</style></head><body>
<h1>parallel-lab: strategy comparison</h1>
{link}
{table.html_table(rows, target)}
<p class="legend">{html.escape(_legend(rows, target))}</p>
{images}
<h2>Notes</h2><ul>{notes}</ul>
</body></html>
"""


def _legend(rows: list[dict], target: float | None) -> str:
    memory = (
        "peak memory allocated by tensors per GPU (physical id), highest epoch; "
        "max/mean over devices is the imbalance"
        if rows[0]["memory_kind"] == "gpu"
        else "CPU run: peak resident set size per process (rank), highest epoch, in place of "
        "GPU memory"
    )
    return (
        f"Steady s/epoch is the median of epochs 2..n (epoch 1 is the warm-up, shown "
        f"apart); speedup and accuracy delta are against {table.BASELINE}; scaling "
        f"efficiency = speedup / devices. Time to target = wall time until test accuracy "
        f"first reached {target if target is not None else '(none set)'}. Memory: "
        f"{memory}."
    )
