"""The MLflow tracker against a real (SQLite) store: background syncs, system metrics."""

import pytest
from mlflow.tracking import MlflowClient

from pipeline.results import EpochRow
from pipeline.tracking.mlflow_run import Tracker


@pytest.fixture
def tracker(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    tracker = Tracker(tmp_path / "run.json", "tests", "run", {}, {"lr": 0.1}, fingerprint="f")
    tracker.publish([])
    return tracker


def epoch(n: int) -> EpochRow:
    return EpochRow(
        n,
        train_loss=1.0 / n,
        train_acc=0.5,
        test_loss=1.0,
        test_acc=0.5 + n / 100,
        epoch_seconds=1.0,
        samples_per_s=100.0,
        wall_seconds=float(n),
    )


def test_background_syncs_then_the_final_one_deliver_every_epoch_once(tracker):
    history = []
    for n in (1, 2, 3):
        history.append(epoch(n))
        tracker.publish_soon(history)  # returns at once; a push still running is left alone
    assert tracker.publish(history, finished=True)  # waits for the background push first
    client = MlflowClient()
    run = client.get_run(tracker.run_id)
    assert run.info.status == "FINISHED" and run.data.params["lr"] == "0.1"
    steps = [m.step for m in client.get_metric_history(tracker.run_id, "test_acc")]
    assert sorted(steps) == [1, 2, 3]


def test_a_run_shorter_than_the_sampling_interval_still_gets_system_metrics(tracker):
    # MLflow publishes only whole sampling windows; the tracker logs the open one at the end
    tracker.start_system_metrics(60.0, gpu_uuids=None, resume=False)
    tracker.stop_system_metrics()
    tracker.publish([], finished=True)
    run = MlflowClient().get_run(tracker.run_id)
    assert "system/cpu_utilization_percentage" in run.data.metrics
    assert 0 <= run.data.metrics["system/cpu_utilization_percentage"] <= 100
