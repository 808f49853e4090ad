"""MLflow logging that never loses anything: local first, then published, idempotently.

The writing process keeps the truth on disk: checkpoints/<strategy>/run.json holds the run's
identity, params, tags, the status MLflow should show and the store (tracking URI) the run
lives in; the per-epoch history lives in the checkpoint record and results/. `publish_run`
pushes whatever MLflow does not have yet: it creates the run if needed (pointed at another
store, it creates it there with everything kept on disk), logs params and tags, the epochs
MLflow lacks (checked against the server, so a restarted job never logs an epoch twice, each
stamped with the time the epoch ended), artifacts, and the status. Per epoch it runs on a
background thread (`Tracker.publish_soon`); the end of the stage waits for it. If the
tracking server is down, training goes on, a warning says what is pending, and the next push
(every epoch, at the end of the stage, or `python -m pipeline.publish`) delivers it.
Non-writing ranks get `NullTracker`.

Status: RUNNING while a stage trains (again RUNNING when a stopped run resumes), then
FINISHED, FAILED (an error; the launcher marks a run whose workers died without a word) or
KILLED (SIGTERM: the run checkpointed and `dvc repro` resumes it).

MLflow itself is imported inside the functions that talk to it: it takes about a second to
import, and only the writing rank ever needs it.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

from pipeline.errors import first_line
from pipeline.files import atomic_write
from pipeline.results import EpochRow
from pipeline.tracking import store
from pipeline.tracking.store import experiment_id, param_text, tracking_uri
from pipeline.tracking.system_metrics import publish_final_sample, system_metrics_monitor

RUNNING, FINISHED, FAILED, KILLED = "RUNNING", "FINISHED", "FAILED", "KILLED"


class NullTracker:
    """What non-writing ranks get, so the loop never asks `if rank == 0`."""

    run_id: Optional[str] = None

    def publish(
        self,
        history: list[EpochRow],
        artifacts: Sequence[Path] = (),
        status: Optional[str] = None,
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


def new_record(
    fingerprint: str, experiment: str, run_name: str, tags: dict[str, str], params: dict[str, Any]
) -> dict[str, Any]:
    """run.json of a run not yet created in MLflow."""
    return {
        "fingerprint": fingerprint,
        "run_id": None,
        "tracking_uri": None,
        "experiment": experiment,
        "run_name": run_name,
        "tags": tags,
        "params": {k: param_text(v) for k, v in params.items()},
        "params_logged": False,
        "epochs_logged": [],
        "artifacts_logged": [],
        "status": RUNNING,
        "status_logged": None,
    }


class Tracker:
    """The writer's side of one strategy's MLflow run."""

    def __init__(
        self,
        record_path: Path,
        experiment: str,
        run_name: str,
        tags: dict[str, str],
        params: dict[str, Any],
        fingerprint: str,
    ):
        self.record_path = record_path
        record = read_record(record_path)
        if record.get("fingerprint") != fingerprint:  # a new run (not a resumed one)
            record = new_record(fingerprint, experiment, run_name, tags, params)
        record["status"] = RUNNING  # a resumed run that had failed or was stopped runs again
        self.record = record
        self._write()
        self._monitor = None
        self._background: threading.Thread | None = None

    @property
    def run_id(self) -> str | None:
        return self.record["run_id"]

    def _write(self) -> None:
        write_record(self.record_path, self.record)

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
        status: Optional[str] = None,
        wait_s: float = 0.0,
    ) -> bool:
        """Push what MLflow lacks, and `status` if given. True when nothing is pending; never
        raises on an outage. With wait_s, keep retrying that long first (a tracking server
        that is restarting gets a grace period at the end of a stage). Waits for a
        background push first."""
        if self._background is not None:
            self._background.join()
            self._background = None
        if status is not None:
            self.record["status"] = status
            self._write()
        return self._publish(history, artifacts, wait_s)

    def _publish(
        self, history: list[EpochRow], artifacts: Sequence[Path] = (), wait_s: float = 0.0
    ) -> bool:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                publish_run(self.record, history, artifacts, save=self._write)
                return True
            except Exception as err:  # noqa: BLE001 - any failure of the server is an outage
                failure = first_line(err)
            if time.monotonic() >= deadline:
                break
            time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
        print(
            f"warning: MLflow at {tracking_uri()} unreachable ({failure}); kept locally, "
            f"pending: {pending(self.record, history, artifacts)}; retrying at the next "
            "epoch, at the end of the stage, or run `python -m pipeline.publish`",
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


def read_record(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def write_record(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(record, indent=1))


def pending(record: dict[str, Any], history: list[EpochRow], artifacts: Sequence[Path]) -> str:
    """What MLflow still lacks, in words."""
    epochs = len({r.epoch for r in history} - set(record.get("epochs_logged", [])))
    parts = [f"{epochs} epoch(s)"]
    if set(map(str, artifacts)) - set(record.get("artifacts_logged", [])):
        parts.append("artifacts")
    if record.get("status") != record.get("status_logged"):
        parts.append(f"status {record.get('status')}")
    return ", ".join(parts)


def publish_run(
    record: dict[str, Any],
    history: list[EpochRow],
    artifacts: Sequence[Path],
    save: Callable[[], None],
) -> None:
    """Push what MLflow lacks of this run, idempotently (also `python -m pipeline.publish`)."""
    from mlflow.entities import Metric, Param, RunTag

    client = store.client()
    if record.get("tracking_uri") not in (None, tracking_uri()):
        # The run lives in another store: create it here, with everything kept on disk.
        record.update(
            run_id=None,
            tracking_uri=None,
            params_logged=False,
            epochs_logged=[],
            artifacts_logged=[],
            status_logged=None,
        )
    if record["run_id"] is None:
        run = client.create_run(
            experiment_id(client, record["experiment"]),
            run_name=record["run_name"],
            tags=record["tags"],
        )
        record.update(run_id=run.info.run_id, tracking_uri=tracking_uri(), status_logged=RUNNING)
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
        stamp = int((row.ended_at or time.time()) * 1000)  # when the epoch ended
        client.log_batch(
            run_id, metrics=[Metric(k, v, stamp, row.epoch) for k, v in row.metrics().items()]
        )
    record["epochs_logged"] = sorted(logged | {r.epoch for r in history})
    for path in artifacts:
        if str(path) not in record["artifacts_logged"]:
            client.log_artifact(run_id, str(path))
            record["artifacts_logged"].append(str(path))
    status = record.get("status") or RUNNING
    if status != record.get("status_logged"):
        if status == RUNNING:
            client.update_run(run_id, status=RUNNING)
        else:
            client.set_terminated(run_id, status)
        record["status_logged"] = status
    save()
