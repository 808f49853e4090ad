"""The comparison's arithmetic and table (pipeline/reporting/table.py) as pure functions, and
the throughput plot's captions, which say what the table's cells say."""

import pytest

from pipeline import results
from pipeline.batch_plan import BatchPlan
from pipeline.config import ConfigError, load_config
from pipeline.reporting import device_table, table
from pipeline.reporting.plots import bar_label
from pipeline.results import EpochRow, RunSummary
from support import run_summary


def history(accs, seconds, warmup=(), samples=None, resumed=None) -> list[EpochRow]:
    """Epochs 1..n; `warmup`: the epochs (1-based) marked warm-up; `samples`: each epoch's
    samples (64 each unless given); `resumed`: {epoch: the step a process resumed it at}."""
    wall, rows = 0.0, []
    samples = samples or [64] * len(seconds)
    resumed = resumed or {}
    for i, (acc, s, n) in enumerate(zip(accs, seconds, samples)):
        wall += s
        rows.append(
            EpochRow(
                i + 1,
                1.0,
                0.5,
                1.0,
                acc,
                s,
                n / s,
                wall,
                warmup=i + 1 in warmup,
                resumed_at_step=resumed.get(i + 1, 0),
            )
        )
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
    # one whole epoch: no steady state to tell apart, it stands in, labelled as warm-up
    (one,) = history([0.5], [10.0], {1}, samples=[640])
    assert results.steady_rows([one]) == [one]
    assert results.steady_seconds([one]) == results.warmup_seconds([one]) == 10.0
    assert results.steady_samples_per_s([one]) == 64.0
    assert results.steady_basis([one]) == results.WARMUP_STANDS_IN
    assert results.speed_note([one]) == (
        "steady figures include warm-up: every epoch was the first its process ran, none is "
        "free of a start's one-off work; epoch 1 stands in"
    )
    assert results.steady_basis(history(accs, [10.0, 2.0], {1})) == results.STEADY
    assert results.speed_note(history(accs, [10.0, 2.0], {1})) is None
    # epoch 1 counts as warm-up also in a history recorded before the mark existed
    assert results.steady_seconds(history(accs, [10.0, 2.0, 4.0, 3.0])) == 3.0


def test_steady_figures_leave_out_every_warmup_epoch():
    """A run stopped in epoch 3 at step 6 of 10 and resumed: epoch 3 is the resumed process's
    first, a warm-up, split between two processes; the steady epochs are 2 and 4."""
    plan = BatchPlan.make(32, 1).drawing_from(320)  # 10 steps of 32
    assert (plan.steps, plan.samples_per_epoch) == (10, 320)
    assert plan.samples_from(0) == 320 and plan.samples_from(6) == (10 - 6) * 32 == 128
    assert plan.samples_from(10) == 0
    with pytest.raises(ValueError):
        plan.samples_from(11)
    h = history([0.5] * 4, [9.0, 2.0, 3.5, 4.0], {1, 3}, [320] * 4, resumed={3: 6})
    assert [r.epoch for r in results.steady_rows(h)] == [2, 4]
    assert results.steady_seconds(h) == 3.0  # median of 2.0 and 4.0
    assert results.steady_samples_per_s(h) == pytest.approx(320 / 3.0)
    assert results.warmup_seconds(h) == 9.0
    # every epoch a warm-up (each in a process of its own): the whole ones stand in, epoch 2,
    # resumed at step 6 (its time spread over two processes' starts), never does
    h = history([0.5] * 2, [9.0, 3.5], {1, 2}, [320, 320], resumed={2: 6})
    assert results.steady_rows(h) == h[:1]
    assert results.steady_samples_per_s(h) == pytest.approx(320 / 9.0)
    assert results.speed_note(h) == (
        "steady figures include warm-up: every epoch was the first its process ran, none is "
        "free of a start's one-off work; epoch 1 stands in (epoch 2 resumed at step 6: left "
        "out, its steps ran in more than one process)"
    )
    # two whole warm-up epochs (the second resumed at its first step) both stand in
    h = history([0.5] * 2, [9.0, 3.0], {1, 2}, [320, 320])
    assert results.steady_rows(h) == h
    assert "epochs 1 and 2 stand in" in results.speed_note(h)


def test_an_epoch_resumed_mid_way_never_stands_in_for_a_steady_one():
    """Issue 28: a 1-epoch run resumed at step 13 of 16 had its resumed process's 3 steps
    stand in as its steady epoch. An epoch split between processes is neither a steady nor
    a warm-up figure: the run has no speed figures, and says why."""
    (split,) = history([0.5], [4.0], {1}, [512], resumed={1: 13})
    assert results.is_split(split) and results.steady_rows([split]) == []
    assert results.steady_seconds([split]) is None
    assert results.steady_samples_per_s([split]) is None
    assert results.warmup_seconds([split]) is None
    assert results.steady_basis([split]) == results.NO_STEADY
    note = results.speed_note([split])
    assert note == (
        "no steady epoch: every epoch was the first its process ran and was resumed "
        "mid-epoch (epoch 1 at step 13), its steps split between processes that each paid a "
        "start's one-off work; its warm-up and steady speed figures are left empty"
    )
    # a split epoch 1 in a longer run: steady figures from the rest, no warm-up figure
    h = history([0.5] * 3, [4.0, 2.0, 2.0], {1}, resumed={1: 13})
    assert results.steady_seconds(h) == 2.0 and results.warmup_seconds(h) is None
    assert results.speed_note(h) == (
        "no warm-up figure: epoch 1 was resumed at step 13, its steps split between processes"
    )
    # what metrics.json carries: the empty figures and why, and an older file still reads
    summary = RunSummary.from_json(
        {
            **run_summary("single", ["cpu"], 1.0, 0.5, {}).to_json(),
            **results.speed_figures([split]),
        }
    )
    assert summary.steady_epoch_seconds is None and summary.steady_samples_per_s is None
    assert summary.warmup_epoch_seconds is None
    assert (summary.steady_basis, summary.speed_note) == (results.NO_STEADY, note)
    assert RunSummary.from_json(summary.to_json()) == summary
    old = {
        k: v
        for k, v in run_summary("single", ["cpu"], 1.0, 0.5, {}).to_json().items()
        if k not in ("steady_basis", "speed_note")
    }
    assert RunSummary.from_json(old).steady_basis == results.STEADY
    assert RunSummary.from_json(old).speed_note is None and "speed_note" not in (
        RunSummary.from_json(old).memory
    )


def test_warmup_mark_goes_through_history_csv_and_the_checkpoint_record():
    rows = history([0.5, 0.6], [9.0, 2.0], {1})
    header, first, second = results.history_csv(rows).splitlines()
    column = header.split(",").index("warmup")
    assert (first.split(",")[column], second.split(",")[column]) == ("1", "0")
    assert rows[0].metrics()["warmup"] == 1.0 and rows[1].metrics()["warmup"] == 0.0
    assert [EpochRow.from_record(r.to_record()) for r in rows] == rows
    parsed = {k: float(v) for k, v in zip(header.split(","), first.split(",")) if v}
    assert EpochRow.from_record(parsed).warmup is True
    old = {k: v for k, v in rows[0].to_record().items() if k != "warmup"}  # before the mark
    assert EpochRow.from_record(old).warmup is False and "warmup" not in rows[0].memory


def test_the_resumed_step_goes_through_history_csv_and_the_checkpoint_record(tmp_path):
    rows = history([0.5, 0.6], [9.0, 2.0], {1, 2}, resumed={2: 13})
    (tmp_path / "single").mkdir()
    (tmp_path / "single" / results.HISTORY).write_text(results.history_csv(rows))
    read = results.read_history("single", tmp_path)
    assert [(r.resumed_at_step, type(r.resumed_at_step)) for r in read] == [(0, int), (13, int)]
    assert rows[1].metrics()["resumed_at_step"] == 13.0  # an MLflow metric, per epoch
    assert [EpochRow.from_record(r.to_record()) for r in rows] == rows
    old = {k: v for k, v in rows[1].to_record().items() if k != "resumed_at_step"}
    assert EpochRow.from_record(old).resumed_at_step == 0  # written before the field


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
        metrics("single", ["cuda:0"], 10.0, 0.90, {"gpu_0": 100.0}),
        metrics("ddp", ["cuda:0", "cuda:1"], 4.0, 0.88, {"gpu_0": 60.0, "gpu_1": 60.0}),
    ]
    hist = {"single": history([0.8, 0.9], [9.0, 10.0]), "ddp": history([0.7, 0.88], [9.0, 4.0])}
    single, ddp = table.comparison_rows(results, hist, 0.85)
    assert single["speedup_vs_single"] == 1.0 and single["acc_delta_vs_single"] == 0.0
    assert ddp["speedup_vs_single"] == 2.5 and ddp["scaling_efficiency"] == 1.25
    assert ddp["acc_delta_vs_single"] == pytest.approx(-0.02)
    assert (single["epoch_to_target"], single["time_to_target_s"]) == (2, 19.0)
    assert ddp["time_to_target_s"] == 13.0 and ddp["gpu0_share"] == 0.5
    text = table.markdown_table([single, ddp], 0.85)
    assert "time to acc 0.85" in text and "training peak MiB (busiest GPU)" in text
    # above 100%: flagged with its likely cause (issue 68)
    assert (
        "| ddp | 2 (2) | 32+32 | 4.00 (9.00) | 1600 | 2.50x (125%, above 100%: likely each "
        "device's smaller share of the batch running faster per sample (caches), or a slowed "
        "single run) | 0.8800 (-0.0200) |"
    ) in text
    assert "| 13.0 s (epoch 2) | 60 (gpu_0) |" in text
    assert ddp["peak_memory_mib"] == {"gpu_0": 60.0, "gpu_1": 60.0}
    assert ddp["eval_peak_memory_mib"] == {"gpu_0": 15.0, "gpu_1": 15.0}
    # each device's training and evaluation peaks: the per-device table, a row per device
    head, body = device_table.cells([single, ddp])
    assert head == [
        "strategy",
        "GPU",
        "training peak allocated MiB",
        "training peak reserved MiB",
        "eval peak allocated MiB",
        "eval peak reserved MiB",
        "training max/mean",
    ]
    assert body == [
        ["single", "gpu_0", "100", "100", "25", "100", "1.00"],
        ["ddp", "gpu_0", "60", "60", "15", "60", "1.00"],
        ["", "gpu_1", "60", "60", "15", "60", ""],
    ]


def test_rows_without_single_say_so_instead_of_inventing_a_baseline():
    ddp = metrics("ddp", ["cpu", "cpu"], 4.0, 0.8, {"cpu_0": 900.0, "cpu_1": 800.0})
    ddp.memory.update(memory_kind="cpu", peak_reserved_mib={})
    del ddp.memory["eval_peak_memory_mib"]  # results written before evaluation was measured
    (row,) = table.comparison_rows([ddp], {"ddp": history([0.5], [4.0])}, 0.9)
    assert row["speedup_vs_single"] is None and row["acc_delta_vs_single"] is None
    text = table.markdown_table([row], 0.9)
    assert "training peak RSS MiB (busiest process, CPU)" in text
    assert "| n/a | 0.8000 | not reached | 900 (cpu_0) |" in text
    assert device_table.cells([row]) == (
        ["strategy", "process", "training peak RSS MiB", "eval peak RSS MiB", "training max/mean"],
        [["ddp", "cpu_0", "900", "n/a", "1.00"], ["", "cpu_1", "800", "n/a", ""]],
    )
    # a CPU run's evaluation has no peak of its own (pipeline.results.NOT_SEPARABLE)
    ddp.memory.update(eval_peak_memory_mib="not separable on CPU", eval_mem_imbalance=None)
    (row,) = table.comparison_rows([ddp], {"ddp": history([0.5], [4.0])}, 0.9)
    assert [line[3] for line in device_table.cells([row])[1]] == ["not separable on CPU"] * 2


def test_target_accuracy_is_a_fraction():
    with pytest.raises(ConfigError, match="report.target_accuracy: got 90.0, expected <= 1.0"):
        load_config("params.yaml", ["report.target_accuracy=90.0"])
    cfg = load_config("params.yaml", ["report.target_accuracy=null"])
    assert cfg.report.target_accuracy is None


def test_per_epoch_files_have_a_column_for_every_known_strategy():
    """DVC plots only the columns dvc.yaml names (every strategy): one that did not run is
    blank. One file per plotted figure: accuracy, training loss, samples/s."""
    h = {"ddp": history([0.5, 0.75], [1, 2])}
    assert table.wide_csv(h, ["single", "ddp"], "test_acc") == "epoch,single,ddp\n1,,0.5\n2,,0.75\n"
    assert table.wide_csv(h, ["single", "ddp"], "train_loss") == "epoch,single,ddp\n1,,1\n2,,1\n"
    assert table.wide_csv(h, ["ddp"], "samples_per_s") == "epoch,ddp\n1,64\n2,32\n"
    assert set(table.WIDE_PLOTS.values()) <= set(results.HISTORY_COLUMNS)


def test_a_throughput_bar_says_what_its_speedup_must_be_read_with():
    row = {"steady_samples_per_s": 2500.0, "speedup_vs_single": 1.11, "scaling_efficiency": 1.11}
    assert bar_label(row) == "1.11x, eff 111%"
    assert bar_label({**row, "speedup_within_noise": True}) == "1.11x, eff 111%\nwithin noise"
    shared = {**row, "speedup_vs_single": None, "shared_devices": {"0": 2}}
    assert bar_label(shared) == "shared-device: no speed"
    assert bar_label({**row, "steady_samples_per_s": None}) == "no steady epoch"
