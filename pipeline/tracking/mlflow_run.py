"""MLflow logging that never loses anything: local first, then published, idempotently.

The run's writer keeps the truth on disk: checkpoints/<strategy>/run.json holds the run's
identity, params, tags, the status MLflow should show and the store (tracking URI) the run
lives in (`open_record`, written before the first step; no MLflow in the writer); the
per-epoch history lives in the checkpoint record and results/. `publish_run` pushes whatever
MLflow does not have yet: it creates the run if needed (pointed at another store, it creates
it there with everything kept on disk), logs params and tags, the epochs MLflow lacks
(checked against the server, so a restarted job never logs an epoch twice, each stamped with
the time the epoch ended), artifacts, the final model as an MLflow model (once:
`log_final_model`), and the status. The stage's publisher process (publisher.py) calls it
through `kept_runs.publish_strategy` whenever the run's files change and at the end of the
stage; `python -m pipeline.publish` calls it the same way. If the tracking server is down,
training goes on, a warning says what is pending, and the next push delivers it.

Status: RUNNING while a stage trains (again RUNNING when a stopped run resumes), then
FINISHED, FAILED (an error; the launcher marks a run whose workers died without a word) or
KILLED (SIGTERM: the run checkpointed and `dvc repro` resumes it).

MLflow itself is imported inside the functions that talk to it: it takes about a second to
import, and only the publishing process ever needs it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

from pipeline.errors import UserError, first_line
from pipeline.files import atomic_write
from pipeline.results import EpochRow
from pipeline.tracking import store
from pipeline.tracking.store import experiment_id, param_text, tracking_uri

RUNNING, FINISHED, FAILED, KILLED = "RUNNING", "FINISHED", "FAILED", "KILLED"
TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
MODEL_NAME = "model"  # the logged model's name: runs:/<run_id>/model loads it
# The run's final model as MLflow logs it, supplied by training (tracking builds no model):
# () -> (the plain model in eval mode with the run's final weights, an input example: a float32
# numpy batch of normalized test images, [N, 1, 28, 28], the run's final figures by name).
ModelSource = Callable[[], tuple[Any, Any, dict[str, float]]]
# the final figures' prefix as metrics of the logged model (and its run): apart from the
# per-epoch series of the same name (test_acc), grouped in the UI like "system/"
FINAL = "final/"


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
        "model_id": None,  # the MLflow logged model of the final weights, once created
        "model_logged": False,
        "status": RUNNING,
        "status_logged": None,
        "started_at": time.time(),  # the run's start in MLflow, wherever it is created
    }


def open_record(path: Path, new: dict[str, Any], fresh: bool) -> None:
    """The writer's run.json as its run starts, no MLflow involved. `new`: the record of this
    run were it new (`new_record`). `fresh`: the run trains from its first step. Where the
    last run had the same fingerprint and ended (its checkpoints were deleted, say), it gets
    an MLflow run of its own, and that one stays as it ended, with its metrics and artifacts.
    One still RUNNING is this stage's own, whose workers were restarted before their first
    checkpoint: it goes on, as does a stopped or failed run that resumes."""
    record = read_record(path)
    ended = record.get("status", RUNNING) != RUNNING
    if record.get("fingerprint") != new["fingerprint"] or (fresh and ended):  # a new run
        record = new
    record["status"] = RUNNING
    write_record(path, record)


def mark_status(path: Path, status: str) -> None:
    """How a run ended, kept in its run.json by a writer no publisher follows (a worker
    started by hand): `python -m pipeline.publish` pushes it."""
    record = read_record(path)
    if record:
        record["status"] = status
        write_record(path, record)


# run.json's keys and what they hold (`new_record`'s; run_id and tracking_uri may be null)
RECORD_TYPES: dict[str, Any] = {
    "fingerprint": str,
    "run_id": (str, type(None)),
    "tracking_uri": (str, type(None)),
    "experiment": str,
    "run_name": str,
    "tags": dict,
    "params": dict,
    "params_logged": bool,
    "epochs_logged": list,
    "artifacts_logged": list,
    "status": str,
}


def read_record(path: Path) -> dict[str, Any]:
    """run.json, checked; {} where there is none. A corrupt one is refused rather than taken
    for none, which would start another MLflow run and lose the link to this one."""
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:  # ValueError: JSON's and UTF-8's errors
        problem: str | None = first_line(err)
    else:
        problem = _record_problem(record)
    if problem is not None:
        raise UserError(
            f"{path}: corrupt MLflow run record ({problem}); delete it (rm {path}) and run "
            "the train stage again: the run's epochs go to a new MLflow run"
        )
    assert isinstance(record, dict)  # _record_problem refuses anything else
    return record


def _record_problem(record: Any) -> str | None:
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, expected an object"
    for key, kind in RECORD_TYPES.items():
        if not isinstance(record.get(key), kind):
            return f"{key}: got {record.get(key)!r:.40}"
    if record["status"] not in (RUNNING, FINISHED, FAILED, KILLED):
        return f"status: got {record['status']!r:.40}"
    started = record.get("started_at", 0.0)  # records of earlier versions have none
    if isinstance(started, bool) or not isinstance(started, (int, float)):
        return f"started_at: got {started!r:.40}"
    return None


def write_record(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(record, indent=1))


def pending(
    record: dict[str, Any],
    history: list[EpochRow],
    artifacts: Sequence[Path],
    model: Optional[ModelSource] = None,
) -> str:
    """What MLflow still lacks, in words."""
    epochs = len({r.epoch for r in history} - set(record.get("epochs_logged", [])))
    parts = [f"{epochs} epoch(s)"]
    if set(map(str, artifacts)) - set(record.get("artifacts_logged", [])):
        parts.append("artifacts")
    if model is not None and not record.get("model_logged"):
        parts.append("the logged model")
    if record.get("status") != record.get("status_logged"):
        parts.append(f"status {record.get('status')}")
    return ", ".join(parts)


def publish_run(
    record: dict[str, Any],
    history: list[EpochRow],
    artifacts: Sequence[Path],
    save: Callable[[], None],
    model: Optional[ModelSource] = None,
) -> None:
    """Push what MLflow lacks of this run, idempotently (also `python -m pipeline.publish`);
    `model`: the final model, logged once (`log_final_model`)."""
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
            model_id=None,
            model_logged=False,
            status_logged=None,
        )
    if record["run_id"] is None:
        started = record.get("started_at")  # absent from records of earlier versions
        run = client.create_run(
            experiment_id(client, record["experiment"]),
            start_time=int(started * 1000) if started else None,
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
    if model is not None and not record.get("model_logged"):
        log_final_model(client, record, model, save)
    status = record.get("status") or RUNNING
    if status != record.get("status_logged"):
        if status == RUNNING:
            client.update_run(run_id, status=RUNNING)
        else:
            client.set_terminated(run_id, status, end_time=finished_at_ms(status, history))
        record["status_logged"] = status
    save()


def finished_at_ms(status: str, history: list[EpochRow]) -> int | None:
    """When a FINISHED run ended: its last epoch's end. A stage run again that finds nothing
    left to train (its finished checkpoint) then leaves the run's end, and the duration MLflow
    shows, as they were, and a run pushed to another store later keeps its own. A stopped or
    failed run ends now (None)."""
    ends = [row.ended_at for row in history if row.ended_at]
    return int(max(ends) * 1000) if status == FINISHED and ends else None


def log_final_model(
    client: Any, record: dict[str, Any], model: ModelSource, save: Callable[[], None]
) -> None:
    """The final weights as the MLflow model "model" of the run (`mlflow.pytorch.log_model`:
    `runs:/<run_id>/model` loads it), with a signature and an input example, and the run's
    final figures logged against it (FINAL + name, e.g. "final/test_acc"), so MLflow's
    logged-model view compares and ranks the strategies' models. The record keeps the logged
    model's id as soon as it exists and marks it logged at the end: an interrupted attempt is
    finished in the same logged model, a re-publish logs nothing."""
    import mlflow.pytorch
    import torch
    from mlflow.entities import Metric

    run_id = record["run_id"]
    if record.get("model_id") is None:
        experiment = client.get_run(run_id).info.experiment_id
        created = client.create_logged_model(experiment, name=MODEL_NAME, source_run_id=run_id)
        record["model_id"] = created.model_id
        save()
    module, example, figures = model()
    with torch.no_grad():
        output = module(torch.from_numpy(example)).numpy()
    with fluent_store(tracking_uri()):
        mlflow.pytorch.log_model(
            module,
            name=MODEL_NAME,
            model_id=record["model_id"],
            run_id=run_id,
            signature=tensor_signature(example, output),
            input_example=example,
            # as given, not inferred (inference loads the model in a subprocess: seconds)
            pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"],
            validate_serving_input=False,  # a second load and prediction; the tests load it
        )
    stamp = int(time.time() * 1000)
    metrics = [
        Metric(FINAL + k, v, stamp, 0, model_id=record["model_id"]) for k, v in figures.items()
    ]
    client.log_batch(run_id, metrics=metrics)
    record["model_logged"] = True
    save()


def tensor_signature(example: Any, output: Any) -> Any:
    """The signature `mlflow.models.infer_signature` gives two numpy batches: a tensor of each
    one's dtype and shape, the batch dimension left free (-1). Built here because inferring it
    imports scipy, which a GPU machine with its own torch would need carried for nothing but
    this (benchmarks/gpu_wheels.py)."""
    from mlflow.models import ModelSignature
    from mlflow.types import Schema, TensorSpec

    def spec(batch: Any) -> Any:
        return Schema([TensorSpec(batch.dtype, (-1, *batch.shape[1:]))])

    return ModelSignature(inputs=spec(example), outputs=spec(output))


@contextmanager
def fluent_store(uri: str) -> Iterator[None]:
    """MLflow's fluent API (`mlflow.pytorch.log_model` takes no client) pointed at `uri` for a
    while, through the variable it reads; `mlflow.set_tracking_uri` would leave it pointed
    there for good, and unset the variable when put back."""
    before = os.environ.get(TRACKING_URI_ENV)
    os.environ[TRACKING_URI_ENV] = uri
    try:
        yield
    finally:
        if before is None:
            del os.environ[TRACKING_URI_ENV]
        else:
            os.environ[TRACKING_URI_ENV] = before
