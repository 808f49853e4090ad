"""The run's record and its push against real (SQLite) stores: every epoch once, statuses,
timestamps, moving to another store, system metrics, and the comparison parent run. The
publisher process that makes these pushes is test_publisher.py's."""

import json
import os
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from pipeline.errors import UserError
from pipeline.results import EpochRow
from pipeline.tracking.kept_runs import publish_strategy
from pipeline.tracking.mlflow_run import new_record
from support import KeptRecord


@pytest.fixture
def tracker(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    tracker = KeptRecord(tmp_path / "run.json")
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


def test_pushes_as_the_epochs_come_deliver_every_epoch_once(tracker):
    history = []
    for n in (1, 2, 3):
        history.append(epoch(n))
        tracker.publish(history)  # each push carries every epoch so far
    tracker.publish(history, status="FINISHED")
    client = MlflowClient()
    run = client.get_run(tracker.run_id)
    assert run.info.status == "FINISHED" and run.data.params["lr"] == "0.1"
    steps = [m.step for m in client.get_metric_history(tracker.run_id, "test_acc")]
    assert steps == [1, 2, 3]


def test_a_run_shorter_than_the_sampling_interval_still_gets_system_metrics(tracker):
    # MLflow publishes only whole sampling windows; the publisher logs the open one at the end
    from pipeline.tracking.store import tracking_uri
    from pipeline.tracking.system_metrics import publish_final_sample, system_metrics_monitor

    monitor = system_metrics_monitor(tracker.run_id, 60.0, None, False, tracking_uri())
    monitor.start()
    publish_final_sample(monitor)
    tracker.publish([], status="FINISHED")
    run = MlflowClient().get_run(tracker.run_id)
    assert "system/cpu_utilization_percentage" in run.data.metrics
    assert 0 <= run.data.metrics["system/cpu_utilization_percentage"] <= 100


def test_statuses_follow_the_stage_and_a_resumed_run_runs_again(tracker, tmp_path):
    client = MlflowClient()
    assert client.get_run(tracker.run_id).info.status == "RUNNING"
    tracker.publish([epoch(1)], status="KILLED")  # SIGTERM: checkpointed, to be resumed
    assert client.get_run(tracker.run_id).info.status == "KILLED"
    resumed = KeptRecord(tmp_path / "run.json", fresh=False)
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
    first = tracker.run_id
    again = KeptRecord(tmp_path / "run.json", fresh=True)
    again.publish([epoch(1)])
    assert again.run_id != first
    assert client.get_run(first).info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(first, "test_acc")] == [1, 2]
    assert [m.step for m in client.get_metric_history(again.run_id, "test_acc")] == [1]


def test_epochs_are_stamped_when_they_ended_not_when_they_were_pushed(tracker):
    ended = [1_700_000_000.0, 1_700_000_123.5]  # an outage in between: pushed together later
    tracker.publish([epoch(1, ended[0]), epoch(2, ended[1])])
    history = MlflowClient().get_metric_history(tracker.run_id, "test_acc")
    assert [m.timestamp for m in history] == [int(t * 1000) for t in ended]


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
    again = KeptRecord(tmp_path / "run.json", fresh=False)
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
    newer = KeptRecord(tmp_path / "run2.json", "g", params={"lr": 0.2})
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

    other = KeptRecord(tmp_path / "run2.json", "h", "ddp", params={})
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
    bare = KeptRecord(tmp_path / "run3.json", "i", "fsdp", params={})
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
