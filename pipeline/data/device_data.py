"""Device-resident Fashion-MNIST and the data order every strategy shares.

The whole uint8 dataset (about 55 MB) is moved to the training device once; batches are index
gathers on the device, normalised there, so the hot loop has no DataLoader, no per-sample
Python and no host sync.

Data order (the same for every strategy, so runs compare): each epoch draws one seeded
permutation of the training set. Optimizer step k uses positions [k*B, (k+1)*B) of it; with
gradient accumulation A that global batch is A micro-batches of B/A in order; a data-parallel
rank r of W takes every W-th sample of each micro-batch (`micro[r::W]`). This is exactly the
split DistributedSampler makes (strided over the shuffled order), and it means the union of
the ranks' samples in any micro-step is the single-device micro-batch. The remainder of an
epoch (N mod B samples, different ones each epoch) is not used, so every strategy takes the
same number of equal steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.batch_plan import BatchPlan

# Fashion-MNIST training-set pixel statistics (on the 0..1 scale).
MEAN, STD = 0.2860, 0.3530


@dataclass(frozen=True)
class DeviceData:
    train_images: torch.Tensor  # uint8 [N, 28, 28] on the device
    train_labels: torch.Tensor  # int64 [N]
    test_images: torch.Tensor
    test_labels: torch.Tensor


def to_device(
    arrays: Mapping[str, np.ndarray | torch.Tensor],
    device: torch.device,
    limit_train: int | None,
    limit_test: int | None,
) -> DeviceData:
    """The fetched arrays (fashion_mnist.load_arrays; tensors too), cut to the limits."""

    def take(name: str, limit: int | None) -> torch.Tensor:
        return torch.as_tensor(arrays[name][:limit]).to(device, non_blocking=True)

    return DeviceData(
        train_images=take("train_images", limit_train),
        train_labels=take("train_labels", limit_train).long(),
        test_images=take("test_images", limit_test),
        test_labels=take("test_labels", limit_test).long(),
    )


def normalize(images: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 [B, 28, 28] -> float [B, 1, 28, 28], zero mean and unit variance."""
    return ((images.to(dtype) / 255.0 - MEAN) / STD).unsqueeze(1)


def epoch_permutation(seed: int, epoch: int, n: int, device: torch.device) -> torch.Tensor:
    """The shuffled training order of `epoch`, identical on every rank of the same device type."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=generator, device=device)


def micro_batch_indices(
    order: torch.Tensor, step: int, micro: int, plan: BatchPlan, rank: int
) -> torch.Tensor:
    """Rows of `order` that data-parallel rank `rank` trains on in micro-step `micro` of
    optimizer step `step`: its strided share of the micro-batch."""
    start = step * plan.batch_size + micro * plan.micro
    return order[start : start + plan.micro][rank :: plan.data_world]


def eval_shard(n: int, rank: int, world: int, batch: int) -> tuple[list[torch.Tensor], list[int]]:
    """Rank `rank`'s strided share of the test set, cut into batches of exactly `batch`.

    Every rank gets the same number of equal-sized batches (collectives inside sharded models
    need that): the tail is padded with index 0, and the real sample count of each batch is
    returned beside it so padding never counts.
    """
    mine = torch.arange(rank, n, world)
    per_rank = -(-n // world)
    batches = max(1, -(-per_rank // batch))
    padded = torch.zeros(batches * batch, dtype=torch.long)
    padded[: len(mine)] = mine
    counts = [max(0, min(batch, len(mine) - i * batch)) for i in range(batches)]
    return list(padded.split(batch)), counts
