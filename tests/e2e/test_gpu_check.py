"""`make gpu-check DEVICE=cpu`: the GPU check's script at its tiny CPU size, so it cannot rot
between the rare runs on a GPU. Strategies train through the real stages; every check
must pass and every figure the GPU run reports must be there."""

import json
import os
import subprocess
import sys

import torch

from support import LEARNED, REPO

# single (the ratios' reference), fsdp (an identity kept at any world size) and
# pipeline_parallel (its stages in one process) take every path of the script; every
# strategy's stage itself is tested by the every_strategy runs, so three keep this cheap
RUN = ["single", "fsdp", "pipeline_parallel"]
CHECKS = {"replicas_bf16", "precision_auto", "memory_peaks", "accuracy_is_model", "mlflow_runs"}


def gpu_check(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    cmd = [sys.executable, "-m", "benchmarks.gpu_check", *args]
    return subprocess.run(cmd, cwd=REPO, env=env, text=True, capture_output=True, timeout=900)


def test_the_cpu_run_passes_every_check_and_measures_every_strategy(tmp_path):
    out = tmp_path / "gpu-check.json"
    proc = gpu_check("--device", "cpu", "--synthetic", "--strategies", *RUN, "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert {c["check"] for c in result["checks"] if c["ok"]} == CHECKS
    for name in CHECKS:
        assert f"gpu-check: PASS {name}:" in proc.stdout
    assert result["info"]["torch"] == torch.__version__  # which torch it used
    assert result["data"] == "synthetic (512/128 images)"
    rows = result["rows"]
    assert set(rows) == set(RUN)
    assert rows["single"]["x_single"] == 1.0
    for name, row in rows.items():
        assert row["steady_epoch_s"] > 0 and row["samples_per_s"] > 0, name
        assert 0 < row["mfu"] < 1, name
        assert row["precision"] == "fp32", name  # precision auto on the CPU
        assert row["train_peak_mib"] and row["eval_peak_mib"], name
        # tiny_params' configuration (width 8, 512 samples, 2 epochs of 16 steps, the bands):
        # measured 1.0 for every strategy with AVX-512 and AVX2 kernels; bound 0.5, chance 0.1
        assert row["test_acc"] >= LEARNED, name
    assert f"| single | {rows['single']['steady_epoch_s']:.3f} | 1.00 |" in proc.stdout


def test_asking_for_a_gpu_where_there_is_none_is_one_line_and_exit_2():
    proc = gpu_check("--device", "cuda")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"gpu-check: --device cuda, but torch {torch.__version__} sees no GPU; expected a "
        "CUDA GPU (or DEVICE=cpu for the tiny CPU run)"
    ]
