"""`make quick`: every stage in one process, each as its own command would run it."""

import shutil

import torch
import yaml
from mlflow.tracking import MlflowClient

from support import PREDICT, run

# on top of params.yaml's `quick` (6000 images, 3 epochs): what the test mirror holds
SMALL = ["data.limit_train=512", "data.limit_test=128", "train.epochs=2", "train.batch_size=32"]


def test_the_quickstart_is_the_stages_run_one_by_one(fetched_project):
    """Its one process runs fetch, each strategy's train (workers forked from it under the
    elastic agent), compare and publish; each strategy trains exactly as its own command
    would: ddp, launched after single in the same process (whose launch must leave nothing
    behind), has the same weights, bitwise, as `python -m pipeline.train ddp` alone."""
    # strategies: single and ddp (one process, then two), each predicted as the quickstart's
    project = fetched_project(**PREDICT)
    out = run(project, "python", "-m", "pipeline.quickstart", *SMALL).stdout
    assert "quickstart: done in" in out and (project / "reports/index.html").exists()
    quick = torch.load(project / "results/ddp/model.pt", weights_only=True)
    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tests")
    runs = client.search_runs([experiment.experiment_id], "tags.dvc_stage LIKE 'train@%'")
    assert sorted((r.data.tags["strategy"], r.info.status) for r in runs) == [
        ("ddp", "FINISHED"),
        ("single", "FINISHED"),
    ]
    # ddp came after single in the same process, with the environment its own launch gives
    assert {r.data.tags["strategy"]: r.data.params["world_size"] for r in runs}["ddp"] == "2"

    shutil.rmtree(project / "checkpoints")  # else the stage would resume the finished run
    quick_overrides = yaml.safe_load((project / "params.yaml").read_text())["quick"]
    run(project, "python", "-m", "pipeline.train", "ddp", *quick_overrides, *SMALL)
    alone = torch.load(project / "results/ddp/model.pt", weights_only=True)
    assert alone.keys() == quick.keys()
    assert all(torch.equal(alone[k], quick[k]) for k in alone)
