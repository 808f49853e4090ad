"""The stage's publisher (pipeline/tracking/publisher.py) and the stream it follows
(stream.py): whole lines only, nothing pushed before the writer opened the run, each epoch
in MLflow as it ends (before any checkpoint holds it), the step metrics at their steps and
never in the way, a restarted writer going on with the same run, and a publisher process
that makes the store, ends when told or when its launcher is gone, and cuts its waits short
on a stop."""

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from pipeline.results import CHECKPOINTS, RUN_RECORD, EpochRow
from pipeline.tracking import stream
from pipeline.tracking.mlflow_run import KILLED, RUNNING, new_record, open_record, read_record
from pipeline.tracking.publisher import QUEUED_AT_MOST, Follower, Publisher
from support import free_port, wait_for


def epoch(n: int) -> EpochRow:
    return EpochRow(n, 1.0 / n, 0.5, 1.0, 0.5 + n / 100, 1.0, 100.0, float(n), ended_at=1.0e9 + n)


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project directory (checkpoints/ and results/ are relative) and its SQLite store."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    return tmp_path


def record_path():
    return CHECKPOINTS / "ddp" / RUN_RECORD


def open_run(live, fresh=True, history=()):
    """What the writer does as its run starts: run.json, then the stream's head."""
    new = new_record("f", "tests", "ddp", {"strategy": "ddp"}, {"lr": 0.1})
    open_record(record_path(), new, fresh)
    stream.open_stream(live, stream.Head("f", None, None, bool(history)))


def runs():
    client = MlflowClient()
    experiment = client.get_experiment_by_name("tests")
    return [] if experiment is None else client.search_runs([experiment.experiment_id])


def test_only_whole_lines_are_read_and_the_rest_waits(tmp_path):
    live = tmp_path / "stream.jsonl"
    assert stream.read_lines(live, 0) == ([], 0)  # not written yet
    stream.steps(live, 5, {"step_train_loss": 1.0}, 7)
    with open(live, "a") as f:
        f.write('{"step": 1')  # a line still being written
    lines, offset = stream.read_lines(live, 0)
    assert lines == [{"step": 5, "metrics": {"step_train_loss": 1.0}, "at": 7}]
    with open(live, "a") as f:
        f.write(', "metrics": {}, "at": 0}\n')
    assert stream.read_lines(live, offset) == (
        [{"step": 1, "metrics": {}, "at": 0}],
        live.stat().st_size,
    )


def test_an_epoch_travels_whole(tmp_path):
    live = tmp_path / "stream.jsonl"
    row = EpochRow(2, 0.5, 0.6, 0.7, 0.8, 1.5, 300.0, 3.0, 1.7e9, core_wait=0.1, memory={"m": 1.0})
    stream.epoch_ended(live, row)
    read = stream.Read()
    read.take(live, QUEUED_AT_MOST)
    assert read.epochs == {2: row}


def test_nothing_is_pushed_before_the_writer_opens_the_run(project):
    """run.json may be an older run's until the writer rewrites it: a push meanwhile would
    race the writer's own write."""
    live = project / "stream.jsonl"
    older = new_record("older", "tests", "ddp", {}, {})
    open_record(record_path(), older, fresh=True)
    follower = Follower("ddp", live, threading.Event())
    follower.follow()
    assert read_record(record_path())["run_id"] is None and not runs()


def test_each_epoch_reaches_mlflow_as_it_ends_and_the_end_settles_the_run(project):
    live = project / "stream.jsonl"
    open_run(live)
    follower = Follower("ddp", live, threading.Event())
    follower.follow()
    client = MlflowClient()
    (run,) = runs()
    assert run.info.status == RUNNING and run.data.params["lr"] == "0.1"
    for n in (1, 2):  # no checkpoint holds them yet (checkpoint.every_epochs: 0)
        stream.epoch_ended(live, epoch(n))
        follower.follow()
        history = client.get_metric_history(run.info.run_id, "test_acc")
        assert [m.step for m in history] == list(range(1, n + 1))
    follower.end(KILLED, wait_s=0.0, give_up=False)  # a SIGTERM's checkpoint
    assert client.get_run(run.info.run_id).info.status == KILLED
    assert len(runs()) == 1


def test_step_metrics_reach_the_run_at_their_steps_before_its_final_status(project):
    live = project / "stream.jsonl"
    open_run(live)
    follower = Follower("ddp", live, threading.Event())
    for step in (50, 100, 150):
        stream.steps(live, step, {"step_train_loss": 1 / step}, 1_700_000_000_000 + step)
    follower.follow()
    stream.epoch_ended(live, epoch(1))
    follower.end(RUNNING, wait_s=0.0, give_up=False)
    client = MlflowClient()
    run_id = read_record(record_path())["run_id"]
    logged = client.get_metric_history(run_id, "step_train_loss")
    assert [(m.step, m.value, m.timestamp) for m in logged] == [
        (s, 1 / s, 1_700_000_000_000 + s) for s in (50, 100, 150)
    ]
    assert [m.step for m in client.get_metric_history(run_id, "test_acc")] == [1]


def test_step_metrics_wait_for_the_run_bounded_and_a_failed_send_warns_once(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")  # nobody
    live = tmp_path / "stream.jsonl"
    open_run(live)
    for step in range(3 * QUEUED_AT_MOST):  # more than it keeps: the rest are dropped
        stream.steps(live, step, {"step_train_loss": 1.0}, 0)
    follower = Follower("ddp", live, threading.Event())
    follower.follow()  # the push fails: no run to send them to, so they wait
    assert len(follower.read.points) == QUEUED_AT_MOST
    follower.run_id = "0" * 32  # as if a push had made the run (the server is gone again)
    for _ in range(2):
        follower.send_points()
        stream.steps(live, 0, {"step_train_loss": 1.0}, 0)
        follower.read.take(live, QUEUED_AT_MOST)
    follower.send_points()
    warnings = [x for x in capsys.readouterr().err.splitlines() if "MLflow step metrics" in x]
    assert len(warnings) == 1 and follower.read.points == []


def test_a_restarted_writer_goes_on_with_the_same_run(project):
    live = project / "stream.jsonl"
    open_run(live)
    follower = Follower("ddp", live, threading.Event())
    stream.epoch_ended(live, epoch(1))
    follower.follow()
    # the job died; torchrun restarts its workers, whose writer finds the stream opened and
    # appends to it (RunRecorder._open_run)
    assert stream.opened(live)
    stream.epoch_ended(live, epoch(1))  # redone: MLflow keeps the first
    stream.epoch_ended(live, epoch(2))
    follower.end(RUNNING, wait_s=0.0, give_up=False)
    (run,) = runs()
    client = MlflowClient()
    assert [m.step for m in client.get_metric_history(run.info.run_id, "test_acc")] == [1, 2]


def test_the_publisher_process_pushes_everything_before_the_launcher_goes_on(project):
    with Publisher("ddp", wait_s=0.0, experiment="tests") as publisher:
        open_run(publisher.stream)
        stream.epoch_ended(publisher.stream, epoch(1))
        assert publisher.finish(KILLED) is None and publisher.process.exitcode == 0
    record = read_record(record_path())
    assert MlflowClient().get_run(record["run_id"]).info.status == KILLED
    assert not publisher.stream.exists()  # its directory went with it


def test_a_stage_refused_before_its_workers_stops_its_publisher_at_once(project):
    with Publisher("ddp", wait_s=900, experiment="tests") as publisher:
        pass  # as when the launcher refuses the stage: no writer opened a run
    assert publisher.process.exitcode is not None and not record_path().exists()


def test_the_store_is_made_when_the_stage_is_accepted_at_idle_priority(project, monkeypatch):
    """Issue 51: the store and the experiment are made before the workers start (make_store
    returns once they are), not beside their first epochs; a stage refused before that makes
    none; the publisher runs at SCHED_IDLE beside them, and says in the stage's timeline what
    CPU it used."""
    timeline = project / "timeline.txt"
    monkeypatch.setenv("PARALLEL_LAB_TIMELINE", str(timeline))
    database = project / "mlflow.db"
    with Publisher("ddp", wait_s=900, experiment="tests") as publisher:
        assert not database.exists()  # no go yet: a refused stage would stop here
        assert publisher.make_store()
        # set once it made the store (at normal priority, while no epoch runs), before it
        # says so: the workers start beside an idle-priority publisher
        assert os.sched_getscheduler(publisher.process.pid) == os.SCHED_IDLE
        assert MlflowClient().get_experiment_by_name("tests") is not None
        assert publisher.finish() is None  # no run opened: stopped at once
    with Publisher("ddp", wait_s=900, experiment="tests") as publisher:
        open_run(publisher.stream)
        assert publisher.finish() is None and publisher.process.exitcode == 0
    (line,) = [x for x in timeline.read_text().splitlines() if "MLflow publisher CPU" in x]
    assert float(line.rsplit(" ", 1)[1]) > 0


def test_a_publisher_that_died_is_said_so(project):
    with Publisher("ddp", wait_s=900, experiment="tests") as publisher:
        open_run(publisher.stream)
        publisher.process.kill()  # as the OOM killer would
        assert publisher.finish() == "its publisher exited with -9"


def test_a_stop_cuts_the_final_wait_for_an_absent_server_short(tmp_path, monkeypatch, capfd):
    """final_sync_wait_s far beyond the test's patience and nothing listening: after a
    SIGTERM (as the launcher passes on) the publisher tries once, says so and ends, and the
    run stays kept locally for `python -m pipeline.publish`."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
    with Publisher("ddp", wait_s=900, experiment="tests") as publisher:
        open_run(publisher.stream)
        publisher.make_store()  # it follows the run from here
        os.kill(publisher.process.pid, signal.SIGTERM)
        assert publisher.finish() is None and publisher.process.exitcode == 0
    assert "unreachable" in capfd.readouterr().err
    assert read_record(record_path())["run_id"] is None


def test_a_stop_the_launcher_saw_makes_the_final_push_one_try(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
    with Publisher("ddp", wait_s=900, experiment="tests") as publisher:
        open_run(publisher.stream)
        assert publisher.finish(KILLED, give_up=True) is None
        assert publisher.process.exitcode == 0
    assert "unreachable" in capfd.readouterr().err
    # kept for `python -m pipeline.publish`, which pushes it once the server is back
    assert read_record(record_path())["status"] == KILLED


def test_a_publisher_whose_launcher_is_gone_pushes_what_came_and_ends(project):
    """The launcher SIGKILLed: the publisher notices (its parent changed), pushes once more
    and ends; the run stays RUNNING in MLflow until its rerun or `python -m pipeline.publish`
    settles it, its epochs on disk."""
    code = (
        "import os, sys\n"
        "from pipeline.tracking.publisher import Publisher\n"
        "p = Publisher('ddp', 0.0, 'tests')\n"
        "print(p.stream, p.process.pid, flush=True)\n"
        "sys.stdin.readline()\n"
        "os._exit(0)\n"  # no finish: as if killed
    )
    launcher = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    path, pid = launcher.stdout.readline().split()
    live = Path(path)
    open_run(live)
    stream.epoch_ended(live, epoch(1))
    wait_for(lambda: read_record(record_path())["run_id"] is not None, 120, "the first push")
    launcher.communicate("\n", timeout=120)
    wait_for(lambda: not os.path.exists(f"/proc/{pid}"), 120, "the publisher to end")
    run_id = read_record(record_path())["run_id"]
    assert MlflowClient().get_run(run_id).info.status == RUNNING
    assert [m.step for m in MlflowClient().get_metric_history(run_id, "test_acc")] == [1]


def test_the_training_code_never_imports_mlflow():
    """A worker's modules (its session, recorder, trainer and the stream it appends to) load
    without MLflow: only the publisher process talks to the server."""
    code = (
        "import sys\n"
        "import pipeline.launch.worker, pipeline.training.session, pipeline.recording.recorder\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'mlflow'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert done.stdout.strip() == "[]"
