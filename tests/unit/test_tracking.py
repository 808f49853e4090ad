"""The MLflow tracker against real (SQLite) stores: background pushes, statuses, timestamps,
step metrics, moving to another store, system metrics, and the comparison parent run."""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
from mlflow.tracking import MlflowClient

from pipeline.errors import UserError
from pipeline.results import EpochRow
from pipeline.tracking.kept_runs import publish_strategy
from pipeline.tracking.mlflow_run import MlflowTracker, new_record
from support import wait_for


@pytest.fixture
def tracker(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    tracker = MlflowTracker(
        tmp_path / "run.json", new_record("f", "tests", "run", {}, {"lr": 0.1}), fresh=True
    )
    tracker.publish([])
    return tracker


def epoch(n: int, ended_at: float = 0.0) -> EpochRow:
    return EpochRow(
        n,
        train_loss=1.0 / n,
        train_acc=0.5,
        test_loss=1.0,
        test_acc=0.5 + n / 100,
        epoch_seconds=1.0,
        samples_per_s=100.0,
        wall_seconds=float(n),
        ended_at=ended_at,
    )


def test_background_syncs_then_the_final_one_deliver_every_epoch_once(tracker):
    history = []
    for n in (1, 2, 3):
        history.append(epoch(n))
        tracker.publish_soon(history)  # returns at once; a push still running takes it next
    assert tracker.publish(history, status="FINISHED")  # waits for the background push first
    client = MlflowClient()
    run = client.get_run(tracker.run_id)
    assert run.info.status == "FINISHED" and run.data.params["lr"] == "0.1"
    steps = [m.step for m in client.get_metric_history(tracker.run_id, "test_acc")]
    assert sorted(steps) == [1, 2, 3]


def test_an_epoch_asked_for_while_the_run_opens_arrives_without_another_push(tmp_path, monkeypatch):
    """The writer may hold after its first epoch (a fault, a slow step): that epoch must reach
    MLflow though no later push comes to carry it."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    tracker = MlflowTracker(
        tmp_path / "run.json", new_record("f", "tests", "run", {}, {}), fresh=True
    )
    opening = threading.Event()
    tracker.open_soon([], then=opening.wait)  # the open's thread busy until released
    tracker.publish_soon([epoch(1)])
    opening.set()
    client = MlflowClient()
    wait_for(
        lambda: tracker.run_id and client.get_metric_history(tracker.run_id, "test_acc"),
        60,
        "epoch 1 in MLflow",
    )
    tracker.close()


def test_a_run_shorter_than_the_sampling_interval_still_gets_system_metrics(tracker):
    # MLflow publishes only whole sampling windows; the tracker logs the open one at the end
    tracker.start_system_metrics(60.0, gpu_uuids=None, resume=False)
    tracker.close()
    tracker.publish([], status="FINISHED")
    run = MlflowClient().get_run(tracker.run_id)
    assert "system/cpu_utilization_percentage" in run.data.metrics
    assert 0 <= run.data.metrics["system/cpu_utilization_percentage"] <= 100


def test_statuses_follow_the_stage_and_a_resumed_run_runs_again(tracker, tmp_path):
    client = MlflowClient()
    assert client.get_run(tracker.run_id).info.status == "RUNNING"
    tracker.publish([epoch(1)], status="KILLED")  # SIGTERM: checkpointed, to be resumed
    assert client.get_run(tracker.run_id).info.status == "KILLED"
    resumed = MlflowTracker(
        tmp_path / "run.json", new_record("f", "tests", "run", {}, {"lr": 0.1}), fresh=False
    )
    resumed.publish([epoch(1)])
    assert resumed.run_id == tracker.run_id
    assert client.get_run(tracker.run_id).info.status == "RUNNING"
    resumed.publish([epoch(1), epoch(2)], status="FINISHED")
    assert client.get_run(tracker.run_id).info.status == "FINISHED"


def test_a_fresh_start_of_the_same_identity_gets_a_run_of_its_own(tracker, tmp_path):
    """Its checkpoints gone (or never written), the same configuration trains from scratch:
    a new MLflow run with its own epochs and artifacts; the old one stays as it ended."""
    client = MlflowClient()
    tracker.publish([epoch(1), epoch(2)], status="FINISHED")
    again = MlflowTracker(
        tmp_path / "run.json", new_record("f", "tests", "run", {}, {"lr": 0.1}), fresh=True
    )
    again.publish([epoch(1)])
    assert again.run_id != tracker.run_id
    assert client.get_run(tracker.run_id).info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(tracker.run_id, "test_acc")] == [1, 2]
    assert [m.step for m in client.get_metric_history(again.run_id, "test_acc")] == [1]


def test_epochs_are_stamped_when_they_ended_not_when_they_were_pushed(tracker):
    ended = [1_700_000_000.0, 1_700_000_123.5]  # an outage in between: pushed together later
    tracker.publish([epoch(1, ended[0]), epoch(2, ended[1])])
    history = MlflowClient().get_metric_history(tracker.run_id, "test_acc")
    assert [m.timestamp for m in history] == [int(t * 1000) for t in ended]


def test_step_metrics_reach_the_run_at_their_steps_before_its_final_status(tracker):
    for step in (50, 100, 150):
        tracker.log_steps_soon(step, {"step_train_loss": 1 / step}, 1_700_000_000_000 + step)
    tracker.publish([epoch(1)], status="FINISHED")  # gives the queued points their moment
    client = MlflowClient()
    logged = client.get_metric_history(tracker.run_id, "step_train_loss")
    assert [(m.step, m.value, m.timestamp) for m in logged] == [
        (s, 1 / s, 1_700_000_000_000 + s) for s in (50, 100, 150)
    ]
    assert [m.step for m in client.get_metric_history(tracker.run_id, "test_acc")] == [1]


def test_step_metrics_never_wait_for_an_mlflow_that_is_away(tmp_path, monkeypatch, capsys):
    from pipeline.tracking.step_metrics import QUEUED_AT_MOST, StepMetrics

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    steps = StepMetrics(lambda: "0" * 32)
    for step in range(3 * QUEUED_AT_MOST):  # more than it keeps: the rest are dropped
        steps.log_soon(step, {"step_train_loss": 1.0}, 0)
    assert steps.queue.qsize() <= QUEUED_AT_MOST
    for _ in range(2):
        steps.flush(30.0)  # returns once the points were tried (refused at once here)
        steps.log_soon(0, {"step_train_loss": 1.0}, 0)
    steps.flush(30.0)
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "MLflow step metrics not logged" in warnings[0]
    assert steps.queue.qsize() == 0


def test_step_metrics_wait_for_the_run_to_exist():
    from pipeline.tracking.step_metrics import StepMetrics

    steps = StepMetrics(lambda: None)  # the server was away at the start: no run yet
    steps.log_soon(10, {"step_train_loss": 1.0}, 0)
    steps.flush(30.0)  # dropped without a word, nothing sent anywhere
    assert steps.queue.qsize() == 0 and not steps.warned


def test_a_finished_run_keeps_its_start_and_end_when_its_stage_runs_again(tracker, tmp_path):
    """A stage run again that finds its run finished (nothing left to train) hands on the same
    numbers: the run ends in MLflow when its last epoch did, then and after the rerun, so the
    duration MLflow shows stays the run's."""
    client = MlflowClient()
    started = client.get_run(tracker.run_id).info.start_time
    last_epoch_ended = started / 1000 + 2.5
    history = [epoch(1, started / 1000 + 1.0), epoch(2, last_epoch_ended)]
    tracker.publish(history, status="FINISHED")
    assert client.get_run(tracker.run_id).info.end_time == int(last_epoch_ended * 1000)
    again = MlflowTracker(
        tmp_path / "run.json", new_record("f", "tests", "run", {}, {"lr": 0.1}), fresh=False
    )
    again.publish(history)
    assert client.get_run(tracker.run_id).info.status == "RUNNING"  # its stage runs again
    again.publish(history, status="FINISHED")
    info = client.get_run(tracker.run_id).info
    assert (info.start_time, info.end_time) == (started, int(last_epoch_ended * 1000))


def test_a_stopped_run_ends_when_it_stopped(tracker):
    client = MlflowClient()
    epoch_ended = client.get_run(tracker.run_id).info.start_time / 1000 + 0.001
    stopped = time.time()
    tracker.publish([epoch(1, epoch_ended)], status="KILLED")  # stopped in epoch 2
    assert client.get_run(tracker.run_id).info.end_time >= int(stopped * 1000)


def test_another_store_gets_the_whole_run_from_disk(tracker, tmp_path, monkeypatch):
    started = tracker.record["started_at"]
    history = [epoch(1, started + 1.0), epoch(2, started + 2.0)]
    tracker.publish(history, status="FINISHED")
    first = tracker.run_id
    other = f"sqlite:///{tmp_path / 'other.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", other)
    tracker.publish(history)  # the record names the first store: the run is created here
    assert tracker.run_id != first and tracker.record["tracking_uri"] == other
    run = MlflowClient(tracking_uri=other).get_run(tracker.run_id)
    assert run.info.status == "FINISHED" and run.data.params["lr"] == "0.1"
    # its own start and end, not when it was pushed here
    assert (run.info.start_time, run.info.end_time) == (
        int(started * 1000),
        int(started * 1000) + 2000,
    )
    steps = [m.step for m in MlflowClient(other).get_metric_history(tracker.run_id, "test_acc")]
    assert steps == [1, 2]


def test_compare_again_over_the_same_runs_keeps_one_parent(tracker, tmp_path):
    from pipeline.tracking.comparison_run import close_comparison, open_comparison

    client = MlflowClient()
    children = [tracker.run_id]
    parents = [open_comparison("tests", children, {}, {}).parent_id for _ in range(2)]
    assert parents[0] == parents[1]
    note = {"speed_note": "no steady epoch: ..."}  # why its speed metrics are absent
    close_comparison(parents[0], {tracker.run_id: {}}, [], {tracker.run_id: note})
    tags = client.get_run(tracker.run_id).data.tags
    assert tags["speed_note"] == note["speed_note"]
    assert tags["mlflow.parentRunId"] == parents[0]
    # a new run of the strategy: a new comparison, and the old parent, now empty, goes
    newer = MlflowTracker(
        tmp_path / "run2.json", new_record("g", "tests", "run", {}, {"lr": 0.2}), fresh=True
    )
    newer.publish([])
    newer_comparison = open_comparison("tests", [newer.run_id], {}, {})
    parent = newer_comparison.parent_id
    assert newer_comparison.url.endswith(
        f"runs=[%22{newer.run_id}%22]&experiments=[%221%22]&workflowType=machine_learning"
    )
    close_comparison(parent, {newer.run_id: {"speedup_vs_single": 1.0}}, [])
    close_comparison(parent, {tracker.run_id: {"speedup_vs_single": 1.0}}, [])
    experiment = client.get_experiment_by_name("tests").experiment_id
    left = [
        r.info.run_id for r in client.search_runs([experiment]) if r.info.run_name == "comparison"
    ]
    assert left == [parent]


def test_the_comparison_carries_its_runs_torch_stack_not_its_own(tracker, tmp_path):
    """compare trains nothing: the parent's torch, CUDA and driver tags are those its runs
    were trained with (another machine's, here), a disagreement shown as such."""
    import torch

    from pipeline.tracking.comparison_run import open_comparison
    from pipeline.tracking.provenance import TORCH_STACK

    other = MlflowTracker(
        tmp_path / "run2.json", new_record("h", "tests", "ddp", {}, {}), fresh=True
    )
    other.publish([])
    client = MlflowClient()
    stacks = [
        {"torch": "2.9.0+cu128", "cuda": "12.8", "cudnn": "91002", "nccl": "2.27.3"},
        {"torch": "2.9.0+cu128", "cuda": "12.8", "cudnn": "91002", "nccl": "2.27.5"},
    ]
    for run_id, stack in zip([tracker.run_id, other.run_id], stacks):
        for key, value in {**stack, "nvidia_driver": "580.65.06"}.items():
            client.set_tag(run_id, key, value)
    parent = open_comparison("tests", [tracker.run_id, other.run_id], {}, {}).parent_id
    tags = client.get_run(parent).data.tags
    assert {k: tags[k] for k in TORCH_STACK} == {
        "torch": "2.9.0+cu128",
        "cuda": "12.8",
        "cudnn": "91002",
        "nccl": "mixed: 2.27.3, 2.27.5",
        "nvidia_driver": "580.65.06",
    }
    # a run logged without them: this machine's own
    bare = MlflowTracker(
        tmp_path / "run3.json", new_record("i", "tests", "fsdp", {}, {}), fresh=True
    )
    bare.publish([])
    parent = open_comparison("tests", [bare.run_id], {}, {}).parent_id
    assert client.get_run(parent).data.tags["torch"] == torch.__version__


def test_publish_refuses_epochs_of_another_run(tmp_path, monkeypatch):
    """An older configuration's epochs (latest.json) never go into a newer run (run.json):
    publish stops with one line and touches nothing, MLflow included."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'never.db'}")
    checkpoints = tmp_path / "checkpoints" / "ddp"
    checkpoints.mkdir(parents=True)
    record = new_record("newer", "tests", "ddp", {}, {})
    (checkpoints / "run.json").write_text(json.dumps(record))
    older = {"fingerprint": "older", "epoch": 1, "step": 0, "history": []}
    (checkpoints / "latest.json").write_text(json.dumps(older))
    with pytest.raises(UserError, match="belong to run older.* to run newer; not published"):
        publish_strategy("ddp")
    assert json.loads((checkpoints / "run.json").read_text()) == record
    assert not (tmp_path / "never.db").exists()


def test_a_new_store_is_made_without_mlflows_migration_lines(tmp_path):
    """A stage's log on a new store: MLflow's "Creating initial MLflow database tables..."
    and "Updating database tables" at INFO were two lines amid the epochs."""
    code = (
        "from pipeline.tracking.store import client, experiment_id\n"
        "experiment_id(client(), 'tests')\n"
    )
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "mlflow.db").exists()
    assert "database tables" not in done.stderr + done.stdout
