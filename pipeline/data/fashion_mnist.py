"""The dataset's facts: its files and their sums, where the fetch stage puts them, and how
training loads what it wrote."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.config import FASHION_MNIST_MD5, FASHION_MNIST_MIRRORS
from pipeline.errors import UserError, first_sentence

if TYPE_CHECKING:
    from torch import Tensor  # imported where used: the fetch command starts without it

MIRRORS = FASHION_MNIST_MIRRORS  # the defaults of data.mirrors and data.md5
MD5 = FASHION_MNIST_MD5
FILES = {  # train/test -> (images file, labels file)
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
DATA_DIR = Path("data/fashion-mnist")  # the fetch stage's output: raw/*.gz and TENSORS
TENSORS = "tensors.pt"  # {train,test}_{images,labels} as uint8 tensors


# what the fetch stage writes (download.convert): name -> the shape of one sample
SAMPLE_SHAPES = {
    "train_images": (28, 28),
    "train_labels": (),
    "test_images": (28, 28),
    "test_labels": (),
}
REFETCH = "run the fetch stage again (dvc repro fetch, or python -m pipeline.fetch)"


def load_tensors(data_dir: Path = DATA_DIR, mmap: bool = False) -> dict[str, Tensor]:
    """The fetch stage's tensors, checked: a damaged or foreign file is bad input naming the
    fix, on every rank alike (each reads the same file before any collective). `mmap`: the
    tensors' data is read only where it is used (the launcher reads the labels alone)."""
    import torch

    path = data_dir / TENSORS
    if not path.exists():
        raise UserError(f"{path}: not found; run the fetch stage first (dvc repro fetch)")
    try:
        tensors = torch.load(path, weights_only=True, mmap=mmap)
        problem = _tensors_problem(tensors)
    except Exception as err:  # noqa: BLE001 - whatever torch.load makes of a damaged file
        problem = first_sentence(err)
    if problem is not None:
        raise UserError(f"{path}: corrupt ({problem}); {REFETCH}")
    assert isinstance(tensors, dict)  # _tensors_problem refuses anything else
    return tensors


def _tensors_problem(tensors: Any) -> str | None:
    import torch

    if not isinstance(tensors, dict) or set(tensors) != set(SAMPLE_SHAPES):
        keys = sorted(tensors) if isinstance(tensors, dict) else type(tensors).__name__
        return f"holds {keys}, expected {', '.join(SAMPLE_SHAPES)}"
    for name, shape in SAMPLE_SHAPES.items():
        t = tensors[name]
        if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.shape[1:] != shape:
            return f"{name} is not uint8 samples of shape {shape}"
    for split in ("train", "test"):
        images, labels = tensors[f"{split}_images"], tensors[f"{split}_labels"]
        if len(images) != len(labels) or len(labels) == 0:
            return f"{len(images)} {split} images, {len(labels)} labels"
        if int(labels.max()) > 9:
            return f"{split} label {int(labels.max())}, expected 0 to 9"
    return None


def train_samples(limit_train: int | None, data_dir: Path = DATA_DIR) -> int:
    """How many training samples a run draws from: the fetched set, cut to data.limit_train.
    Memory-mapped: only the headers and the labels are read, so the launcher can check the
    data and plan the batch before any worker loads it."""
    n = len(load_tensors(data_dir, mmap=True)["train_labels"])
    return min(n, limit_train) if limit_train is not None else n
