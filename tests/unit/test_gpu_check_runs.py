"""What gpu-check trains and how it counts the MLflow runs (benchmarks/gpu_check.py), without
a GPU: the plan of its runs, and the mlflow_runs check against a real SQLite store. (Its CPU
path end to end: tests/e2e/test_gpu_check.py.)"""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest
from mlflow.tracking import MlflowClient

from benchmarks.gpu_check import (
    EXPERIMENT,
    SIZES,
    StageFailed,
    check_mlflow,
    planned_runs,
    run_stage,
    stop_group,
)
from pipeline.strategies import NAMES
from support import wait_for


def test_every_run_on_a_gpu_logs_to_the_checks_experiment_single_at_defaults_too():
    """single_defaults once went to params.yaml's experiment: 6 runs counted for 7 stages."""
    runs = planned_runs(list(NAMES), "cuda", SIZES["cuda"], real_data=True)
    two = ["ddp_2ranks", "fsdp_2ranks", "pipeline_parallel_2ranks"]
    assert list(runs) == [*NAMES, "single_defaults", *two, "single_again"]
    assert runs["single_again"] == runs["single"]  # the A/A repeat, last
    # 2 ranks sharing the one GPU: the device named twice (issue 48)
    assert runs["ddp_2ranks"][1][:2] == ["devices=0,0", "ddp.nproc=2"]
    assert runs["pipeline_parallel_2ranks"][1][:3] == [
        "devices=0,0",
        "pipeline_parallel.stages=2",
        "pipeline_parallel.nproc=2",
    ]
    assert runs["single_defaults"] == (
        "single",
        ["devices=0", "train.epochs=2", f"mlflow.experiment={EXPERIMENT}"]
        + ["data.limit_train=60000", "data.limit_test=10000"],
    )
    for row, (_, overrides) in runs.items():
        assert f"mlflow.experiment={EXPERIMENT}" in overrides, row
        assert "data.limit_train=60000" in overrides, row


def test_the_cpu_run_has_no_defaults_row_and_limits_only_the_real_data():
    runs = planned_runs(["single", "fsdp"], "cpu", SIZES["cpu"], real_data=False)
    assert runs["fsdp"] == (
        "fsdp",
        ["devices=cpu", "fsdp.nproc=1", "model.width=8", "train.batch_size=32"]
        + ["train.epochs=2", "train.eval_batch_size=64", "train.channels_last=false"]
        + ["train.cuda_graph=none", f"mlflow.experiment={EXPERIMENT}"],
    )
    # 2 processes on the CPU, then the A/A repeat, last
    assert list(runs) == ["single", "fsdp", "fsdp_2ranks", "single_again"]
    assert runs["fsdp_2ranks"][1][:2] == ["devices=cpu", "fsdp.nproc=2"]
    none_again = planned_runs(["single", "fsdp"], "cpu", SIZES["cpu"], False, two_ranks=())
    assert list(none_again) == ["single", "fsdp", "single_again"]
    real = planned_runs(["single"], "cpu", SIZES["cpu"], real_data=True)
    assert real["single"][1][-2:] == ["data.limit_train=512", "data.limit_test=128"]


def finished(client: MlflowClient, experiment: str, acc: float) -> dict:
    """A stage's finding as gpu-check gathers it, with its FINISHED run in `experiment`."""
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(experiment)
    run = client.create_run(experiment_id)
    client.log_metric(run.info.run_id, "test_acc", acc)
    client.set_terminated(run.info.run_id, "FINISHED")
    return {"run": {"run_id": run.info.run_id}, "metrics": {"test_acc": acc}}


def test_mlflow_runs_counts_each_stages_own_run_in_the_experiment(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    rows = {"single": finished(client, EXPERIMENT, 0.9), "dp": finished(client, EXPERIMENT, 0.8)}
    assert check_mlflow(uri, rows) == {
        "check": "mlflow_runs",
        "ok": True,
        "detail": "2 runs in experiment 'gpu-check' for 2 stages",
    }
    elsewhere = {**rows, "single_defaults": finished(client, "parallel-lab", 0.9)}
    result = check_mlflow(uri, elsewhere)
    assert not result["ok"]
    assert result["detail"] == (
        "2 runs in experiment 'gpu-check' for 3 stages; single_defaults: in experiment "
        "'parallel-lab'"
    )
    shared = {**rows, "single_defaults": rows["single"]}
    result = check_mlflow(uri, shared)
    assert not result["ok"]
    assert result["detail"].endswith("; single_defaults: the run of single")
    assert "gpu-check: FAIL mlflow_runs:" in capsys.readouterr().out


# a stage's shape: a process with a child of its own (the launcher and a worker) that never
# ends; the child's pid in argv[1] once it runs
HANGS = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[1] + ".tmp", "w").write(str(child.pid))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)
"""


def test_stopping_a_stage_ends_its_whole_process_group(tmp_path):
    pid_file = tmp_path / "worker.pid"
    proc = subprocess.Popen(
        [sys.executable, "-c", HANGS, str(pid_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    wait_for(pid_file.exists, 120, "the stage's worker")
    worker = int(pid_file.read_text())
    stop_group(proc)
    assert proc.returncode is not None
    wait_for(
        lambda: not psutil.pid_exists(worker) or psutil.Process(worker).status() == "zombie",
        30,
        "the worker to end",
    )


def test_a_stage_past_its_time_fails_saying_so(tmp_path):
    cmd = [sys.executable, "-c", "import time; time.sleep(600)"]
    with pytest.raises(StageFailed, match="did not finish within 1 s"):
        run_stage(cmd, tmp_path, dict(os.environ), timeout_s=1)


def test_a_stage_that_exits_non_zero_says_its_code_and_error(tmp_path):
    cmd = [sys.executable, "-c", "import sys; sys.exit('broken here')"]
    with pytest.raises(StageFailed, match="exited 1: broken here"):
        run_stage(cmd, tmp_path, dict(os.environ), timeout_s=60)
