"""How a train stage ends: its exit code per outcome, and the orderly exit of its workers
(pipeline/launch/launcher.py `stage_exit`, pipeline/launch/worker.py)."""

import gc
import itertools
import multiprocessing
import os
import signal
from pathlib import Path

import pytest

from pipeline.errors import (
    DISK_FULL_EXIT,
    ERROR_FILE_ENV,
    FAILURE_EXIT,
    OUTCOME_FILE_ENV,
    STOPPED_EXIT,
    USER_ERROR_EXIT,
    Outcome,
    no_space_line,
)
from pipeline.interrupts.stop import StopRequest
from pipeline.launch.launcher import read_outcome, stage_exit, worker_error, workers_environment
from pipeline.launch.worker import comm_threads, hand_back_stop_signals, left_threads_warning
from pipeline.tracking.stream import STREAM_ENV

OUTCOMES = (None, Outcome.FINISHED, Outcome.STOPPED)


# a worker's line: none, bad input's, a full disk's
LINES = ("", "train.batch_size: got 0, expected at least 1", no_space_line(Path("checkpoints/x")))


def expected(code: int, signalled: bool, outcome: Outcome | None, user_error: str) -> int:
    if user_error.startswith("no space left on device"):
        return DISK_FULL_EXIT
    if user_error:
        return USER_ERROR_EXIT
    if code == 0:
        return 0
    if signalled and outcome is Outcome.FINISHED:
        return 0  # torchrun's non-zero code only says it forwarded the signal
    if outcome is Outcome.STOPPED:
        return STOPPED_EXIT
    return FAILURE_EXIT


@pytest.mark.parametrize(
    "code, signalled, outcome, user_error",
    list(itertools.product((0, 1, -6, 143), (False, True), OUTCOMES, LINES)),
)
def test_every_outcome_has_its_own_exit_code(code, signalled, outcome, user_error):
    assert stage_exit(code, signalled, outcome, user_error) == expected(
        code, signalled, outcome, user_error
    )


def test_the_codes_are_distinct_and_none_is_a_signal_death():
    codes = {0, FAILURE_EXIT, USER_ERROR_EXIT, STOPPED_EXIT, DISK_FULL_EXIT}
    assert len(codes) == 5
    assert all(c < 128 for c in codes)  # a shell reports 128 + N for a death by signal N


def test_a_rank_that_died_after_the_writer_finished_is_a_failure():
    """The abort at exit this project once had: results written, then a rank crashed. No
    signal came, so the crash is reported, not hidden."""
    assert stage_exit(1, False, Outcome.FINISHED, "") == FAILURE_EXIT


def test_outcome_file(tmp_path):
    path = tmp_path / "outcome"
    assert read_outcome(path) is None  # the writer never got that far
    path.write_text("stopped")
    assert read_outcome(path) is Outcome.STOPPED
    path.write_text("half-writ")
    assert read_outcome(path) is None


def test_comm_threads_names_only_a_process_groups_threads(tmp_path):
    threads(tmp_path, "python", "pt_gloo_runloop", "gloo_tcp_loop", "pt_autograd_0")
    (tmp_path / "9").mkdir()  # a thread that ended while the directory was read
    assert sorted(comm_threads(tmp_path)) == ["gloo_tcp_loop", "pt_gloo_runloop"]


def test_this_process_has_no_comm_threads():
    assert comm_threads() == []


def threads(tasks, *names: str):
    """A /proc/self/task of threads with these names."""
    for tid, name in enumerate(names):
        (tasks / str(tid)).mkdir()
        (tasks / str(tid) / "comm").write_text(name + "\n")
    return tasks


@pytest.mark.parametrize(
    "names, collects, warns",
    [
        ((), False, False),  # the groups and their threads went with the destroy
        (("python", "pt_autograd_0"), False, False),
        (("python", "pt_gloo_runloop"), True, True),  # held in a cycle, and outliving it
    ],
)
def test_the_exit_collects_only_where_a_groups_thread_is_left(
    tmp_path, monkeypatch, capsys, names, collects, warns
):
    collected = []
    monkeypatch.setattr(gc, "collect", lambda: collected.append(True))
    assert left_threads_warning(threads(tmp_path, *names)) is warns
    assert bool(collected) is collects
    assert ("outlived the process group" in capsys.readouterr().err) is warns


def test_without_a_thread_list_the_exit_collects_anyway(tmp_path, monkeypatch):
    collected = []
    monkeypatch.setattr(gc, "collect", lambda: collected.append(True))
    assert left_threads_warning(tmp_path / "no-proc") is False
    assert collected == [True]


def test_a_launch_leaves_the_environment_as_it_found_it(tmp_path, monkeypatch):
    """The workers' environment (their GPUs, threads, where a user error and the outcome come
    back) is the launch's alone: the quickstart's next launch, in the same process, starts
    from the user's. A thread count the user set stays theirs."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    before = dict(os.environ)
    with workers_environment([], 2, tmp_path, tmp_path / "stream") as (
        error_file,
        outcome_file,
        live,
    ):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == ""  # devices: cpu hides every GPU
        assert os.environ["OMP_NUM_THREADS"] == str(max(1, (os.cpu_count() or 1) // 2))
        assert os.environ[ERROR_FILE_ENV] == str(error_file)
        assert os.environ[OUTCOME_FILE_ENV] == str(outcome_file)
        assert os.environ[STREAM_ENV] == str(live)
    assert dict(os.environ) == before
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    with workers_environment(["1"], 1, tmp_path, live):
        assert os.environ["OMP_NUM_THREADS"] == "3"
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_a_workers_error_is_read_from_torchelastics_record_of_it():
    trace = 'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: bad\n'
    recorded = {"message": "ValueError: bad\nmore", "extraInfo": {"py_callstack": trace}}
    assert worker_error(recorded) == ("ValueError: bad", trace)
    # no error file (a signal, a plain exit): torch's own words, which name no error
    assert worker_error("Signal 9 (SIGKILL) received by PID 7") == ("", "")
    assert worker_error({"message": "ValueError: bad"}) == ("ValueError: bad", "")


def finished_worker(signal_during_run: int | None) -> None:
    """A forked worker's end, without the run: its stop request, a stop signal while the run
    goes on (or none), the hand-back, then the stopping agent's SIGTERM."""
    stop = StopRequest(world_size=1)
    if signal_during_run is not None:
        signal.raise_signal(signal_during_run)
        assert stop.flag  # the run went on, to write what it had
    hand_back_stop_signals(stop)
    signal.raise_signal(signal.SIGTERM)
    os._exit(0)  # a signal that did not end the process


@pytest.mark.parametrize("signal_during_run", [None, signal.SIGTERM, signal.SIGINT])
def test_a_finished_worker_ends_at_a_stop_signal(signal_during_run):
    """torch's wrapper waits, after a worker's run, for the agent to read its return value;
    an agent that is stopping never does, and kills it 30 s after its SIGTERM. So a finished
    worker ends at that SIGTERM, and at once where a stop signal came while its run finished:
    by that signal (SIGINT here, where the run saw one), not by the later SIGTERM."""
    child = multiprocessing.get_context("fork").Process(
        target=finished_worker, args=(signal_during_run,)
    )
    child.start()
    child.join(timeout=60)
    assert child.exitcode == -(signal_during_run or signal.SIGTERM)
