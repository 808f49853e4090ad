"""The report's answer (pipeline/reporting/answer.py): one recommendation per objective from
the table's rows, its reasons in measured numbers, the noise rule, the source notes' claim."""

import itertools
import json
from pathlib import Path

import pytest

from pipeline.reporting import answer, table
from pipeline.reporting.pages import html_page, markdown_page
from pipeline.reporting.plots import PLOTS
from pipeline.results import EpochRow, RunSummary
from pipeline.tracking.comparison_run import Registration
from support import run_summary

TARGET = 0.85


def run(
    name: str,
    devices: list[str],
    steady: float,
    acc: float,
    peaks: dict[str, float],
    imbalance: float | None = None,
    kind: str = "gpu",
) -> RunSummary:
    if imbalance is None and peaks:
        imbalance = max(peaks.values()) / (sum(peaks.values()) / len(peaks))
    memory = {"memory_kind": kind, "peak_memory_mib": peaks, "mem_imbalance": imbalance}
    return run_summary(name, devices, steady, acc, memory)


def history(accs: list[float], seconds: list[float]) -> list[EpochRow]:
    wall, out = 0.0, []
    for i, (acc, s) in enumerate(zip(accs, seconds)):
        wall += s
        out.append(EpochRow(i + 1, 1.0, 0.5, 1.0, acc, s, 64 / s, wall))
    return out


def rows_of(runs: list[RunSummary], target: float | None = TARGET) -> list[dict]:
    hist = {r.strategy: history([0.5, r.test_acc], [9.0, r.steady_epoch_seconds]) for r in runs}
    return table.comparison_rows(runs, hist, target)


SINGLE = run("single", ["cuda:0"], 10.0, 0.90, {"gpu_0": 100.0})
DP = run("dp", ["cuda:0", "cuda:1"], 6.6, 0.885, {"gpu_0": 90.0, "gpu_1": 50.0})
DDP = run("ddp", ["cuda:0", "cuda:1"], 4.0, 0.88, {"gpu_0": 60.0, "gpu_1": 60.0})


def by_objective(a: answer.Answer) -> dict[str, answer.Recommendation]:
    return {r.objective: r for r in a.recommendations}


def test_each_objective_recommends_with_its_reasons_in_numbers():
    a = answer.recommend(rows_of([SINGLE, DP, DDP]), TARGET)
    assert a.hardware == "2 GPUs (gpu_0, gpu_1)"
    rec = by_objective(a)
    assert list(rec) == ["fastest_to_target", "throughput", "peak_memory", "memory_balance"]
    assert all(r.strategies == ("ddp",) for r in a.recommendations)
    # ddp reaches 0.88 (>= 0.85) at epoch 2: 9 + 4 = 13 s; single 19 s
    assert rec["fastest_to_target"].title == "Fastest to test accuracy 0.85"
    assert rec["fastest_to_target"].reasons[0] == "ddp: 1.46x sooner than single (13.0 vs 19.0 s)"
    assert rec["throughput"].reasons[0] == (
        "ddp: 2.50x single's steady samples/s (1600 vs 640 samples/s)"
    )
    assert rec["throughput"].reasons[1] == (
        "ranking: ddp 1600 samples/s; dp 970 samples/s; single 640 samples/s"
    )
    assert rec["peak_memory"].reasons[0] == (
        "ddp: 0.60x single's training peak on the busiest GPU (60 vs 100 MiB)"
    )
    # single ran on one device: nothing to balance, so it is out of that objective
    balance = rec["memory_balance"]
    assert balance.reasons[0].startswith("ddp: its busiest GPU peaks at 1.00x the mean over")
    assert "(gpu_0 60, gpu_1 60 MiB); the next best: dp 1.29 over 2 GPUs" in balance.reasons[0]
    assert balance.reasons[-1] == "one device, nothing to balance: single"
    assert a.choice() == ("throughput", "ddp")


def test_a_tie_recommends_every_tied_strategy():
    fsdp = run("fsdp", ["cuda:0", "cuda:1"], 4.0, 0.88, {"gpu_0": 60.4, "gpu_1": 59.6})
    rec = by_objective(answer.recommend(rows_of([SINGLE, DDP, fsdp]), TARGET))
    assert rec["throughput"].strategies == ("ddp", "fsdp")
    assert rec["throughput"].reasons[0] == (
        "ddp and fsdp tie (ddp 1600 samples/s; fsdp 1600 samples/s)"
    )
    assert rec["fastest_to_target"].strategies == ("ddp", "fsdp")
    # the peaks read the same at the report's precision (60 MiB): a tie too
    assert rec["peak_memory"].strategies == ("ddp", "fsdp")
    assert rec["memory_balance"].strategies == ("ddp",)  # 1.00 and 1.01 read apart
    # three-way: the exact figures' best first, named as a list
    slower = run(
        "pipeline_parallel", ["cuda:0", "cuda:1"], 4.001, 0.88, {"gpu_0": 9.0, "gpu_1": 9.0}
    )
    three = by_objective(answer.recommend(rows_of([SINGLE, slower, DDP, fsdp]), TARGET))
    assert three["throughput"].strategies == ("ddp", "fsdp", "pipeline_parallel")
    assert three["throughput"].reasons[0].startswith("ddp, fsdp and pipeline_parallel tie (")
    assert "- **Highest throughput: ddp, fsdp and pipeline_parallel**" in answer.markdown(
        answer.recommend(rows_of([SINGLE, slower, DDP, fsdp]), TARGET)
    )
    assert answer.recommend(rows_of([SINGLE, DDP, fsdp]), TARGET).choice() == ("throughput", "ddp")


def test_a_tie_is_registered_as_its_strategy_on_the_fewest_devices_then_the_simplest():
    """`tie_pick` reads no figure: the same strategy whatever order the tied come in."""
    devices = {"single": 1, "dp": 1, "balanced_dp": 1, "ddp": 2, "fsdp": 2}
    devices["pipeline_parallel"] = 2
    cases = [
        (["ddp", "single"], "single"),  # fewer devices
        (["balanced_dp", "dp"], "dp"),  # as many: the registry's order
        (["pipeline_parallel", "fsdp", "ddp"], "ddp"),
        (["pipeline_parallel", "balanced_dp", "fsdp"], "balanced_dp"),
    ]
    for tied, expected in cases:
        for order in itertools.permutations(tied):
            rows = [{"strategy": name, "n_devices": devices[name]} for name in order]
            assert answer.tie_pick(rows) == expected, order
    # ddp on one device against dp over two: the fewer devices outrank the registry's order
    assert (
        answer.tie_pick([{"strategy": "ddp", "n_devices": 1}, {"strategy": "dp", "n_devices": 2}])
        == "ddp"
    )


def test_figures_that_read_apart_are_no_tie():
    fsdp = run("fsdp", ["cuda:0", "cuda:1"], 4.0, 0.88, {"gpu_0": 62.0, "gpu_1": 58.0})
    rec = by_objective(answer.recommend(rows_of([DDP, fsdp]), TARGET))
    assert rec["peak_memory"].strategies == ("ddp",)
    assert rec["memory_balance"].strategies == ("ddp",)  # 1.00 vs 1.03


def test_memory_rankings_call_a_difference_within_the_spread_a_tie():
    """Issue 33: "pipeline_parallel, 0.97x single" was a win with no spread measured. A
    difference within the larger of two strategies' epoch-to-epoch spreads is a tie; one
    beyond it is a win; with no spread measured the answer says the difference is untested."""
    pp = run("pipeline_parallel", ["cuda:0", "cuda:1"], 5.0, 0.88, {"gpu_0": 97.0, "gpu_1": 97.0})
    rows = rows_of([SINGLE, pp])
    untested = by_objective(answer.recommend(rows, TARGET))["peak_memory"]
    assert untested.strategies == ("pipeline_parallel",)
    assert untested.reasons[-1] == (
        "no epoch-to-epoch spread measured (it takes 2 or more epochs): the differences are "
        "not tested against noise"
    )
    for row, spread in zip(rows, (4.0, 1.0)):  # single's peak moved 4 MiB between epochs
        row["peak_memory_spread_mib"] = spread
    tied = by_objective(answer.recommend(rows, TARGET))["peak_memory"]
    assert tied.strategies == ("pipeline_parallel", "single")  # the lower figure first
    # its MLflow alias: single's, on one GPU against the pipeline's two
    assert tied.pick == "single"
    assert tied.reasons[1] == (
        "single's model stands for them in MLflow: the simplest on the fewest devices"
    )
    assert tied.reasons[0] == (
        "pipeline_parallel and single tie within the spread (pipeline_parallel 97 MiB (gpu_0); "
        "single 100 MiB (gpu_0))"
    )
    assert tied.reasons[-1] == (
        "epoch-to-epoch spread (a difference within it is a tie): pipeline_parallel 1 MiB, "
        "single 4 MiB"
    )
    rows[0]["peak_memory_spread_mib"] = 2.0  # 3 MiB apart, beyond both spreads: a win
    assert by_objective(answer.recommend(rows, TARGET))["peak_memory"].reasons[0] == (
        "pipeline_parallel: 0.97x single's training peak on the busiest GPU (97 vs 100 MiB)"
    )
    # the imbalance likewise, with its own spread
    dp, ddp = rows_of([DP, DDP])  # imbalance 1.29 and 1.00
    dp["mem_imbalance_spread"], ddp["mem_imbalance_spread"] = 0.3, 0.01
    balance = by_objective(answer.recommend([dp, ddp], TARGET))["memory_balance"]
    assert balance.strategies == ("ddp", "dp")
    assert balance.reasons[-1] == (
        "epoch-to-epoch spread (a difference within it is a tie): ddp 0.010, dp 0.300"
    )


def test_missing_figures_leave_a_strategy_out_and_say_so():
    old = run("dp", ["cuda:0", "cuda:1"], 6.6, 0.80, {})  # results from before memory was measured
    rec = by_objective(answer.recommend(rows_of([SINGLE, old, DDP]), TARGET))
    assert rec["peak_memory"].strategies == ("ddp",)
    assert rec["peak_memory"].reasons[-1] == "not measured: dp"
    assert rec["memory_balance"].reasons[-1] == "one device, nothing to balance: single, dp"
    # dp's 0.80 never reached 0.85
    assert rec["fastest_to_target"].reasons[-1] == "not reached by dp"


def test_a_single_strategy_is_the_answer_and_says_it_is_alone():
    a = answer.recommend(rows_of([SINGLE]), TARGET)
    rec = by_objective(a)
    assert rec["throughput"].strategies == ("single",)
    assert rec["throughput"].reasons == (
        "single: 640 steady samples/s; the only strategy compared",
    )
    assert rec["throughput"].accuracy == ()  # nothing to compare single with
    assert rec["memory_balance"].strategies == ()
    assert rec["memory_balance"].reasons == (
        "every strategy ran on one device: nothing to balance",
    )
    assert "Here: not measured (dp: no run compared)." in a.notes_claim
    assert a.choice() == ("throughput", "single")
    assert a.hardware == "1 GPU (gpu_0)"


def test_single_winning_is_compared_with_the_next_best():
    slow = run("ddp", ["cuda:0", "cuda:1"], 12.5, 0.88, {"gpu_0": 120.0, "gpu_1": 120.0})
    rec = by_objective(answer.recommend(rows_of([SINGLE, slow]), TARGET))
    assert rec["throughput"].reasons[0] == (
        "single: 1.25x ddp's steady samples/s (640 vs 512 samples/s) (the next best)"
    )
    assert rec["peak_memory"].reasons[0] == (
        "single: 0.83x ddp's training peak on the busiest GPU (100 vs 120 MiB) (the next best)"
    )


def test_when_no_strategy_reached_the_target_none_is_recommended_for_it():
    a = answer.recommend(rows_of([SINGLE, DDP], target=0.95), 0.95)
    rec = by_objective(a)
    assert rec["fastest_to_target"].strategies == ()
    assert rec["fastest_to_target"].reasons == (
        "no strategy reached test accuracy 0.95 (the highest final: single 0.9000); "
        "none recommended for it",
    )
    assert rec["throughput"].strategies == ("ddp",)
    assert a.choice() == ("throughput", "ddp")
    text = answer.markdown(a)
    assert "- **Fastest to test accuracy 0.95: none**" in text


def test_no_target_set():
    rec = by_objective(answer.recommend(rows_of([SINGLE, DDP], target=None), None))
    assert rec["fastest_to_target"].strategies == ()
    assert rec["fastest_to_target"].reasons == (
        "no target set (report.target_accuracy): nothing to reach",
    )


def test_without_single_the_next_best_is_the_reference():
    fsdp = run("fsdp", ["cuda:0", "cuda:1"], 5.0, 0.86, {"gpu_0": 50.0, "gpu_1": 50.0})
    a = answer.recommend(rows_of([DDP, fsdp]), TARGET)
    rec = by_objective(a)
    assert rec["throughput"].reasons[0] == (
        "ddp: 1.25x fsdp's steady samples/s (1600 vs 1280 samples/s) (the next best)"
    )
    assert rec["throughput"].accuracy == ("ddp 0.8800 (no single run to compare with)",)
    rows = rows_of([DDP, fsdp])
    rows[1]["steady_samples_per_s"] = 0.0  # a broken figure: no ratio, no crash
    assert by_objective(answer.recommend(rows, TARGET))["throughput"].reasons[0] == (
        "ddp: 1600 vs fsdp's 0 (the next best)"
    )
    assert "not measured (single and dp: no run compared)" in a.notes_claim


def test_no_strategy_with_a_figure_leaves_every_objective_empty():
    rows = rows_of([SINGLE, DDP])
    for row in rows:
        row["steady_samples_per_s"] = None
    rec = by_objective(answer.recommend(rows, TARGET))
    assert rec["throughput"].strategies == ()
    assert rec["throughput"].reasons == ("no strategy has this figure",)
    # the registered model then comes from the first objective that has a pick
    assert answer.recommend(rows, TARGET).choice() == ("fastest_to_target", "ddp")
    with pytest.raises(ValueError):
        answer.recommend([], TARGET)


def test_the_noise_rule():
    assert answer.seed_spread(None) is None
    assert answer.seed_spread({"0": 0.9}) is None  # one seed: no spread
    assert answer.seed_spread({"0": 0.90, "1": 0.93, "2": 0.91}) == pytest.approx(0.03)
    assert answer.pair_noise(None, None) is None
    assert answer.pair_noise(0.01, None) == 0.01
    assert answer.pair_noise(0.01, 0.03) == 0.03
    assert answer.accuracy_verdict(-0.02, 0.01) == "real"
    assert answer.accuracy_verdict(-0.02, 0.03) == "within noise"
    assert answer.accuracy_verdict(0.03, 0.03) == "within noise"  # not beyond the spread
    assert answer.accuracy_verdict(-0.02, None) == "no noise estimate"
    assert answer.accuracy_verdict(None, 0.01) == "no single run to compare with"


def test_accuracy_is_called_real_or_noise_only_with_seeds():
    rows = rows_of([SINGLE, DP, DDP])
    without = answer.recommend(rows, TARGET)
    assert by_objective(without)["throughput"].accuracy == (
        "ddp 0.8800 vs single 0.9000 (-0.0200): no noise estimate",
    )
    assert without.noise.startswith("No noise estimate: each strategy ran with one seed")
    assert "`dvc exp run --queue -S seed=1,2,3`, then `dvc queue start`" in without.noise
    seeds = {"single": {"0": 0.90, "1": 0.87}, "ddp": {"0": 0.88, "1": 0.875, "2": 0.885}}
    noisy = answer.recommend(rows, TARGET, seeds)
    assert by_objective(noisy)["throughput"].accuracy == (
        "ddp 0.8800 vs single 0.9000 (-0.0200): within noise (seed spread 0.0300)",
    )
    assert "single 0.0300 (2 seeds), ddp 0.0100 (3 seeds)" in noisy.noise
    assert "No seeds yet for dp" in noisy.noise
    tight = {"single": {"0": 0.90, "1": 0.895}, "ddp": {"0": 0.88, "1": 0.884}}
    assert by_objective(answer.recommend(rows, TARGET, tight))["throughput"].accuracy == (
        "ddp 0.8800 vs single 0.9000 (-0.0200): real (seed spread 0.0050)",
    )


def test_the_notes_claim_beside_what_was_measured():
    a = answer.recommend(rows_of([SINGLE, DP, DDP]), TARGET)
    assert a.notes_claim.startswith(
        "The source notes: dp on 2 GPUs vs single on 1 GPU: 1.51x faster per epoch "
        "(14 s -> 9.3 s), with lower accuracy (single: 0.92 test accuracy). Here: dp on 2 GPUs "
        "(cuda:0, cuda:1) vs single on 1 GPU (cuda:0): 1.52x per steady epoch (10.00 s -> "
        "6.60 s); test accuracy 0.9000 -> 0.8850 (-0.0150: no noise estimate)."
    )
    assert a.notes_measured["speedup"] == pytest.approx(10.0 / 6.6)
    assert (a.notes_measured["dp_devices"], a.notes_measured["single_devices"]) == (2, 1)
    cpu = [
        run("single", ["cpu"], 3.0, 0.9, {"cpu_0": 500.0}, kind="cpu"),
        run("dp", ["cpu"], 3.3, 0.9, {"cpu_0": 520.0}, kind="cpu"),
        run("ddp", ["cpu", "cpu"], 2.0, 0.9, {"cpu_0": 500.0, "cpu_1": 480.0}, kind="cpu"),
    ]
    a = answer.recommend(rows_of(cpu), TARGET)
    assert a.hardware == "the CPU (up to 2 processes)"
    assert "Here: dp on 1 CPU device (cpu) vs single on 1 CPU device (cpu): 0.91x" in a.notes_claim
    balance = by_objective(a)["memory_balance"]
    assert balance.reasons[0].startswith("ddp: its busiest process peaks at 1.02x the mean")


def registration(version: str | None, aliases: bool = False) -> Registration:
    return Registration(
        "parallel-lab",
        "ddp",
        "highest throughput",
        "abc123",
        version=version,
        why_not="" if version else "MLflow unreachable",
        aliases={"recommended": ("3", "ddp"), "least-memory": ("4", "single")} if aliases else {},
    )


def test_the_answer_as_markdown_html_and_json():
    a = answer.recommend(rows_of([SINGLE, DP, DDP]), TARGET)
    text = answer.markdown(a, registration("3"))
    assert text.startswith("## Which strategy on this hardware: 2 GPUs (gpu_0, gpu_1)\n\n")
    assert "- **Highest throughput: ddp**\n  - ddp: 2.50x single's steady samples/s" in text
    assert (
        "MLflow model: ddp's (highest throughput) registered as parallel-lab version 3 (run "
        'abc123); load it with `mlflow.pytorch.load_model("models:/parallel-lab/3")`'
    ) in text
    assert "not registered (MLflow unreachable)" in answer.markdown(a, registration(None))
    # with its aliases: loaded through the alias, each objective's own pick named
    assert (
        "registered as parallel-lab version 3 (run abc123); load it with `mlflow.pytorch."
        'load_model("models:/parallel-lab@recommended")`. Per objective: `@least-memory` '
        "single's (version 4)"
    ) in answer.markdown(a, registration("3", aliases=True))
    assert answer.to_json(a, registration("3", aliases=True))["registered_model"]["aliases"] == {
        "recommended": {"version": "3", "strategy": "ddp"},
        "least-memory": {"version": "4", "strategy": "single"},
    }
    page = answer.html_section(a, registration("3"))
    assert page.startswith('<section class="answer">')
    assert "<b>Highest throughput:</b> <span class=pick>ddp</span>" in page
    assert "single&#x27;s steady samples/s" in page  # escaped
    assert "<code>mlflow.pytorch.load_model(&quot;models:/parallel-lab/3&quot;)</code>" in page
    one = answer.html_section(answer.recommend(rows_of([SINGLE]), TARGET))
    assert "<code>dvc exp run --queue -S seed=1,2,3</code>" in one
    data = json.loads(json.dumps(answer.to_json(a, registration("3"))))
    assert data["objectives"]["throughput"]["strategies"] == ["ddp"]
    assert data["objectives"]["throughput"]["pick"] == "ddp"
    assert data["registered_model"]["uri"] == "models:/parallel-lab/3"
    assert data["notes_claim"]["notes"]["single_epoch_s"] == 14.0
    assert data["notes_claim"]["measured"]["dp_devices"] == 2
    assert answer.to_json(a)["registered_model"] is None


def test_the_pages_open_with_the_answer(tmp_path: Path):
    rows = rows_of([SINGLE, DP, DDP])
    a = answer.recommend(rows, TARGET)
    md = markdown_page(rows, TARGET, None, a, registration("3"))
    first, second, *_ = md.split("\n\n")
    assert first == "# parallel-lab: which strategy for this hardware"
    assert second.startswith("## Which strategy on this hardware")
    assert md.index("Highest throughput") < md.index("## The comparison") < md.index("| ddp |")
    for name in PLOTS:
        (tmp_path / name).write_bytes(b"png")
    page = html_page(rows, TARGET, None, tmp_path, a, registration("3"))
    body = page.split("<body>\n", 1)[1]
    assert body.startswith("<h1>parallel-lab: which strategy for this hardware</h1>\n")
    assert body.index('<section class="answer">') < body.index("<table")


def test_a_run_without_a_steady_epoch_is_not_ranked_on_speed_and_says_why(tmp_path: Path):
    """Issue 28: single's only epoch was resumed mid-epoch, so it has no speed figures
    (pipeline.results.speed_figures); the report leaves its cells empty with the reason and
    ranks the others on throughput without it. ddp's one whole epoch stands in, labelled."""
    from dataclasses import replace

    from pipeline import results
    from pipeline.reporting.plots import plot_throughput
    from pipeline.reporting.report import child_metrics, child_tags

    split = history([0.9], [4.0])
    split = [replace(split[0], warmup=True, resumed_at_step=13)]
    whole = {
        s: [replace(history([0.88], [t])[0], warmup=True)] for s, t in (("dp", 4.0), ("ddp", 2.0))
    }
    single = replace(SINGLE, epochs=1, **results.speed_figures(split))
    dp = replace(DP, epochs=1, **results.speed_figures(whole["dp"]))
    ddp = replace(DDP, epochs=1, **results.speed_figures(whole["ddp"]))
    note = results.speed_note(split)
    assert note is not None and note.startswith("no steady epoch")
    rows = table.comparison_rows([single, dp, ddp], {"single": split, **whole}, TARGET)
    by = {r["strategy"]: r for r in rows}
    assert by["single"]["steady_samples_per_s"] is None and by["single"]["steady_epoch_s"] is None
    assert by["ddp"]["speedup_vs_single"] is None  # no baseline figure to divide by
    assert f"speed: {note}" in by["single"]["notes"]
    head, cells = table.table_cells(rows, TARGET)
    single_cells, ddp_cells = dict(zip(head, cells[0])), dict(zip(head, cells[2]))
    assert single_cells["steady s/epoch (warm-up epoch 1)"] == "none (see notes)"
    assert single_cells["steady samples/s"] == "none (see notes)"
    assert ddp_cells["steady s/epoch (warm-up epoch 1)"] == "2.00 (warm-up) (2.00)"
    throughput = by_objective(answer.recommend(rows, TARGET))["throughput"]
    assert throughput.strategies == ("ddp",)
    assert throughput.reasons == (
        "ddp: 2.00x dp's steady samples/s (32 vs 16 samples/s) (the next best)",
        "including warm-up (no epoch free of it): dp, ddp",
        "no epoch-to-epoch spread measured (it takes 2 or more steady epochs): the differences "
        "are not tested against noise",
        f"no steady figure, not ranked: single ({note})",
    )
    claim = answer.recommend(rows, TARGET).notes_claim
    # the line goes on with what explains the notes' accuracy (notes_accuracy.py)
    assert "Here: not measured (no steady figure: single). Note 004" in claim
    assert child_tags(by["single"]) == {"speed_note": note}
    assert child_tags(by["ddp"])["speed_note"].startswith("steady figures include warm-up")
    assert "steady_epoch_s" not in child_metrics(by["single"])
    plot_throughput(rows, tmp_path / "throughput.png")  # an empty bar, not a crash
    assert (tmp_path / "throughput.png").stat().st_size > 0
