"""A run that fails after it started never leaves its MLflow run RUNNING, bad input found
mid-run included; a stage refused before its run reopened leaves an earlier run as it ended.
Real SQLite stores; the session in one process."""

from __future__ import annotations

import json
import signal

import pytest
from mlflow.tracking import MlflowClient

from pipeline.config import load_config
from pipeline.context import DistContext
from pipeline.data.download import convert
from pipeline.data.fashion_mnist import ARRAYS, DATA_DIR, train_samples, write_arrays
from pipeline.errors import UserError
from pipeline.results import CHECKPOINT_RECORD, CHECKPOINTS, RUN_RECORD
from pipeline.run_spec import resolve_run
from pipeline.tracking.kept_runs import publish_strategy
from pipeline.tracking.mlflow_run import FAILED, KILLED, RUNNING, new_record
from pipeline.tracking.stage_end import settle_run
from pipeline.training import session
from pipeline.training.trainer import Trainer
from support import empty_store

# one process, no process group: DCP says it saves and loads locally, as meant here
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

CPU = DistContext(rank=0, local_rank=0, world_size=1, gpus=())
TINY = [
    "model.width=4",
    "train.epochs=2",
    "train.batch_size=16",
    "data.limit_train=64",
    "data.limit_test=32",
    "mlflow.experiment=tests",
    "mlflow.log_model=false",
    "report.system_metrics_interval_s=null",
    "report.log_every_s=null",
]


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A project directory with its MLflow store: the client that reads it."""
    monkeypatch.chdir(tmp_path)
    empty_store(tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    return MlflowClient()


def statuses(client: MlflowClient) -> list[str]:
    experiment = client.get_experiment_by_name("tests")
    if experiment is None:
        return []
    return [r.info.status for r in client.search_runs([experiment.experiment_id])]


def test_bad_input_found_mid_run_leaves_the_run_failed(store, raw_dataset, monkeypatch):
    """The worker's user-error path: the session's run was open (its first epoch trained)
    when the error came, and it ends FAILED, in run.json and, pushed from there as a worker
    started by hand is (no launcher, so no publisher), in MLflow."""
    DATA_DIR.mkdir(parents=True)
    write_arrays(DATA_DIR / ARRAYS, convert(raw_dataset[0]))

    def bad_input(*args, **kwargs):
        raise UserError("found mid-run")

    monkeypatch.setattr(Trainer, "evaluate", bad_input)  # after the first epoch's steps
    sigterm = signal.getsignal(signal.SIGTERM)  # the session installs its own
    try:
        with pytest.raises(UserError, match="found mid-run"):
            cfg = load_config(None, TINY)
            job = (CPU.world_size, train_samples(cfg.data.limit_train))  # as the worker's
            trainer, kept = session.start(resolve_run(cfg, "single", job), CPU)
            trainer.fit(kept)
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    assert json.loads((CHECKPOINTS / "single" / RUN_RECORD).read_text())["status"] == FAILED
    publish_strategy("single")
    assert statuses(store) == [FAILED]


def write_run_record(status: str) -> None:
    record = {**new_record("f", "tests", "single", {}, {}), "status": status}
    (CHECKPOINTS / "single").mkdir(parents=True)
    (CHECKPOINTS / "single" / RUN_RECORD).write_text(json.dumps(record))


def test_the_launcher_marks_a_run_a_user_error_left_running(store):
    """A torchrun restart that met bad input before its workers reopened the run: nobody
    ended it, so the launcher does."""
    write_run_record(RUNNING)
    settle_run("single", FAILED, user_error=True)
    assert json.loads((CHECKPOINTS / "single" / RUN_RECORD).read_text())["status"] == FAILED
    assert statuses(store) == [FAILED]


def test_a_refused_stage_leaves_an_earlier_run_as_it_ended(store):
    """A run stopped at a checkpoint (KILLED, to be resumed) is not made FAILED by a later
    stage that bad input stopped before it reopened the run; MLflow is not even asked."""
    write_run_record(KILLED)
    settle_run("single", FAILED, user_error=True)
    assert json.loads((CHECKPOINTS / "single" / RUN_RECORD).read_text())["status"] == KILLED
    assert statuses(store) == []


def test_a_run_that_died_before_its_first_checkpoint_beside_an_older_one(store):
    """A new configuration's run killed in its first epoch, where the previous
    configuration's checkpoint still stands: the launcher marks it FAILED all the same,
    without taking any of the older run's epochs."""
    write_run_record(RUNNING)
    older = {"fingerprint": "older", "epoch": 1, "step": 0, "history": [], "world_size": 1}
    (CHECKPOINTS / "single" / CHECKPOINT_RECORD).write_text(json.dumps(older))
    settle_run("single", FAILED)
    assert statuses(store) == [FAILED]
    run_id = json.loads((CHECKPOINTS / "single" / RUN_RECORD).read_text())["run_id"]
    assert store.get_metric_history(run_id, "test_acc") == []
