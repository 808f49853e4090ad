"""Checkpoints through torch.distributed.checkpoint (pipeline/checkpoints/checkpoint.py), for
real: torchrun jobs on the CPU (gloo) killed mid-run, restarted by torchrun, resumed from
their last checkpoint, and bitwise equal to an uninterrupted run of the same configuration,
for every strategy, with SGD momentum (optimizer state to restore)."""

import json
import shutil

import pytest
import torch

from support import Background, make_project, run, tiny_params

METRICS = ("train_loss", "test_loss", "test_acc", "best_test_acc")
TINY = {
    "model": {"width": 8},  # the stem's 8 channels do not split evenly over 3 ranks
    "train": {"epochs": 3, "batch_size": 24, "eval_batch_size": 48, "momentum": 0.9},
    "data": {"limit_train": 72, "limit_test": 48},  # 3 steps an epoch
    "strategies": ["fsdp"],
    "fsdp": {"nproc": 3},
    "report": {"system_metrics_interval_s": None},
}


@pytest.fixture(scope="module")
def project(tmp_path_factory, http_mirror):
    project = make_project(
        tmp_path_factory.mktemp("sharded") / "project", tiny_params(http_mirror, **TINY)
    )
    run(project, "python", "-m", "pipeline.fetch")
    return project


def reset(project):
    for name in ("results", "checkpoints"):
        shutil.rmtree(project / name, ignore_errors=True)


def train(project, name, *overrides, db, keep=False, **env):
    """Train `name` from scratch (or, with keep, from the checkpoints already there)."""
    if not keep:
        reset(project)
    proc = run(
        project,
        "python",
        "-m",
        "pipeline.train",
        name,
        *overrides,
        MLFLOW_TRACKING_URI=f"sqlite:///{project / db}",
        timeout=300,
        **env,
    )
    model = torch.load(project / f"results/{name}/model.pt", weights_only=True)
    metrics = json.loads((project / f"results/{name}/summary.json").read_text())
    return proc, model, {k: metrics[k] for k in METRICS}


def assert_bitwise(model, reference):
    assert model.keys() == reference.keys()
    differ = [k for k in reference if not torch.equal(model[k], reference[k])]
    assert not differ, f"{len(differ)} tensors differ, first {differ[0]}"


def test_fsdp_resumes_uneven_shards_with_momentum_bitwise(project):
    """fsdp over 3 processes: 8 stem channels shard 3/3/2, their momentum buffers alike. One
    rank dies mid checkpoint write (its files on disk, the commit pending: the epoch 1
    checkpoint stays in force), another mid-epoch 3; each restart resumes."""
    _, reference, ref_metrics = train(project, "fsdp", db="fsdp-ref.db")
    faults = ["rank=2,epoch=2,point=checkpoint", "rank=1,epoch=3,step=1"]
    proc, model, metrics = train(
        project,
        "fsdp",
        f"checkpoint.max_restarts={len(faults)}",
        db="fsdp-faults.db",
        PARALLEL_LAB_FAULT=";".join(faults),
    )
    out = proc.stdout
    assert out.count("fault: rank") == 2, out
    assert "resuming at epoch 2 step 0" in out and "resuming at epoch 3 step 0" in out, out
    assert_bitwise(model, reference)
    assert metrics == ref_metrics
    # one committed checkpoint is left: its DCP shards and metadata, a file per rank
    (step_dir,) = [p for p in (project / "checkpoints/fsdp").iterdir() if p.is_dir()]
    assert step_dir.name == "e3-s0"
    names = {p.name for p in step_dir.iterdir()}
    assert {".metadata", "rank0.pt", "rank1.pt", "rank2.pt"} <= names


@pytest.mark.parametrize(
    "name, overrides",
    [
        # one process, the plain model (dp and balanced_dp save exactly this: their module is
        # the plain model, checked in tests/unit/test_dp_strategies.py)
        # (ddp: tests/e2e/test_reliability.py kills its ranks at twelve points, bitwise)
        ("single", []),
        ("pipeline_parallel", []),  # each rank saves and loads its own stage
        ("pipeline_parallel", ["pipeline_parallel.nproc=1"]),  # every stage in one process
    ],
    ids=["single", "pipeline_parallel", "pipeline_parallel_1proc"],
)
def test_every_strategy_resumes_bitwise(project, name, overrides):
    short = ["train.epochs=2", "data.limit_train=48"]  # 2 steps an epoch
    _, reference, ref_metrics = train(project, name, *short, *overrides, db=f"{name}-ref.db")
    proc, model, metrics = train(
        project,
        name,
        *short,
        *overrides,
        "checkpoint.max_restarts=1",
        db=f"{name}-fault.db",
        PARALLEL_LAB_FAULT="rank=0,epoch=2,step=1",
    )
    assert "resuming at epoch 2 step 0" in proc.stdout, proc.stdout
    assert_bitwise(model, reference)
    assert metrics == ref_metrics


def test_fsdp_resumes_its_own_checkpoint_at_another_world_size(project, tmp_path):
    """Saved by 2 processes, resumed by 3: the model and optimizer state reshard (8 stem
    channels as 4/4, then 3/3/2). With SyncBN the trajectory does not depend on the world
    size, so the run's own checkpoint resumes (more GPUs, or a node lost under
    dist.min_nnodes), with a note of where the world size changed. In fp64 the run ends where
    the uninterrupted 2-process run does, up to rounding: measured 4.4e-16, bound 1e-9. (ddp
    with SyncBN takes the same path; checkpoint.resume_from reads through the same code.)"""
    reset(project)
    options = ["train.precision=fp64", "fsdp.sync_bn=true"]
    release = tmp_path / "copied"
    saved = tmp_path / "saved-by-2"
    # the uninterrupted run, rank 0 waiting before epoch 3 while its epoch 2 checkpoint is
    # copied away
    with Background(
        project,
        "python",
        "-m",
        "pipeline.train",
        "fsdp",
        *options,
        "fsdp.nproc=2",
        log=tmp_path / "reference.log",
        MLFLOW_TRACKING_URI=f"sqlite:///{project / 'fsdp-2.db'}",
        PARALLEL_LAB_FAULT=f"rank=0,epoch=3,action=hold,release={release}",
    ) as reference_run:
        reference_run.wait_for_output("fault: rank 0 holding before step 0 of epoch 3", 240)
        shutil.copytree(project / "checkpoints/fsdp", saved)
        release.touch()
        assert reference_run.wait(timeout=240) == 0, reference_run.output()[-4000:]
    reference = torch.load(project / "results/fsdp/model.pt", weights_only=True)
    reset(project)  # the run's own checkpoints, as the 2-process run left them after epoch 2
    shutil.copytree(saved, project / "checkpoints/fsdp")
    proc, model, _ = train(project, "fsdp", *options, "fsdp.nproc=3", db="fsdp-3.db", keep=True)
    assert (
        "resuming at epoch 3 step 0 from checkpoints/fsdp (saved by 2 process(es), "
        "resharded over 3)" in proc.stdout
    ), proc.stdout
    notes = json.loads((project / "results/fsdp/summary.json").read_text())["notes"]
    assert any(n.startswith("world size 2 -> 3 at epoch 3 step 0") for n in notes), notes
    assert model.keys() == reference.keys()
    diff = max((model[k] - reference[k]).abs().max().item() for k in reference)
    assert diff < 1e-9, diff
