"""The final model as an MLflow model (logged once, loadable, with its signature, the run's
final figures logged against it), its registration by the compare stage under aliases, and the
seed sweeps found in MLflow, against real SQLite stores."""

import json
import tempfile

import mlflow
import mlflow.pytorch
import numpy as np
import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient

from pipeline.data.fashion_mnist import ARRAYS, write_arrays
from pipeline.reporting import answer
from pipeline.reporting.report import register
from pipeline.resnet import build_model
from pipeline.results import CONFIG, MODEL, SUMMARY, RunSummary, headline
from pipeline.tracking.comparison_run import register_model, seed_accuracies
from pipeline.tracking.final_model import input_example, model_source, plain_model
from pipeline.tracking.mlflow_run import MODEL_NAME, tensor_signature
from support import KeptRecord, run_summary


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the store's artifacts (mlruns/) land here
    # and the copies mlflow.pytorch.load_model and get_model_info download and never remove
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    return MlflowClient()


@pytest.fixture
def results(tmp_path):
    """results/ddp/ of a width-4 run, and a fetched test set of 8 images."""
    out, data = tmp_path / "results" / "ddp", tmp_path / "data"
    out.mkdir(parents=True)
    data.mkdir()
    (out / CONFIG).write_text(yaml.safe_dump({"seed": 3, "model": {"width": 4}}))
    trained = build_model(4, 3)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.01)  # not the initial weights
    torch.save(trained.state_dict(), out / MODEL)
    summary = run_summary("ddp", ["cpu", "cpu"], 2.0, 0.75, {"peak_memory_mib": {"cpu_0": 900.0}})
    (out / SUMMARY).write_text(json.dumps(summary.to_json()))
    images = np.random.default_rng(0).integers(0, 256, (8, 28, 28), dtype=np.uint8)
    labels = np.zeros(8, dtype=np.uint8)  # a whole fetched set: its reader checks it
    arrays = {"train_images": images, "train_labels": labels}
    write_arrays(data / ARRAYS, {**arrays, "test_images": images, "test_labels": labels})
    return out, data, trained


def published(tmp_path, results):
    out, data, _ = results
    tracker = KeptRecord(tmp_path / "run.json", "f", "ddp", params={"lr": 0.1})
    tracker.publish([], [out / MODEL], status="FINISHED", model=model_source(out, data))
    return tracker


def test_the_final_model_is_logged_once_and_loads_as_trained(tmp_path, store, results):
    out, data, trained = results
    tracker = published(tmp_path, results)
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["model_logged"] and record["model_id"]
    # a re-publish (python -m pipeline.publish, the launcher) logs nothing again
    tracker.publish([], [out / MODEL], status="FINISHED", model=model_source(out, data))
    experiment = store.get_experiment_by_name("tests").experiment_id
    models = store.search_logged_models([experiment])
    assert [(m.name, m.source_run_id) for m in models] == [(MODEL_NAME, tracker.run_id)]
    # model.pt stays a plain artifact of the run
    assert {a.path for a in store.list_artifacts(tracker.run_id)} == {MODEL}
    loaded = mlflow.pytorch.load_model(f"runs:/{tracker.run_id}/model")
    x = torch.from_numpy(input_example(data, 8))
    assert x.shape == (8, 1, 28, 28) and x.dtype == torch.float32
    with torch.no_grad():
        assert torch.allclose(loaded(x), trained.eval()(x), atol=1e-5)
        assert torch.allclose(plain_model(out)(x), trained(x))
    info = mlflow.models.get_model_info(f"runs:/{tracker.run_id}/model")
    (tensor,) = info.signature.inputs.inputs
    assert tensor.shape == (-1, 1, 28, 28) and str(tensor.type) == "float32"
    (logits,) = info.signature.outputs.inputs
    assert logits.shape == (-1, 10) and str(logits.type) == "float32"
    assert info.saved_input_example_info is not None


def test_the_final_figures_are_the_logged_models_so_mlflow_ranks_them(tmp_path, store, results):
    """MLflow 3's logged-model view compares models by the metrics logged against them: the
    run's metrics.json figures, as final/<name> (apart from the per-epoch test_acc)."""
    tracker = published(tmp_path, results)
    experiment = store.get_experiment_by_name("tests").experiment_id
    (model,) = store.search_logged_models([experiment])
    linked = {m.key: m.value for m in model.metrics}
    expected = headline(RunSummary.from_json(json.loads((results[0] / SUMMARY).read_text())))
    assert linked == {f"final/{k}": v for k, v in expected.items() if v is not None}
    assert linked["final/test_acc"] == 0.75 and linked["final/peak_memory_mib"] == 900.0
    assert all(m.model_id == model.model_id for m in model.metrics)
    ranked = store.search_logged_models(
        [experiment], order_by=[{"field_name": "metrics.final/test_acc", "ascending": False}]
    )
    assert [m.model_id for m in ranked] == [model.model_id]
    # the run's per-epoch series keep their own names: no final point among them
    assert store.get_metric_history(tracker.run_id, "test_acc") == []


def test_the_signature_is_the_one_mlflow_infers_from_the_batches(results):
    out, data, _ = results
    module, example, _ = model_source(out, data)()
    with torch.no_grad():
        output = module(torch.from_numpy(example)).numpy()
    inferred = mlflow.models.infer_signature(example, output)
    assert tensor_signature(example, output).to_dict() == inferred.to_dict()


def test_the_recommended_model_is_registered_once(tmp_path, store, results):
    tracker = published(tmp_path, results)
    first = register_model("tests", "ddp", "highest throughput", tracker.run_id)
    assert (first.version, first.uri, first.why_not) == ("1", "models:/tests/1", "")
    again = register_model("tests", "ddp", "highest throughput", tracker.run_id)
    assert again.version == "1"  # compare run again over the same runs: the same version
    (version,) = store.search_model_versions("name = 'tests'")
    assert version.run_id == tracker.run_id
    assert version.tags == {"strategy": "ddp", "recommended_for": "highest throughput"}
    x = torch.from_numpy(input_example(results[1]))
    with torch.no_grad():
        expected = results[2].eval()(x)
        assert torch.allclose(mlflow.pytorch.load_model("models:/tests/1")(x), expected, atol=1e-5)


def test_registration_says_why_not(tmp_path, store, monkeypatch):
    bare = KeptRecord(tmp_path / "run.json", "f", "ddp", params={})
    bare.publish([], status="FINISHED")
    missing = register_model("tests", "ddp", "highest throughput", bare.run_id)
    assert missing.version is None and "has no logged model yet" in missing.why_not
    assert "not in the MLflow store" in register_model("tests", "ddp", "x", None).why_not
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    away = register_model("tests", "ddp", "x", bare.run_id)
    assert away.version is None and away.why_not.startswith("MLflow unreachable")


def comparison_rows(run_ids: dict[str, str]) -> list[dict]:
    """single and ddp as the table has them: ddp has the throughput, single the lower peak."""
    rows = [
        {"strategy": "single", "steady_samples_per_s": 100.0, "peak_memory_mib": {"cpu_0": 500.0}},
        {"strategy": "ddp", "steady_samples_per_s": 300.0, "peak_memory_mib": {"cpu_0": 900.0}},
    ]
    for row in rows:
        row.update(
            mlflow_run_id=run_ids[row["strategy"]],
            memory_kind="cpu",
            world_size=1,
            devices=["cpu"],
            n_devices=1,
            mem_imbalance=None,
            test_acc=0.9,
            steady_epoch_s=1.0,
            time_to_target_s=None,
            epoch_to_target=None,
        )
    return rows


def test_compare_registers_each_objectives_pick_under_its_alias(tmp_path, store, results):
    """The objectives disagree: ddp is the fastest, single the lightest. Each has its version,
    `@recommended` the registered choice's (throughput's); an objective that recommends
    nothing the next time leaves no alias behind."""
    out, data, trained = results
    run_ids = {}
    for name in ("single", "ddp"):
        tracker = KeptRecord(tmp_path / f"{name}.json", name, name, params={})
        tracker.publish([], status="FINISHED", model=model_source(out, data))
        run_ids[name] = tracker.run_id
    rows = comparison_rows(run_ids)
    registered = register(answer.recommend(rows, None), rows, "tests", reachable=True)
    assert (registered.strategy, registered.uri) == ("ddp", "models:/tests@recommended")
    versions = {v.run_id: str(v.version) for v in store.search_model_versions("name = 'tests'")}
    ddp, single = versions[run_ids["ddp"]], versions[run_ids["single"]]
    assert registered.aliases == {
        "recommended": (ddp, "ddp"),
        "highest-throughput": (ddp, "ddp"),
        "least-memory": (single, "single"),
    }
    aliases = store.get_registered_model("tests").aliases
    assert {alias: str(version) for alias, version in aliases.items()} == {
        "recommended": ddp,
        "highest-throughput": ddp,
        "least-memory": single,
    }
    x = torch.from_numpy(input_example(data))
    with torch.no_grad():
        loaded = mlflow.pytorch.load_model("models:/tests@least-memory")
        assert torch.allclose(loaded(x), trained.eval()(x), atol=1e-5)
    assert store.get_model_version_by_alias("tests", "recommended").run_id == run_ids["ddp"]
    # again, memory unmeasured: no pick for least-memory, so no alias; the rest unchanged
    for row in rows:
        row["peak_memory_mib"] = {}
    again = register(answer.recommend(rows, None), rows, "tests", reachable=True)
    assert set(again.aliases) == {"recommended", "highest-throughput"}
    assert set(store.get_registered_model("tests").aliases) == {"recommended", "highest-throughput"}
    assert len(store.search_model_versions("name = 'tests'")) == 2  # reused, none added


def test_compare_registers_the_throughput_pick_or_says_mlflow_was_away():
    rows = [
        {"strategy": "single", "mlflow_run_id": "a", "steady_samples_per_s": 100.0},
        {"strategy": "ddp", "mlflow_run_id": "b", "steady_samples_per_s": 300.0},
    ]
    for row in rows:
        row.update(
            memory_kind="cpu",
            world_size=1,
            devices=["cpu"],
            n_devices=1,
            peak_memory_mib={},
            mem_imbalance=None,
            test_acc=0.9,
            steady_epoch_s=1.0,
            time_to_target_s=None,
            epoch_to_target=None,
        )
    answered = answer.recommend(rows, None)
    away = register(answered, rows, "tests", reachable=False)
    assert (away.strategy, away.objective, away.run_id) == ("ddp", "highest throughput", "b")
    assert away.version is None and away.why_not == "MLflow unreachable"


def test_seed_sweeps_are_the_runs_that_differ_only_in_seed(store):
    experiment = store.create_experiment("tests")

    def finished(strategy, seed, acc, lr="0.1", status="FINISHED"):
        run = store.create_run(experiment, tags={"strategy": strategy})
        rid = run.info.run_id
        store.log_param(rid, "seed", seed)
        store.log_param(rid, "train.lr", lr)
        store.log_metric(rid, "test_acc", 0.5, step=1)
        store.log_metric(rid, "test_acc", acc, step=2)  # the final epoch's
        store.set_terminated(rid, status)
        return rid

    mine = finished("ddp", "0", 0.90)
    finished("ddp", "1", 0.88)
    finished("ddp", "2", 0.93)
    finished("ddp", "3", 0.50, lr="0.2")  # another configuration
    finished("ddp", "4", 0.50, status="FAILED")
    finished("single", "5", 0.50)  # another strategy
    assert seed_accuracies(mine) == {"0": 0.90, "1": 0.88, "2": 0.93}
    assert answer.seed_spread(seed_accuracies(mine)) == pytest.approx(0.05)
    assert seed_accuracies(None) is None
    alone = finished("fsdp", "0", 0.9)
    assert seed_accuracies(alone) == {"0": 0.9}  # one seed: no spread
