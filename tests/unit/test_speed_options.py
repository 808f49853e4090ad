"""The speed options of the shared loop, on the CPU: augmentation, precision modes and their
fallbacks, the learning-rate schedules, and the two training loaders against each other.
One real CLI run trains with the options combined."""

from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms.functional as TF
from torch import nn

from pipeline.batch_plan import BatchPlan
from pipeline.checkpoints.checkpoint import Checkpointer, Position, rng_state
from pipeline.config import Config, ConfigError, TrainConfig, load_config
from pipeline.data import loaders
from pipeline.data.device_data import to_device
from pipeline.data.download import convert
from pipeline.data.fashion_mnist import FILES
from pipeline.data.idx import write_idx_gz
from pipeline.data.loaders import (
    DataLoaderBatches,
    DeviceBatches,
    Feed,
    augment_plan,
    crop_flip,
    make_batches,
    usable_cores,
    worker_count,
)
from pipeline.errors import UserError
from pipeline.numerics import precision
from pipeline.numerics.build import fit_to_strategy
from pipeline.numerics.optim import LrSchedule, loss_function, make_optimizer
from pipeline.numerics.precision import (
    auto_choice,
    build_precision,
    configure_backends,
)
from pipeline.numerics.torch_compile import compile_forward
from pipeline.resnet import build_model
from pipeline.strategies.base import DataParallelRun, PipelinedRun, Run, StrategyFacts, alone
from support import write_raw

CPU = torch.device("cpu")


def config(*overrides: str) -> Config:
    return load_config(None, list(overrides))


def batches_for(cfg: Config, data, rank: int, world: int, channels_last: bool, *raw_dir: Path):
    """The loader a rank of `world` data-parallel ranks trains from."""
    plan = BatchPlan.make(cfg.train.batch_size, cfg.train.grad_accum)
    plan = plan.over(world, "test").drawing_from(len(data.train_labels))
    feed = Feed(plan, rank, torch.float32, channels_last, CPU)
    return make_batches(data, cfg.data, cfg.seed, feed, *raw_dir)


# --- augmentation -------------------------------------------------------------------------


def test_crop_flip_is_torchvisions_padded_crop_then_flip():
    images = torch.randint(0, 256, (40, 28, 28), dtype=torch.uint8)
    plan = augment_plan(seed=1, epoch=0, n=40, device=CPU)
    out = crop_flip(images, plan[:, :2], plan[:, 2].bool())
    for image, (dy, dx, flip), got in zip(images, plan.tolist(), out):
        expected = TF.crop(TF.pad(image[None], [4]), dy, dx, 28, 28)  # RandomCrop(28, padding=4)
        expected = TF.hflip(expected) if flip else expected
        assert torch.equal(got, expected[0])


def test_augment_plan_covers_every_offset_and_both_flips():
    plan = augment_plan(seed=0, epoch=3, n=5000, device=CPU)
    assert set(plan[:, 0].tolist()) == set(range(9)) == set(plan[:, 1].tolist())
    assert set(plan[:, 2].tolist()) == {0, 1}
    assert torch.equal(plan, augment_plan(seed=0, epoch=3, n=5000, device=CPU))
    assert not torch.equal(plan, augment_plan(seed=0, epoch=4, n=5000, device=CPU))


@pytest.fixture(scope="module")
def tensors(raw_dataset):
    return convert(raw_dataset[0])


def device_batches(tensors, *overrides: str, rank: int = 0, world: int = 1) -> DeviceBatches:
    cfg = config("train.batch_size=32", *overrides)
    data = to_device(tensors, CPU, cfg.data.limit_train, None)
    return batches_for(cfg, data, rank, world, False)


def test_augmented_ranks_together_train_singles_batch(tensors):
    """Augmentation is drawn per position of the order: each sample looks the same whichever
    rank trains it, so the ranks' shares of a micro-batch make up single's micro-batch."""
    opts = ("data.augment=true", "train.grad_accum=2")
    single = list(device_batches(tensors, *opts).epoch(1))
    ranks = [list(device_batches(tensors, *opts, rank=r, world=2).epoch(1)) for r in (0, 1)]
    for (_, micro), (_, m0), (_, m1) in zip(single, *ranks):
        for (x, y), (x0, y0), (x1, y1) in zip(micro, m0, m1):
            assert torch.equal(x[0::2], x0) and torch.equal(x[1::2], x1)
            assert torch.equal(y[0::2], y0) and torch.equal(y[1::2], y1)
    plain = list(device_batches(tensors).epoch(1))
    assert not torch.equal(single[0][1][0][0], torch.cat([x for x, _ in plain[0][1]]))


def test_the_dataloader_path_augments_with_torchvisions_transforms(tensors, raw_dataset):
    """data.loader=dataloader with data.augment: every batch is cropped and flipped by
    torchvision (so differs from the plain batch of the same samples), shapes unchanged."""
    plain = list(dataloader_batches(tensors, raw_dataset[0]).epoch(0))
    augmented = list(dataloader_batches(tensors, raw_dataset[0], "data.augment=true").epoch(0))
    assert len(plain) == len(augmented) == 16
    for (_, [(x, y)]), (_, [(xa, ya)]) in zip(plain, augmented):
        assert x.shape == xa.shape == (32, 1, 28, 28) and torch.equal(y, ya)
        assert not torch.equal(x, xa)


def test_workers_are_at_most_the_cores_the_process_may_use():
    count, note = worker_count(4, 2)
    assert count == 2 and note is not None and note.startswith("data.workers 4 -> 2")
    assert worker_count(4, 4) == (4, None) and worker_count(0, 1) == (0, None)
    assert worker_count(2, 16) == (2, None)


def test_more_workers_than_cores_start_no_more_and_torch_does_not_warn(tensors, raw_dataset):
    """data.workers above the process's cores (os.sched_getaffinity: what torch checks) starts
    one worker per core, says so in a note, and torch's "suggested max number of worker"
    warning never comes."""
    cores = usable_cores()
    loader = dataloader_batches(tensors, raw_dataset[0], f"data.workers={cores + 2}")
    assert loader.workers == cores
    assert any(n.startswith(f"data.workers {cores + 2} -> {cores}") for n in loader.notes)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        steps = loader.epoch(0)
        next(steps)
        steps.close()
    assert not [w for w in caught if "worker" in str(w.message)], [str(w.message) for w in caught]


# --- the two loaders ----------------------------------------------------------------------


def dataloader_batches(
    tensors, raw_dir, *overrides: str, rank: int = 0, world: int = 1
) -> DataLoaderBatches:
    cfg = config("train.batch_size=32", "data.loader=dataloader", "data.workers=0", *overrides)
    data = to_device(tensors, CPU, cfg.data.limit_train, None)
    return batches_for(cfg, data, rank, world, False, raw_dir)


def flat(steps) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [pair for _, micro in steps for pair in micro]


@pytest.mark.parametrize("accum, augment", [(1, "false"), (2, "false"), (2, "true")])
def test_loaders_give_identical_batches_when_their_permutations_agree(
    tensors, raw_dataset, accum, augment
):
    """At seed 0 the device path's generator (seed * 1000003 + epoch) and the samplers'
    (seed + epoch) get the same seed, and on the CPU draw the same permutation: then the
    torchvision path (PIL, ToTensor, Normalize, DataLoader) must produce exactly the device
    path's batches, accumulation split and dropped remainder included, and with augmentation
    each position's crop and flip (augment_plan, drawn on the CPU by both)."""
    opts = (
        "seed=0",
        f"train.grad_accum={accum}",
        "data.limit_train=200",
        f"data.augment={augment}",
    )
    device = device_batches(tensors, *opts)
    loader = dataloader_batches(tensors, raw_dataset[0], *opts)
    assert device.steps == loader.steps == 200 // 32
    for epoch in (0, 1):
        a, b = flat(device.epoch(epoch)), flat(loader.epoch(epoch))
        assert len(a) == len(b) == device.steps * accum
        for (xa, ya), (xb, yb) in zip(a, b):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)


@pytest.mark.parametrize("augment", ["false", "true"])
def test_dataloader_ranks_together_train_singles_batch(tensors, raw_dataset, augment):
    """DistributedSampler strides over the same seeded permutation the single-rank sampler
    draws, so the ranks' shares make up single's batch (the device path's rule); augmented
    too, as a sample's crop and flip follow its position in that permutation, not its rank."""
    opts = ("seed=3", "train.grad_accum=2", f"data.augment={augment}")
    single = flat(dataloader_batches(tensors, raw_dataset[0], *opts).epoch(2))
    ranks = [
        flat(dataloader_batches(tensors, raw_dataset[0], *opts, rank=r, world=2).epoch(2))
        for r in (0, 1)
    ]
    assert len(single) == len(ranks[0]) == len(ranks[1]) == (512 // 32) * 2
    for (x, y), (x0, y0), (x1, y1) in zip(single, *ranks):
        assert torch.equal(x[0::2], x0) and torch.equal(x[1::2], x1)
        assert torch.equal(y[0::2], y0) and torch.equal(y[1::2], y1)


@pytest.mark.parametrize("loader", ["device", "dataloader"])
def test_a_resumed_epoch_continues_with_the_same_batches(tensors, raw_dataset, loader):
    opts = ("seed=5", "data.augment=true")
    make = (
        (lambda: device_batches(tensors, *opts))
        if loader == "device"
        else (lambda: dataloader_batches(tensors, raw_dataset[0], *opts))
    )
    whole, tail = list(make().epoch(1)), list(make().epoch(1, start_step=5))
    assert [s for s, _ in tail] == list(range(5, 16))
    for (_, micro), (_, again) in zip(whole[5:], tail):
        assert all(torch.equal(a, b) for pa, pb in zip(micro, again) for a, b in zip(pa, pb))


@pytest.fixture(scope="module")
def one_image_raw(tmp_path_factory) -> Path:
    """IDX files whose 512 training images are one image: what tells two batches apart is
    then their augmentation alone."""
    directory = tmp_path_factory.mktemp("one-image")
    write_raw(directory)
    image = np.arange(28 * 28, dtype=np.uint8).reshape(1, 28, 28) % 251  # no symmetry
    write_idx_gz(directory / FILES["train"][0], np.repeat(image, 512, axis=0))
    return directory


def augmented_epoch(tensors, raw_dir, rank: int, epoch: int, *overrides: str) -> list:
    """Rank `rank` of 2's augmented images of `epoch`, as its own process would load them:
    each process seeds the global RNG alike (session.py), which must not decide them."""
    torch.manual_seed(0)
    batches = dataloader_batches(
        tensors, raw_dir, "data.augment=true", *overrides, rank=rank, world=2
    )
    return [x for x, _ in flat(batches.epoch(epoch))]


def test_dataloader_ranks_augment_their_samples_differently(tensors, one_image_raw):
    """Issue 28: the k-th sample of every rank got the same crop and flip. Every image being
    the same, the ranks' batches differ where their augmentations do: in every batch. The
    same rank, epoch and seed give the same bits, whatever the global RNG holds; another
    epoch or seed gives others."""
    rank0, rank1 = (augmented_epoch(tensors, one_image_raw, r, 1) for r in (0, 1))
    assert len(rank0) == len(rank1) == 16
    assert not any(torch.equal(a, b) for a, b in zip(rank0, rank1))
    torch.manual_seed(1234)  # another global RNG state, and worker processes: the same bits
    batches = dataloader_batches(
        tensors, one_image_raw, "data.augment=true", "data.workers=2", rank=0, world=2
    )
    again = [x for x, _ in flat(batches.epoch(1))]
    assert all(torch.equal(a, b) for a, b in zip(rank0, again))
    assert batches.notes == (loaders.AUGMENT_NOTE,)
    assert (
        "no two ranks share them" in batches.notes[0] and "another world size" in batches.notes[0]
    )
    other_epoch = augmented_epoch(tensors, one_image_raw, 0, 2)
    other_seed = augmented_epoch(tensors, one_image_raw, 0, 1, "seed=1")
    for other in (other_epoch, other_seed):
        assert not any(torch.equal(a, b) for a, b in zip(rank0, other))


def test_channels_last_inputs(tensors):
    cfg = config("train.batch_size=32")
    batches = batches_for(cfg, to_device(tensors, CPU, None, None), 0, 1, True)
    ((_, [(x, _)]),) = list(batches.epoch(0, start_step=15))
    assert x.shape == (32, 1, 28, 28) and x.is_contiguous(memory_format=torch.channels_last)


# --- precision ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["fp16", "tf32"])
def test_cuda_only_modes_fall_back_to_fp32_on_cpu_with_a_note(name):
    prec = build_precision(name, CPU)
    assert (prec.name, prec.dtype, prec.autocast_dtype, prec.scaler) == (
        "fp32",
        torch.float32,
        None,
        None,
    )
    assert len(prec.notes) == 1 and name in prec.notes[0] and "fp32" in prec.notes[0]


def test_bf16_autocasts_on_cpu_and_keeps_fp32_parameters():
    prec = build_precision("bf16", CPU)
    model = nn.Linear(4, 3)
    with prec.autocast():
        out = model(torch.randn(2, 4))
    assert out.dtype == torch.bfloat16 and model.weight.dtype == torch.float32
    assert prec.notes == [] and prec.scaler is None


@pytest.mark.parametrize(
    "kind, capability, name, noted",
    [
        ("cpu", None, "fp32", False),
        ("cuda", (9, 0), "bf16", False),  # H100
        ("cuda", (8, 0), "bf16", False),  # A100: the first with bfloat16 units
        ("cuda", (7, 5), "fp16", True),  # T4: bf16 would be emulated
        ("cuda", (7, 0), "fp16", True),  # V100
    ],
)
def test_auto_takes_bf16_only_where_the_gpu_has_it(kind, capability, name, noted):
    chosen, notes = auto_choice(kind, capability)
    assert chosen == name and bool(notes) == noted
    if noted:
        assert f"compute capability {capability[0]}.{capability[1]}" in notes[0]
        assert "fp16" in notes[0] and "loss scaling" in notes[0]


def test_bf16_asked_of_an_old_gpu_falls_back_with_a_note():
    """Through the capability seam (no GPU here): the Precision a V100 gets for bf16."""
    prec = build_precision("bf16", CPU, [(7, 0)])
    assert prec.name == "bf16"  # on the CPU the capability does not matter
    old = precision._resolve("bf16", "cuda", (7, 0))
    assert old.name == "fp32" and "no native bfloat16" in old.notes[0]
    assert precision._resolve("bf16", "cuda", (8, 6)).autocast_dtype == torch.bfloat16
    assert precision._resolve("tf32", "cuda", (7, 5)).name == "fp32"


A100, T4, H100, V100 = (8, 0), (7, 5), (9, 0), (7, 0)


@pytest.mark.parametrize(
    "capabilities, lowest, ranks",
    [
        ([A100], A100, [0]),
        ([H100, A100], A100, [1]),
        ([A100, T4, H100, T4], T4, [1, 3]),
        ([V100, T4], V100, [0]),  # (7, 0) < (7, 5): compared as (major, minor)
        ([(8, 6), (8, 9)], (8, 6), [0]),
        ([H100, None, A100], None, [1]),  # unknown counts as the lowest
        ([None], None, [0]),
    ],
)
def test_the_lowest_capability_and_the_ranks_that_have_it(capabilities, lowest, ranks):
    assert precision.lowest_capability(capabilities) == (lowest, ranks)


def test_auto_is_decided_for_the_job_by_its_lowest_capability():
    """Every mix of the GPUs of two ranks, against what each GPU alone would take: bf16 only
    where both have it, the same whichever rank holds the older GPU."""
    gpus = [V100, T4, A100, (8, 6), H100, None]
    for first in gpus:
        for second in gpus:
            alone = {auto_choice("cuda", c)[0] for c in (first, second)}
            name, notes = precision.job_auto_choice("cuda", [first, second])
            assert name == ("bf16" if alone == {"bf16"} else "fp16")
            assert bool(notes) == (name == "fp16")
            assert precision.job_auto_choice("cuda", [second, first])[0] == name
    assert precision.job_auto_choice("cpu", [None, None]) == ("fp32", [])


def test_a_mixed_job_says_which_rank_decided_fp16():
    name, notes = precision.job_auto_choice("cuda", [A100, A100, H100, T4])
    assert (name, notes) == (
        "fp16",
        [
            "precision auto: fp16 with loss scaling for the job: the lowest compute capability "
            "among its GPUs is 7.5 (rank 3), which has no native bfloat16"
        ],
    )
    many = precision.job_auto_choice("cuda", [T4] * 6)[1][0]
    assert "is 7.5 (ranks 0, 1, 2, 3 and 2 more)" in many
    # one process: the note of its one GPU, as before
    assert precision.job_auto_choice("cuda", [T4]) == auto_choice("cuda", T4)


def test_every_rank_builds_the_precision_of_the_jobs_oldest_gpu():
    """What build_precision gives an A100 rank and a T4 rank of one job, through the
    capability seam: the same precision on both, fallbacks included."""
    cuda = torch.device("cuda", 0)  # never touched: no GPU here
    job = [A100, T4]
    for asked in ("bf16", "tf32"):
        built = [build_precision(asked, cuda, job) for _ in job]
        assert [p.name for p in built] == ["fp32", "fp32"]
        assert [p.autocast_dtype for p in built] == [None, None]
    fine = build_precision("auto", cuda, [A100, H100])
    assert (fine.name, fine.autocast_dtype, fine.notes) == ("bf16", torch.bfloat16, [])


def test_fp64_is_plain_fp64():
    prec = build_precision("fp64", CPU)
    assert (prec.dtype, prec.autocast_dtype, prec.scaler, prec.notes) == (
        torch.float64,
        None,
        None,
        [],
    )
    with prec.autocast():
        assert not torch.is_autocast_enabled("cpu")


def test_plain_precision_backward_is_plain_backward():
    torch.manual_seed(0)
    a, b = nn.Linear(4, 2), nn.Linear(4, 2)
    b.load_state_dict(a.state_dict())
    x = torch.randn(8, 4)
    opt_a, opt_b = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters(), lr=0.1)
    prec = build_precision("fp32", CPU)
    prec.backward(a(x).sum())
    opt_a.step()
    b(x).sum().backward()
    opt_b.step()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


FACTS = StrategyFacts(name="test", options=object, spans_nodes=False, mesh=alone)


def plain_parallel(model: nn.Module, pipelined: bool = False) -> Run:
    where = {"module": model, "writer": True, "devices": ["cpu"], "batch_split": [1]}
    if pipelined:
        return PipelinedRun(step=lambda x, y, training: None, eval_batch_size=1, **where)
    return DataParallelRun(forward=model, **where)


def test_a_pipeline_schedule_takes_bf16_autocast_but_not_channels_last():
    model = build_model(4, 0)
    prec, channels_last = fit_to_strategy(
        build_precision("bf16", CPU), plain_parallel(model, pipelined=True), FACTS, True
    )
    assert prec.name == "bf16" and prec.autocast_dtype == torch.bfloat16 and not channels_last
    assert prec.notes == [
        "channels_last: not applied; pipeline stages send activations contiguous NCHW"
    ]
    assert all(p.is_contiguous() for p in model.parameters())


# (the GradScaler of fp16 on CUDA, built without CUDA here, says it disables itself)
@pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled")
def test_a_pipeline_schedule_falls_back_from_fp16_which_needs_loss_scaling():
    """fp16 (an older GPU's auto) scales the loss before backward; the schedule runs its own."""
    cuda = torch.device("cuda")
    prec, _ = fit_to_strategy(
        build_precision("fp16", cuda, capabilities=[(7, 0)]),
        plain_parallel(build_model(4, 0), pipelined=True),
        FACTS,
        False,
    )
    assert prec.name == "fp32" and prec.autocast_dtype is None and prec.scaler is None
    assert prec.notes == [
        "precision fp16 on cuda: the pipeline schedule runs backward itself, without the loss "
        "scaling fp16 needs; running fp32 instead"
    ]


def test_channels_last_converts_the_wrapped_model_in_place():
    model = build_model(4, 0)
    params = list(model.parameters())
    prec, channels_last = fit_to_strategy(
        build_precision("fp32", CPU), plain_parallel(model), FACTS, True
    )
    assert channels_last and prec.notes == []
    assert list(model.parameters()) == params  # the same Parameter objects
    assert model[0][0].weight.is_contiguous(memory_format=torch.channels_last)


def test_compile_is_skipped_with_a_note_where_there_is_no_forward():
    assert compile_forward(None, True) == (
        None,
        ["compile: not applied; this strategy runs its own pipeline schedule"],
    )
    forward = nn.Linear(2, 2)
    assert compile_forward(forward, False) == (forward, [])


def test_cuda_graphs_are_not_asked_of_a_strategy_that_cannot_take_them():
    forward = nn.Linear(2, 2)
    _, notes = compile_forward(forward, True, "reduce-overhead", cuda_graphs=False)
    assert any("reduce-overhead: not applied" in n for n in notes)
    _, notes = compile_forward(forward, True, "reduce-overhead")
    assert "compile mode: reduce-overhead" in notes


def test_auto_speed_settings_on_the_cpu_are_fp32_and_nchw():
    model = build_model(4, 0)
    prec, channels_last = fit_to_strategy(
        build_precision("auto", CPU), plain_parallel(model), FACTS, None
    )
    assert prec.name == "fp32" and prec.autocast_dtype is None and not channels_last
    assert model[0][0].weight.is_contiguous()


def test_backend_switches_leave_the_cpu_alone():
    before = torch.backends.cudnn.benchmark
    configure_backends(build_precision("tf32", CPU), CPU)
    assert torch.backends.cudnn.benchmark == before


# --- optimizer, schedule, loss ------------------------------------------------------------


def test_sgd_runs_fused_on_plain_tensors():
    optimizer = make_optimizer(nn.Linear(3, 3).parameters(), TrainConfig(momentum=0.9))
    assert optimizer.defaults["fused"] and optimizer.defaults["momentum"] == 0.9


def test_onecycle_is_torchs_onecycle_curve():
    train = TrainConfig(epochs=4, lr=0.4, lr_schedule="onecycle", warmup_epochs=1.0)
    steps_per_epoch = 10
    model = nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.4)
    reference = torch.optim.lr_scheduler.OneCycleLR(
        optimizer,
        max_lr=0.4,
        total_steps=40,
        pct_start=0.25,
        anneal_strategy="cos",
        cycle_momentum=False,
    )
    for step in range(40):
        assert lr_at(train, step, steps_per_epoch) == pytest.approx(
            optimizer.param_groups[0]["lr"], rel=1e-9
        )
        optimizer.step()
        reference.step()


def test_cosine_warms_up_linearly_then_decays_to_zero():
    train = TrainConfig(epochs=5, lr=0.2, lr_schedule="cosine", warmup_epochs=1.0)
    lrs = [lr_at(train, step, 10) for step in range(50)]
    assert lrs[:10] == pytest.approx([0.02 * (i + 1) for i in range(10)])
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:])) and lrs[-1] < 0.001
    assert lr_at(replace(train, lr_schedule="none"), 37, 10) == 0.2


def test_linear_lr_scaling_sets_the_schedules_peak():
    train = TrainConfig(
        epochs=2,
        lr=0.1,
        batch_size=512,
        lr_scaling="linear",
        lr_schedule="cosine",
        warmup_epochs=1.0,
    )
    assert lr_at(train, 9, 10) == pytest.approx(0.2)


def lr_at(train: TrainConfig, step: int, steps_per_epoch: int) -> float:
    return LrSchedule.of(train, steps_per_epoch).at(step)


def test_label_smoothing_is_refused_where_the_schedule_owns_the_loss():
    train = TrainConfig(label_smoothing=0.1)
    with pytest.raises(UserError, match="train.label_smoothing"):
        loss_function(train, schedule_owns_loss=True)
    logits, labels = torch.randn(4, 10), torch.tensor([1, 2, 3, 4])
    expected = torch.nn.functional.cross_entropy(logits, labels, label_smoothing=0.1)
    assert torch.equal(loss_function(train, schedule_owns_loss=False)(logits, labels), expected)


@pytest.mark.parametrize(
    "key, value",
    [
        ("train.precision", "fp8"),
        ("data.loader", "ffcv"),
        ("train.lr_schedule", "step"),
        ("train.label_smoothing", "1.0"),
    ],
)
def test_bad_option_values_are_refused(key, value):
    with pytest.raises(ConfigError, match=key):
        config(f"{key}={value}")


# --- the options together, through the CLI ------------------------------------------------


def test_a_checkpoint_keeps_the_fp16_loss_scale(tmp_path):
    # fp16 runs on CUDA only; the scaler's state is plain numbers, which the weights-only
    # checkpoint loader must accept (it refuses arbitrary objects)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    ckpt = Checkpointer(tmp_path, rank=0, world_size=1, writer=True, key="k")
    own = {"rng": rng_state(CPU), "train_totals": torch.zeros(3)}  # a rank's whole state
    ckpt.save(Position(1, 0), {**own, "grad_scaler": scaler.state_dict()}, {"history": []})
    restored = torch.amp.GradScaler("cpu")
    restored.load_state_dict(ckpt.load(ckpt.latest()[0])["grad_scaler"])
    assert restored.get_scale() == 1024.0
