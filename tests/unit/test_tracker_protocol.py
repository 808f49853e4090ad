"""The three publishers of a run's MLflow events (pipeline/tracking/mlflow_run.py `Tracker`):
mypy checks their types where the recorder holds them; these check what it does not, the
names and defaults of `publish`'s parameters, and what the relay does with a model."""

import inspect

import pytest

from pipeline.results import EpochRow
from pipeline.tracking.mlflow_run import FINISHED, MlflowTracker, NullTracker, Tracker, new_record
from pipeline.tracking.relay import Opening, Relay, read_events


@pytest.mark.parametrize("publisher", [NullTracker, MlflowTracker, Relay])
def test_each_publisher_takes_the_same_parameters_with_the_same_defaults(publisher):
    # mypy lets an implementation rename a parameter or change its default: a caller passing
    # `status=`, or leaving `wait_s` out, would then get another behaviour from each class
    assert inspect.signature(publisher.publish) == inspect.signature(Tracker.publish)


def test_the_relay_takes_a_model_and_hands_the_push_over_without_it(tmp_path):
    events = tmp_path / "events.jsonl"
    new = new_record("f", "tests", "ddp", {}, {})
    relay = Relay(events, tmp_path / "run.json", Opening(new, True, [], None, None))
    history = [EpochRow(1, 1.0, 0.5, 1.0, 0.5, 1.0, 100.0, 1.0)]
    assert relay.publish(history, status=FINISHED, model=lambda: (object(), None, {}))
    relay.publish(history, status=FINISHED)
    batch, _ = read_events(events, 0)
    assert [e["event"] for e in batch] == ["open", "publish", "publish"]
    assert batch[1] == batch[2]  # the line the publisher reads is the same without a model
