"""The comparison report: its arithmetic as pure functions, then one tiny real `dvc repro` over
every registered strategy, checked the way a reader and MLflow would see it."""
import base64
import io
import json
import re

import pytest
from mlflow.tracking import MlflowClient
from PIL import Image

from conftest import dvc, make_project, tiny_params
from pipeline import report, strategies
from pipeline.compare import CHILD_METRICS, PLOTS
from pipeline.config import STRATEGY_NAMES, load_config
from pipeline.errors import UserError

IMAGE = "registry.example/parallel-lab:test"
PROVENANCE_TAGS = {"git_commit", "git_dirty", "params_sha256", "dvc_lock_sha256", "torch", "cuda",
                   "cudnn", "nccl", "nvidia_driver", "hostname", "container_image"}


def history(accs, seconds):
    wall, rows = 0.0, []
    for i, (acc, s) in enumerate(zip(accs, seconds)):
        wall += s
        rows.append({"epoch": i + 1, "test_acc": acc, "epoch_seconds": s, "wall_seconds": wall})
    return rows


def metrics(name, devices, steady, acc, peaks):
    return {"strategy": name, "world_size": len(devices), "devices": devices,
            "batch_split": [64 // len(devices)] * len(devices), "warmup_epoch_seconds": 9.0,
            "steady_epoch_seconds": steady, "steady_samples_per_s": 6400 / steady,
            "test_acc": acc, "best_test_acc": acc, "memory_kind": "gpu",
            "peak_memory_mib": peaks, "peak_reserved_mib": peaks,
            "mem_imbalance": 1.0, "gpu0_share": 0.5, "mlflow_run_id": None, "notes": []}


def test_warmup_is_the_first_epoch_and_steady_the_median_of_the_rest():
    assert report.warmup_seconds([10.0, 2.0, 4.0, 3.0]) == 10.0
    assert report.steady_seconds([10.0, 2.0, 4.0, 3.0]) == 3.0
    assert report.steady_seconds([10.0, 2.0, 4.0]) == 3.0
    assert report.steady_seconds([10.0]) == 10.0  # one epoch: no steady state to tell apart


def test_time_to_target_is_the_first_crossing_or_none():
    h = history([0.5, 0.8, 0.7, 0.9], [3.0, 2.0, 2.0, 2.0])
    assert report.time_to_target(h, 0.75) == (2, 5.0)
    assert report.time_to_target(h, 0.5) == (1, 3.0)
    assert report.time_to_target(h, 0.95) == (None, None)
    assert report.time_to_target(h, None) == (None, None)


def test_speedup_efficiency_and_delta():
    assert report.speedup(10.0, 4.0) == 2.5
    assert report.scaling_efficiency(2.5, 4) == 0.625
    assert report.delta(0.91, 0.9) == pytest.approx(0.01)
    assert report.speedup(None, 4.0) is None and report.scaling_efficiency(None, 2) is None
    assert report.delta(0.9, None) is None


def test_rows_compare_against_single():
    results = [metrics("single", ["cuda:0"], 10.0, 0.90, {"gpu0": 100.0}),
               metrics("ddp", ["cuda:0", "cuda:1"], 4.0, 0.88, {"gpu0": 60.0, "gpu1": 60.0})]
    hist = {"single": history([0.8, 0.9], [9.0, 10.0]), "ddp": history([0.7, 0.88], [9.0, 4.0])}
    single, ddp = report.comparison_rows(results, hist, 0.85)
    assert single["speedup_vs_single"] == 1.0 and single["acc_delta_vs_single"] == 0.0
    assert ddp["speedup_vs_single"] == 2.5 and ddp["scaling_efficiency"] == 1.25
    assert ddp["acc_delta_vs_single"] == pytest.approx(-0.02)
    assert (single["epoch_to_target"], single["time_to_target_s"]) == (2, 19.0)
    assert ddp["time_to_target_s"] == 13.0 and ddp["gpu0_share"] == 0.5
    text = report.markdown_table([single, ddp], 0.85)
    assert "peak allocated MiB per GPU" in text and "time to acc 0.85" in text
    assert "| ddp | 2 | cuda:0, cuda:1 | 32+32 | 9.00 | 4.00 | 1600 | 2.50x | 125% |" in text
    assert "gpu0 60, gpu1 60" in text and "13.0 s (epoch 2)" in text


def test_rows_without_single_say_so_instead_of_inventing_a_baseline():
    results = [metrics("ddp", ["cpu", "cpu"], 4.0, 0.8, {"cpu0": 900.0, "cpu1": 800.0})]
    results[0].update(memory_kind="cpu", peak_reserved_mib={})
    (row,) = report.comparison_rows(results, {"ddp": history([0.5], [4.0])}, 0.9)
    assert row["speedup_vs_single"] is None and row["acc_delta_vs_single"] is None
    text = report.markdown_table([row], 0.9)
    assert "peak RSS (CPU) MiB per process" in text
    assert "| n/a | n/a |" in text and "not reached" in text


def test_target_accuracy_is_a_fraction():
    with pytest.raises(UserError, match="report.target_accuracy: got 90.0, expected <= 1.0"):
        load_config("params.yaml", ["report.target_accuracy=90.0"])
    assert load_config("params.yaml", ["report.target_accuracy=null"]).report.target_accuracy is None


def test_accuracy_file_has_a_column_for_every_known_strategy():
    text = report.accuracy_wide({"ddp": history([0.5, 0.75], [1, 1])}, ["single", "ddp"])
    assert text == "epoch,single,ddp\n1,,0.5\n2,,0.75\n"


# --- one tiny real pipeline ---------------------------------------------------------------

@pytest.fixture(scope="module")
def project(tmp_path_factory, http_mirror):
    names = strategies.names()
    params = tiny_params(http_mirror, strategies=names,
                         report={"target_accuracy": 0.05, "system_metrics_interval_s": 0.5})
    params["data"]["limit_train"] = 128  # 4 steps an epoch: the stages' start-up dominates
    project = make_project(tmp_path_factory.mktemp("report") / "project", params)
    dvc(project, "repro", timeout=900, PARALLEL_LAB_IMAGE=IMAGE)
    return project


def test_summary_json_has_every_column_for_every_strategy(project):
    summary = json.loads((project / "reports/summary.json").read_text())
    assert list(summary) == strategies.names()
    keys = {k for k, _, _ in report.columns(0.05, "cpu")} - {"strategy"}
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
    assert not re.search(r'(src|href)="(?!data:)', page)  # nothing fetched from elsewhere
    for name in strategies.names():
        assert f"<td>{name}</td>" in page
    assert "peak RSS (CPU)" in page
    markdown = (project / "reports/summary.md").read_text()
    assert all(f"| {name} |" in markdown for name in strategies.names())


def test_mlflow_groups_the_strategy_runs_under_one_comparison(project):
    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tests")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    parent = runs.pop("comparison")
    assert parent.info.status == "FINISHED"
    attached = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {f"report/{n}" for n in ("index.html", "summary.md", *PLOTS)} <= attached
    assert PROVENANCE_TAGS <= set(parent.data.tags)
    assert set(runs) == set(strategies.names())
    for name, run in runs.items():
        result = json.loads((project / f"results/{name}/metrics.json").read_text())
        assert run.info.run_id == result["mlflow_run_id"]
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert PROVENANCE_TAGS | {"gpu_names"} <= set(run.data.tags), name
        assert run.data.tags["container_image"] == IMAGE
        keys = set(run.data.metrics)
        expected = {"test_acc", "epoch_seconds", "samples_per_s", "cpu0/peak_rss_mib",
                    "mem_imbalance", "cpu0_share", "system/cpu_utilization_percentage",
                    *CHILD_METRICS}
        assert expected <= keys, (name, expected - keys)
        assert [m.step for m in client.get_metric_history(run.info.run_id, "cpu0/peak_rss_mib")
                ] == [1, 2]
        assert not any(k.startswith("system/gpu") for k in keys)  # a CPU run samples no GPU


def test_dvc_plots_and_metrics_show_the_comparison(project):
    shown = json.loads(dvc(project, "plots", "show", "--json").stdout)
    assert not shown.get("errors"), shown.get("errors")
    (chart,) = shown["data"]["test accuracy per strategy"]
    assert {d["field"] for d in chart["content"]["data"]["values"]} == set(STRATEGY_NAMES)
    assert all(f"reports/{n}" in shown["data"] for n in PLOTS)
    assert "speedup_vs_single" in dvc(project, "metrics", "show").stdout

