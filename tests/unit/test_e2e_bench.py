"""benchmarks/e2e.py --dvc: how it reads each stage's seconds out of one `dvc repro` (DVC's
output, stamped as each line arrived) and each train stage's own process out of the
pipeline/timeline.py marks. The timing itself is a benchmark's, run by hand (docs/performance.md,
"End to end")."""

import os

from benchmarks.e2e import phase_offsets, project_path, stage_seconds, train_process_seconds


def test_each_stage_runs_from_its_line_to_the_next():
    stamped = [
        (1.0, "Running stage 'fetch':\n"),
        (1.1, "> python -m pipeline.fetch\n"),
        (3.0, "Running stage 'train@single':\n"),
        (9.5, "Running stage 'compare':\n"),
        (11.0, "Updating lock file 'dvc.lock'\n"),
    ]
    assert stage_seconds(stamped, 0.25, 12.0) == {
        "dvc start": 0.75,
        "fetch": 2.0,
        "train@single": 6.5,
        "compare": 2.5,
    }


def test_a_train_stage_process_runs_from_its_command_to_its_workers_end():
    timeline = "\n".join(
        [
            "100.0 7 command",
            "101.0 7 agent",
            "101.5 8 worker",  # rank 0, a process of its own
            "104.0 7 workers ended",
            "110.0 9 command",
            "112.5 9 workers ended",
        ]
    )
    assert train_process_seconds(timeline) == [4.0, 2.5]


def test_a_project_copys_commands_find_its_code_first_then_the_callers(monkeypatch, tmp_path):
    """The benchmarks' stage commands keep what the caller put on PYTHONPATH (gpu-check's
    carried wheels on a python without MLflow): the peer once dropped it."""
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert project_path(tmp_path) == str(tmp_path)
    monkeypatch.setenv("PYTHONPATH", "/tmp/site")
    assert project_path(tmp_path).split(os.pathsep) == [str(tmp_path), "/tmp/site"]


def test_a_stages_phases_are_the_seconds_from_its_command_to_each_first_mark():
    timeline = "\n".join(
        [
            "100.0 7 command",
            "106.7 7 agent",
            "108.0 8 worker",
            "109.6 8 first step",
            "130.0 8 trained",
            "131.0 7 workers ended",
            "131.5 7 trained",  # a phase marked again: its first mark counts
        ]
    )
    assert phase_offsets(timeline) == {
        "command": 0.0,
        "agent": 6.7,
        "worker": 8.0,
        "first step": 9.6,
        "trained": 30.0,
        "workers ended": 31.0,
    }
    assert phase_offsets("") == {} and phase_offsets("5.0 1 agent") == {}
