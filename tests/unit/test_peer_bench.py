"""benchmarks/peer.py, the Lightning peer row: its medians and table from a tiny result, the
exit when Lightning is missing (no Lightning needed), and the peer script itself where the
`peer` extra is installed."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.peer import default_job, job_table, medians, mfu, table

REPO = Path(__file__).resolve().parents[2]


def run(ours_wall: float, peer_wall: float, bare_wall: float | None = None) -> dict:
    row = {
        "ours": {"wall_s": ours_wall, "train_s": ours_wall / 2, "test_acc": 0.5},
        "peer": {
            "wall_s": peer_wall,
            "before_train_s": 5.0,
            "train_s": peer_wall - 5,
            "test_acc": 0.5,
        },
    }
    if bare_wall is not None:
        row["bare"] = {
            "wall_s": bare_wall,
            "before_train_s": 1.0,
            "train_s": bare_wall - 1,
            "test_acc": 0.5,
        }
    return row


def test_medians_and_the_ratio_of_the_median_walls():
    m = medians([run(10, 40, 4), run(30, 20, 16), run(20, 30, 8)])
    assert m["ours"]["wall_s"] == 20 and m["ours"]["train_s"] == 10
    assert m["peer"]["wall_s"] == 30 and m["peer"]["before_train_s"] == 5
    assert m["bare"]["wall_s"] == 8 and m["bare"]["train_s"] == 7
    assert m["ratio_wall"] == pytest.approx(20 / 30)
    assert m["ratio_bare"] == pytest.approx(8 / 30)


def test_table_rows_against_the_goal_with_the_floor_where_measured():
    sizes = {"quickstart": run(10, 40, 8), "one epoch": run(8, 10)}
    result = {
        "settings": {
            "sizes": {
                name: {"width": 8, "train": 6000, "test": 1000, "epochs": 3, "batch": 256}
                for name in sizes
            }
        },
        "sizes": {name: {"median": medians([r])} for name, r in sizes.items()},
    }
    lines = table(result).splitlines()
    assert len(lines) == 4
    assert lines[2] == (
        "| quickstart: width 8, 6000 images, 3 epochs | 10.0 | 5.0 | 40.0 | 5.0 | 35.0 "
        "| 8.0 | 7.0 | 0.25x (met) | 0.20x |"
    )
    assert lines[3].endswith("| 5.0 | - | - | 0.80x (missed) | - |")
    assert all(line.count("|") == lines[0].count("|") for line in lines)


def test_mfu_is_the_trained_flops_per_second_over_the_peak():
    size = {"train": 60000, "epochs": 10}
    # 1 GFLOP an image, 600k images in 60 s: 10 TFLOP/s of a 100 TFLOP/s peak
    assert mfu(1e9, size, 60.0, 100e12) == pytest.approx(0.10)
    assert mfu(1e9, size, 30.0, 100e12) == pytest.approx(0.20)  # twice as fast, twice the share


def test_the_default_job_is_params_yaml_experiment_at_full_size(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("model: {width: 32}\ntrain: {epochs: 4, batch_size: 128}\n")
    assert default_job(params) == (32, 60000, 10000, 4, 128)


def test_the_job_table_puts_the_three_jobs_in_rows_with_mfu_against_the_peak():
    r = run(20, 50, 10)
    result = {
        "settings": {"sizes": {"default job": {"train": 1000, "epochs": 2}}},
        "sizes": {"default job": {"median": medians([r]), "flops_per_image": 1e9}},
        "peak": {"flops": 1e12, "precision": "bf16", "source": "datasheet"},
    }
    lines = job_table(result, "default job").splitlines()
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| ours", "| bare loop", "| Lightning"]
    # ours: 2000 images' 2 TFLOP in its 10 training seconds, of a 1 TFLOP/s peak
    assert lines[2] == "| ours | 20.0 | 10.0 | 10.0 | 20.0% | 0.5000 | 0.40x (goal <= 0.5x: met) |"
    assert lines[3] == "| bare loop | 10.0 | 9.0 | 1.0 | 22.2% | 0.5000 | 0.20x |"
    assert lines[4] == "| Lightning | 50.0 | 45.0 | 5.0 | 4.4% | 0.5000 | 1.00x |"
    del result["peak"]  # a result from before MFU: the cell says nothing rather than guess
    assert job_table(result, "default job").splitlines()[2].split(" | ")[4] == "-"


def test_without_lightning_it_exits_2_naming_the_make_target():
    hidden = (
        "import runpy, sys; sys.modules['lightning'] = None; "
        "runpy.run_module('benchmarks.peer', run_name='__main__', alter_sys=True)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", hidden], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "benchmarks.peer: lightning is not installed; run `make peer-install` (the peer extra)"
    ]


@pytest.fixture
def fetched(tmp_path) -> Path:
    """A directory as a project's fetch stage leaves it: tiny learnable arrays."""
    from pipeline.data.fashion_mnist import ARRAYS, write_arrays
    from pipeline.data.synthetic import synthetic_split

    arrays = {}
    for split, n, seed in (("train", 256, 1), ("test", 128, 2)):
        arrays[f"{split}_images"], arrays[f"{split}_labels"] = synthetic_split(n, seed)
    (tmp_path / "data" / "fashion-mnist").mkdir(parents=True)
    write_arrays(tmp_path / "data" / "fashion-mnist" / ARRAYS, arrays)
    return tmp_path


def run_marked(module: str, project: Path, *args: str) -> dict:
    """`python -m module` in `project` at a tiny size, as benchmarks/peer.py runs it; its marks."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "MLFLOW_TRACKING_URI": f"sqlite:///{project / 'mlflow.db'}",
    }
    marks = project / "marks.json"
    argv = ["--width", "4", "--epochs", "2", "--batch-size", "64", "--marks", str(marks)]
    subprocess.run([sys.executable, "-m", module, *argv, *args], cwd=project, env=env, check=True)
    result = json.loads(marks.read_text())
    assert result["train_start"] < result["train_end"]
    assert 0.0 <= result["test_acc"] <= 1.0
    return result


def test_the_bare_loop_trains_and_writes_nothing_but_its_marks(fetched):
    marks = run_marked("benchmarks.bare_loop", fetched)
    assert sorted(p.name for p in fetched.iterdir()) == ["data", "marks.json"]
    # the floor under a stage's first step (benchmarks/startup.py)
    assert marks["train_start"] < marks["first_step"] < marks["train_end"]
    assert marks["steps"] == 4 * 2  # 256 images at batch 64, 2 epochs


def test_the_bare_loop_trains_and_tests_on_the_first_images_alone(fetched):
    marks = run_marked("benchmarks.bare_loop", fetched, "--limit-train", "128", "--limit-test", "1")
    assert marks["steps"] == 2 * 2  # 128 images at batch 64, 2 epochs; all 256: 4 an epoch
    assert marks["test_acc"] in (0.0, 1.0)  # one test image


def test_the_peer_trains_logs_checkpoints_and_marks(fetched):
    """Run as the benchmark runs it, a process of its own: Lightning's MLflow logger points
    MLflow's fluent API at its store for good (`mlflow.set_tracking_uri`), which in this
    process would redirect every later test's runs."""
    pytest.importorskip("lightning")
    tmp_path = fetched
    run_marked("benchmarks.lightning_peer", tmp_path, "--out", str(tmp_path / "peer"))
    checkpoints = list((tmp_path / "peer" / "checkpoints").glob("*.ckpt"))
    assert [p.name for p in checkpoints] == ["epoch=1-step=8.ckpt"]  # 256 // 64 steps an epoch
    with sqlite3.connect(tmp_path / "mlflow.db") as db:
        steps = db.execute("SELECT step FROM metrics WHERE key = 'test_acc' ORDER BY step")
        assert len(steps.fetchall()) == 2  # a validation every epoch
