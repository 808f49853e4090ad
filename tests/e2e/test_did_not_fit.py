"""Out of device memory is a result, not a crash (issue 50, goal 3): a `dvc repro` whose
balanced_dp runs out of memory at a training step (injected: torch's OutOfMemoryError, as a
batch too large raises it) goes on to compare; the stage says "did not fit" in one line naming
the keys that would make it fit, with no traceback; the report lists it apart, ranked in
nothing, while single is still compared; its MLflow run is FAILED; and the repro is done."""

import json

from mlflow.tracking import MlflowClient

from support import dvc, make_project, tiny_params

OOM = "rank=0,epoch=2,step=2,action=oom,strategy=balanced_dp"


def test_a_strategy_out_of_memory_is_reported_and_the_others_compared(tmp_path, http_mirror):
    params = tiny_params(http_mirror, strategies=["single", "balanced_dp"])
    project = make_project(tmp_path / "project", params)
    proc = dvc(project, "repro", timeout=600, PARALLEL_LAB_FAULT=OOM)
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out
    (said,) = [line for line in out.splitlines() if line.startswith("train[balanced_dp]: did")]
    assert said.startswith(
        "train[balanced_dp]: did not fit: out of memory on cpu_0 in epoch 2, at a per-device "
        "batch of 32, "
    )
    assert said.endswith(
        "to fit, lower train.batch_size (32 now), raise train.grad_accum (1 now), lower "
        "balanced_dp.gpu0_bsz (GPU 0's share), or use a strategy that shards the model (fsdp)"
    )
    answer = json.loads((project / "reports/recommendation.json").read_text())
    record = answer["did_not_fit"]["balanced_dp"]
    assert (record["failed_on"], record["batch_split"], record["epochs_done"]) == ("cpu_0", [32], 1)
    assert record["peak_mib"]["cpu_0"] > 0
    for objective in answer["objectives"].values():
        assert "balanced_dp" not in objective["strategies"]
    metrics = json.loads((project / "reports/summary.json").read_text())  # DVC's, by figure
    assert all(set(by_strategy) == {"single"} for by_strategy in metrics.values())
    report = (project / "reports/summary.md").read_text()
    assert "## Did not fit" in report and "| balanced_dp | 32 | cpu_0 |" in report
    assert "Did not fit</h2>" in (project / "reports/index.html").read_text()
    assert "- **Did not fit: balanced_dp**" in report  # in the answer, beside the picks
    assert "Did not fit: balanced_dp" in out  # and in what compare printed
    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tests")
    runs = client.search_runs([experiment.experiment_id], "tags.mlflow.runName = 'balanced_dp'")
    assert [r.info.status for r in runs] == ["FAILED"]
    # a result at these settings: the repro is done until they change
    assert "Data and pipelines are up to date" in dvc(project, "status").stdout
