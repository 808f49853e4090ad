"""Training batches for the shared loop, two ways (`data.loader`), optionally augmented
(`data.augment`: random 28x28 crop of the image padded by 4 black pixels, then a horizontal
flip with probability 1/2, torchvision's RandomCrop(28, padding=4) + RandomHorizontalFlip).

Both loaders yield, for each optimizer step, `(step, [(images, labels)] * grad_accum)`: this
rank's micro-batches, normalised, in the model's dtype and memory format, on the device.

`device` (default): the uint8 dataset already on the device (device_data.py); a batch is an
index gather, augmentation is one batched gather with per-sample offsets drawn on the device.
No DataLoader, no per-sample Python, no host sync.

`dataloader`: what the source notes do. torchvision's FashionMNIST (PIL image per sample,
ToTensor + Normalize, torchvision's pad, crop and flip for augmentation) in a DataLoader with
`data.workers` worker processes (at most the cores the process may use: `worker_count`),
pinned memory on CUDA; with several data-parallel ranks a
DistributedSampler gives each rank its share. Same global batch, same split of each batch
over ranks (DistributedSampler strides over the shuffled order, as device_data.py does) and
the same step count (the remainder is dropped). The order differs: the permutation comes from
the samplers' CPU generator seeded with `seed + epoch` (every rank draws the same one; the
single-rank RandomSampler is seeded to draw it too), not from device_data.py's generator on
the training device. So the two loaders train on the same samples per epoch in a different
order. Evaluation uses the device-resident test set either way, so test metrics are computed
identically.

Augmentation follows one rule in both: each position of the epoch's order has its own crop
and flip (`augment_plan`, from seed and epoch), whichever rank trains it and whatever the
global RNG holds. (torchvision's RandomCrop and RandomHorizontalFlip draw from the global RNG,
which every rank seeds alike: the k-th sample of every rank got the same crop and flip, and a
resumed epoch different ones.) So no two ranks share an augmentation, a resumed epoch replays
its own exactly, and a run resumed at another world size or `data.workers` augments each
sample as it would have.
"""

from __future__ import annotations

import gzip
import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
import torch.nn.functional as F

from pipeline.batch_plan import BatchPlan
from pipeline.config import DataConfig
from pipeline.data.device_data import (
    MEAN,
    STD,
    DeviceData,
    epoch_permutation,
    micro_batch_indices,
    normalize,
)
from pipeline.data.fashion_mnist import DATA_DIR, FILES, REFETCH
from pipeline.errors import UserError, first_line

PAD = 4  # pixels of black border the random crop chooses its window from
CPU = torch.device("cpu")  # where the dataloader path draws its augmentation
SIZE = 28
Step = tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]


@dataclass(frozen=True)
class Feed:
    """Where this process's batches go and in what form."""

    plan: BatchPlan
    rank: int  # which of the plan's `data_world` shares of each micro-batch (plan.data_rank)
    dtype: torch.dtype  # the model's
    channels_last: bool
    device: torch.device


class Batches:
    """What both loaders share: this rank's place, the input format, `prepare` (also what
    evaluation feeds the device-resident test set through), and the contract the loop reads:
    `steps` optimizer steps per epoch, `epoch(e, start_step)` yielding them."""

    steps: int
    notes: tuple[str, ...] = ()  # for the run's record (summary.json, MLflow)

    def __init__(self, options: DataConfig, seed: int, feed: Feed):
        self.options, self.seed, self.plan, self.rank = options, seed, feed.plan, feed.rank
        self.dtype, self.channels_last, self.device = feed.dtype, feed.channels_last, feed.device
        self.steps = feed.plan.steps

    def epoch(self, epoch: int, start_step: int = 0) -> Iterator[Step]:
        raise NotImplementedError

    def prepare(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 [B, 28, 28] on the device -> the model's input."""
        return to_model_input(normalize(images, self.dtype), self.channels_last)


class DeviceBatches(Batches):
    def __init__(self, data: DeviceData, options: DataConfig, seed: int, feed: Feed):
        super().__init__(options, seed, feed)
        self.data = data

    def epoch(self, epoch: int, start_step: int = 0) -> Iterator[Step]:
        n, augment, batch = len(self.data.train_labels), self.options.augment, self.plan
        # one row per position of the epoch's order: [sample index, crop dy, crop dx, flip]
        order = epoch_permutation(self.seed, epoch, n, self.device)[:, None]
        if augment:
            order = torch.cat([order, augment_plan(self.seed, epoch, n, self.device)], 1)
        for step in range(start_step, self.steps):
            micro_batches = []
            for micro in range(batch.grad_accum):
                rows = micro_batch_indices(order, step, micro, batch, self.rank)
                images = self.data.train_images[rows[:, 0]]
                if augment:
                    images = crop_flip(images, rows[:, 1:3], rows[:, 3].bool())
                micro_batches.append((self.prepare(images), self.data.train_labels[rows[:, 0]]))
            yield step, micro_batches


def augment_plan(seed: int, epoch: int, n: int, device: torch.device) -> torch.Tensor:
    """[n, 3] int64 per position of the epoch's order: crop offsets (dy, dx) in 0..8 and a
    flip bit. Drawn for the whole epoch at once and indexed by position, so a sample gets the
    same augmentation whichever rank trains it, and a resumed epoch replays it exactly."""
    generator = torch.Generator(device=device)
    generator.manual_seed((seed * 1_000_003 + epoch) ^ 0xA46)  # not the permutation's stream
    offsets = torch.randint(0, 2 * PAD + 1, (n, 2), generator=generator, device=device)
    flips = torch.randint(0, 2, (n, 1), generator=generator, device=device)
    return torch.cat([offsets, flips], 1)


def crop_flip(images: torch.Tensor, offsets: torch.Tensor, flips: torch.Tensor) -> torch.Tensor:
    """uint8 [B, 28, 28]: each image padded by 4 zero (black) pixels, cropped to 28x28 at its
    (dy, dx), mirrored left-right where `flips`; one gather for the whole batch."""
    padded = F.pad(images, (PAD, PAD, PAD, PAD))
    span = torch.arange(SIZE, device=images.device)
    rows = offsets[:, :1] + span
    cols = offsets[:, 1:] + torch.where(flips[:, None], SIZE - 1 - span, span)
    batch = torch.arange(len(images), device=images.device)[:, None, None]
    return padded[batch, rows[:, :, None], cols[:, None, :]]


def to_model_input(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


AUGMENT_NOTE = (
    "data.augment (dataloader): each sample's crop and flip follow its position in the "
    "epoch's order (seed, epoch), the device loader's rule: no two ranks share them, and a "
    "run resumed at another world size or data.workers augments each sample as it would have"
)


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (a container's cpuset, taskset,
    srun's --cpus-per-task), what torch's DataLoader checks its workers against."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def worker_count(asked: int, cores: int) -> tuple[int, Optional[str]]:
    """The DataLoader workers to start for `data.workers` = `asked` where the process may use
    `cores` cores, and a note where that is fewer: more workers than cores only take turns
    on them (torch warns of it at every epoch's loader), and which worker loads a sample
    changes nothing it gets (its position decides its augmentation)."""
    if asked <= cores:
        return asked, None
    return cores, (
        f"data.workers {asked} -> {cores}: this process may use {cores} core(s) "
        "(os.sched_getaffinity), and more DataLoader workers than cores would only take "
        "turns on them"
    )


class PositionedSamples(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """The training set read by (position in the epoch's order, sample index): the PIL image,
    padded, cropped and flipped as `plan` says for that position (none without a plan), then
    ToTensor + Normalize. torchvision's functional pad/crop/hflip are RandomCrop(28,
    padding=4)'s and RandomHorizontalFlip's operations, with the draws taken from `plan`."""

    def __init__(self, dataset: Any, plan: Optional[torch.Tensor]):
        from torchvision import transforms

        self.dataset, self.plan = dataset, plan
        self.to_tensor = transforms.Compose(
            [transforms.ToTensor(), transforms.Normalize((MEAN,), (STD,))]
        )

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: tuple[int, int]) -> tuple[torch.Tensor, int]:
        import torchvision.transforms.functional as TF

        position, index = item
        image, label = self.dataset[index]
        if self.plan is not None:
            dy, dx, flip = self.plan[position].tolist()
            image = TF.crop(TF.pad(image, [PAD]), dy, dx, SIZE, SIZE)
            image = TF.hflip(image) if flip else image
        return self.to_tensor(image), label


class DataLoaderBatches(Batches):
    def __init__(
        self, options: DataConfig, seed: int, feed: Feed, raw_dir: Path = DATA_DIR / "raw"
    ):
        from torchvision import datasets

        super().__init__(options, seed, feed)
        try:
            with tempfile.TemporaryDirectory(prefix="fashion-mnist-") as root:
                # torchvision reads the whole split into memory here; the files can go after
                dataset = datasets.FashionMNIST(torchvision_root(raw_dir, Path(root)), train=True)
        except Exception as err:  # noqa: BLE001 - the fetched files, damaged: every rank alike
            raise UserError(
                f"{raw_dir}/: not the fetched Fashion-MNIST files ({first_line(err)}); {REFETCH}"
            ) from None
        n_train = self.plan.n_train
        assert n_train is not None  # self.steps has been read: the plan knows it
        self.dataset = torch.utils.data.Subset(dataset, range(n_train))
        self.workers, workers_note = worker_count(self.options.workers, usable_cores())
        self.notes = (
            *((AUGMENT_NOTE,) if self.options.augment else ()),
            *((workers_note,) if workers_note else ()),
        )

    def rank_order(self, epoch: int) -> list[int]:
        """This rank's sample indices for the epoch, in the order it trains on them."""
        sampler: torch.utils.data.Sampler[int]
        if self.plan.data_world > 1:
            sampler = torch.utils.data.DistributedSampler(
                self.dataset,
                num_replicas=self.plan.data_world,
                rank=self.rank,
                shuffle=True,
                seed=self.seed,
                drop_last=True,
            )
            sampler.set_epoch(epoch)
        else:
            generator = torch.Generator()
            generator.manual_seed(self.seed + epoch)  # DistributedSampler's seeding
            sampler = torch.utils.data.RandomSampler(self.dataset, generator=generator)
        return list(sampler)

    def epoch(self, epoch: int, start_step: int = 0) -> Iterator[Step]:
        plan, n = self.plan, len(self.dataset)
        per_step = plan.per_rank * plan.grad_accum  # this rank's samples per optimizer step
        # the k-th sample of rank r is at position r + k * data_world of the epoch's order
        # (DistributedSampler strides over it), which its augmentation is drawn for
        positions = range(self.rank, n, plan.data_world)
        order = list(zip(positions, self.rank_order(epoch)))
        order = order[start_step * per_step : self.steps * per_step]
        augment = augment_plan(self.seed, epoch, n, CPU) if self.options.augment else None
        on_cuda = self.device.type == "cuda"
        loader = torch.utils.data.DataLoader(
            PositionedSamples(self.dataset, augment),
            batch_size=plan.per_rank,
            sampler=order,
            num_workers=self.workers,
            pin_memory=on_cuda,
            drop_last=True,
        )
        micro = (
            (self.prepare_float(x), y.to(self.device, non_blocking=on_cuda)) for x, y in loader
        )
        for step in range(start_step, self.steps):
            yield step, list(itertools.islice(micro, plan.grad_accum))

    def prepare_float(self, x: torch.Tensor) -> torch.Tensor:
        """A normalised fp32 batch from the DataLoader -> the model's input on the device."""
        x = x.to(self.device, non_blocking=self.device.type == "cuda").to(self.dtype)
        return to_model_input(x, self.channels_last)


def torchvision_root(raw_dir: Path, root: Path) -> Path:
    """Make `root` a torchvision dataset root: the fetched (MD5-checked) files, uncompressed,
    in root/FashionMNIST/raw, which is where and how torchvision reads them."""
    dest = root / "FashionMNIST" / "raw"
    dest.mkdir(parents=True, exist_ok=True)
    for pair in FILES.values():
        for name in pair:
            with gzip.open(raw_dir / name, "rb") as src, (dest / name[:-3]).open("wb") as out:
                shutil.copyfileobj(src, out)
    return root


def make_batches(
    data: DeviceData,
    options: DataConfig,
    seed: int,
    feed: Feed,
    raw_dir: Path = DATA_DIR / "raw",
) -> Batches:
    """`raw_dir`: the fetched IDX files, which the dataloader path reads through torchvision."""
    if options.loader == "device":
        return DeviceBatches(data, options, seed, feed)
    return DataLoaderBatches(options, seed, feed, raw_dir=raw_dir)
