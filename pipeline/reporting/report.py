"""The compare stage's work: results/<strategy>/ of every strategy -> reports/, and the
strategy runs grouped in MLflow under a parent run "comparison" holding the report; the
recommended strategies' models registered in MLflow, under aliases.

reports/:
  summary.md, index.html  the answer (answer.py), the table (table.py), the per-device memory
                          table (device_table.py) and the plots (plots.py; pages.py)
  recommendation.json     the answer: one recommendation per objective, with its reasons
  summary.json            the DVC metrics: accuracy, samples/s, seconds, peak MiB by strategy
  comparison.json         every column, keyed by strategy
  mlflow_url.txt          the MLflow page with this comparison's runs side by side
  accuracy.csv, loss.csv, throughput.csv
                          test accuracy, training loss, samples/s by epoch, one column per
                          strategy (DVC plots)
  accuracy_vs_epoch.png, accuracy_vs_time.png, throughput.png, memory.png
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from pipeline.config import MlflowConfig, ReportConfig
from pipeline.did_not_fit import read_did_not_fit
from pipeline.errors import UserError
from pipeline.files import atomic_write, staged
from pipeline.reporting import answer, table
from pipeline.reporting import predicted as predicted_section
from pipeline.reporting import unfit as unfit_section
from pipeline.reporting.pages import html_page, markdown_page, with_appendix
from pipeline.reporting.plots import PLOTS, write_plots
from pipeline.reporting.row import OptionalFigure, Row
from pipeline.reporting.speed_noise import speedup_within_noise
from pipeline.results import read_config, read_history, read_summary
from pipeline.strategies import NAMES, OPT_IN, check_names
from pipeline.tracking.comparison_run import (
    RECOMMENDED,
    Registration,
    close_comparison,
    open_comparison,
    register_model,
    seed_accuracies,
    set_aliases,
)
from pipeline.tracking.kept_runs import current_run_id, log_final_models
from pipeline.tracking.mlflow_run import ModelSource
from pipeline.tracking.provenance import base_tags

REPORTS = Path("reports")
# the figures MLflow gets per strategy run, beside its per-epoch metrics
CHILD_METRICS: tuple[OptionalFigure, ...] = (
    "warmup_epoch_s",
    "steady_epoch_s",
    "steady_samples_per_s",
    "speedup_vs_single",
    "scaling_efficiency",
    "acc_delta_vs_single",
    "time_to_target_s",
)
REPORT_FILES = (
    "index.html",
    "summary.md",
    "summary.json",
    "comparison.json",
    "recommendation.json",
    *table.WIDE_PLOTS,
    *PLOTS,
)
MLFLOW_URL = "mlflow_url.txt"


def write_report(
    names: list[str],
    report: ReportConfig,
    mlflow_options: MlflowConfig,
    model_of: Callable[[Path], ModelSource] | None = None,
    predicted: dict[str, Any] | None = None,
) -> str:
    """Write reports/ for the strategies `names`, group their runs in MLflow, log their final
    models (`model_of` results/<strategy>/, where given) and register the recommended
    strategies'; `predicted`: the predict stage's document, shown as its own section and
    logged to the comparison run under names that say so. Returns what the stage prints:
    the answer and a table that fit a terminal (table.TEXT_WIDTH), and where the report and
    the MLflow page are."""
    check_names(names)
    target = report.target_accuracy
    # the strategies that ran out of device memory: listed apart, ranked in nothing
    unfit = [r for r in map(read_did_not_fit, names) if r is not None]
    names = [n for n in names if n not in {r.strategy for r in unfit}]
    if not names:
        raise UserError(
            "every strategy ran out of device memory, nothing to compare: "
            + "; ".join(f"{r.strategy} {r.line()}" for r in unfit)
        )
    results = [read_summary(name) for name in names]
    histories = {name: read_history(name) for name in names}
    rows = table.comparison_rows(results, histories, target)
    for row, result in zip(rows, results):  # the runs as the store MLflow points at holds them
        row["mlflow_run_id"] = current_run_id(result.strategy, result.fingerprint)
    children = [r["mlflow_run_id"] for r in rows if r["mlflow_run_id"]]
    mlflow = open_comparison(
        mlflow_options.experiment,
        children,
        {**base_tags(torch_stack=False), "dvc_stage": "compare", "strategies": ",".join(names)},
        {"strategies": ",".join(names), "report.target_accuracy": target},
    )

    # the noise estimate: each strategy's seed sweep among the runs in MLflow, if any
    seeds = {r["strategy"]: seed_accuracies(r["mlflow_run_id"]) for r in rows} if mlflow else {}
    answered = answer.recommend(rows, target, seeds)
    answered = replace(answered, unfit=tuple((r.strategy, r.line()) for r in unfit))
    base = next((r for r in rows if r["strategy"] == table.BASELINE), None)
    for row in rows:  # the table's speedups, read against the A/A floor (speed_noise.py)
        row["speedup_within_noise"] = speedup_within_noise(row, base, answered.floor)
    if mlflow is not None and model_of is not None:  # what `register` registers
        log_final_models([r["strategy"] for r in rows if r["mlflow_run_id"]], model_of)
    registered = register(answered, rows, mlflow_options.experiment, mlflow is not None)

    unreachable = "MLflow was unreachable: the runs are not grouped"
    # once every input has been read (a refusal makes no file), the report as one set: the
    # old one stays whole until the new one is (files.staged)
    with staged(REPORTS) as out:
        for name, data in (
            ("summary.json", table.summary_json(rows)),
            ("comparison.json", table.comparison_json(rows)),
            (
                "recommendation.json",
                {
                    **answer.to_json(answered, registered),
                    "did_not_fit": {r.strategy: r.to_json() for r in unfit},
                },
            ),
        ):
            atomic_write(out / name, json.dumps(data, indent=2) + "\n")
        # a column for every strategy dvc.yaml plots (NAMES), and one for an opt-in
        # strategy where it ran
        columns = [*NAMES, *(name for name in OPT_IN if name in histories)]
        for name, field in table.WIDE_PLOTS.items():
            atomic_write(out / name, table.wide_csv(histories, columns, field))
        # the URL alone, to open or script with (`xdg-open $(cat reports/mlflow_url.txt)`)
        atomic_write(out / MLFLOW_URL, (mlflow.url if mlflow else unreachable) + "\n")
        write_plots(rows, histories, target, out)
        md, page = "", ""
        if predicted is not None:
            configs = {name: read_config(name) for name in names}
            md = predicted_section.markdown(predicted, rows, configs)
            page = predicted_section.html_section(predicted, rows, configs)
        atomic_write(
            out / "summary.md",
            with_appendix(
                markdown_page(rows, target, mlflow, answered, registered),
                unfit_section.markdown(unfit) + md,
            ),
        )
        atomic_write(
            out / "index.html",
            with_appendix(
                html_page(rows, target, mlflow, out, answered, registered),
                unfit_section.html_section(unfit) + page,
            ),
        )

    if mlflow is not None:
        close_comparison(
            mlflow.parent_id,
            {r["mlflow_run_id"]: child_metrics(r) for r in rows if r["mlflow_run_id"]},
            [REPORTS / name for name in REPORT_FILES],
            {r["mlflow_run_id"]: child_tags(r) for r in rows if r["mlflow_run_id"]},
            predicted_section.mlflow_metrics(predicted) if predicted else {},
        )
    # the link is hundreds of characters long: its file and the page hold it, not the terminal
    mlflow_line = (
        f"MLflow, these runs side by side: the link in {REPORTS / MLFLOW_URL} and atop the report"
        if mlflow is not None
        else unreachable
    )
    return (
        answer.text(answered, registered, table.TEXT_WIDTH)
        + "\n"
        + table.text_table(rows, target)
        + f"\nReport: {REPORTS / 'index.html'} (per-device memory, plots, notes)\n"
        + mlflow_line
        + "\n"
    )


def register(
    answered: answer.Answer, rows: list[Row], experiment: str, reachable: bool
) -> Registration | None:
    """The recommended strategies' logged models as versions of the registered model named
    after the MLflow experiment: the choice (the throughput pick, else the first objective's)
    under the alias RECOMMENDED, each objective's pick under its own (Recommendation.alias:
    objectives.py), so where the objectives disagree each has its version. None when no
    objective recommends a strategy."""
    choice = answered.choice()
    if choice is None:
        return None
    strategy = choice[1]
    picks = {r.objective: r.pick for r in answered.recommendations if r.pick is not None}
    run_ids = {r["strategy"]: r["mlflow_run_id"] for r in rows}

    def title(s: str) -> str:  # what the strategy is recommended for: "highest throughput"
        titles = [r.title for r in answered.recommendations if picks.get(r.objective) == s]
        return ", ".join(t[:1].lower() + t[1:] for t in titles)

    if not reachable:
        why = "MLflow unreachable"
        return Registration(experiment, strategy, title(strategy), run_ids[strategy], why_not=why)
    versions = {
        s: register_model(experiment, s, title(s), run_ids[s])
        for s in dict.fromkeys([strategy, *picks.values()])
    }
    wanted = {
        r.alias: versions[r.pick] if r.pick is not None else None for r in answered.recommendations
    }
    aliases = set_aliases(experiment, {RECOMMENDED: versions[strategy], **wanted})
    return replace(versions[strategy], aliases=aliases)


def child_metrics(row: Row) -> dict[str, float]:
    return {k: v for k in CHILD_METRICS if (v := row[k]) is not None}


def child_tags(row: Row) -> dict[str, str]:
    """Why a run's speed figures are missing from its metrics, or include warm-up (MLflow
    has no empty metric to say it with)."""
    return {"speed_note": row["speed_note"]} if row["speed_note"] else {}
