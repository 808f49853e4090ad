"""Speed ranked only where the machine let it be measured (issue 68): a run that waited beyond
core_wait.BUSY_WAIT for a core is shown with its figure and "machine busy: not ranked", and is
left out of the speed objectives and their floors; a scaling efficiency above 100%, measured
or predicted, is flagged with its likely cause."""

from __future__ import annotations

import pytest

from pipeline.core_wait import BUSY_WAIT, busy
from pipeline.reporting import answer, predicted, speed_noise, table
from support import finished_run as run

BUSY = [0.70, 0.72, 0.72]  # the 64 to 78%
QUIET = [0.05, 0.04, 0.04]


def rows_of(*runs, target: float | None = None) -> list[dict]:
    return table.comparison_rows([s for s, _ in runs], {s.strategy: h for s, h in runs}, target)


def by_objective(rows: list[dict], target: float | None = None) -> dict:
    return {r.objective: r for r in answer.recommend(rows, target).recommendations}


def test_the_threshold_is_a_share_of_runnable_time():
    assert 0 < BUSY_WAIT < 1
    assert busy(BUSY_WAIT + 0.01) and not busy(BUSY_WAIT) and not busy(None)


def test_a_busy_run_is_shown_with_its_figure_and_not_ranked():
    """ddp, timed while the machine was busy, came out 2x single: shown, not ranked."""
    single = run("single", [3, 2.0, 2.0], waits=QUIET)
    ddp = run("ddp", [3, 1.0, 1.0], waits=BUSY)
    rows = rows_of(single, ddp)
    throughput = by_objective(rows)["throughput"]
    assert throughput.strategies == ("single",)
    assert throughput.reasons[-1] == (
        "machine busy: not ranked: ddp 6000 samples/s (ddp waited 72% of its runnable time for "
        "a CPU core (beyond 50%, its time is the machine's more than the strategy's))"
    )
    head, body = table.table_cells(rows, None)
    assert dict(zip(head, body[1]))["speedup vs single (scaling efficiency)"] == (
        "2.00x (200%, above 100%: one device, as single: a difference of the runs, not "
        "scaling, machine busy: not ranked)"
    )
    assert "2.00x! busy" in table.text_table(rows, None)


def test_the_same_run_on_an_idle_machine_is_ranked_as_before():
    single = run("single", [3, 2.0, 2.0], waits=QUIET)
    ddp = run("ddp", [3, 1.0, 1.0], waits=QUIET)
    assert by_objective(rows_of(single, ddp))["throughput"].strategies == ("ddp",)


def test_a_busy_run_sets_no_floor_for_the_others():
    """Its wait would have widened the load floor to (1 - 0.04) / (1 - 0.72) - 1 = 243%, a
    tie for every quiet pair; left out, the quiet ones are judged on their own floor."""
    rows = rows_of(
        run("single", [3, 2.0, 2.0], waits=QUIET),
        run("dp", [3, 2.02, 2.02], waits=QUIET),
        run("ddp", [3, 1.0, 1.0], waits=QUIET),
        run("fsdp", [3, 1.5, 1.5], waits=BUSY),
    )
    floor = speed_noise.speed_floor(rows)
    assert set(floor.waits["throughput"]) == {"single", "dp", "ddp"}
    assert floor.load["throughput"] == pytest.approx(0.0)
    assert by_objective(rows)["throughput"].strategies == ("ddp",)


def test_every_run_busy_ranks_nothing_and_says_why():
    rows = rows_of(run("single", [3, 2.0, 2.0], waits=BUSY), run("ddp", [3, 1.0, 1.0], waits=BUSY))
    throughput = by_objective(rows)["throughput"]
    assert throughput.strategies == () and throughput.pick is None
    assert throughput.reasons[0] == (
        "every strategy timed ran on a busy machine (waited 72% to 72% of its runnable time for "
        "a core)"
    )
    assert throughput.headline == f"none; {throughput.reasons[0]}"
    assert [r.startswith("machine busy: not ranked: ") for r in throughput.reasons[1:]] == [
        True,
        True,
    ]
    # memory is no speed: the objectives that do not time still rank
    assert by_objective(rows)["peak_memory"].strategies


def test_time_to_target_leaves_a_busy_run_out_too():
    single = run("single", [3, 2.0, 2.0], accuracy=[0.5, 0.9, 0.9], waits=QUIET)
    ddp = run("ddp", [1, 1.0, 1.0], accuracy=[0.5, 0.9, 0.9], waits=BUSY)
    target = by_objective(rows_of(single, ddp, target=0.85), 0.85)["fastest_to_target"]
    assert target.strategies == ("single",)
    assert target.reasons[-1].startswith("machine busy: not ranked: ddp 2.0 s (epoch 2)")


def test_an_efficiency_above_100_percent_is_flagged_with_its_likely_cause():
    # single waited more for a core than ddp: the load, not the strategy
    rows = rows_of(
        run("single", [3, 4.0, 4.0], waits=[0.3, 0.4, 0.4]),
        run("ddp", [3, 1.0, 1.0], devices=["cpu", "cpu"], waits=QUIET),
    )
    ddp = rows[1]
    assert ddp["scaling_efficiency"] == pytest.approx(2.0)
    assert ddp["above_linear"] == (
        "above 100%: likely the machine's load (single waited 40% for a core, this run 4%)"
    )
    cell = table.table_cells(rows, None)[1][1][5]
    assert cell.startswith("4.00x (200%, above 100%: likely the machine's load")
    assert "4.00x!" in table.text_table(rows, None)
    # without a load difference to blame: the batch share's caches, or a slowed single
    quiet = rows_of(run("single", [3, 4.0, 4.0]), run("ddp", [3, 1.0, 1.0], devices=["cpu", "cpu"]))
    assert quiet[1]["above_linear"].startswith("above 100%: likely each device's smaller share")
    # at or below 100%: nothing said
    assert (
        rows_of(run("single", [3, 2.0, 2.0]), run("ddp", [3, 2.0, 2.0]))[1]["above_linear"] is None
    )


def test_a_predicted_efficiency_above_100_percent_is_flagged():
    doc = {
        "by_devices": {
            "2": {
                "ddp": {"predicted_efficiency": 8.5},
                "fsdp": {"predicted_efficiency": 0.9},
            }
        }
    }
    assert predicted.efficiency_cell(8.5) == "850% (above 100%: see below)"
    assert predicted.efficiency_cell(0.9) == "90%"
    (line,) = predicted.above_linear(doc)
    assert line.startswith("Above 100% (ddp on 2): a predicted efficiency above 100% is none")
    assert "single's baseline step ran slower per sample" in line
