"""The comparison report of one tiny real `dvc repro` over every registered strategy, checked
the way a reader and MLflow would see it (the arithmetic: tests/unit/test_report_table.py)."""

import base64
import html
import io
import json
import re

import pytest
from mlflow.tracking import MlflowClient
from PIL import Image

from pipeline import strategies
from pipeline.reporting import table
from pipeline.reporting.compare import CHILD_METRICS
from pipeline.reporting.plots import PLOTS
from support import IMAGE, LEARNED, dvc

PROVENANCE_TAGS = {
    "git_commit",
    "git_dirty",
    "params_sha256",
    "dvc_lock_sha256",
    "torch",
    "cuda",
    "cudnn",
    "nccl",
    "nvidia_driver",
    "hostname",
    "container_image",
}


@pytest.fixture(scope="module")
def project(every_strategy):
    return every_strategy


def test_every_strategy_learned(project):
    """Chance is 0.1; the tiny run reaches about 1.0 on the synthetic data."""
    summary = json.loads((project / "reports/summary.json").read_text())
    for name, row in summary.items():
        assert row["test_acc"] >= LEARNED, (name, row["test_acc"])
        assert row["epoch_to_target"] is not None, name


def test_summary_json_has_every_column_for_every_strategy(project):
    summary = json.loads((project / "reports/summary.json").read_text())
    assert list(summary) == list(strategies.NAMES)
    keys = {k for k, _, _ in table.columns(LEARNED, "cpu")} - {"strategy"}
    for name, row in summary.items():
        assert keys | {"cpu0_share", "epoch_to_target", "mlflow_run_id"} <= set(row), name
        assert row["memory_kind"] == "cpu" and row["peak_memory_mib"]["cpu0"] > 50
        assert row["time_to_target_s"] > 0 and row["steady_samples_per_s"] > 0
    assert summary["single"]["speedup_vs_single"] == 1.0
    assert set(summary["ddp"]["peak_memory_mib"]) == {"cpu0", "cpu1"}


def test_pngs_are_real_plots(project):
    for name in PLOTS:
        image = Image.open(project / "reports" / name).convert("RGB")
        assert image.width >= 600 and image.height >= 400, name
        assert len(image.getcolors(maxcolors=1 << 20)) > 50, name  # not a blank canvas


def test_html_page_is_self_contained(project):
    page = (project / "reports/index.html").read_text()
    embedded = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(embedded) == len(PLOTS)
    for data in embedded:
        assert Image.open(io.BytesIO(base64.b64decode(data))).width >= 600
    assert not re.search(r'src="(?!data:)', page)  # nothing fetched from elsewhere
    # one link out: this comparison's runs side by side in MLflow
    (link,) = map(html.unescape, re.findall(r'href="([^"]+)"', page))
    assert link.startswith("http://127.0.0.1:5000/#/compare-runs?runs=[") and "experiments=" in link
    assert link.endswith("&workflowType=machine_learning")  # MLflow's training view
    for name in strategies.NAMES:
        assert f"<td>{name}</td>" in page
    assert "peak RSS (CPU)" in page
    markdown = (project / "reports/summary.md").read_text()
    assert all(f"| {name} |" in markdown for name in strategies.NAMES)


def test_mlflow_groups_the_strategy_runs_under_one_comparison(project):
    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tests")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    parent = runs.pop("comparison")
    assert parent.info.status == "FINISHED"
    attached = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {f"report/{n}" for n in ("index.html", "summary.md", *PLOTS)} <= attached
    assert PROVENANCE_TAGS <= set(parent.data.tags)
    assert set(runs) == set(strategies.NAMES)
    for name, run in runs.items():
        result = json.loads((project / f"results/{name}/metrics.json").read_text())
        assert run.data.tags["parallel_lab_fingerprint"] == result["fingerprint"]
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert PROVENANCE_TAGS | {"gpu_names"} <= set(run.data.tags), name
        assert run.data.tags["container_image"] == IMAGE
        keys = set(run.data.metrics)
        expected = {
            "test_acc",
            "epoch_seconds",
            "samples_per_s",
            "cpu0/peak_rss_mib",
            "mem_imbalance",
            "cpu0_share",
            "system/cpu_utilization_percentage",
            *CHILD_METRICS,
        }
        assert expected <= keys, (name, expected - keys)
        assert [
            m.step for m in client.get_metric_history(run.info.run_id, "cpu0/peak_rss_mib")
        ] == [1, 2]
        assert not any(k.startswith("system/gpu") for k in keys)  # a CPU run samples no GPU


def test_dvc_plots_and_metrics_show_the_comparison(project):
    shown = json.loads(dvc(project, "plots", "show", "--json").stdout)
    assert not shown.get("errors"), shown.get("errors")
    (chart,) = shown["data"]["test accuracy per strategy"]
    assert {d["field"] for d in chart["content"]["data"]["values"]} == set(strategies.NAMES)
    assert all(f"reports/{n}" in shown["data"] for n in PLOTS)
    assert "speedup_vs_single" in dvc(project, "metrics", "show").stdout
