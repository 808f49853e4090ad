"""The comparison's arithmetic and table (pipeline/reporting/table.py) as pure functions."""

import pytest

from pipeline import results
from pipeline.batch_plan import BatchPlan
from pipeline.config import ConfigError, load_config
from pipeline.reporting import table
from pipeline.results import EpochRow, RunSummary
from support import run_summary


def history(accs, seconds, warmup=(), samples=None) -> list[EpochRow]:
    """Epochs 1..n; `warmup`: the epochs (1-based) marked warm-up; `samples`: each epoch's
    samples (64 each unless given)."""
    wall, rows = 0.0, []
    samples = samples or [64] * len(seconds)
    for i, (acc, s, n) in enumerate(zip(accs, seconds, samples)):
        wall += s
        rows.append(EpochRow(i + 1, 1.0, 0.5, 1.0, acc, s, n / s, wall, warmup=i + 1 in warmup))
    return rows


def metrics(name, devices, steady, acc, peaks) -> RunSummary:
    memory = {
        "memory_kind": "gpu",
        "peak_memory_mib": peaks,
        "peak_reserved_mib": peaks,
        "mem_imbalance": 1.0,
        "gpu0_share": 0.5,
        "eval_peak_memory_mib": {k: v / 4 for k, v in peaks.items()},
        "eval_peak_reserved_mib": peaks,
        "eval_mem_imbalance": 1.0,
        "eval_gpu0_share": 0.5,
    }
    return run_summary(name, devices, steady, acc, memory)


def test_warmup_is_the_first_epoch_and_steady_the_median_of_the_rest():
    accs = [0.5] * 4
    assert results.warmup_seconds(history(accs, [10.0, 2.0, 4.0, 3.0], {1})) == 10.0
    assert results.steady_seconds(history(accs, [10.0, 2.0, 4.0, 3.0], {1})) == 3.0
    assert results.steady_seconds(history(accs, [10.0, 2.0, 4.0], {1})) == 3.0
    # one epoch: no steady state to tell apart, it stands in (as every figure of the run)
    (one,) = history([0.5], [10.0], {1}, samples=[640])
    assert results.steady_rows([one]) == [one]
    assert results.steady_seconds([one]) == results.warmup_seconds([one]) == 10.0
    assert results.steady_samples_per_s([one]) == 64.0
    # epoch 1 counts as warm-up also in a history recorded before the mark existed
    assert results.steady_seconds(history(accs, [10.0, 2.0, 4.0, 3.0])) == 3.0


def test_steady_figures_leave_out_every_warmup_epoch():
    """A run stopped in epoch 3 at step 6 of 10 and resumed: epoch 3 is the resumed process's
    first, a warm-up, which ran steps 6..9 only; the steady epochs are 2 and 4."""
    plan = BatchPlan.make(32, 1).drawing_from(320)  # 10 steps of 32
    assert (plan.steps, plan.samples_per_epoch) == (10, 320)
    assert plan.samples_from(0) == 320 and plan.samples_from(6) == (10 - 6) * 32 == 128
    assert plan.samples_from(10) == 0
    with pytest.raises(ValueError):
        plan.samples_from(11)
    samples = [320, 320, plan.samples_from(6), 320]
    h = history([0.5] * 4, [9.0, 2.0, 1.5, 4.0], {1, 3}, samples)
    assert [r.epoch for r in results.steady_rows(h)] == [2, 4]
    assert h[2].samples_per_s * h[2].epoch_seconds == pytest.approx(128)
    assert results.steady_seconds(h) == 3.0  # median of 2.0 and 4.0
    assert results.steady_samples_per_s(h) == pytest.approx(320 / 3.0)
    assert results.warmup_seconds(h) == 9.0
    # every epoch a warm-up (each in a process of its own): all of them stand in
    h = history([0.5] * 2, [9.0, 1.5], {1, 2}, [320, 128])
    assert results.steady_rows(h) == h
    assert results.steady_samples_per_s(h) == pytest.approx(224 / 5.25)


def test_warmup_mark_goes_through_history_csv_and_the_checkpoint_record():
    rows = history([0.5, 0.6], [9.0, 2.0], {1})
    header, first, second = results.history_csv(rows).splitlines()
    column = header.split(",").index("warmup")
    assert (first.split(",")[column], second.split(",")[column]) == ("1", "0")
    assert rows[0].metrics()["warmup"] == 1.0 and rows[1].metrics()["warmup"] == 0.0
    assert [EpochRow.from_record(r.to_record()) for r in rows] == rows
    parsed = {k: float(v) for k, v in zip(header.split(","), first.split(","))}
    assert EpochRow.from_record(parsed).warmup is True
    old = {k: v for k, v in rows[0].to_record().items() if k != "warmup"}  # before the mark
    assert EpochRow.from_record(old).warmup is False and "warmup" not in rows[0].memory


def test_time_to_target_is_the_first_crossing_or_none():
    h = history([0.5, 0.8, 0.7, 0.9], [3.0, 2.0, 2.0, 2.0])
    assert table.time_to_target(h, 0.75) == (2, 5.0)
    assert table.time_to_target(h, 0.5) == (1, 3.0)
    assert table.time_to_target(h, 0.95) == (None, None)
    assert table.time_to_target(h, None) == (None, None)


def test_speedup_efficiency_and_delta():
    assert table.speedup(10.0, 4.0) == 2.5
    assert table.scaling_efficiency(2.5, 4) == 0.625
    assert table.delta(0.91, 0.9) == pytest.approx(0.01)
    assert table.speedup(None, 4.0) is None and table.scaling_efficiency(None, 2) is None
    assert table.delta(0.9, None) is None


def test_rows_compare_against_single():
    results = [
        metrics("single", ["cuda:0"], 10.0, 0.90, {"gpu0": 100.0}),
        metrics("ddp", ["cuda:0", "cuda:1"], 4.0, 0.88, {"gpu0": 60.0, "gpu1": 60.0}),
    ]
    hist = {"single": history([0.8, 0.9], [9.0, 10.0]), "ddp": history([0.7, 0.88], [9.0, 4.0])}
    single, ddp = table.comparison_rows(results, hist, 0.85)
    assert single["speedup_vs_single"] == 1.0 and single["acc_delta_vs_single"] == 0.0
    assert ddp["speedup_vs_single"] == 2.5 and ddp["scaling_efficiency"] == 1.25
    assert ddp["acc_delta_vs_single"] == pytest.approx(-0.02)
    assert (single["epoch_to_target"], single["time_to_target_s"]) == (2, 19.0)
    assert ddp["time_to_target_s"] == 13.0 and ddp["gpu0_share"] == 0.5
    text = table.markdown_table([single, ddp], 0.85)
    assert "peak allocated MiB per GPU" in text and "time to acc 0.85" in text
    assert "| ddp | 2 | cuda:0, cuda:1 | 32+32 | 9.00 | 4.00 | 1600 | 2.50x | 125% |" in text
    assert "gpu0 60, gpu1 60" in text and "13.0 s (epoch 2)" in text
    # training and evaluation peaks both shown; the peak and imbalance columns are training's
    head, cells = table.table_cells([single, ddp], 0.85)
    ddp_cells = dict(zip(head, cells[1]))
    assert ddp_cells["training peak allocated MiB per GPU"] == "gpu0 60, gpu1 60"
    assert ddp_cells["eval peak allocated MiB per GPU"] == "gpu0 15, gpu1 15"
    assert ddp_cells["training mem imbalance (max/mean)"] == "1.00"
    assert ddp["peak_memory_mib"] == {"gpu0": 60.0, "gpu1": 60.0}
    assert ddp["eval_peak_memory_mib"] == {"gpu0": 15.0, "gpu1": 15.0}


def test_rows_without_single_say_so_instead_of_inventing_a_baseline():
    ddp = metrics("ddp", ["cpu", "cpu"], 4.0, 0.8, {"cpu0": 900.0, "cpu1": 800.0})
    ddp.memory.update(memory_kind="cpu", peak_reserved_mib={})
    del ddp.memory["eval_peak_memory_mib"]  # results written before evaluation was measured
    (row,) = table.comparison_rows([ddp], {"ddp": history([0.5], [4.0])}, 0.9)
    assert row["speedup_vs_single"] is None and row["acc_delta_vs_single"] is None
    text = table.markdown_table([row], 0.9)
    assert "training peak RSS (CPU) MiB per process" in text
    assert "eval peak RSS (CPU) MiB per process" in text
    assert "| cpu0 900, cpu1 800 | 1.00 | n/a |" in text
    assert "| n/a | n/a |" in text and "not reached" in text
    # a CPU run's evaluation has no peak of its own (pipeline.results.NOT_SEPARABLE)
    ddp.memory.update(eval_peak_memory_mib="not separable on CPU", eval_mem_imbalance=None)
    (row,) = table.comparison_rows([ddp], {"ddp": history([0.5], [4.0])}, 0.9)
    text = table.markdown_table([row], 0.9)
    assert "| cpu0 900, cpu1 800 | 1.00 | not separable on CPU |" in text


def test_target_accuracy_is_a_fraction():
    with pytest.raises(ConfigError, match="report.target_accuracy: got 90.0, expected <= 1.0"):
        load_config("params.yaml", ["report.target_accuracy=90.0"])
    cfg = load_config("params.yaml", ["report.target_accuracy=null"])
    assert cfg.report.target_accuracy is None


def test_accuracy_file_has_a_column_for_every_known_strategy():
    text = table.accuracy_wide({"ddp": history([0.5, 0.75], [1, 1])}, ["single", "ddp"])
    assert text == "epoch,single,ddp\n1,,0.5\n2,,0.75\n"
