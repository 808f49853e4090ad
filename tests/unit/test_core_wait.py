"""The machine's load seen from inside a run (pipeline/core_wait.py, issue 51): each thread's
time on a core and time waiting for one, read from /proc, and the share of the runnable time
spent waiting; carried by history.csv, the checkpoint record and MLflow."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline import core_wait, results
from pipeline.results import EpochRow


def tasks(folder: Path, threads: dict[str, str]) -> Path:
    """A /proc/<pid>/task of threads with these schedstat lines."""
    for name, line in threads.items():
        (folder / name).mkdir(parents=True)
        (folder / name / "schedstat").write_text(line + "\n")
    return folder


def test_read_takes_every_threads_ran_and_waited_nanoseconds(tmp_path):
    folder = tasks(tmp_path, {"100": "900 100 7", "101": "50 0 2"})
    assert core_wait.read(folder) == {"100": (900, 100), "101": (50, 0)}


def test_read_skips_a_thread_without_figures_and_finds_none_where_no_kernel_counts(tmp_path):
    folder = tasks(tmp_path / "t", {"100": "900 100 7", "101": ""})
    assert core_wait.read(folder) == {"100": (900, 100)}
    assert core_wait.read(tmp_path / "no-proc") is None  # macOS: no /proc
    assert core_wait.read(tasks(tmp_path / "u", {"7": "no counts"})) is None


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="no /proc here")
def test_read_finds_this_process_threads():
    assert str(os.getpid()) in (core_wait.read() or {})  # the main thread's id is the pid's


@pytest.mark.parametrize(
    ("before", "after", "share"),
    [
        ({"1": (100, 0)}, {"1": (400, 100)}, 0.25),  # ran 300, waited 100
        # a new thread counts from 0: 200 of 600
        ({"1": (100, 0)}, {"1": (400, 100), "2": (100, 100)}, 1 / 3),
        ({"1": (100, 0), "2": (5, 5)}, {"1": (200, 0)}, 0.0),  # an ended thread is lost
        ({"1": (100, 0)}, {"1": (100, 0)}, None),  # nothing ran
        (None, {"1": (1, 1)}, None),
        ({"1": (1, 1)}, None, None),
    ],
)
def test_wait_share_is_the_runnable_times_share_spent_without_a_core(before, after, share):
    assert core_wait.wait_share(before, after) == pytest.approx(share)


def row(epoch: int, wait: float | None) -> EpochRow:
    return EpochRow(epoch, 1.0, 0.5, 1.0, 0.8, 2.0, 3000.0, 2.0 * epoch, core_wait=wait)


def test_the_share_goes_through_history_csv_the_checkpoint_record_and_mlflow(tmp_path):
    rows = [row(1, 0.25), row(2, None)]
    (tmp_path / "single").mkdir()
    (tmp_path / "single" / results.HISTORY).write_text(results.history_csv(rows))
    assert results.read_history("single", tmp_path) == rows  # None: an empty cell
    assert [EpochRow.from_record(r.to_record()) for r in rows] == rows
    assert rows[0].metrics()["core_wait"] == 0.25
    assert "core_wait" not in rows[1].metrics()  # nothing logged where nothing was measured
    old = {k: v for k, v in rows[0].to_record().items() if k != "core_wait"}
    assert EpochRow.from_record(old).core_wait is None  # written before the field


def test_only_the_optional_column_may_be_empty(tmp_path):
    text = results.history_csv([row(1, 0.25)]).replace("0.25", "")
    text = text.replace(",2,", ",,", 1)  # epoch_seconds emptied too
    (tmp_path / "single").mkdir()
    (tmp_path / "single" / results.HISTORY).write_text(text)
    with pytest.raises(results.UserError, match="history"):
        results.read_history("single", tmp_path)


def test_a_runs_load_is_the_median_and_unknown_if_any_epoch_is():
    assert results.core_wait([row(1, 0.1), row(2, 0.3), row(3, 0.2)]) == 0.2
    assert results.core_wait([row(1, 0.1), row(2, None)]) is None
    assert results.core_wait([]) is None


# --- threads per process (issue 68) ----------------------------------------------------------


@pytest.mark.parametrize(
    ("cores", "nproc", "others", "threads"),
    [
        (2, 1, 0.0, 2),  # idle: the cores' even share
        (2, 1, 1.0, 1),  # a busy process beside it: one thread
        (2, 1, 9.0, 1),  # never none
        (2, 2, 0.0, 1),
        (16, 2, 0.0, 8),
        (16, 2, 6.0, 5),  # the free cores' share
        (16, 1, None, 16),  # nothing known of the load: the even share
    ],
)
def test_threads_per_process_is_the_free_cores_share(cores, nproc, others, threads):
    assert core_wait.threads_per_process(cores, nproc, others) == threads


def test_others_runnable_reads_the_kernels_count_less_the_reader(tmp_path):
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("8.44 8.41 5.60 3/120 11266\n")
    assert core_wait.others_runnable(loadavg) == 2.0
    assert core_wait.others_runnable(tmp_path / "absent") is None
    loadavg.write_text("garbled\n")
    assert core_wait.others_runnable(loadavg) is None
