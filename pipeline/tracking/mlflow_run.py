"""MLflow logging that never loses anything: local first, then published, idempotently.

The writing process keeps the truth on disk (checkpoints/<strategy>/run.json for the run's
identity, params and tags; the per-epoch history in the checkpoint record and results/) and
`Tracker.publish` pushes whatever MLflow does not have yet: it creates the run if needed,
logs params, the epochs MLflow lacks (checked against the server, so a restarted job never
logs an epoch twice), artifacts and the final status. Per epoch it runs on a background
thread (`publish_soon`); the end of the stage waits for it. If the tracking server is down,
training goes on, a warning says what is pending, and the next push (every epoch, at the end
of the stage, or `python -m pipeline.publish`) delivers it. Non-writing ranks get
`NullTracker`.

Tracking URI: MLFLOW_TRACKING_URI, else the embedded store `sqlite:///mlflow.db` at the
repository root (the directory DVC runs stages in).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from pipeline.errors import first_line
from pipeline.files import atomic_write
from pipeline.results import EpochRow
from pipeline.tracking.store import param_text, tracking_uri
from pipeline.tracking.system_metrics import publish_final_sample, system_metrics_monitor

# Fail fast while the server is away (MLflow's default retries for minutes); we retry at the
# next epoch instead, so training never waits on the network for long.
HTTP_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


class NullTracker:
    """What non-writing ranks get, so the loop never asks `if rank == 0`."""

    run_id: Optional[str] = None

    def publish(
        self,
        history: list[EpochRow],
        artifacts: Sequence[Path] = (),
        finished: bool = False,
        status: str = "FINISHED",
        wait_s: float = 0.0,
    ) -> bool:
        return True

    def publish_soon(self, history: list[EpochRow]) -> None:
        pass

    def start_system_metrics(
        self, interval_s: float | None, gpu_uuids: dict[str, str] | None, resume: bool
    ) -> None:
        pass

    def stop_system_metrics(self) -> None:
        pass


class Tracker:
    def __init__(
        self,
        record_path: Path,
        experiment: str,
        run_name: str,
        tags: dict[str, str],
        params: dict[str, Any],
        fingerprint: str,
    ):
        for key, value in HTTP_ENV.items():
            os.environ.setdefault(key, value)
        self.record_path = record_path
        record = self._read()
        if record.get("fingerprint") != fingerprint:  # a new run (not a resumed one)
            record = {
                "fingerprint": fingerprint,
                "run_id": None,
                "experiment": experiment,
                "run_name": run_name,
                "tags": tags,
                "params": {k: param_text(v) for k, v in params.items()},
                "params_logged": False,
                "artifacts_logged": [],
                "status": None,
            }
        self.record = record
        self._write()
        self._warned = False
        self._monitor = None
        self._background: threading.Thread | None = None

    @property
    def run_id(self) -> str | None:
        return self.record["run_id"]

    def _read(self) -> dict:
        try:
            return json.loads(self.record_path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def _write(self) -> None:
        self.record_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.record_path, json.dumps(self.record, indent=1))

    def publish_soon(self, history: list[EpochRow]) -> None:
        """`publish` on a background thread, so the next epoch does not wait for MLflow (tens
        of ms an epoch into SQLite, more over a network: percents of a sub-second GPU epoch).
        A push still running is left alone: pushes are idempotent and the next one delivers
        what it missed. The history on disk (checkpoint record, results/) stays the truth."""
        if self._background is not None and self._background.is_alive():
            return
        self._background = threading.Thread(
            target=self._publish, args=(list(history),), name="mlflow-publish", daemon=True
        )
        self._background.start()

    def publish(
        self,
        history: list[EpochRow],
        artifacts: Sequence[Path] = (),
        finished: bool = False,
        status: str = "FINISHED",
        wait_s: float = 0.0,
    ) -> bool:
        """Push what MLflow lacks. True when nothing is pending; never raises on an outage.
        With wait_s, keep retrying that long first (a tracking server that is restarting
        gets a grace period at the end of a stage). Waits for a background push first."""
        if self._background is not None:
            self._background.join()
            self._background = None
        return self._publish(history, artifacts, finished, status, wait_s)

    def _publish(
        self,
        history: list[EpochRow],
        artifacts: Sequence[Path] = (),
        finished: bool = False,
        status: str = "FINISHED",
        wait_s: float = 0.0,
    ) -> bool:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                publish_run(self.record, history, artifacts, finished, status, save=self._write)
                return True
            except Exception as err:  # noqa: BLE001 - any failure of the server is an outage
                failure = first_line(err)
            if time.monotonic() >= deadline:
                break
            time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
        pending = len(history) - len(self.record.get("epochs_logged", []))
        print(
            f"warning: MLflow at {tracking_uri()} unreachable ({failure}); "
            f"kept locally, pending: {max(pending, 0)} epoch(s)"
            f"{', artifacts' if artifacts else ''}{', final status' if finished else ''}; "
            "retrying at the next epoch, at the end of the stage, or run "
            "`python -m pipeline.publish`",
            file=sys.stderr,
            flush=True,
        )
        return False

    def start_system_metrics(
        self, interval_s: float | None, gpu_uuids: dict[str, str] | None, resume: bool
    ) -> None:
        """MLflow's own sampler (CPU, memory, disk, network and, through NVML, GPU utilisation
        and memory) logging `system/...` into this run every `interval_s` seconds."""
        if interval_s is None or self.run_id is None:
            return  # switched off, or MLflow is away: the timeline is lost, never the run
        try:
            monitor = system_metrics_monitor(
                self.run_id, interval_s, gpu_uuids, resume, tracking_uri()
            )
            monitor.start()
            self._monitor = monitor
        except Exception as err:  # noqa: BLE001 - a timeline is never worth a failed run
            print(
                f"warning: no MLflow system metrics ({first_line(err)})",
                file=sys.stderr,
                flush=True,
            )

    def stop_system_metrics(self) -> None:
        if self._monitor is not None:
            publish_final_sample(self._monitor)
            self._monitor = None


def publish_run(
    record: dict,
    history: list[EpochRow],
    artifacts: Sequence[Path],
    finished: bool,
    status: str,
    save,
) -> None:
    """Push what MLflow lacks of this run, idempotently (also `python -m pipeline.publish`)."""
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri())
    if record["run_id"] is None:
        experiment = client.get_experiment_by_name(record["experiment"])
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else client.create_experiment(record["experiment"])
        )
        run = client.create_run(experiment_id, run_name=record["run_name"], tags=record["tags"])
        record["run_id"] = run.info.run_id
        save()
    run_id = record["run_id"]
    if not record["params_logged"]:
        items = [Param(k, v) for k, v in record["params"].items()]
        for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            client.log_batch(run_id, params=items[i : i + 100])
        client.log_batch(run_id, tags=[RunTag(k, v) for k, v in record["tags"].items()])
        record["params_logged"] = True
        save()
    logged = {m.step for m in client.get_metric_history(run_id, "test_acc")}
    for row in history:
        if row.epoch in logged:
            continue
        stamp = int(time.time() * 1000)
        metrics = [Metric(k, v, stamp, row.epoch) for k, v in row.metrics().items()]
        client.log_batch(run_id, metrics=metrics)
    record["epochs_logged"] = sorted(r.epoch for r in history)
    for path in artifacts:
        if str(path) not in record["artifacts_logged"]:
            client.log_artifact(run_id, str(path))
            record["artifacts_logged"].append(str(path))
    if finished and record.get("status") != status:
        client.set_terminated(run_id, status)
        record["status"] = status
    save()
