"""The speed objectives of the report's answer (pipeline/reporting/answer.py, issue 30): a
throughput difference within the measured epoch-to-epoch spread is a tie, and a ranking that
sets runs with different speed options against each other says so."""

from __future__ import annotations

from pipeline.reporting import answer, table
from pipeline.results import EpochRow, RunSummary
from support import finished_run

GRAPHED = {"precision": "bf16", "channels_last": True, "compile": "default", "cuda_graphs": "step"}


Run = tuple[RunSummary, list[EpochRow]]


def run(name: str, seconds: list[float], features: dict | None = None) -> Run:
    """A finished 1-device run whose epochs took `seconds` (the first a warm-up)."""
    return finished_run(name, seconds, features=features)


def rows_of(*runs: Run) -> list[dict]:
    return table.comparison_rows([s for s, _ in runs], {s.strategy: h for s, h in runs}, None)


def throughput(*runs: Run) -> answer.Recommendation:
    rows = rows_of(*runs)
    (rec,) = [
        r for r in answer.recommend(rows, None).recommendations if r.objective == "throughput"
    ]
    return rec


def test_a_throughput_difference_within_the_epoch_to_epoch_spread_is_a_tie():
    # ddp 1043 samples/s against single's 1017: 1.03x, but their steady epochs spread by
    # 36 and 34 samples/s (5.7 to 5.9 s, 5.8 to 6.0 s), more than the 26 between them (ddp:
    # no A/A partner of single's, so the spread alone decides)
    single = run("single", [9.0, 5.9, 5.8, 6.0])
    ddp = run("ddp", [9.0, 5.75, 5.7, 5.9])
    rec = throughput(single, ddp)
    assert rec.strategies == ("ddp", "single")
    assert rec.reasons == (
        "ddp and single tie within the spread (ddp 1043 samples/s; single 1017 samples/s)",
        # both on one device: the tie's MLflow pick is the simpler (answer.tie_pick)
        "single's model stands for them in MLflow: the simplest of them",
        "epoch-to-epoch spread (a difference within it is a tie): ddp 36 samples/s, single 34 "
        "samples/s",
    )  # no win is claimed


def test_a_difference_beyond_the_spread_is_a_win():
    single = run("single", [9.0, 5.9, 5.8, 6.0])
    ddp = run("ddp", [9.0, 5.0, 4.95, 5.05])  # 1200 samples/s, spreads of 24 and 35
    rec = throughput(single, ddp)
    assert rec.strategies == ("ddp",)
    assert rec.reasons[0] == "ddp: 1.18x single's steady samples/s (1200 vs 1017 samples/s)"


def test_a_graphed_run_is_never_set_against_an_eager_one_without_saying_so():
    single = run("single", [9.0, 3.0, 3.0, 3.0], GRAPHED)
    ddp = run("ddp", [9.0, 6.0, 6.0, 6.0])
    rec = throughput(single, ddp)
    assert rec.strategies == ("single",)
    assert (
        rec.reasons[0]
        == "single: 2.00x ddp's steady samples/s (2000 vs 1000 samples/s) (the next best)"
    )
    assert rec.reasons[1] == (
        "not like for like: single ran bf16, channels_last, compile, CUDA graph of the whole "
        "step; ddp: fp32 (part of the difference is the speed options', not the strategies')"
    )
    # alike, nothing to say
    same = throughput(run("single", [9.0, 3.0, 3.0, 3.0]), ddp)
    assert not any(reason.startswith("not like for like") for reason in same.reasons)


def test_the_table_names_each_runs_speed_options():
    rows = rows_of(run("single", [9.0, 3.0, 3.0], GRAPHED))
    head, (cells,) = table.table_cells(rows, None)
    assert cells[head.index("speed features")] == (
        "bf16, channels_last, compile, CUDA graph of the whole step"
    )
    assert table.features_text({}) == "n/a"  # results from before the options were recorded
