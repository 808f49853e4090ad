"""Every reported number is the truth about the artifact it names, for every strategy, with real
processes on the CPU:

- the final test_acc and test_loss of summary.json are those of results/<strategy>/model.pt,
  loaded into a plain model and evaluated by `standalone_eval` below, which shares no code
  with the strategies or the training loop;
- a change to a training module's behaviour retrains from scratch (the old checkpoint is
  refused, saying why) and gives other weights; a change DVC does not see re-runs
  nothing;
- what MLflow holds for each run (status, params, per-epoch metrics stamped with the time the
  epoch ended, artifacts) matches results/<strategy>/, after a clean run, and after a run whose
  rank 0 was killed mid-epoch and resumed while the MLflow server was down, once
  `python -m pipeline.publish` has run twice;
- `compare` run twice keeps one "comparison" parent run, holding every strategy's run.

The clean run is the session's `every_strategy` repro; the adverse one retrains a copy of it
with a code change, for one strategy of each checkpoint kind (ADVERSE), so one run of each
checks both the retraining and the recovery.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from mlflow.tracking import MlflowClient

from pipeline import strategies
from pipeline.data.fashion_mnist import load_tensors
from pipeline.resnet import resnet18
from support import MlflowServer, dvc, free_port, run

# the first test here waits for the shared `dvc repro` of every strategy (conftest.py
# every_strategy, its own limit 900 s): eight of them, one of 4 processes, on 2 busy cores
pytestmark = pytest.mark.timeout(1200)


NAMES = list(strategies.NAMES)
# The adverse run retrains one strategy of each checkpoint kind: dp (one process, the plain
# model's state, as single and balanced_dp), fsdp (several processes, sharded through
# torch.distributed.checkpoint, as ddp) and pipeline_parallel (a stage per process). ddp's
# killed ranks are test_reliability's; every strategy's clean run is every_strategy's.
ADVERSE = ["dp", "fsdp", "pipeline_parallel"]
ARTIFACTS = {"metrics.json", "summary.json", "history.csv", "config.yaml", "model.pt"}
# Fashion-MNIST's pixel statistics, written out here rather than imported: the evaluation
# below must not share code with what it checks
MEAN, STD = 0.2860, 0.3530
# a training module's behaviour changed: the learning rate schedule returns half the rate
OPTIM = "pipeline/numerics/optim.py"
ORIGINAL, HALVED = (
    """        if self.kind == "none":
            return peak
""",
    """        if self.kind == "none":
            return peak / 2
""",
)


def standalone_eval(project: Path, strategy: str) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of the saved weights on the run's test set."""
    out = project / "results" / strategy
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    model = resnet18(cfg["model"]["width"])
    model.load_state_dict(torch.load(out / "model.pt", weights_only=True))
    model.eval()
    tensors = load_tensors(project / "data/fashion-mnist")
    n = cfg["data"]["limit_test"] or len(tensors["test_labels"])
    images = (tensors["test_images"][:n].float() / 255 - MEAN) / STD
    labels = tensors["test_labels"][:n].long()
    loss_sum, correct = 0.0, 0
    with torch.no_grad():
        for x, y in zip(
            images.split(cfg["train"]["eval_batch_size"]),
            labels.split(cfg["train"]["eval_batch_size"]),
        ):
            logits = model(x.unsqueeze(1))
            loss_sum += F.cross_entropy(logits.double(), y, reduction="sum").item()
            correct += int((logits.argmax(1) == y).sum())
    return loss_sum / n, correct / n


def assert_metrics_are_the_models(project: Path, names: list[str] = NAMES) -> None:
    for name in names:
        metrics = json.loads((project / f"results/{name}/summary.json").read_text())
        loss, acc = standalone_eval(project, name)
        print(
            f"{name}: summary.json test_loss {metrics['test_loss']:.7f} test_acc "
            f"{metrics['test_acc']:.4f}; model.pt {loss:.7f} {acc:.4f}"
        )
        assert abs(metrics["test_loss"] - loss) <= 1e-6, name
        assert abs(metrics["test_acc"] - acc) <= 1e-6, name


def flat(node: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in node.items():
        if isinstance(value, dict) and key != "md5":
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_mlflow_matches_files(project: Path, uri: str, names: list[str] = NAMES) -> None:
    client = MlflowClient(tracking_uri=uri)
    for name in names:
        out = project / "results" / name
        metrics = json.loads((out / "summary.json").read_text())
        # run.json: the run of these results (the same fingerprint) in this store
        record = json.loads((project / f"checkpoints/{name}/run.json").read_text())
        assert record["fingerprint"] == metrics["fingerprint"] and record["tracking_uri"] == uri
        run_ = client.get_run(record["run_id"])
        assert run_.data.tags["parallel_lab_fingerprint"] == metrics["fingerprint"], name
        assert run_.data.tags["mlflow.note.content"] == "\n".join(metrics["notes"]), name
        assert run_.info.status == "FINISHED", name
        config = flat(yaml.safe_load((out / "config.yaml").read_text()))
        for key, value in config.items():
            assert run_.data.params[key] == str(value), (name, key)
        header, *rows = (out / "history.csv").read_text().splitlines()
        columns = header.split(",")
        table = [dict(zip(columns, map(float, row.split(",")))) for row in rows]
        for column in columns:
            if column in ("epoch", "ended_at"):
                continue
            logged = client.get_metric_history(run_.info.run_id, column)
            assert [m.step for m in logged] == [int(r["epoch"]) for r in table], (name, column)
            for m, row in zip(logged, table):
                assert m.value == pytest.approx(row[column], rel=1e-5), (name, column)
                # stamped when the epoch ended, not when MLflow heard of it
                assert abs(m.timestamp - row["ended_at"] * 1000) <= 1, (name, column)
        listed = {a.path for a in client.list_artifacts(run_.info.run_id)}
        assert listed == ARTIFACTS, name
        with tempfile.TemporaryDirectory() as tmp:
            for artifact in ARTIFACTS:
                copy = Path(client.download_artifacts(run_.info.run_id, artifact, tmp))
                assert sha(copy) == sha(out / artifact), (name, artifact)


def test_metrics_json_reports_the_saved_model(every_strategy):
    assert_metrics_are_the_models(every_strategy)


def test_mlflow_matches_the_files_after_a_clean_run(every_strategy):
    assert_mlflow_matches_files(every_strategy, f"sqlite:///{every_strategy / 'mlflow.db'}")


def test_another_store_gets_every_run_from_disk(every_strategy, tmp_path):
    """`dvc repro` on the embedded store, then pointed at a real server: DVC has nothing to
    re-run, and `python -m pipeline.publish` (what `make run` and the container run after
    it) creates every run there, with its whole history and artifacts, from what is on disk."""
    project = tmp_path / "project"
    shutil.copytree(every_strategy, project, symlinks=True)
    server = MlflowServer(tmp_path, free_port())
    server.start()
    try:
        repro = dvc(project, "repro", MLFLOW_TRACKING_URI=server.uri)
        assert "Running stage" not in repro.stdout
        run(project, "python", "-m", "pipeline.publish", MLFLOW_TRACKING_URI=server.uri)
        assert_mlflow_matches_files(project, server.uri)
    finally:
        server.kill()


@pytest.fixture(scope="module")
def adverse(every_strategy, tmp_path_factory):
    """A copy of the clean run, retrained after a change to a training module, with every
    stage's rank 0 killed at the start of epoch 2 (torchrun restarts it, and it resumes from
    the epoch 1 checkpoint) while the MLflow server the stages log to is down."""
    project = tmp_path_factory.mktemp("adverse") / "project"
    shutil.copytree(every_strategy, project, symlinks=True)
    optim = project / OPTIM
    assert ORIGINAL in optim.read_text()
    optim.write_text(optim.read_text().replace(ORIGINAL, HALVED))
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["strategies"] = ADVERSE
    params["checkpoint"]["max_restarts"] = 1
    params["mlflow"]["final_sync_wait_s"] = 0
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    server = MlflowServer(project.parent, free_port())  # not started: the server is away
    repro = dvc(
        project,
        "repro",
        timeout=900,
        MLFLOW_TRACKING_URI=server.uri,
        PARALLEL_LAB_FAULT="rank=0,epoch=2,step=0",
    )
    yield project, server, repro
    server.kill()


def test_a_code_change_retrains_from_scratch(every_strategy, adverse):
    project, _, repro = adverse
    out = repro.stdout
    for name in ADVERSE:
        assert f"Running stage 'train@{name}'" in out
        assert (
            f"train[{name}]: not resuming checkpoints/{name}: its code differs "
            f"(pipeline/numerics/optim.py)"
        ) in out, name
        old = torch.load(every_strategy / f"results/{name}/model.pt", weights_only=True)
        new = torch.load(project / f"results/{name}/model.pt", weights_only=True)
        assert any(not torch.equal(old[k], new[k]) for k in old), name
    assert_metrics_are_the_models(project, ADVERSE)


def test_a_killed_rank_resumes_and_mlflow_catches_up_after_the_outage(adverse):
    project, server, repro = adverse
    for name in ADVERSE:  # each stage's rank 0 died and was restarted from the checkpoint
        assert f"train[{name}]: resuming at epoch 2 step 0" in repro.stdout, name
    assert "unreachable" in repro.stderr
    server.start()
    for _ in range(2):  # the second push finds nothing missing
        published = run(project, "python", "-m", "pipeline.publish", MLFLOW_TRACKING_URI=server.uri)
        assert published.stdout.count("FINISHED") == len(ADVERSE), published.stdout
    assert_mlflow_matches_files(project, server.uri, ADVERSE)


def test_a_change_dvc_does_not_see_reruns_nothing(adverse):
    project, server, _ = adverse
    os.utime(project / OPTIM)  # touched: same content
    repro = dvc(project, "repro", MLFLOW_TRACKING_URI=server.uri)
    assert "Running stage" not in repro.stdout, repro.stdout


def test_compare_twice_keeps_one_comparison(adverse):
    project, server, _ = adverse
    server.start()
    # the runs in the store (the catch-up test above does it too; this test needs no order)
    run(project, "python", "-m", "pipeline.publish", MLFLOW_TRACKING_URI=server.uri)
    for _ in range(2):
        run(project, "python", "-m", "pipeline.compare", MLFLOW_TRACKING_URI=server.uri)
    client = MlflowClient(tracking_uri=server.uri)
    experiment = client.get_experiment_by_name("tests")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.info.run_name == "comparison"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    children = {
        r.data.tags.get("strategy")
        for r in runs
        if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id
    }
    assert children == set(ADVERSE)
