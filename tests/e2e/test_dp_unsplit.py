"""`dp` and `balanced_dp` through the CLI on the CPU: they run unsplit, say so, and in fp64 end
with exactly the weights of `single`; a gpu0_bsz above the micro-batch is refused."""

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from support import make_project, run, tiny_params

# fp64 makes the three runs comparable to the last bit; 64 samples and width 4 keep them quick.
TINY_FP64 = dict(
    data={"limit_train": 64, "limit_test": 32},
    model={"width": 4},
    train={
        "epochs": 1,
        "batch_size": 32,
        "grad_accum": 2,
        "eval_batch_size": 32,
        "precision": "fp64",
    },
    balanced_dp={"gpu0_bsz": 2},
)


@dataclass
class Runs:
    project: Path  # single, dp and balanced_dp have each been trained once here
    refused: subprocess.CompletedProcess  # balanced_dp with gpu0_bsz above the micro-batch


@pytest.fixture(scope="module")
def runs(tmp_path_factory, http_mirror) -> Runs:
    """The CLI runs, all at once (most of each is process start-up); every training has its
    own MLflow store so no two processes create or write one sqlite file together."""
    project = make_project(
        tmp_path_factory.mktemp("dp") / "project", tiny_params(http_mirror, **TINY_FP64)
    )
    run(project, "python", "-m", "pipeline.fetch")

    def train(name: str) -> None:
        run(
            project,
            "python",
            "-m",
            "pipeline.train",
            name,
            MLFLOW_TRACKING_URI=f"sqlite:///{project / f'mlflow-{name}.db'}",
        )

    with ThreadPoolExecutor(4) as pool:
        refused = pool.submit(
            run,
            project,
            "python",
            "-m",
            "pipeline.train",
            "balanced_dp",
            "balanced_dp.gpu0_bsz=999",
            check=False,
        )
        list(pool.map(train, ("single", "dp", "balanced_dp")))  # list() re-raises failures
        return Runs(project, refused.result())


@pytest.mark.parametrize("name", ["dp", "balanced_dp"])
def test_runs_unsplit_on_cpu_and_says_so(runs, name):
    metrics = json.loads((runs.project / f"results/{name}/metrics.json").read_text())
    assert metrics["strategy"] == name and metrics["epochs"] == 1
    assert metrics["devices"] == ["cpu"]
    assert metrics["batch_split"] == [16]  # the micro-batch: 32 / grad_accum 2
    assert any("runs unsplit" in note for note in metrics["notes"])


@pytest.mark.parametrize("name", ["dp", "balanced_dp"])
def test_fp64_weights_equal_single(runs, name):
    reference = torch.load(runs.project / "results/single/model.pt")
    weights = torch.load(runs.project / f"results/{name}/model.pt")
    assert weights.keys() == reference.keys()
    for key, value in reference.items():
        assert (weights[key].double() - value.double()).abs().max().item() < 1e-12, key


def test_gpu0_bsz_above_micro_batch_exits_2_with_one_line(runs):
    assert runs.refused.returncode == 2
    lines = runs.refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "balanced_dp.gpu0_bsz" in lines[0] and "999" in lines[0], lines
