"""The writer's MLflow events and the publisher that replays them (pipeline/tracking/relay.py):
whole lines only, the same run an MlflowTracker in the writer would make, a restarted writer
going on with the same run, a publisher process that ends when told or when its launcher is
gone, and a stop that cuts its waits short."""

import json
import os
import signal
import threading

import pytest
from mlflow.tracking import MlflowClient

from pipeline.results import EpochRow
from pipeline.tracking.mlflow_run import FINISHED, new_record, read_record
from pipeline.tracking.relay import (
    END,
    Opening,
    Publisher,
    Relay,
    Replay,
    append_event,
    publish_events,
    read_events,
)
from support import free_port, wait_for


def epoch(n: int) -> EpochRow:
    return EpochRow(n, 1.0 / n, 0.5, 1.0, 0.5 + n / 100, 1.0, 100.0, float(n), ended_at=1.0e9 + n)


def opening(history: list[EpochRow] = (), fresh: bool = True) -> Opening:
    new = new_record("f", "tests", "ddp", {"strategy": "ddp"}, {"lr": 0.1})
    return Opening(new, fresh, list(history), None, None)


@pytest.fixture
def store(tmp_path, monkeypatch) -> str:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def replay_all(events, record_path) -> Replay:
    replay = Replay(record_path, stop=threading.Event())
    batch, _ = read_events(events, 0)
    for event in batch:
        replay.apply(event)
    replay.close()
    return replay


def test_only_whole_lines_are_read_and_the_rest_waits(tmp_path):
    events = tmp_path / "events.jsonl"
    assert read_events(events, 0) == ([], 0)  # not written yet
    append_event(events, {"event": "close"})
    with open(events, "a") as f:
        f.write('{"event": "ste')  # a line still being written
    batch, offset = read_events(events, 0)
    assert batch == [{"event": "close"}] and offset == len('{"event": "close"}\n')
    with open(events, "a") as f:
        f.write('ps"}\n')
    assert read_events(events, offset) == ([{"event": "steps"}], events.stat().st_size)


def test_the_opening_travels_whole():
    before = opening([epoch(1), epoch(2)], fresh=False)
    after = Opening.from_event(json.loads(json.dumps(before.to_event())))
    assert after == before


def test_replayed_events_make_the_run_the_writer_would_have(tmp_path, store):
    events, record_path = tmp_path / "events.jsonl", tmp_path / "run.json"
    relay = Relay(events, record_path, opening())
    history = []
    for n in (1, 2):
        history.append(epoch(n))
        relay.publish_soon(history)
        relay.log_steps_soon(n * 10, {"step_train_loss": 1.0 / n}, 1_000_000 + n)
    assert relay.run_id is None  # nothing replayed yet: the writer never waits for MLflow
    relay.publish(history, [], status=FINISHED)
    relay.close()
    replay_all(events, record_path)
    record = read_record(record_path)
    assert record["status"] == record["status_logged"] == FINISHED
    assert relay.run_id == record["run_id"]
    client = MlflowClient()
    run = client.get_run(record["run_id"])
    assert run.info.status == FINISHED and run.data.params["lr"] == "0.1"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "test_acc")] == [1, 2]
    steps = client.get_metric_history(run.info.run_id, "step_train_loss")
    assert sorted((m.step, m.value) for m in steps) == [(10, 1.0), (20, 0.5)]


def test_a_restarted_writer_goes_on_with_the_same_run(tmp_path, store):
    events, record_path = tmp_path / "events.jsonl", tmp_path / "run.json"
    first = Relay(events, record_path, opening())
    first.publish_soon([epoch(1)])  # then the job died; torchrun restarts its workers
    again = Relay(events, record_path, opening([epoch(1)], fresh=False))
    again.publish([epoch(1), epoch(2)], status=FINISHED)
    replay_all(events, record_path)
    runs = MlflowClient().search_runs(
        [MlflowClient().get_experiment_by_name("tests").experiment_id]
    )
    assert len(runs) == 1 and runs[0].info.status == FINISHED


def test_the_publisher_process_pushes_everything_before_the_launcher_goes_on(tmp_path, store):
    record_path = tmp_path / "run.json"
    with Publisher(record_path, bound_s=900, experiment="tests") as publisher:
        relay = Relay(publisher.events, record_path, opening())
        relay.publish([epoch(1)], [], status=FINISHED)
        relay.close()
        assert publisher.finish() is None and publisher.process.exitcode == 0
    record = read_record(record_path)
    assert MlflowClient().get_run(record["run_id"]).info.status == FINISHED
    assert not publisher.events.exists()  # its directory went with it


def test_a_stage_refused_before_its_workers_stops_its_publisher_at_once(tmp_path, store):
    record_path = tmp_path / "run.json"
    with Publisher(record_path, bound_s=900, experiment="tests") as publisher:
        pass  # as when the launcher refuses the stage: nothing was handed over
    assert publisher.process.exitcode is not None and not record_path.exists()


def test_the_store_is_made_when_the_stage_is_accepted_at_idle_priority(
    tmp_path, store, monkeypatch
):
    """Issue 51: the store and the experiment are made before the workers start (make_store
    returns once they are), not beside their first epochs; a stage refused before that makes
    none; the publisher runs at SCHED_IDLE beside them, and says in the stage's timeline what
    CPU it used."""
    timeline = tmp_path / "timeline.txt"
    monkeypatch.setenv("PARALLEL_LAB_TIMELINE", str(timeline))
    database = tmp_path / "mlflow.db"
    with Publisher(tmp_path / "run.json", bound_s=900, experiment="tests") as publisher:
        assert not database.exists()  # no go yet: a refused stage would stop here
        assert publisher.make_store()
        # set once it made the store (at normal priority, while no epoch runs), before it
        # says so: the workers start beside an idle-priority publisher
        assert os.sched_getscheduler(publisher.process.pid) == os.SCHED_IDLE
        assert MlflowClient().get_experiment_by_name("tests") is not None
        assert publisher.finish() is None  # nothing handed over: stopped at once
    with Publisher(tmp_path / "run.json", bound_s=900, experiment="tests") as publisher:
        Relay(publisher.events, tmp_path / "run.json", opening())
        assert publisher.finish() is None and publisher.process.exitcode == 0
    (line,) = [x for x in timeline.read_text().splitlines() if "MLflow publisher CPU" in x]
    assert float(line.rsplit(" ", 1)[1]) > 0


def test_a_publisher_that_died_is_said_so(tmp_path, store):
    record_path = tmp_path / "run.json"
    with Publisher(record_path, bound_s=900, experiment="tests") as publisher:
        Relay(publisher.events, record_path, opening())
        publisher.process.kill()  # as the OOM killer would
        assert publisher.finish() == "its publisher exited with -9"


def test_a_stop_cuts_the_final_wait_for_an_absent_server_short(tmp_path, monkeypatch, capfd):
    """final_sync_wait_s far beyond the test's patience and nothing listening: after a
    SIGTERM (as the launcher passes on) the publisher tries once, says so and ends, and the
    run stays kept locally for `python -m pipeline.publish`."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
    record_path = tmp_path / "run.json"
    with Publisher(record_path, bound_s=900, experiment="tests") as publisher:
        relay = Relay(publisher.events, record_path, opening())
        wait_for(record_path.exists, 120, "the publisher to replay the opening")  # it runs
        os.kill(publisher.process.pid, signal.SIGTERM)
        relay.publish([epoch(1)], [], status=FINISHED, wait_s=900)
        assert publisher.finish() is None and publisher.process.exitcode == 0
    assert "unreachable" in capfd.readouterr().err
    assert read_record(record_path)["status"] == FINISHED


def test_a_stop_the_writer_saw_makes_the_final_push_one_try(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
    record_path = tmp_path / "run.json"
    with Publisher(record_path, bound_s=900, experiment="tests") as publisher:
        relay = Relay(publisher.events, record_path, opening())
        relay.publish([epoch(1)], [], status=FINISHED, wait_s=900, give_up=lambda: True)
        assert publisher.finish() is None and publisher.process.exitcode == 0
    assert "unreachable" in capfd.readouterr().err


def test_a_publisher_whose_launcher_is_gone_replays_what_came_and_ends(tmp_path, store):
    events, record_path = tmp_path / "events.jsonl", tmp_path / "run.json"
    Relay(events, record_path, opening()).publish_soon([epoch(1)])
    replay = Replay(record_path, threading.Event())
    publish_events(events, replay, parent=-1)  # not this process's parent: the launcher died
    assert replay.tracker is None  # its threads ended
    # the run is open in MLflow, as the writer left it; its epochs are on disk (the
    # checkpoint record), for `python -m pipeline.publish`
    run_id = read_record(record_path)["run_id"]
    assert MlflowClient().get_run(run_id).info.status == "RUNNING"


def test_nothing_after_the_launchers_end_is_replayed(tmp_path, store):
    events, record_path = tmp_path / "events.jsonl", tmp_path / "run.json"
    append_event(events, END)
    Relay(events, record_path, opening())  # too late: no worker writes after the end
    publish_events(events, Replay(record_path, threading.Event()), os.getppid())
    assert not record_path.exists()
