"""The opt-in `horovod` strategy trains the same model as `single` (CPU, real horovodrun runs
via the CLI, 2 processes over Gloo), as tests/e2e/test_parity.py checks the others: in fp64,
from the same seed and global batch, 10 optimizer steps, with gradient accumulation (Horovod's
`backward_passes_per_step`) and without, synchronised BatchNorm on. Skipped where Horovod is
not installed (`make install HOROVOD=1` builds it: docs/horovod.md)."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest
import torch

from support import TEN_STEPS, make_project, run, tiny_params, train_in_one_process


def horovod_missing() -> str | None:
    """Why the test cannot run here, or None: horovod.torch must import (its build's
    extension loads against this torch)."""
    if importlib.util.find_spec("horovod") is None:
        return "Horovod is not installed (make install HOROVOD=1 builds it: docs/horovod.md)"
    try:
        import horovod.torch  # noqa: F401
    except ImportError as err:
        return f"horovod.torch does not import here: {err}"
    return None


pytestmark = pytest.mark.skipif(horovod_missing() is not None, reason=str(horovod_missing()))

FP64 = [
    *TEN_STEPS,
    "train.precision=fp64",
    "horovod.nproc=2",
    "horovod.sync_bn=true",
]
ACCUM2 = [*FP64, "train.grad_accum=2"]
# SGD with state and weight decay: where Horovod's broadcast_optimizer_state, called on the
# fresh optimizer, would have stepped it on zero gradients (the strategy does not call it then)
MOMENTUM = ["train.momentum=0.9", "train.weight_decay=5e-4"]
RUNS = [
    ("single", "single", FP64),
    ("horovod", "horovod", FP64),
    ("single_accum2", "single", ACCUM2),
    ("horovod_accum2", "horovod", ACCUM2),
    ("single_momentum", "single", [*FP64, *MOMENTUM]),
    ("horovod_momentum", "horovod", [*FP64, *MOMENTUM]),
]
FP64_BOUND = 1e-9  # tests/e2e/test_parity.py's


@pytest.fixture(scope="module")
def trained(tmp_path_factory, http_mirror) -> dict[str, tuple[dict, dict]]:
    project = make_project(tmp_path_factory.mktemp("horovod") / "p", tiny_params(http_mirror))
    run(project, "python", "-m", "pipeline.fetch")
    kept = train_in_one_process(project, RUNS, OMP_NUM_THREADS="1")
    return {
        label: (
            torch.load(kept / label / "model.pt"),
            json.loads((kept / label / "summary.json").read_text()),
        )
        for label, _, _ in RUNS
    }


def max_abs_diff(reference: dict, other: dict) -> float:
    assert list(other) == list(reference), "state_dict keys differ from the plain model's"
    return max((other[k].double() - reference[k].double()).abs().max().item() for k in reference)


@pytest.mark.parametrize(
    "single, horovod",
    [
        ("single", "horovod"),
        ("single_accum2", "horovod_accum2"),
        ("single_momentum", "horovod_momentum"),
    ],
)
def test_horovod_in_fp64_matches_single(trained, single, horovod):
    diff = max_abs_diff(trained[single][0], trained[horovod][0])
    print(f"{horovod}: max |param/buffer - single| = {diff:.3g}")
    assert diff < FP64_BOUND


def test_horovod_ran_two_processes(trained):
    summary = trained["horovod"][1]
    assert summary["strategy"] == "horovod"
    assert summary["world_size"] == 2 and summary["devices"] == ["cpu", "cpu"]


def test_a_quickstart_listing_horovod_reports_it_beside_ddp(fetched_project):
    """`make quick` with horovod added to `strategies` (predict.gpus is empty in the tests'
    params: the predict stage says none were asked for); the report has its row beside
    ddp's, and its CSVs a column for it."""
    project = fetched_project()
    small = ["data.limit_train=512", "data.limit_test=128", "train.epochs=2", "train.batch_size=32"]
    run(project, "python", "-m", "pipeline.quickstart", "strategies=[single,ddp,horovod]", *small)
    summary = json.loads((project / "reports/summary.json").read_text())
    assert all(list(figure) == ["single", "ddp", "horovod"] for figure in summary.values())
    markdown = (project / "reports/summary.md").read_text()
    assert "| ddp |" in markdown and "| horovod |" in markdown
    header = (project / "reports/accuracy.csv").read_text().splitlines()[0]
    assert header.endswith(",hybrid,horovod")


def test_horovod_killed_mid_epoch_resumes_on_a_rerun_to_the_same_weights(fetched_project):
    """horovodrun restarts nothing: a rank killed in epoch 2 ends the stage, and the stage run
    again resumes from epoch 1's checkpoint, its momentum restored and broadcast from rank 0
    (hvd.broadcast_optimizer_state), to the weights of the run never killed, bitwise."""
    project = fetched_project()
    args = ("python", "-m", "pipeline.train", "horovod", *MOMENTUM)
    run(project, *args)
    reference = torch.load(project / "results/horovod/model.pt")
    for folder in ("results", "checkpoints"):
        shutil.rmtree(project / folder)
    killed = run(project, *args, check=False, PARALLEL_LAB_FAULT="rank=1,epoch=2,step=3")
    assert killed.returncode != 0 and "fault: rank 1 killed" in killed.stdout, killed.stderr
    run(project, *args)  # no fault: it resumes
    resumed = torch.load(project / "results/horovod/model.pt")
    assert list(resumed) == list(reference)
    assert all(torch.equal(resumed[k], reference[k]) for k in reference)
