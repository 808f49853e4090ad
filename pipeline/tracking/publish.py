"""Pushing to MLflow what the train stages kept locally while the tracking server was away.

Each writer keeps its run's identity, params and tags in checkpoints/<strategy>/run.json and
its per-epoch history in the checkpoint record (latest.json); `publish_strategy` hands them
to the same idempotent push the stage uses: it creates a missing run, logs the epochs MLflow
lacks (never twice), uploads the artifacts and sets the final status.
"""

from __future__ import annotations

import json

from pipeline.files import atomic_write
from pipeline.results import ARTIFACTS, METRICS, RESULTS, EpochRow
from pipeline.tracking.mlflow_run import publish_run
from pipeline.training.checkpoint import ROOT as CHECKPOINTS


def publish_strategy(name: str) -> str:
    """Push one strategy's local record; a one-line account of what MLflow now holds."""
    record_path = CHECKPOINTS / name / "run.json"
    latest_path = CHECKPOINTS / name / "latest.json"
    if not record_path.exists():
        return f"{name}: nothing recorded locally (not trained yet)"
    record = json.loads(record_path.read_text())
    history = (
        [EpochRow.from_record(r) for r in json.loads(latest_path.read_text())["history"]]
        if latest_path.exists()
        else []
    )
    out = RESULTS / name
    finished = (out / METRICS).exists()
    artifacts = [out / a for a in ARTIFACTS if (out / a).exists()] if finished else []

    def save() -> None:
        atomic_write(record_path, json.dumps(record, indent=1))

    publish_run(record, history, artifacts, finished, "FINISHED", save)
    state = "finished" if finished else "in progress"
    return f"{name}: run {record['run_id']} has {len(history)} epoch(s), {state}"
