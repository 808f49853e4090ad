"""What moves while a train stage runs: at a terminal (a pseudo-terminal from util-linux
`script`), a bar through DVC, the launcher and torchrun; off one, a line every
report.log_every_s seconds from the writer rank alone, MLflow's step metrics, and a
history.csv that grows by each epoch, for `dvc plots`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from mlflow.tracking import MlflowClient

from support import Background, dvc, project_env

STEP_METRICS = ("step_train_loss", "step_samples_per_s")


@pytest.mark.skipif(shutil.which("script") is None, reason="no util-linux `script`")
def test_at_a_terminal_each_epoch_has_a_live_bar(fetched_project):
    project = fetched_project()
    proc = subprocess.run(
        ["script", "-qfec", "dvc repro --single-item train@single", "/dev/null"],
        cwd=project,
        env=project_env(project),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=300,
    )
    out = proc.stdout.decode(errors="replace")
    assert proc.returncode == 0, out[-4000:]
    for epoch in (1, 2):
        # the bar's last state (16 steps of 32 samples), redrawn in place after a "\r" and
        # never on a new line, then cleared for the epoch's line
        last = re.search(
            rf"\repoch {epoch}/2: 100%\|[^\r\n]*\| 16/16 \[\d\d:\d\d<\d\d:\d\d, "
            rf"loss \d+\.\d{{4}}, \d+ samples/s\]\r +\r",
            out,
        )
        assert last, out[-4000:]
        assert f"train[single] epoch {epoch}/2: loss" in out
    assert " step 8/16: " not in out  # the bar stands for the log lines


def test_off_a_terminal_log_lines_step_metrics_and_a_growing_history(fetched_project, tmp_path):
    """report.log_every_s: 0 prints a line after every step: one per step, from rank 0 of
    the two; mlflow.log_every_steps: 5 logs at steps 5, 10, ... of the run."""
    project = fetched_project(report={"log_every_s": 0}, mlflow={"log_every_steps": 5})
    go_on = tmp_path / "go-on"
    with Background(
        project,
        "python",
        "-m",
        "pipeline.train",
        "ddp",
        log=tmp_path / "train.log",
        PARALLEL_LAB_FAULT=f"rank=0,epoch=2,step=2,action=hold,release={go_on}",
    ) as train:
        train.wait_for_output("fault: rank 0 holding before step 2 of epoch 2", timeout=240)
        # mid-run: history.csv holds epoch 1, and `dvc plots` shows it
        history = project / "results/ddp/history.csv"  # a DVC plot of train@ddp
        assert [line.split(",")[0] for line in history.read_text().splitlines()] == [
            "epoch",
            "1",
        ]
        assert not (project / "results/ddp/metrics.json").exists()
        plot = "results/ddp/history.csv"
        shown = json.loads(dvc(project, "plots", "show", "--json", plot).stdout)
        values = shown["data"][plot][0]["content"]["data"]["values"]
        assert [v["epoch"] for v in values] == ["1"] and float(values[0]["test_acc"]) >= 0
        go_on.touch()
        code = train.wait(timeout=240)
    out = train.output()
    assert code == 0, out[-4000:]
    lines = re.findall(
        r"^train\[ddp\] epoch (\d)/2 step (\d+)/16: loss \d+\.\d{4} \d+ samples/s "
        r"ETA \d+:\d\d memory cpu_0 \d+ MiB RSS$",
        out,
        re.MULTILINE,
    )
    assert [(int(e), int(s)) for e, s in lines] == [(e, s) for e in (1, 2) for s in range(1, 17)]

    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    (run_,) = client.search_runs([client.get_experiment_by_name("tests").experiment_id])
    for name in STEP_METRICS:
        logged = client.get_metric_history(run_.info.run_id, name)
        assert [m.step for m in logged] == [5, 10, 15, 20, 25, 30], name
        assert all(0 < m.value < float("inf") for m in logged), name
    # beside the per-epoch metrics, never among history.csv's columns
    assert not set(STEP_METRICS) & set(history.read_text().splitlines()[0].split(","))
    assert len(history.read_text().splitlines()) == 3
