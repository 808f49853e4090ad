"""Parallelisms composed on one device mesh (pipeline/parallel_dims.py) train the model
`single` trains: channel_parallel (the notes' 通道并行) at 2 and 4 processes, and hybrids
(data x channel, FSDP x channel, data x pipeline) at 4, for real, torchrun on the CPU (gloo),
in fp64 with gradient accumulation (2 micro-steps: the data replicas' and FSDP's no-sync
paths in play, and a pipeline's gradients averaged after its second schedule run alone).

Channel shards compute every split layer's share and sum the partial outputs in a different
order than one device's kernel does, so they differ from `single` by rounding alone: in fp64
measured at most 3e-16 after 10 steps; bound 1e-9 as test_parity.py's. Their checkpoints hold
the split tensors as DTensors with their global shapes, so a run saved by 4 processes resumes
at 2, and at another factorization of its 4 (data x channel 2x2 -> 1x4; FSDP x channel 2x2 ->
channel 4, its shards gathered and split again); a data x pipeline
run's stages save their blocks under the plain model's names, so 2x2 resumes as 1 x 4
stages, cut elsewhere."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import support
from pipeline.resnet import resnet18
from support import Background, make_project, run, tiny_params, train_in_one_process

FP64_BOUND = 1e-9
TEN_STEPS = [*support.TEN_STEPS, "train.precision=fp64", "train.grad_accum=2"]
RUNS = [
    ("single", "single", TEN_STEPS),
    ("channel_parallel", "channel_parallel", [*TEN_STEPS, "channel_parallel.nproc=2"]),
    ("channel_parallel_4", "channel_parallel", [*TEN_STEPS, "channel_parallel.nproc=4"]),
    ("data_x_channel", "hybrid", [*TEN_STEPS, "hybrid.data=2", "hybrid.channel=2"]),
    (
        "fsdp_x_channel",
        "hybrid",
        [*TEN_STEPS, "hybrid.data=1", "hybrid.shard=2", "hybrid.channel=2"],
    ),
    (
        "data_x_pipeline",
        "hybrid",
        [*TEN_STEPS, "hybrid.data=2", "hybrid.pipeline=2", "hybrid.channel=1"],
    ),
]


@pytest.fixture(scope="module")
def fetched(tmp_path_factory, http_mirror):
    project = make_project(tmp_path_factory.mktemp("mesh") / "project", tiny_params(http_mirror))
    run(project, "python", "-m", "pipeline.fetch")
    return project


@pytest.fixture(scope="module")
def trained(fetched):
    kept = train_in_one_process(fetched, RUNS, OMP_NUM_THREADS="1")
    out = {}
    for label, _, _ in RUNS:
        out[label] = (
            torch.load(kept / label / "model.pt", weights_only=True),
            json.loads((kept / label / "summary.json").read_text()),
        )
    return out


def max_abs_diff(reference: dict, other: dict) -> float:
    assert list(other) == list(reference), "state_dict keys differ from the plain model's"
    return max((other[k].double() - reference[k].double()).abs().max().item() for k in reference)


@pytest.mark.parametrize("label", [label for label, _, _ in RUNS[1:]])
def test_fp64_matches_single(trained, label):
    diff = max_abs_diff(trained["single"][0], trained[label][0])
    print(f"{label}: max |param/buffer - single| = {diff:.3g}")
    assert diff < FP64_BOUND
    # The epoch's mean loss: summed per batch in fp32 (numerics/totals.py), over each data
    # rank's share, so data ranks round it differently: measured 2.8e-8 apart for the data
    # hybrids, 0 for channel shards (every rank sums the same logits); bound 1e-6.
    single, other = trained["single"][1], trained[label][1]
    assert abs(other["train_loss"] - single["train_loss"]) < 1e-6
    assert other["test_acc"] == single["test_acc"]


def test_model_pt_loads_into_the_plain_model(trained):
    state, summary = trained["channel_parallel_4"]
    model = resnet18(8).double()
    model.load_state_dict(state)  # strict: every key and shape the plain model's
    assert summary["world_size"] == 4


def test_rows_say_how_the_mesh_split_and_what_it_moves(trained):
    notes = trained["data_x_channel"][1]["notes"]
    assert "mesh: replicate 2 x channel 2" in notes, notes
    moved = [n for n in notes if n.startswith("channel: 16 all-reduces")]
    # 8 samples a micro-step, 2 micro-steps: width 8's 16 all-reduces of fp64 activations
    assert moved and moved[0].endswith("MiB of float64 activations an optimizer step, blocking")
    assert trained["channel_parallel_4"][1]["batch_split"] == [16, 16, 16, 16]
    assert trained["data_x_channel"][1]["batch_split"] == [8, 8, 8, 8]


def held_run(project, tmp_path, name, overrides, label):
    """Train `name` to the end, holding before epoch 3 while its epoch-2 checkpoint is
    copied away; -> the finished run's model and the copy."""
    release, saved = tmp_path / f"go-{label}", tmp_path / f"saved-{label}"
    with Background(
        project,
        "python",
        "-m",
        "pipeline.train",
        name,
        *overrides,
        log=tmp_path / f"{label}.log",
        MLFLOW_TRACKING_URI=f"sqlite:///{project / (label + '.db')}",
        PARALLEL_LAB_FAULT=f"rank=0,epoch=3,action=hold,release={release}",
    ) as job:
        job.wait_for_output("fault: rank 0 holding before step 0 of epoch 3", 240)
        shutil.copytree(project / f"checkpoints/{name}", saved)
        release.touch()
        assert job.wait(timeout=240) == 0, job.output()[-4000:]
    return torch.load(project / f"results/{name}/model.pt", weights_only=True), saved


RESUMES = [
    # (strategy, saved by, resumed by, what the resume says)
    ("channel_parallel", ["channel_parallel.nproc=4"], ["channel_parallel.nproc=2"], "4", "2"),
    (
        "hybrid",
        ["hybrid.data=2", "hybrid.channel=2"],
        ["hybrid.data=1", "hybrid.channel=4"],
        "4",
        "4",
    ),
    (
        "hybrid",
        ["hybrid.data=2", "hybrid.pipeline=2", "hybrid.channel=1"],
        ["hybrid.data=1", "hybrid.pipeline=4", "hybrid.channel=1"],
        "4",
        "4",
    ),
    (
        "hybrid",
        ["hybrid.data=1", "hybrid.shard=2", "hybrid.channel=2"],
        ["hybrid.data=1", "hybrid.shard=1", "hybrid.channel=4"],
        "4",
        "4",
    ),
]


@pytest.mark.parametrize(
    "name, saved_by, resumed_by, before, after",
    RESUMES,
    ids=[
        "channel_4_to_2",
        "hybrid_2x2_to_1x4",
        "data_x_pipeline_2x2_to_1x4",
        "fsdp_x_channel_2x2_to_1x4",
    ],
)
def test_resumes_resharded(fetched, tmp_path, name, saved_by, resumed_by, before, after):
    """With SGD momentum (optimizer state to reshard), 3 epochs of 3 steps in fp64; the
    resumed run ends where the uninterrupted one does, up to rounding."""
    project = shutil.copytree(fetched, tmp_path / "project")
    common = [
        "train.precision=fp64",
        "train.momentum=0.9",
        "train.epochs=3",
        "train.batch_size=24",
        "data.limit_train=72",
        "model.width=8",
    ]
    reference, saved = held_run(project, tmp_path, name, [*common, *saved_by], "reference")
    for folder in ("results", "checkpoints"):
        shutil.rmtree(project / folder)
    shutil.copytree(saved, project / f"checkpoints/{name}")
    proc = run(
        project,
        "python",
        "-m",
        "pipeline.train",
        name,
        *common,
        *resumed_by,
        MLFLOW_TRACKING_URI=f"sqlite:///{project / 'resumed.db'}",
    )
    resumed = f"resuming at epoch 3 step 0 from checkpoints/{name}"
    assert resumed in proc.stdout, proc.stdout
    if before != after:
        assert f"(saved by {before} process(es), resharded over {after})" in proc.stdout
    model = torch.load(project / f"results/{name}/model.pt", weights_only=True)
    assert max_abs_diff(reference, model) < FP64_BOUND


@pytest.mark.parametrize(
    "overrides, key, expected",
    [
        (["channel_parallel", "channel_parallel.nproc=3"], "channel_parallel", "multiple of 3"),
        (["hybrid", "hybrid.data=1", "hybrid.channel=3"], "hybrid", "multiple of 3"),
        (["hybrid", "hybrid.data=3", "hybrid.channel=1"], "train.batch_size", "3 x 1"),
        (
            ["hybrid", "hybrid.data=1", "hybrid.pipeline=7", "hybrid.channel=1"],
            "hybrid.pipeline",
            "expected at most 6",
        ),
    ],
    ids=["channel_width", "hybrid_width", "hybrid_batch", "hybrid_stages"],
)
def test_what_does_not_divide_exits_2_before_any_process(
    fetched, tmp_path, overrides, key, expected
):
    project = shutil.copytree(fetched, tmp_path / "project")  # the module's runs left theirs
    for kept in ("results", "checkpoints"):
        shutil.rmtree(project / kept, ignore_errors=True)
    proc = run(project, "python", "-m", "pipeline.train", *overrides, check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0] and expected in lines[0], lines
    assert "launch[" not in proc.stdout  # refused before torchrun started anything
    assert not (project / "results").exists() and not (project / "checkpoints").exists()
