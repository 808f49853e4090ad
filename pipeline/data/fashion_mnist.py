"""The dataset's facts: its files and their sums, where the fetch stage puts them, and how
training loads what it wrote."""

from __future__ import annotations

from pathlib import Path

from pipeline.config import FASHION_MNIST_MD5, FASHION_MNIST_MIRRORS
from pipeline.errors import UserError

MIRRORS = FASHION_MNIST_MIRRORS  # the defaults of data.mirrors and data.md5
MD5 = FASHION_MNIST_MD5
FILES = {  # train/test -> (images file, labels file)
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
DATA_DIR = Path("data/fashion-mnist")  # the fetch stage's output: raw/*.gz and TENSORS
TENSORS = "tensors.pt"  # {train,test}_{images,labels} as uint8 tensors


def load_tensors(data_dir: Path = DATA_DIR) -> dict:
    import torch

    path = data_dir / TENSORS
    if not path.exists():
        raise UserError(f"{path}: not found; run the fetch stage first (dvc repro fetch)")
    return torch.load(path, weights_only=True)


def train_samples(limit_train: int | None, data_dir: Path = DATA_DIR) -> int:
    """How many training samples a run draws from: the fetched set, cut to data.limit_train.
    Memory-mapped: only the tensor's header is read, so the launcher can plan the batch before
    any worker loads the data."""
    import torch

    path = data_dir / TENSORS
    if not path.exists():
        raise UserError(f"{path}: not found; run the fetch stage first (dvc repro fetch)")
    n = len(torch.load(path, weights_only=True, mmap=True)["train_labels"])
    return min(n, limit_train) if limit_train is not None else n
