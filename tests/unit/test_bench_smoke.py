"""benchmarks/bench.py in its tiniest form: every row runs and lands in the JSON. No timings
are judged here (a shared CI machine cannot promise any)."""

import json
import subprocess
import sys

from pipeline.data.download import convert
from pipeline.data.fashion_mnist import ARRAYS, write_arrays
from pipeline.strategies import NAMES
from support import REPO

ROWS = [
    "baseline",
    "single_dataloader",
    "single_fast",
    *(n for n in NAMES if n != "single"),
    "single_fast+mlflow",
]


def fetched(tmp_path, raw_dataset):
    """What the fetch stage leaves in data/fashion-mnist, from the synthetic raw files."""
    data = tmp_path / "fashion-mnist"
    (data / "raw").mkdir(parents=True)
    for gz in raw_dataset[0].glob("*.gz"):
        (data / "raw" / gz.name).write_bytes(gz.read_bytes())
    write_arrays(data / ARRAYS, convert(data / "raw"))
    return data


def test_bench_writes_every_row(tmp_path, raw_dataset):
    data = fetched(tmp_path, raw_dataset)
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.bench",
            "--width",
            "2",
            "--limit-train",
            "64",
            "--batch-size",
            "32",
            "--warmup",
            "1",
            "--epochs",
            "1",
            "--baseline-workers",
            "0",
            "--set",
            "data.workers=0",
            "report.system_metrics_interval_s=0.5",
            "--fast",
            "train.precision=bf16",
            "--data",
            str(data),
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "", "HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert set(ROWS) <= set(result["rows"])
    for name in ROWS:
        row = result["rows"][name]
        assert row["status"] == "ok", (name, row)
        assert row["epoch_s"] > 0 and row["samples_per_epoch"] == 64 and 0 < row["mfu"]
    assert result["rows"]["single_fast"]["precision"] == "bf16"
    assert result["rows"]["single_fast+mlflow"]["reference"] == "single_fast"
    # every strategy's cost against single with the same settings, in the JSON
    assert set(result["ratios_to_single"]) == set(NAMES) - {"single"}
    assert all(ratio > 0 for ratio in result["ratios_to_single"].values())
    assert [t["target"] for t in result["targets"]] == [
        "single_fast >= 2x baseline (1.5x at the very least)",
        "MLflow logging <= 1%",
    ]
    assert "| baseline |" in proc.stdout


def test_profile_step_reports_the_step_and_its_operators(tmp_path, raw_dataset):
    data = fetched(tmp_path, raw_dataset)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.profile_step",
            "--strategy",
            "ddp",
            "--warmup",
            "2",
            "--steps",
            "2",
            "--rows",
            "3",
            "--data",
            str(data),
            "--trace",
            str(tmp_path / "t.json"),
            "--set",
            "model.width=2",
            "train.batch_size=32",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "", "HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "ddp model.width=2 train.batch_size=32 | batch 32" in proc.stdout
    assert "step: " in proc.stdout and "Self CPU time total" in proc.stdout
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]


def test_sync_bn_rows_per_tree_and_ratios_within_each_round():
    """benchmarks/sync_bn.py's plan and arithmetic: each chosen strategy's rows, once per
    tree, another tree named in the label; a ratio is the median of the per-round ratios."""
    from pathlib import Path

    from benchmarks.sync_bn import plan, ratios

    rows = plan(["ddp"], {"this": REPO, "old": Path("/elsewhere")})
    assert [(label, tree) for label, _, _, tree in rows] == [
        ("ddp, sync_bn off", "this"),
        ("ddp, sync_bn on", "this"),
        ("ddp, sync_bn off (old)", "old"),
        ("ddp, sync_bn on (old)", "old"),
    ]
    assert all(strategy == "ddp" for _, strategy, _, _ in rows)
    assert rows[1][2] == ["ddp.sync_bn=true"]
    rounds = [{"a": 1.0, "b": 2.0}, {"a": 2.0, "b": 3.0}, {"a": 1.0, "b": 5.0}]
    assert ratios(rounds) == {"a": 1.0, "b": 2.0}  # the per-round ratios 2, 1.5 and 5


def test_stop_time_rows_per_tree_and_ratios_to_this_trees_same_row():
    """benchmarks/stop_time.py's plan and arithmetic: every row once per tree, another tree
    named in the label; a ratio is the median over rounds of the row's seconds over this
    tree's same row in the same round."""
    from benchmarks.stop_time import ROWS, plan, ratios

    rows = plan(["this", "old"])
    assert [(label, tree) for label, _, tree in rows] == [
        *((row, "this") for row in ROWS),
        *((f"{row} (old)", "old") for row in ROWS),
    ]
    assert all(row in ROWS for _, row, _ in rows)
    mid, last = "SIGTERM mid-epoch", "SIGTERM after the last step"
    chosen = [r for r in rows if r[1] in (mid, last)]
    rounds = [
        {mid: 1.0, last: 0.5, f"{mid} (old)": 1.0, f"{last} (old)": 30.0},
        {mid: 2.0, last: 1.0, f"{mid} (old)": 1.0, f"{last} (old)": 29.0},
        {mid: 1.0, last: 0.25, f"{mid} (old)": 3.0, f"{last} (old)": 31.0},
    ]
    assert ratios(rounds, chosen) == {
        mid: 1.0,
        last: 1.0,
        f"{mid} (old)": 1.0,  # the per-round ratios 1, 0.5 and 3
        f"{last} (old)": 60.0,  # 60, 29 and 124
    }
    # what each row expects of the stage: a stop at a checkpoint (75) or a finished run (0)
    assert [ROWS[r].exit_code for r in ROWS] == [75, 0, 0]
