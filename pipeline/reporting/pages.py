"""The report as pages: summary.md (plots linked) and index.html (plots embedded, so it opens
from disk and can be mailed on its own). Both open with the answer (answer.py): which strategy
to use on this hardware, per objective; the table, the per-device memory table and the plots
follow. The answer's first lines are one per objective (answer.headlines); its reasons,
rankings, floors and spreads fold beneath them (<details> in index.html, a subsection of
summary.md). The page fits a 1400 px window with 8 GPUs a strategy: the main table has a fixed set
of columns, the memory table a row per device, and a batch split breaks after its "+"."""

from __future__ import annotations

import base64
import html
from pathlib import Path

from pipeline.reporting import answer, device_table, table
from pipeline.reporting.plots import PLOTS
from pipeline.reporting.row import Row
from pipeline.results import NOT_SEPARABLE
from pipeline.tracking.comparison_run import Comparison, Registration

TITLE = "parallel-lab: which strategy for this hardware"

UNREACHABLE = "not grouped in MLflow: it was unreachable (`python -m pipeline.compare` again later)"


# Where a section of another stage's goes (the predictions): before the notes, in both pages
APPENDIX = "<!-- appendix -->"


def with_appendix(page: str, section: str) -> str:
    """`page` with `section` in its appendix's place (nothing there: the marker goes)."""
    return page.replace(APPENDIX + "\n", section + "\n" if section else "", 1)


def markdown_page(
    rows: list[Row],
    target: float | None,
    mlflow: Comparison | None,
    answered: answer.Answer,
    registered: Registration | None = None,
) -> str:
    link = (
        f"**[Open these {len(mlflow.runs)} runs side by side in MLflow]({mlflow.url})** "
        f"(parent run `{mlflow.parent_id}`)"
        if mlflow
        else UNREACHABLE
    )
    parts = [
        f"# {TITLE}\n",
        answer.markdown(answered, registered),
        "## The comparison\n",
        link + "\n",
        table.markdown_table(rows, target),
        _legend(rows, target) + "\n",
        "## Memory per device\n",
        device_table.markdown_table(rows),
        _memory_legend(rows) + "\n",
    ]
    parts += [f"![{name}]({name})\n" for name in PLOTS]
    parts += [APPENDIX, "## Notes\n"] + [
        f"- {', '.join(names)}: {note}" for names, note in grouped_notes(rows)
    ]
    return "\n".join(parts) + "\n"


def grouped_notes(rows: list[Row]) -> list[tuple[list[str], str]]:
    """Each run's notes, a note that several strategies share said once with their names (on
    a CPU every run notes that evaluation's memory is not separable), in the rows' order. A
    strategy's own note that starts with its name (as its log says it) loses that here."""
    names: dict[str, list[str]] = {}
    for r in rows:
        for note in r["notes"]:
            names.setdefault(note.removeprefix(f"{r['strategy']}: "), []).append(r["strategy"])
    return [(strategies, note) for note, strategies in names.items()]


def html_page(
    rows: list[Row],
    target: float | None,
    mlflow: Comparison | None,
    directory: Path,
    answered: answer.Answer,
    registered: Registration | None = None,
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
        f"<li><b>{html.escape(', '.join(names))}</b>: {html.escape(note)}</li>"
        for names, note in grouped_notes(rows)
    )
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{TITLE}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; font-size: 13px; }}
th, td {{ border: 1px solid #ccc; padding: 4px 8px; text-align: right; }}
td {{ white-space: nowrap; }} td.wrap {{ white-space: normal; }}
th {{ background: #f3f3f3; }} td:first-child, th:first-child {{ text-align: left; }}
img {{ max-width: 48%; margin: 1em 1% 0 0; border: 1px solid #eee; }}
p.legend {{ max-width: 70em; font-size: 13px; color: #555; }}
p.mlflow {{ font-size: 15px; }}
section.answer {{ max-width: 72em; background: #f5f8fc; border: 1px solid #c9d7ea;
  border-radius: 6px; padding: 0.4em 1.4em 0.8em; }}
section.answer h2 {{ margin: 0.5em 0 0.4em; font-size: 1.3em; }}
section.answer ul {{ padding-left: 1.2em; margin: 0; }}
section.answer ul.headlines > li {{ margin: 0.3em 0; font-size: 15px; }}
section.answer details {{ margin-top: 0.6em; }}
section.answer summary {{ cursor: pointer; font-size: 13px; color: #0b5cad; }}
section.answer details > ul > li {{ margin: 0.55em 0; font-size: 14px; }}
section.answer li ul {{ margin: 0.15em 0; font-size: 13px; color: #444; }}
section.answer p {{ font-size: 13px; color: #444; margin: 0.6em 0 0; }}
section.answer p.model {{ color: #222; }}
span.pick {{ font-weight: 600; color: #0b5cad; }} span.none {{ color: #a33; }}
section.answer code {{ background: #e8eef6; padding: 0 3px; border-radius: 3px; }}
</style></head><body>
<h1>{TITLE}</h1>
{answer.html_section(answered, registered)}
<h2>The comparison</h2>
{link}
{table.html_table(rows, target)}
<p class="legend">{html.escape(_legend(rows, target))}</p>
<h2>Memory per device</h2>
{device_table.html_table(rows)}
<p class="legend">{html.escape(_memory_legend(rows))}</p>
{images}
{APPENDIX}
<h2>Notes</h2><ul>{notes}</ul>
</body></html>
"""


def _legend(rows: list[Row], target: float | None) -> str:
    where = "GPU (physical id)" if rows[0]["memory_kind"] == "gpu" else "process (rank), RSS"
    return (
        f"Steady s/epoch is the median over the epochs not marked warm-up (the first "
        f"epoch each process ran: epoch 1, shown apart, and a resumed one), steady "
        f"samples/s an epoch's samples over it. Where every epoch is a warm-up, the whole "
        f"ones stand in, marked (warm-up); an epoch resumed mid-way never does (its time "
        f"spans more than one process start): a run left without a figure shows none, says "
        f"why in its notes and is not ranked on throughput. Speedup and accuracy delta are "
        f'against {table.BASELINE}; scaling efficiency = speedup / devices; "within noise": '
        f"inside the A/A noise floor (see Speed noise above), so no speedup at all. Time to "
        f"target = wall "
        f"time until test accuracy first reached "
        f"{target if target is not None else '(none set)'}. Training peak: the highest of any "
        f"one {where} over the training steps of any epoch; every device's is below."
    )


def _memory_legend(rows: list[Row]) -> str:
    memory = (
        "peak memory allocated by tensors (reserved: held by the caching allocator) per GPU "
        "(physical id), highest epoch"
        if rows[0]["memory_kind"] == "gpu"
        else "CPU run: peak resident set size per process (rank), highest epoch, in place of "
        "GPU memory"
    )
    evaluation = (
        "the eval peak the evaluation after them, each reset before it"
        if rows[0]["memory_kind"] == "gpu"
        else f"evaluation's peak is {NOT_SEPARABLE} (a process's RSS during evaluation still "
        "holds training's heap)"
    )
    return (
        f"Memory: {memory}; the training peak covers the training steps only, {evaluation}. "
        f"Training max/mean: the imbalance of the training peaks over the strategy's devices. "
        f"{EVAL_SPLIT}"
    )


# how evaluation batches are split per device (pipeline/training/trainer.py `Trainer.evaluate`,
# pipeline/data/device_data.py `eval_shard`)
EVAL_SPLIT = (
    "Evaluation: ddp and fsdp ranks each evaluate their strided share of the test set, single, "
    "dp and balanced_dp the whole of it, in batches of train.eval_batch_size; dp splits each "
    "batch over its GPUs in torch.chunk pieces, balanced_dp gives GPU 0 its per-forward "
    "gpu0_bsz of it and the rest to the others; pipeline_parallel evaluates in its training "
    "micro-batch shape (train.batch_size / train.grad_accum)."
)
