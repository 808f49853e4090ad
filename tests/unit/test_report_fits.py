"""The report fits where it is read (issue 33): every strategy on 8 GPUs, from fixtures. The
main table keeps a fixed set of columns whatever the devices, each device's memory is a row of
its own, and what the compare stage prints fits a 120-column terminal, the long MLflow link in
a file and the page instead."""

from __future__ import annotations

import html
import json
import re
from dataclasses import replace

import pytest

from pipeline import results
from pipeline.config import MlflowConfig, ReportConfig
from pipeline.reporting import answer, device_table, table
from pipeline.reporting.pages import grouped_notes, html_page
from pipeline.reporting.plots import PLOTS
from pipeline.reporting.report import write_report
from pipeline.results import EpochRow, RunSummary
from pipeline.strategies import NAMES
from pipeline.tracking.comparison_run import RECOMMENDED, Registration
from support import empty_store, run_summary

TARGET = 0.85
# per strategy: (devices, processes, steady s/epoch, final accuracy, device 0's training peak)
LAYOUT = {
    "single": (1, 1, 10.0, 0.90, 12000.0),
    "dp": (8, 1, 4.1, 0.89, 12600.0),
    "balanced_dp": (8, 1, 3.9, 0.89, 11800.0),
    "ddp": (8, 8, 1.6, 0.88, 3000.0),
    "fsdp": (8, 8, 1.8, 0.88, 2000.0),
    "pipeline_parallel": (8, 8, 2.9, 0.885, 2010.0),
    "channel_parallel": (8, 8, 3.4, 0.88, 9000.0),
    "hybrid": (8, 8, 2.2, 0.88, 4000.0),
}


def labels(n: int, nodes: int) -> list[str]:
    per = n // nodes
    if nodes == 1:
        return [f"gpu_{i}" for i in range(n)]
    return [f"node{i // per}_gpu_{i % per}" for i in range(n)]


def epochs(seconds: float, acc: float) -> list[EpochRow]:
    """Three epochs, the first a warm-up."""
    rows, wall = [], 0.0
    for epoch, s in enumerate((9.0, seconds, seconds), 1):
        wall += s
        rows.append(
            EpochRow(epoch, 0.5, 0.5, 0.5, acc - 0.1 + 0.05 * epoch, s, 60000 / s, wall,
                     warmup=epoch == 1)
        )  # fmt: skip
    return rows


def fixture(nodes: int = 1) -> tuple[list[RunSummary], dict[str, list[EpochRow]]]:
    summaries, histories = [], {}
    for name, (n, procs, steady, acc, top) in LAYOUT.items():
        names = labels(n, nodes if procs > 1 else 1)
        peaks = {label: top - 100 * i for i, label in enumerate(names)}
        memory = {
            "memory_kind": "gpu",
            "peak_memory_mib": peaks,
            "peak_reserved_mib": {k: v + 512 for k, v in peaks.items()},
            "mem_imbalance": max(peaks.values()) / (sum(peaks.values()) / len(peaks)),
            "gpu0_share": 1 / n,
            "eval_peak_memory_mib": {k: v / 4 for k, v in peaks.items()},
            "eval_peak_reserved_mib": {k: v + 512 for k, v in peaks.items()},
            "peak_memory_spread_mib": 12.0,
            "mem_imbalance_spread": 0.004,
        }
        summary = run_summary(name, [f"cuda:{i}" for i in range(n)], steady, acc, memory)
        summaries.append(replace(summary, world_size=procs, batch_split=[256 // n] * n))
        histories[name] = epochs(steady, acc)
    return summaries, histories


def rows(nodes: int = 1) -> list[dict]:
    summaries, histories = fixture(nodes)
    return table.comparison_rows(summaries, histories, TARGET)


REGISTERED = Registration(
    "parallel-lab",
    "ddp",
    "highest throughput",
    "0123456789abcdef0123456789abcdef",
    version="12",
    aliases={
        RECOMMENDED: ("12", "ddp"),
        "fastest-to-target": ("12", "ddp"),
        "highest-throughput": ("12", "ddp"),
        "least-memory": ("13", "pipeline_parallel"),
        "most-even-memory": ("14", "balanced_dp"),
    },
)


def test_the_main_table_has_ten_columns_whatever_the_devices():
    for table_rows in (rows(), rows(nodes=2), rows()[:1]):
        head, body = table.table_cells(table_rows, TARGET)
        assert len(head) == 10 and {len(cells) for cells in body} == {10}
    head, body = table.table_cells(rows(), TARGET)
    ddp = dict(zip(head, body[3]))
    assert ddp["training peak MiB (busiest GPU)"] == "3000 (gpu_0)"
    assert ddp["per-device batch"] == "32+32+32+32+32+32+32+32"
    # the one cell that grows with the devices breaks after its "+" on the page
    page = table.html_table(rows(), TARGET)
    assert '<td class="wrap">32+<wbr>32+<wbr>' in page
    longest = max(len(c) for cells in body for c in cells if "+" not in c)
    assert longest <= 20, longest


def test_each_device_is_a_row_of_the_memory_table():
    for nodes in (1, 2):
        head, body = device_table.cells(rows(nodes))
        assert len(head) == 7 and {len(line) for line in body} == {7}
        assert len(body) == sum(n for n, *_ in LAYOUT.values())  # 57 devices in all
        assert max(len(c) for line in body for c in line) <= len("pipeline_parallel")
    head, body = device_table.cells(rows(nodes=2))
    ddp = body[17:25]  # single's 1 row, dp's and balanced_dp's 8 each, then ddp's 8
    assert [line[1] for line in ddp][:5] == [
        "node0_gpu_0",
        "node0_gpu_1",
        "node0_gpu_2",
        "node0_gpu_3",
        "node1_gpu_0",
    ]
    assert ddp[0][0] == "ddp" and all(line[0] == "" for line in ddp[1:])
    # the imbalance, 3000 over the mean of 3000, 2900, ..., 2300, on the first row only
    assert ddp[0][-1] == "1.13" and all(line[-1] == "" for line in ddp[1:])


def test_what_compare_prints_fits_120_columns():
    for nodes in (1, 2):
        answered = answer.recommend(rows(nodes), TARGET)
        printed = answer.text(answered, REGISTERED) + table.text_table(rows(nodes), TARGET)
        widths = [len(line) for line in printed.splitlines()]
        assert max(widths) <= table.TEXT_WIDTH, max(widths)
        # wrapping keeps every word: the long model line reads the same, joined again
        joined = " ".join(printed.split())
        assert 'mlflow.pytorch.load_model("models:/parallel-lab@recommended")' in joined
        assert "`@least-memory` pipeline_parallel's (version 13)" in joined
    header = table.text_table(rows(), TARGET).splitlines()[0].split()
    assert header[:3] == ["strategy", "devices", "s/epoch"]


def test_the_compare_stage_prints_short_lines_and_files_the_mlflow_link(tmp_path, monkeypatch):
    """The whole stage over fixture results (MLflow: an empty local store, these runs not in
    it): every printed line within 120 columns, the link in reports/mlflow_url.txt and atop
    the page, and summary.json (DVC metrics) four numbers a strategy."""
    summaries, histories = fixture()
    for summary in summaries:
        out = tmp_path / "results" / summary.strategy
        out.mkdir(parents=True)
        (out / results.SUMMARY).write_text(json.dumps(summary.to_json()))
        (out / results.HISTORY).write_text(results.history_csv(histories[summary.strategy]))
    monkeypatch.chdir(tmp_path)
    empty_store(tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    printed = write_report(list(NAMES), ReportConfig(target_accuracy=TARGET), MlflowConfig())
    assert max(len(line) for line in printed.splitlines()) <= 120
    url = (tmp_path / "reports/mlflow_url.txt").read_text().strip()
    assert url.startswith("http://127.0.0.1:5000/#/compare-runs?runs=[")
    assert url not in printed and "reports/mlflow_url.txt" in printed
    page = (tmp_path / "reports/index.html").read_text()
    assert url.replace("&", "&amp;") in page
    main = page.split('<table class="main">', 1)[1].split("</table>", 1)[0]
    assert main.split("</tr>", 1)[0].count("<th>") == 10
    memory = page.split('<table class="devices">', 1)[1].split("</table>", 1)[0]
    assert memory.count("<tr>") == 1 + sum(n for n, *_ in LAYOUT.values())
    metrics = json.loads((tmp_path / "reports/summary.json").read_text())
    assert metrics == {
        "acc": {name: LAYOUT[name][3] for name in NAMES},
        "sps": {r.strategy: r.steady_samples_per_s for r in summaries},
        "total_s": {r.strategy: r.total_seconds for r in summaries},
        "peak_mib": {  # the busiest device's training peak
            r.strategy: max(r.memory["peak_memory_mib"].values()) for r in summaries
        },
    }
    for name in table.WIDE_PLOTS:
        assert (tmp_path / "reports" / name).read_text().startswith(f"epoch,{','.join(NAMES)}\n")


@pytest.mark.parametrize("nodes", [1, 2])
def test_the_page_has_no_text_a_browser_cannot_break(nodes, tmp_path):
    """Beside the tables' bounded cells: no run of text without a place to break longer than
    70 characters (about 500 px), so no sentence, code or link text forces the page wider."""
    for name in PLOTS:
        (tmp_path / name).write_bytes(b"png")
    table_rows = rows(nodes)
    answered = answer.recommend(table_rows, TARGET)
    page = html_page(table_rows, TARGET, None, tmp_path, answered, REGISTERED)
    text = html.unescape(re.sub(r"<[^>]+>", " ", page.split("<body>", 1)[1]))
    assert max(len(word) for word in text.split()) <= 70


def test_a_note_several_runs_share_is_said_once_with_their_names():
    shared = "memory: evaluation's peak is not separable on CPU"
    rows = [
        {"strategy": "single", "notes": [shared]},
        {"strategy": "dp", "notes": ["dp on 1 device (cpu): runs unsplit", shared]},
        {"strategy": "ddp", "notes": [shared]},
        {"strategy": "fsdp", "notes": []},
        {"strategy": "pipeline_parallel", "notes": ["pipeline_parallel: blocks split at [3]"]},
    ]
    assert grouped_notes(rows) == [
        (["single", "dp", "ddp"], shared),
        (["dp"], "dp on 1 device (cpu): runs unsplit"),
        (["pipeline_parallel"], "blocks split at [3]"),  # its name is the row's already
    ]
