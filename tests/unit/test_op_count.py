"""benchmarks/op_count.py: the operators one training step dispatches per strategy at world
size 1 (what a launch-bound GPU pays for), its pure arithmetic, and one tiny real count."""

from __future__ import annotations

import collections

import pytest

from benchmarks.op_count import main, over_single, per_step


def test_a_row_is_the_operators_per_step_those_that_compute_and_the_most_frequent():
    counts = collections.Counter(
        {"aten.convolution": 60, "aten.detach": 45, "aten.relu": 30, "aten.empty": 6}
    )
    row = per_step(counts, {"aten.detach"}, 3)
    assert row["ops_per_step"] == 47 and row["computing_per_step"] == 30  # no view, no empty
    assert list(row["top"].items())[:2] == [("aten.convolution", 20.0), ("aten.detach", 15.0)]
    rows = {"single": {"ops_per_step": 400.0}, "ddp": {"ops_per_step": 800.0}}
    assert over_single(rows, "ops_per_step") == {"ddp": 2.0}
    assert over_single({"ddp": rows["ddp"]}, "ops_per_step") == {}


def test_a_pipeline_step_runs_each_micro_batch_through_the_whole_model(tmp_path):
    """pipeline_parallel's 4 micro-batches each pass through every convolution: four times
    single's convolutions in one step, at any width."""
    small = ["model.width=4", "train.batch_size=32", "pipeline_parallel.microbatches=4"]
    result = main(
        ["--strategies", "single", "pipeline_parallel", "--steps", "1", "--out"]
        + [str(tmp_path / "ops.json"), "--set", *small]
    )
    convolutions = {n: r["top"].get("aten.convolution") for n, r in result["rows"].items()}
    assert convolutions["pipeline_parallel"] == 4 * convolutions["single"] > 0
    assert result["over_single"]["pipeline_parallel"] == pytest.approx(
        result["rows"]["pipeline_parallel"]["ops_per_step"]
        / result["rows"]["single"]["ops_per_step"]
    )
    assert (tmp_path / "ops.json").exists()
