"""The MLflow parent run that groups one `compare`'s strategy runs and holds the report."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from pipeline.errors import first_line
from pipeline.tracking.store import param_text, tracking_uri


def open_comparison(experiment: str, tags: dict[str, str], params: dict[str, Any]) -> str | None:
    """Start the parent run that groups one comparison's strategy runs; None if MLflow is
    away (the report is still written; only the grouping is lost)."""
    try:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=tracking_uri())
        found = client.get_experiment_by_name(experiment)
        experiment_id = (
            found.experiment_id if found is not None else client.create_experiment(experiment)
        )
        run_id = client.create_run(experiment_id, run_name="comparison", tags=tags).info.run_id
        client.log_batch(run_id, params=[Param(k, param_text(v)) for k, v in params.items()])
        return run_id
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
    log the comparison's figures into it, attach the report to the parent and finish it."""
    from mlflow.entities import Metric, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri())
    stamp = int(time.time() * 1000)
    for run_id, metrics in children.items():
        try:
            client.log_batch(
                run_id,
                tags=[RunTag("mlflow.parentRunId", parent_id)],
                metrics=[Metric(k, float(v), stamp, 0) for k, v in metrics.items()],
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
    except Exception as err:  # noqa: BLE001
        print(
            f"warning: MLflow comparison run {parent_id} incomplete ({first_line(err)})",
            file=sys.stderr,
            flush=True,
        )
