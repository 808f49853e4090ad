"""The compare stage's work: results/<strategy>/ of every strategy -> reports/, and the
strategy runs grouped in MLflow under a parent run "comparison" holding the report; the
recommended strategy's model registered in MLflow.

reports/:
  summary.md, index.html  the answer (answer.py), the table (table.py) and the plots
                          (plots.py; pages.py)
  recommendation.json     the answer: one recommendation per objective, with its reasons
  summary.json            every column, keyed by strategy (DVC metrics)
  accuracy.csv            test accuracy by epoch, one column per strategy (DVC plots)
  accuracy_vs_epoch.png, accuracy_vs_time.png, throughput.png, memory.png
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.config import MlflowConfig, ReportConfig
from pipeline.files import atomic_write
from pipeline.reporting import answer, table
from pipeline.reporting.pages import html_page, markdown_page
from pipeline.reporting.plots import PLOTS, write_plots
from pipeline.results import read_history, read_summary
from pipeline.strategies import NAMES, check_names
from pipeline.tracking.comparison import (
    Registration,
    close_comparison,
    open_comparison,
    register_model,
    seed_accuracies,
)
from pipeline.tracking.provenance import base_tags
from pipeline.tracking.publish import current_run_id

REPORTS = Path("reports")
# the figures MLflow gets per strategy run, beside its per-epoch metrics
CHILD_METRICS = (
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
    "recommendation.json",
    "accuracy.csv",
    *PLOTS,
)


def compare(names: list[str], report: ReportConfig, mlflow_options: MlflowConfig) -> str:
    """Write reports/ for the strategies `names`, group their runs in MLflow and register the
    recommended strategy's model; returns the answer and the table as markdown and the MLflow
    page that shows the runs side by side."""
    check_names(names)
    target = report.target_accuracy
    results = [read_summary(name) for name in names]
    histories = {name: read_history(name) for name in names}
    rows = table.comparison_rows(results, histories, target)
    for row, result in zip(rows, results):  # the runs as the store MLflow points at holds them
        row["mlflow_run_id"] = current_run_id(result.strategy, result.fingerprint)
    children = [r["mlflow_run_id"] for r in rows if r["mlflow_run_id"]]
    mlflow = open_comparison(
        mlflow_options.experiment,
        children,
        {**base_tags(), "dvc_stage": "compare", "strategies": ",".join(names)},
        {"strategies": ",".join(names), "report.target_accuracy": target},
    )

    # the noise estimate: each strategy's seed sweep among the runs in MLflow, if any
    seeds = {r["strategy"]: seed_accuracies(r["mlflow_run_id"]) for r in rows} if mlflow else {}
    answered = answer.recommend(rows, target, seeds)
    registered = register(answered, rows, mlflow_options.experiment, mlflow is not None)

    REPORTS.mkdir(exist_ok=True)  # once every input has been read: a refusal makes none
    atomic_write(REPORTS / "summary.json", json.dumps(table.summary_json(rows), indent=2) + "\n")
    atomic_write(
        REPORTS / "recommendation.json",
        json.dumps(answer.to_json(answered, registered), indent=2) + "\n",
    )
    atomic_write(REPORTS / "accuracy.csv", table.accuracy_wide(histories, list(NAMES)))
    write_plots(rows, histories, target, REPORTS)
    atomic_write(REPORTS / "summary.md", markdown_page(rows, target, mlflow, answered, registered))
    atomic_write(
        REPORTS / "index.html", html_page(rows, target, mlflow, REPORTS, answered, registered)
    )

    if mlflow is not None:
        close_comparison(
            mlflow.parent_id,
            {r["mlflow_run_id"]: child_metrics(r) for r in rows if r["mlflow_run_id"]},
            [REPORTS / name for name in REPORT_FILES],
            {r["mlflow_run_id"]: child_tags(r) for r in rows if r["mlflow_run_id"]},
        )
    where = (
        f"MLflow, these runs side by side: {mlflow.url}"
        if mlflow is not None
        else "MLflow was unreachable: the runs are not grouped"
    )
    return (
        answer.markdown(answered, registered)
        + "\n"
        + table.markdown_table(rows, target)
        + f"\n{where}\n"
    )


def register(
    answered: answer.Answer, rows: list[dict], experiment: str, reachable: bool
) -> Registration | None:
    """The recommended strategy's logged model as a new version of the registered model named
    after the MLflow experiment (the throughput pick, else the first objective's); None when
    no objective recommends a strategy."""
    choice = answered.choice()
    if choice is None:
        return None
    objective, strategy = choice
    title = next(r.title for r in answered.recommendations if r.objective == objective)
    title = title[:1].lower() + title[1:]
    run_id = next(r["mlflow_run_id"] for r in rows if r["strategy"] == strategy)
    if not reachable:
        return Registration(experiment, strategy, title, run_id, why_not="MLflow unreachable")
    return register_model(experiment, strategy, title, run_id)


def child_metrics(row: dict) -> dict[str, float]:
    return {k: row[k] for k in CHILD_METRICS if row[k] is not None}


def child_tags(row: dict) -> dict[str, str]:
    """Why a run's speed figures are missing from its metrics, or include warm-up (MLflow
    has no empty metric to say it with)."""
    return {"speed_note": row["speed_note"]} if row["speed_note"] else {}
