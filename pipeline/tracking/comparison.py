"""The MLflow parent run that groups one comparison's strategy runs and holds the report.

A comparison is identified by the strategy runs it compares: `compare` run again over the
same runs updates the same parent instead of adding another, and a parent whose runs have
all moved to a newer comparison is deleted, so the experiment keeps one "comparison" per
set of runs and none empty.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import first_line
from pipeline.tracking import store
from pipeline.tracking.store import compare_runs_url, experiment_id, param_text, tracking_uri

KEY_TAG = "parallel_lab_comparison"  # on the parents compare creates: which runs they group


def comparison_key(children: list[str]) -> str:
    return hashlib.sha256(",".join(sorted(children)).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Comparison:
    """A comparison's place in MLflow: its parent run and the page with its runs side by
    side."""

    parent_id: str
    experiment_id: str
    runs: list[str]

    @property
    def url(self) -> str:
        return compare_runs_url(self.experiment_id, self.runs)


def open_comparison(
    experiment: str, children: list[str], tags: dict[str, str], params: dict[str, Any]
) -> Comparison | None:
    """The parent run for these strategy runs: the one an earlier `compare` made for them,
    or a new one. None if MLflow is away (the report is still written; only the grouping is
    lost)."""
    try:
        from mlflow.entities import Param, RunTag

        client = store.client()
        key = comparison_key(children)
        exp_id = experiment_id(client, experiment)
        earlier = client.search_runs([exp_id], f"tags.{KEY_TAG} = '{key}'", max_results=1)
        if earlier:
            run_id = earlier[0].info.run_id
            client.update_run(run_id, status="RUNNING")
            client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        else:
            run_id = client.create_run(
                exp_id, run_name="comparison", tags={**tags, KEY_TAG: key}
            ).info.run_id
            client.log_batch(run_id, params=[Param(k, param_text(v)) for k, v in params.items()])
        return Comparison(run_id, exp_id, list(children))
    except Exception as err:  # noqa: BLE001 - an outage, as in Tracker.publish
        print(
            f"warning: MLflow at {tracking_uri()} unreachable ({first_line(err)}); the "
            "comparison is not grouped in MLflow",
            file=sys.stderr,
            flush=True,
        )
        return None


def close_comparison(
    parent_id: str, children: dict[str, dict[str, float]], artifacts: list[Path]
) -> None:
    """Nest each strategy run under the parent (the `mlflow.parentRunId` tag the UI reads),
    log the comparison's figures into it (those that changed), attach the report to the
    parent, finish it, and delete the parents left without runs."""
    import time

    from mlflow.entities import Metric, RunTag

    client = store.client()
    stamp = int(time.time() * 1000)
    for run_id, metrics in children.items():
        try:
            logged = client.get_run(run_id).data.metrics
            changed = {k: float(v) for k, v in metrics.items() if logged.get(k) != float(v)}
            client.log_batch(
                run_id,
                tags=[RunTag("mlflow.parentRunId", parent_id)],
                metrics=[Metric(k, v, stamp, 0) for k, v in changed.items()],
            )
        except Exception as err:  # noqa: BLE001 - e.g. a run logged to another tracking store
            print(
                f"warning: MLflow run {run_id} not grouped ({first_line(err)})",
                file=sys.stderr,
                flush=True,
            )
    try:
        for path in artifacts:
            client.log_artifact(parent_id, str(path), artifact_path="report")
        client.set_terminated(parent_id, "FINISHED")
        delete_empty_comparisons(client, client.get_run(parent_id).info.experiment_id)
    except Exception as err:  # noqa: BLE001
        print(
            f"warning: MLflow comparison run {parent_id} incomplete ({first_line(err)})",
            file=sys.stderr,
            flush=True,
        )


def delete_empty_comparisons(client: Any, exp_id: str) -> None:
    """Parents compare made whose strategy runs all moved under another comparison."""
    for parent in client.search_runs([exp_id], f"tags.{KEY_TAG} LIKE '%'"):
        pid = parent.info.run_id
        if not client.search_runs([exp_id], f"tags.`mlflow.parentRunId` = '{pid}'", max_results=1):
            client.delete_run(pid)
