"""The comparison table's rows are typed (pipeline/reporting/row.py, `Row`): a misspelled or
undeclared key read from a row, with [] or with .get (which mypy alone lets through: the
project's plugin, tools/mypy_typeddict_keys.py, refuses it), or a figure of the wrong type, is
a mypy error, so `make lint` refuses it; and the type declares exactly the keys
table.comparison_rows makes."""

import textwrap

from test_report_table import history, metrics

from pipeline.reporting import table
from pipeline.reporting.row import Row
from support import mypy_flags, run_summary

SNIPPET = textwrap.dedent(
    """
    from pipeline.reporting.row import Row

    def reads(row: Row) -> None:
        name: str = row["strategy"]
        steady = row.get("steady_epoch_s")
        share = row.get("gpu0_share"), row.get("cpu0_share"), row.get("eval_gpu0_share")
        peaks = row.get("peak_memory_mib") or {}
        busiest = max(peaks.values(), default=0.0) + row["test_acc"]
        row["speedup_within_noise"] = None
        row["strategyy"]  # error: no such key
        if row.get("speed_notee"):  # error: no such key (tools/mypy_typeddict_keys.py)
            pass
        row["eval_cpu0_share"]  # error: run_summary never writes it (no eval share on a CPU)
        row["steady_epoch_s"] + 1.0  # error: None where there is no steady epoch
        row["mlflow_run_id"] = 3  # error: a run id is text

    UNFINISHED: Row = {"strategy": "ddp"}  # error: every other figure missing
    """
)


def test_a_misspelled_row_key_is_a_type_error(tmp_path):
    # the snippet imports row.py alone (typing's names): about 2 s, no cache to copy; the
    # project's config, so its plugin too
    flagged, expected, output = mypy_flags(SNIPPET, tmp_path, timeout=120)
    assert flagged == expected, output


def test_the_type_declares_the_keys_the_table_makes():
    """Every key comparison_rows puts in a row is one Row declares, each key Row requires is
    there, and what it leaves to the compare stage (speedup_within_noise) is optional."""
    gpu = {"gpu_0": 100.0, "gpu_1": 80.0}
    results = [
        metrics("single", ["cuda:0"], 4.0, 0.9, {"gpu_0": 100.0}),
        metrics("ddp", ["cuda:0", "cuda:1"], 2.0, 0.89, gpu),
        run_summary("dp", ["cpu", "cpu"], 3.0, 0.8, {}),  # from before memory was measured
    ]
    histories = {r.strategy: history([0.5, r.test_acc], [9.0, 4.0]) for r in results}
    declared = Row.__required_keys__ | Row.__optional_keys__
    for row in table.comparison_rows(results, histories, 0.85):
        assert set(row) <= declared, set(row) - declared
        assert Row.__required_keys__ <= set(row), Row.__required_keys__ - set(row)
    assert "speedup_within_noise" in Row.__optional_keys__
