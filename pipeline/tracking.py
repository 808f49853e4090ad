"""MLflow logging that never loses anything: local first, then synced, idempotently.

The writing process keeps the truth on disk (checkpoints/<strategy>/run.json for the run's
identity, params and tags; the per-epoch history in the checkpoint record and results/) and
`Tracker.sync` pushes whatever MLflow does not have yet: it creates the run if needed, logs
params, the epochs MLflow lacks (checked against the server, so a restarted job never logs an
epoch twice), artifacts and the final status. Per epoch it runs on a background thread
(`sync_soon`); the end of the stage waits for it. If the tracking server is down, training goes
on, a warning says what is pending, and the next sync (every epoch, at the end of the stage,
or `python -m pipeline.sync`) delivers it. Non-writing ranks get `NullTracker`.

Tracking URI: MLFLOW_TRACKING_URI, else the embedded store `sqlite:///mlflow.db` at the
repository root (the directory DVC runs stages in).
"""
from __future__ import annotations

import json
import os
import platform
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pipeline.errors import UserError
from pipeline.provenance import stack_tags

KNOWN_SCHEMES = {"http", "https", "sqlite", "postgresql", "mysql", "mssql", "file",
                 "databricks"}
# Fail fast while the server is away (MLflow's default retries for minutes); we retry at the
# next epoch instead, so training never waits on the network for long.
HTTP_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def check_tracking_uri(uri: str) -> None:
    """Refuse a malformed URI up front; an unreachable one is an outage, handled later."""
    parsed = urlparse(uri)
    if parsed.scheme == "" or (len(parsed.scheme) == 1 and uri[1:3] in (":\\", ":/")):
        return  # a local directory (file store)
    if parsed.scheme not in KNOWN_SCHEMES:
        raise UserError(f"MLFLOW_TRACKING_URI: got {uri!r}, expected http(s)://host:port, "
                        "sqlite:///path/mlflow.db, postgresql://..., file:/path or a directory")
    if parsed.scheme in ("http", "https") and (not parsed.hostname or _bad_port(parsed)):
        raise UserError(f"MLFLOW_TRACKING_URI: got {uri!r}, expected http(s)://host[:port]")


def _bad_port(parsed) -> bool:
    try:
        parsed.port
    except ValueError:
        return True
    return False


def git_state(cwd: Path | None = None) -> dict[str, str]:
    """Commit and dirty flag of the repository, or 'unknown' outside one."""
    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                                  check=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": commit or "unknown",
            "git_dirty": "unknown" if status is None else str(bool(status)).lower()}


def base_tags() -> dict[str, str]:
    git = git_state()
    return {**git, "mlflow.source.git.commit": git["git_commit"],
            "hostname": socket.gethostname(), "python": platform.python_version(),
            **stack_tags()}


class NullTracker:
    """What non-writing ranks get, so the loop never asks `if rank == 0`."""

    run_id = None

    def sync(self, history: list[dict], artifacts: list[Path] = (), finished: bool = False,
             status: str = "FINISHED", wait_s: float = 0.0) -> bool:
        return True

    def sync_soon(self, history: list[dict]) -> None:
        pass

    def start_system_metrics(self, interval_s: float | None, gpu_uuids: dict[str, str] | None,
                             resume: bool) -> None:
        pass

    def stop_system_metrics(self) -> None:
        pass


class Tracker:
    def __init__(self, record_path: Path, experiment: str, run_name: str,
                 tags: dict[str, str], params: dict[str, Any], fingerprint: str):
        for key, value in HTTP_ENV.items():
            os.environ.setdefault(key, value)
        self.record_path = record_path
        record = self._read()
        if record.get("fingerprint") != fingerprint:  # a new run (not a resumed one)
            record = {"fingerprint": fingerprint, "run_id": None, "experiment": experiment,
                      "run_name": run_name, "tags": tags,
                      "params": {k: _text(v) for k, v in params.items()},
                      "params_logged": False, "artifacts_logged": [], "status": None}
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
        tmp = self.record_path.with_name(f".{self.record_path.name}.tmp")
        tmp.write_text(json.dumps(self.record, indent=1))
        os.replace(tmp, self.record_path)

    def sync_soon(self, history: list[dict]) -> None:
        """`sync` on a background thread, so the next epoch does not wait for MLflow (tens of
        ms an epoch into SQLite, more over a network: percents of a sub-second GPU epoch).
        A sync still running is left alone: syncs are idempotent and the next one pushes
        what it missed. The history on disk (checkpoint record, results/) stays the truth."""
        if self._background is not None and self._background.is_alive():
            return
        self._background = threading.Thread(target=self._sync, args=(list(history),),
                                            name="mlflow-sync", daemon=True)
        self._background.start()

    def sync(self, history: list[dict], artifacts: list[Path] = (), finished: bool = False,
             status: str = "FINISHED", wait_s: float = 0.0) -> bool:
        """Push what MLflow lacks. True when nothing is pending; never raises on an outage.
        With wait_s, keep retrying that long first (a tracking server that is restarting
        gets a grace period at the end of a stage). Waits for a background sync first."""
        if self._background is not None:
            self._background.join()
            self._background = None
        return self._sync(history, artifacts, finished, status, wait_s)

    def _sync(self, history: list[dict], artifacts: list[Path] = (), finished: bool = False,
              status: str = "FINISHED", wait_s: float = 0.0) -> bool:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                push(self.record, history, artifacts, finished, status, save=self._write)
                return True
            except Exception as err:  # noqa: BLE001 - any failure of the server is an outage
                failure = _first_line(err)
            if time.monotonic() >= deadline:
                break
            time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
        pending = len(history) - len(self.record.get("epochs_logged", []))
        print(f"warning: MLflow at {tracking_uri()} unreachable ({failure}); "
              f"kept locally, pending: {max(pending, 0)} epoch(s)"
              f"{', artifacts' if artifacts else ''}{', final status' if finished else ''}; "
              "retrying at the next epoch, at the end of the stage, or run "
              "`python -m pipeline.sync`", file=sys.stderr, flush=True)
        return False

    def start_system_metrics(self, interval_s: float | None, gpu_uuids: dict[str, str] | None,
                             resume: bool) -> None:
        """MLflow's own sampler (CPU, memory, disk, network and, through NVML, GPU utilisation
        and memory) logging `system/...` into this run every `interval_s` seconds."""
        if interval_s is None or self.run_id is None:
            return  # switched off, or MLflow is away: the timeline is lost, never the run
        try:
            self._monitor = system_metrics_monitor(self.run_id, interval_s, gpu_uuids, resume)
            self._monitor.start()
        except Exception as err:  # noqa: BLE001 - a timeline is never worth a failed run
            print(f"warning: no MLflow system metrics ({_first_line(err)})", file=sys.stderr,
                  flush=True)

    def stop_system_metrics(self) -> None:
        if self._monitor is not None:
            publish_final_sample(self._monitor)
            self._monitor = None


def publish_final_sample(monitor) -> None:
    """Stop MLflow's sampler and log one last sample, the run's final state.

    MLflow 3.17 publishes only whole sampling windows and drops the open one at shutdown, so
    a run shorter than the interval would have no `system/...` metrics at all (and every run
    lost its tail). Once the thread has joined, nothing else touches the monitors.
    """
    monitor.finish()
    try:
        monitor.collect_metrics()
        monitor.publish_metrics(monitor.aggregate_metrics())
        monitor.mlflow_logger.flush()
    except Exception as err:  # noqa: BLE001 - as in start_system_metrics
        print(f"warning: last MLflow system-metrics sample not logged ({_first_line(err)})",
              file=sys.stderr, flush=True)


def system_metrics_monitor(run_id: str, interval_s: float, gpu_uuids: dict[str, str] | None,
                           resume: bool):
    """MLflow's SystemMetricsMonitor, its NVML monitor narrowed to the run's GPUs.

    MLflow 3.17's GPUMonitor samples every GPU NVML sees (handles 0..nvmlDeviceGetCount-1)
    and names them by that position. The run's GPUs are looked up by UUID instead (NVML's
    order is PCI order, not necessarily CUDA's) and their metrics renamed to the physical ids
    the rest of the run uses: system/gpu_5_utilization_percentage is GPU 5. A CPU run drops
    the GPU monitor, so it logs no other job's GPUs.
    """
    from mlflow.system_metrics.metrics.gpu_monitor import GPUMonitor
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    monitor = SystemMetricsMonitor(run_id, sampling_interval=interval_s,
                                   resume_logging=resume, tracking_uri=tracking_uri())
    others = [m for m in monitor.monitors if not isinstance(m, GPUMonitor)]
    if len(others) == len(monitor.monitors) or gpu_uuids is None:
        return monitor  # no NVML, or the run's GPUs are unknown: MLflow's default stands
    try:
        monitor.monitors = others + ([_run_gpu_monitor(GPUMonitor, gpu_uuids)]
                                     if gpu_uuids else [])
    except Exception as err:  # noqa: BLE001 - e.g. a MIG slice NVML finds by another UUID
        print(f"warning: system metrics cover every GPU NVML sees: cannot find the run's "
              f"({_first_line(err)})", file=sys.stderr, flush=True)
    return monitor


def _run_gpu_monitor(base: type, gpu_uuids: dict[str, str]):
    import pynvml

    class RunGPUMonitor(base):
        def __init__(self):
            super().__init__()
            self.gpu_handles = [pynvml.nvmlDeviceGetHandleByUUID(u) for u in gpu_uuids.values()]

        def aggregate_metrics(self):
            return renumber_gpu_keys(super().aggregate_metrics(), list(gpu_uuids))

    return RunGPUMonitor()


def renumber_gpu_keys(metrics: dict[str, float], ids: list[str]) -> dict[str, float]:
    """gpu_<position>_... -> gpu_<physical id>_...: ids[i] is the id of the i-th handle."""
    return {re.sub(r"^gpu_(\d+)_", lambda m: f"gpu_{ids[int(m[1])]}_", k): v
            for k, v in metrics.items()}


def open_comparison(experiment: str, tags: dict[str, str], params: dict[str, Any]) -> str | None:
    """Start the parent run that groups one comparison's strategy runs; None if MLflow is
    away (the report is still written; only the grouping is lost)."""
    try:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=tracking_uri())
        found = client.get_experiment_by_name(experiment)
        experiment_id = (found.experiment_id if found is not None
                         else client.create_experiment(experiment))
        run_id = client.create_run(experiment_id, run_name="comparison", tags=tags).info.run_id
        client.log_batch(run_id, params=[Param(k, _text(v)) for k, v in params.items()])
        return run_id
    except Exception as err:  # noqa: BLE001 - an outage, as in Tracker.sync
        print(f"warning: MLflow at {tracking_uri()} unreachable ({_first_line(err)}); the "
              "comparison is not grouped in MLflow", file=sys.stderr, flush=True)
        return None


def close_comparison(parent_id: str, children: dict[str, dict[str, float]],
                     artifacts: list[Path]) -> None:
    """Nest each strategy run under the parent (the `mlflow.parentRunId` tag the UI reads),
    log the comparison's figures into it, attach the report to the parent and finish it."""
    from mlflow.entities import Metric, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri())
    stamp = int(time.time() * 1000)
    for run_id, metrics in children.items():
        try:
            client.log_batch(run_id, tags=[RunTag("mlflow.parentRunId", parent_id)],
                             metrics=[Metric(k, float(v), stamp, 0) for k, v in metrics.items()])
        except Exception as err:  # noqa: BLE001 - e.g. a run logged to another tracking store
            print(f"warning: MLflow run {run_id} not grouped ({_first_line(err)})",
                  file=sys.stderr, flush=True)
    try:
        for path in artifacts:
            client.log_artifact(parent_id, str(path), artifact_path="report")
        client.set_terminated(parent_id, "FINISHED")
    except Exception as err:  # noqa: BLE001
        print(f"warning: MLflow comparison run {parent_id} incomplete ({_first_line(err)})",
              file=sys.stderr, flush=True)


def push(record: dict, history: list[dict], artifacts: list[Path], finished: bool,
         status: str, save) -> None:
    """The idempotent sync itself (also used by `python -m pipeline.sync`)."""
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri())
    if record["run_id"] is None:
        experiment = client.get_experiment_by_name(record["experiment"])
        experiment_id = (experiment.experiment_id if experiment is not None
                         else client.create_experiment(record["experiment"]))
        run = client.create_run(experiment_id, run_name=record["run_name"],
                                tags=record["tags"])
        record["run_id"] = run.info.run_id
        save()
    run_id = record["run_id"]
    if not record["params_logged"]:
        items = [Param(k, v) for k, v in record["params"].items()]
        for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            client.log_batch(run_id, params=items[i:i + 100])
        client.log_batch(run_id, tags=[RunTag(k, v) for k, v in record["tags"].items()])
        record["params_logged"] = True
        save()
    logged = {m.step for m in client.get_metric_history(run_id, "test_acc")}
    for row in history:
        step = int(row["epoch"])
        if step in logged:
            continue
        stamp = int(time.time() * 1000)
        metrics = [Metric(k, float(v), stamp, step) for k, v in row.items()
                   if k != "epoch" and isinstance(v, (int, float))]
        client.log_batch(run_id, metrics=metrics)
    record["epochs_logged"] = sorted(int(r["epoch"]) for r in history)
    for path in artifacts:
        if str(path) not in record["artifacts_logged"]:
            client.log_artifact(run_id, str(path))
            record["artifacts_logged"].append(str(path))
    if finished and record.get("status") != status:
        client.set_terminated(run_id, status)
        record["status"] = status
    save()


def _text(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 6000 else text[:5997] + "..."


def _first_line(err: Exception) -> str:
    lines = str(err).strip().splitlines()
    return (lines[0] if lines else type(err).__name__)[:300]
