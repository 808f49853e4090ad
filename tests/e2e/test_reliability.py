"""Faults, for real: killed ranks under torchrun restarts, SIGTERM, and MLflow outages.

Every run here is a real multi-process job on the CPU (gloo). On the CPU a resumed run must be
bitwise identical to an uninterrupted one: same final weights, same metrics.
"""

import json
import re
import shutil
import signal

import pytest
import torch
from mlflow.tracking import MlflowClient

from pipeline.errors import FAILURE_EXIT, STOPPED_EXIT
from pipeline.interrupts.stop import VOTE_EVERY_STEPS
from pipeline.results import read_history
from support import (
    Background,
    MlflowServer,
    dvc,
    free_port,
    make_project,
    project_temp,
    run,
    tiny_params,
    wait_for,
)

TINY = {
    "model": {"width": 4},
    "train": {"epochs": 2, "batch_size": 32, "eval_batch_size": 64},
    "data": {"limit_train": 128, "limit_test": 64},
    "strategies": ["ddp"],
}
METRICS = ("train_loss", "test_loss", "test_acc", "best_test_acc")


def mlflow_runs(uri: str, experiment: str = "tests"):
    """The client and the strategy runs (a `dvc repro` adds a "comparison" parent too)."""
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    runs = [] if exp is None else client.search_runs([exp.experiment_id])
    return client, [r for r in runs if r.info.run_name != "comparison"]


def final_state(project):
    model = torch.load(project / "results/ddp/model.pt", weights_only=True)
    metrics = json.loads((project / "results/ddp/summary.json").read_text())
    history = [
        line.split(",")[:5]
        for line in (project / "results/ddp/history.csv").read_text().splitlines()
    ]
    return model, {k: metrics[k] for k in METRICS}, history


@pytest.fixture(scope="module")
def fault_project(tmp_path_factory, http_mirror):
    project = make_project(
        tmp_path_factory.mktemp("faults") / "project", tiny_params(http_mirror, **TINY)
    )
    run(project, "python", "-m", "pipeline.fetch")
    run(
        project,
        "python",
        "-m",
        "pipeline.train",
        "ddp",
        MLFLOW_TRACKING_URI=f"sqlite:///{project / 'reference.db'}",
    )
    return project, final_state(project)


def reset(project):
    for name in ("results", "checkpoints"):
        shutil.rmtree(project / name, ignore_errors=True)


# PARALLEL_LAB_FAULT chains: where a rank dies (SIGKILL), one point per torchrun attempt, in
# the order training reaches them; each restart resumes from the last checkpoint and runs into
# the next. Two jobs of six restarts cover every point rather than twelve jobs of one.
KILL_CHAINS = {
    "rank0": [
        "rank=0,point=start",
        "rank=0,epoch=1,step=2",
        "rank=0,epoch=1,point=checkpoint",  # mid checkpoint write: own file done, commit pending
        "rank=0,epoch=2,step=0",
        "rank=0,epoch=2,point=eval",
        "rank=0,point=end",  # after training, before results are written
    ],
    "rank1": [
        "rank=1,point=start",
        "rank=1,epoch=1,step=0",
        "rank=1,epoch=1,point=eval",
        "rank=1,epoch=1,point=checkpoint",
        "rank=1,epoch=2,step=3",  # the last step
        "rank=1,epoch=2,point=checkpoint",  # the final checkpoint
    ],
}


@pytest.mark.parametrize("chain", KILL_CHAINS)
def test_killed_ranks_restart_and_finish_identically(fault_project, chain):
    project, (ref_model, ref_metrics, ref_history) = fault_project
    reset(project)
    faults = KILL_CHAINS[chain]
    uri = f"sqlite:///{project / f'faults-{chain}.db'}"
    proc = run(
        project,
        "python",
        "-m",
        "pipeline.train",
        "ddp",
        f"checkpoint.max_restarts={len(faults)}",
        PARALLEL_LAB_FAULT=";".join(faults),
        MLFLOW_TRACKING_URI=uri,
        timeout=300,
    )
    # counted anywhere in the output: two ranks printing at once can split a line of one
    # (print writes its text and its newline apart) around the other's
    killed = re.findall(r"fault: rank \d+ killed", proc.stdout)
    assert len(killed) == len(faults), proc.stdout  # every attempt died at its point
    model, metrics, history = final_state(project)
    assert metrics == ref_metrics and history == ref_history
    assert all(torch.equal(model[k], ref_model[k]) for k in ref_model)
    client, runs = mlflow_runs(uri)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(runs[0].info.run_id, "test_acc")]
    assert steps == [1, 2]  # every epoch once, none twice


def test_a_crashed_stage_leaves_its_run_failed_until_a_rerun_finishes_it(fault_project):
    """A rank killed without restarts ends the stage; its MLflow run says FAILED (the
    launcher marks it: the dead worker could not), and the rerun resumes the same run."""
    project, (ref_model, ref_metrics, _) = fault_project
    reset(project)
    uri = f"sqlite:///{project / 'crash.db'}"
    crashed = run(
        project,
        "python",
        "-m",
        "pipeline.train",
        "ddp",
        check=False,
        PARALLEL_LAB_FAULT="rank=1,epoch=2,step=0",
        MLFLOW_TRACKING_URI=uri,
    )
    assert crashed.returncode not in (0, 2), crashed.stderr[-3000:]
    (failed,) = mlflow_runs(uri)[1]
    assert failed.info.status == "FAILED"
    rerun = run(project, "python", "-m", "pipeline.train", "ddp", MLFLOW_TRACKING_URI=uri)
    assert "resuming at epoch 2 step 0" in rerun.stdout
    (finished,) = mlflow_runs(uri)[1]
    assert finished.info.run_id == failed.info.run_id and finished.info.status == "FINISHED"
    assert final_state(project)[1] == ref_metrics


def test_an_exception_in_a_worker_is_shown_with_its_traceback(fault_project):
    """A forked worker's exception reaches torchelastic's error file, not the terminal: the
    launcher prints the worker's traceback, then one line naming the rank and the error."""
    project, _ = fault_project
    reset(project)
    crashed = run(
        project,
        "python",
        "-m",
        "pipeline.train",
        "single",
        check=False,
        PARALLEL_LAB_FAULT="rank=0,point=start,action=raise",
        MLFLOW_TRACKING_URI=f"sqlite:///{project / 'raised.db'}",
    )
    error = "RuntimeError: fault: rank 0 raised at the start"
    assert crashed.returncode == FAILURE_EXIT, crashed.stderr[-3000:]
    trace = crashed.stderr[crashed.stderr.index("Traceback (most recent call last):") :]
    assert "pipeline/interrupts/faults.py" in trace and f"\n{error}\n" in trace
    last = crashed.stderr.strip().splitlines()[-1]
    assert last == f"launch[single]: worker rank 0 exited with code 1 ({error})"
    # torch.multiprocessing keeps a raised worker's error in a pytorch-errorfile-*.pickle of
    # the temporary directory and never removes it: the stage's own (removed with it) holds it
    temp = project_temp(project)
    assert not list(temp.glob("pytorch-errorfile-*")), sorted(temp.iterdir())


def test_only_the_strategys_own_section_and_hardware_decide_its_resume(fault_project):
    """A finished run is not trained again, even with its metrics.json gone and another
    strategy's section edited (fsdp.nproc): the rerun resumes it, in the same MLflow run.
    Other hardware (torch's kernels dispatched to the plain DEFAULT instruction set instead
    of this CPU's AVX2 or AVX-512) and a key of ddp's own section that changes what it
    computes (ddp.sync_bn) each start it afresh, saying why in one line (those runs are
    stopped there: how a fresh run trains is every other test's)."""
    project, (_, ref_metrics, _) = fault_project
    reset(project)
    uri = f"sqlite:///{project / 'sections.db'}"
    train = ("python", "-m", "pipeline.train", "ddp")
    run(project, *train, MLFLOW_TRACKING_URI=uri)
    (project / "results/ddp/metrics.json").unlink()
    again = run(
        project, *train, "fsdp.nproc=3", "pipeline_parallel.stages=3", MLFLOW_TRACKING_URI=uri
    )
    # a finished run's resume says so (issue 68), no longer "resuming at epoch 3"
    assert "already trained: all 2 epoch(s)" in again.stdout and "epoch 1/2" not in again.stdout
    assert final_state(project)[1] == ref_metrics
    assert len(mlflow_runs(uri)[1]) == 1

    def afresh(*args: str, **env: str) -> str:
        with Background(
            project, *train, *args, log=project / "afresh.log", MLFLOW_TRACKING_URI=uri, **env
        ) as rerun:
            rerun.wait_for_output("training from scratch", timeout=120)
            (line,) = [line for line in rerun.output().splitlines() if "not resuming" in line]
        return line

    line = afresh(ATEN_CPU_CAPABILITY="default")
    assert "it ran on other hardware (kind:" in line and "(DEFAULT)" in line, line
    line = afresh("ddp.sync_bn=false")
    assert "ddp.sync_bn: True -> False" in line, line


def test_checkpoint_of_another_width_is_refused(fault_project):
    project, _ = fault_project
    reset(project)
    run(
        project,
        "python",
        "-m",
        "pipeline.train",
        "single",
        "model.width=8",
        "train.epochs=1",
        MLFLOW_TRACKING_URI=f"sqlite:///{project / 'w8.db'}",
    )
    shutil.move(project / "checkpoints/single", project / "width8")
    proc = run(
        project,
        "python",
        "-m",
        "pipeline.train",
        "single",
        "checkpoint.resume_from=width8",
        check=False,
        MLFLOW_TRACKING_URI=f"sqlite:///{project / 'w4.db'}",
    )
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: width8") and "model.width" in last and "shape" in last


# --- SIGTERM (docker stop) ------------------------------------------------------------------


def latest(project):
    try:
        return json.loads((project / "checkpoints/ddp/latest.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def test_sigterm_mid_epoch_checkpoints_then_dvc_repro_resumes(tmp_path, http_mirror):
    slow = {
        **TINY,
        "model": {"width": 8},
        "train": {"epochs": 3, "batch_size": 16, "eval_batch_size": 64},
        "data": {"limit_train": 512, "limit_test": 64},
    }
    project = make_project(tmp_path / "project", tiny_params(http_mirror, **slow))
    # rank 0 waits before step 2 of epoch 2 until the signal is there: it lands mid-epoch
    with Background(
        project,
        "dvc",
        "repro",
        log=tmp_path / "repro.log",
        PARALLEL_LAB_FAULT="rank=0,epoch=2,step=2,action=hold",
    ) as repro:
        repro.wait_for_output("fault: rank 0 holding before step 2 of epoch 2", timeout=240)
        repro.signal_group(signal.SIGTERM)  # what `docker stop` does to the whole container
        code = repro.wait(timeout=120)
    out = repro.output()
    assert code != 0, out
    record = latest(project)
    # the ranks stopped at their next vote, at most VOTE_EVERY_STEPS steps after the one
    # before the hold (pipeline/interrupts/stop.py): mid-epoch 2 (0-based 1) of 32 steps
    stop_step = record["step"]
    assert record["epoch"] == 1 and 2 < stop_step <= 2 + VOTE_EVERY_STEPS, record
    assert f"SIGTERM: checkpointed at epoch 2 step {stop_step}" in out
    uri = f"sqlite:///{project / 'mlflow.db'}"
    (stopped,) = mlflow_runs(uri)[1]
    assert stopped.info.status == "KILLED"  # stopped, to be resumed
    resumed = dvc(project, "repro", timeout=400)
    assert f"resuming at epoch 2 step {stop_step}" in resumed.stdout
    metrics = json.loads((project / "results/ddp/summary.json").read_text())
    assert metrics["epochs"] == 3
    (run_,) = mlflow_runs(uri)[1]  # the same run, resumed and finished
    assert run_.info.run_id == stopped.info.run_id and run_.info.status == "FINISHED"
    # Epoch 2 is the resumed process's first: a warm-up, split between the two processes;
    # its seconds count every step, those before the stop from the checkpoint, and its
    # samples/s the whole epoch's samples over them; the steady figures are epoch 3's alone.
    history = read_history("ddp", project / "results")
    assert [r.warmup for r in history] == [True, True, False]
    assert [r.resumed_at_step for r in history] == [0, stop_step, 0]
    assert history[1].epoch_seconds > record["epoch_seconds"] > 0
    assert history[1].wall_seconds > record["wall_seconds"] > history[0].wall_seconds
    steps, batch = 512 // 16, 16
    samples = [round(r.samples_per_s * r.epoch_seconds) for r in history]
    assert samples == [steps * batch] * 3
    assert metrics["steady_epoch_seconds"] == pytest.approx(history[2].epoch_seconds, rel=1e-5)
    assert metrics["steady_samples_per_s"] * metrics["steady_epoch_seconds"] == pytest.approx(
        steps * batch
    )
    client = MlflowClient(tracking_uri=uri)
    marks = client.get_metric_history(run_.info.run_id, "warmup")
    assert [(m.step, m.value) for m in marks] == [(1, 1.0), (2, 1.0), (3, 0.0)]
    # identical to an uninterrupted run of the same configuration
    reference = make_project(tmp_path / "reference", tiny_params(http_mirror, **slow))
    shutil.copytree(project / "data", reference / "data")
    run(reference, "python", "-m", "pipeline.train", "ddp", timeout=400)
    ref = json.loads((reference / "results/ddp/summary.json").read_text())
    assert {k: metrics[k] for k in METRICS} == {k: ref[k] for k in METRICS}


def test_slow_steps_stop_at_the_next_vote_inside_the_grace(fault_project, tmp_path):
    """Issue 28: the ranks voted on a SIGTERM every 16 steps, so at seconds a step (width 64
    on the CPU) the vote came after torchrun's SIGKILL, 30 s after it forwarded the SIGTERM,
    and the run was lost. Now the first vote comes after the first step and the next ones at
    most VOTE_EVERY_S apart: a step here takes longer than that (about 1.8 s, 64 images a
    rank on one thread), so every step boundary is a vote. Rank 0 holds right after the
    first vote (before step 1) for the SIGTERM; the next vote, before step 2, agrees on it."""
    project, _ = fault_project
    reset(project)
    slow = (
        "model.width=64",
        "train.batch_size=128",
        "data.limit_train=512",  # 4 steps
        "train.epochs=1",
        "checkpoint.every_epochs=0",  # the SIGTERM's checkpoint is the only one
        "report.system_metrics_interval_s=null",
    )
    with Background(
        project,
        *("python", "-m", "pipeline.train", "ddp", *slow),
        log=tmp_path / "train.log",
        MLFLOW_TRACKING_URI=f"sqlite:///{project / 'slow.db'}",
        PARALLEL_LAB_FAULT="rank=0,epoch=1,step=1,action=hold",
    ) as train:
        train.wait_for_output("fault: rank 0 holding before step 1 of epoch 1", timeout=240)
        train.signal_group(signal.SIGTERM)
        code = train.wait(timeout=120)
    out = train.output()
    assert code == STOPPED_EXIT, out[-4000:]
    assert "SIGTERM: checkpointed at epoch 1 step 2" in out, out[-4000:]
    assert (latest(project)["epoch"], latest(project)["step"]) == (0, 2)


def test_a_run_whose_only_epoch_was_resumed_mid_way_has_no_speed_and_keeps_its_time(
    fault_project, tmp_path
):
    """Issue 28, through the CLI: a 1-epoch single run stopped by SIGTERM before step 3 of 4
    and resumed. Its one epoch ran in two processes: no steady speed (empty, with the reason),
    and its total time includes the time before the stop, which the SIGTERM's checkpoint
    recorded."""
    project, _ = fault_project
    reset(project)
    train = ("python", "-m", "pipeline.train", "single", "train.epochs=1")
    uri = f"sqlite:///{project / 'split.db'}"
    with Background(
        project,
        *train,
        log=tmp_path / "train.log",
        MLFLOW_TRACKING_URI=uri,
        PARALLEL_LAB_FAULT="rank=0,epoch=1,step=2,action=hold",
    ) as stopped:
        stopped.wait_for_output("fault: rank 0 holding before step 2 of epoch 1", timeout=240)
        stopped.signal_group(signal.SIGTERM)
        assert stopped.wait(timeout=120) != 0, stopped.output()
    # one process stops at the next step: step 2 ran, the checkpoint is before step 3
    assert "SIGTERM: checkpointed at epoch 1 step 3" in stopped.output()
    record = json.loads((project / "checkpoints/single/latest.json").read_text())
    assert (record["epoch"], record["step"]) == (0, 3)
    resumed = run(project, *train, MLFLOW_TRACKING_URI=uri)
    assert "resuming at epoch 1 step 3" in resumed.stdout
    assert "(warm-up) (resumed at step 3)" in resumed.stdout
    metrics = json.loads((project / "results/single/summary.json").read_text())
    speed = ("warmup_epoch_seconds", "steady_epoch_seconds", "steady_samples_per_s")
    assert [metrics[k] for k in speed] == [None, None, None]
    assert metrics["steady_basis"] == "none"
    assert metrics["speed_note"].startswith("no steady epoch: every epoch was the first its")
    assert "(epoch 1 at step 3)" in metrics["speed_note"]
    (row,) = read_history("single", project / "results")
    assert row.resumed_at_step == 3
    assert metrics["total_seconds"] == pytest.approx(row.wall_seconds, rel=1e-5)
    # the time before the stop is counted: in the run's clock and in the epoch's seconds
    assert metrics["total_seconds"] > record["wall_seconds"] >= record["epoch_seconds"] > 0
    assert row.epoch_seconds > record["epoch_seconds"]
    assert row.samples_per_s * row.epoch_seconds == pytest.approx(128, rel=1e-5)


# --- MLflow outages --------------------------------------------------------------------------


@pytest.fixture
def server(tmp_path):
    srv = MlflowServer(tmp_path, free_port())
    yield srv
    srv.kill()


def epochs_in_mlflow(uri: str) -> list[int]:
    client, runs = mlflow_runs(uri)
    assert len(runs) <= 1
    return (
        []
        if not runs
        else [m.step for m in client.get_metric_history(runs[0].info.run_id, "test_acc")]
    )


def test_server_killed_mid_run_and_restarted_loses_nothing(tmp_path, http_mirror, server):
    slow = {
        **TINY,
        "model": {"width": 8},
        "train": {"epochs": 6, "batch_size": 16, "eval_batch_size": 64},
        "data": {"limit_train": 256, "limit_test": 64},
    }
    project = make_project(tmp_path / "project", tiny_params(http_mirror, **slow))
    run(project, "python", "-m", "pipeline.fetch")
    server.start()
    go_on = tmp_path / "server-is-down"
    # rank 0 waits at the start of epoch 2 until the server has been killed
    with Background(
        project,
        "python",
        "-m",
        "pipeline.train",
        "ddp",
        "mlflow.final_sync_wait_s=180",
        log=tmp_path / "train.log",
        MLFLOW_TRACKING_URI=server.uri,
        PARALLEL_LAB_FAULT=f"rank=0,epoch=2,action=hold,release={go_on}",
    ) as train:
        train.wait_for_output("fault: rank 0 holding before step 0 of epoch 2", timeout=240)
        wait_for(lambda: 1 in epochs_in_mlflow(server.uri), 120, "epoch 1 in MLflow")
        server.kill()
        go_on.touch()
        train.wait_for_output("unreachable", timeout=240)  # an epoch's push found it down
        server.start()  # the stage's final push waits up to mlflow.final_sync_wait_s for it
        code = train.wait(timeout=300)
    out = train.output()
    assert code == 0, out
    assert "pending" in out
    client, runs = mlflow_runs(server.uri)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(runs[0].info.run_id, "test_acc")] == [
        1,
        2,
        3,
        4,
        5,
        6,
    ]
    assert {"metrics.json", "model.pt"} <= {
        a.path for a in client.list_artifacts(runs[0].info.run_id)
    }


def test_sigterm_after_the_last_step_loses_nothing_and_ends_within_the_grace(
    fault_project, tmp_path
):
    """A SIGTERM that lands after the last step (rank 0 held at the `end` point) with the
    tracking server away and mlflow.final_sync_wait_s far longer than torchrun's grace: the
    results and the final checkpoint are written, the final push gives up at once instead of
    racing torchrun's SIGKILL, and `python -m pipeline.publish` delivers the whole run later."""
    project, (_, ref_metrics, _) = fault_project
    reset(project)
    away = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with Background(
        project,
        "python",
        "-m",
        "pipeline.train",
        "ddp",
        "mlflow.final_sync_wait_s=900",
        log=tmp_path / "train.log",
        MLFLOW_TRACKING_URI=away,
        PARALLEL_LAB_FAULT="rank=0,point=end,action=hold",
    ) as train:
        train.wait_for_output("fault: rank 0 holding at the end", timeout=240)
        train.signal_group(signal.SIGTERM)
        # inside torchrun's 30 s grace, and far inside final_sync_wait_s: neither the push nor
        # a finished worker waited (for the server; for the agent to read its return value)
        code = train.wait(timeout=25)
    # training had finished: the stage succeeded, though torchrun exits non-zero after it
    # forwards a signal
    assert code == 0, train.output()[-4000:]
    # the server was away from the start: the stage said so and how to publish later
    assert "unreachable" in train.output() and "python -m pipeline.publish" in train.output()
    assert final_state(project)[1] == ref_metrics  # every epoch's result, as if undisturbed
    assert (latest(project)["epoch"], latest(project)["step"]) == (2, 0)
    uri = f"sqlite:///{project / 'late.db'}"
    run(project, "python", "-m", "pipeline.publish", MLFLOW_TRACKING_URI=uri)
    client, (published,) = mlflow_runs(uri)
    steps = [m.step for m in client.get_metric_history(published.info.run_id, "test_acc")]
    assert steps == [1, 2] and "model.pt" in {
        a.path for a in client.list_artifacts(published.info.run_id)
    }
