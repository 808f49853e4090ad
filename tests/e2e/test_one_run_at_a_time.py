"""One run of a stage at a time (issue 50, goal 1; pipeline/locks.py): a second start of a
strategy's stage, of publish or of the quickstart while the first runs is refused at once in
one line naming it; the first goes on to one FINISHED MLflow run; a SIGKILLed stage leaves
nothing that blocks its rerun; two stages that start together on a new store both make it."""

import json
import re
import signal

from mlflow.tracking import MlflowClient

from support import Background, run, wait_for

HOLD = "fault: rank 0 holding before step 1 of epoch 1"


def refused(project, *args: str) -> str:
    """`python -m ARGS`, refused beside the run that holds the lock: exit 2, one line, no
    traceback. (The files it would have written are the running stage's meanwhile: the held
    run's own MLflow run and checkpoint record, read once it ends.)"""
    proc = run(project, "python", "-m", *args, check=False)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    return lines[0]


def held_single(project, tmp_path, release):
    """`python -m pipeline.train single`, held at its first epoch until `release` exists."""
    return Background(
        project,
        *("python", "-m", "pipeline.train", "single"),
        log=tmp_path / "first.log",
        PARALLEL_LAB_FAULT=f"rank=0,epoch=1,step=1,action=hold,release={release}",
    )


def runs_of(project, strategy):
    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tests")
    runs = client.search_runs([experiment.experiment_id], f"tags.strategy = '{strategy}'")
    return [r.info.status for r in runs]


def test_a_second_start_is_refused_while_the_first_runs(fetched_project, tmp_path):
    project = fetched_project()
    release = tmp_path / "go-on"
    with held_single(project, tmp_path, release) as first:
        first.wait_for_output(HOLD, timeout=240)
        pid = first.proc.pid
        line = refused(project, "pipeline.train", "single")
        assert re.fullmatch(
            rf"error: train\[single\] is already running in this project \(pid {pid}, since "
            r"\d\d:\d\d:\d\d: python -m pipeline\.train single\); wait for it to end, or stop "
            rf"it \(kill {pid}\), then run this again",
            line,
        ), line
        line = refused(project, "pipeline.publish")  # it would push the running stage's run
        running = f"error: train[single] is already running in this project (pid {pid}, "
        assert line.startswith(running) and f"(kill {pid})" in line
        release.touch()
        assert first.wait(timeout=240) == 0, first.output()
    assert runs_of(project, "single") == ["FINISHED"]  # one run for the one stage run
    record = json.loads((project / "checkpoints/single/latest.json").read_text())
    assert [row["epoch"] for row in record["history"]] == [1, 2]  # one writer, every epoch
    run(project, "python", "-m", "pipeline.publish")  # and publish once nothing runs


def test_a_killed_stage_leaves_nothing_that_blocks_its_rerun(fetched_project, tmp_path):
    project = fetched_project()
    release = tmp_path / "never"
    with held_single(project, tmp_path, release) as first:
        first.wait_for_output(HOLD, timeout=240)
        first.signal_group(signal.SIGKILL)  # the launcher and its worker: no cleanup at all
        first.proc.wait(timeout=60)
        wait_for(lambda: not any(p.is_running() for p in first._tree), 60, "the workers' end")
    out = run(project, "python", "-m", "pipeline.train", "single").stdout
    assert "launch[single]" in out


def test_a_second_quickstart_is_refused(fetched_project, tmp_path):
    project = fetched_project()
    release = tmp_path / "go-on"
    with Background(
        project,
        *("python", "-m", "pipeline.quickstart", "strategies=[single]"),
        *("data.limit_train=512", "data.limit_test=128", "train.epochs=2"),
        log=tmp_path / "quick.log",
        PARALLEL_LAB_FAULT=f"rank=0,epoch=1,step=1,action=hold,release={release}",
    ) as first:
        first.wait_for_output(HOLD, timeout=240)
        line = refused(project, "pipeline.quickstart")
        assert line.startswith(
            f"error: the quickstart (python -m pipeline.quickstart) is already running in this "
            f"project (pid {first.proc.pid}"
        )
        release.touch()
        assert first.wait(timeout=300) == 0, first.output()


def test_two_stages_started_together_on_a_new_store_both_make_it(fetched_project, tmp_path):
    """DVC's queue workers start stages together: the store's first creation is one
    process's, the other waits for it (no "Online migration" race)."""
    project = fetched_project()
    store = "sqlite:///new.db"  # relative: made by the stages, not copied from a template
    stages = [
        Background(
            project,
            *("python", "-m", "pipeline.train", name),
            log=tmp_path / f"{name}.log",
            MLFLOW_TRACKING_URI=store,
        )
        for name in ("single", "ddp")
    ]
    for stage in stages:
        with stage:
            assert stage.wait(timeout=300) == 0, stage.output()
            assert "Online migration" not in stage.output()
    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'new.db'}")
    runs = client.search_runs([client.get_experiment_by_name("tests").experiment_id])
    assert sorted((r.data.tags["strategy"], r.info.status) for r in runs) == [
        ("ddp", "FINISHED"),
        ("single", "FINISHED"),
    ]
