"""The dataset's facts: its files and their sums, where the fetch stage puts them, and how
training loads what it wrote."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.config import FASHION_MNIST_MD5, FASHION_MNIST_MIRRORS
from pipeline.errors import UserError, first_sentence

if TYPE_CHECKING:
    from torch import Tensor  # imported where used: the fetch stage runs without torch

MIRRORS = FASHION_MNIST_MIRRORS  # the defaults of data.mirrors and data.md5
MD5 = FASHION_MNIST_MD5
FILES = {  # train/test -> (images file, labels file)
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
DATA_DIR = Path("data/fashion-mnist")  # the fetch stage's output: raw/*.gz and ARRAYS
# {train,test}_{images,labels} as uint8 arrays in numpy's .npz (a zip of .npy files, no
# pickle): written and read without torch, and any one array read without the others
ARRAYS = "arrays.npz"
ZIP_MAGIC = b"PK\x03\x04"


# what the fetch stage writes (download.convert): name -> the shape of one sample
SAMPLE_SHAPES = {
    "train_images": (28, 28),
    "train_labels": (),
    "test_images": (28, 28),
    "test_labels": (),
}
REFETCH = "run the fetch stage again (dvc repro fetch, or python -m pipeline.fetch)"


def write_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    np.savez(path, allow_pickle=False, **arrays)


def load_arrays(
    data_dir: Path = DATA_DIR, names: Iterable[str] = SAMPLE_SHAPES
) -> dict[str, np.ndarray]:
    """The fetch stage's arrays of these `names`, checked: a damaged or foreign file is bad
    input naming the fix, on every rank alike (each reads the same file before any
    collective). Only the named arrays are read (the launcher reads the training labels)."""
    path = data_dir / ARRAYS
    if not path.exists():
        raise UserError(f"{path}: not found; run the fetch stage first (dvc repro fetch)")
    arrays: dict[str, np.ndarray] = {}
    try:
        with path.open("rb") as f:
            is_zip = f.read(len(ZIP_MAGIC)) == ZIP_MAGIC
        if not is_zip:
            problem: str | None = "not numpy's .npz of the fetched arrays"
        else:
            with np.load(path, allow_pickle=False) as saved:
                problem = _names_problem(saved.files)
                arrays = {} if problem else {name: saved[name] for name in names}
            problem = problem or _arrays_problem(arrays)
    except Exception as err:  # noqa: BLE001 - whatever numpy and zipfile make of a damaged file
        problem = first_sentence(err)
    if problem is not None:
        raise UserError(f"{path}: corrupt ({problem}); {REFETCH}")
    return arrays


def load_tensors(data_dir: Path = DATA_DIR) -> dict[str, Tensor]:
    """All four arrays as torch tensors, sharing their memory."""
    import torch

    return {name: torch.from_numpy(a) for name, a in load_arrays(data_dir).items()}


def _names_problem(names: list[str]) -> str | None:
    if set(names) != set(SAMPLE_SHAPES):
        return f"holds {sorted(names)}, expected {', '.join(SAMPLE_SHAPES)}"
    return None


def _arrays_problem(arrays: dict[str, Any]) -> str | None:
    for name, a in arrays.items():
        if a.dtype != np.uint8 or a.shape[1:] != SAMPLE_SHAPES[name]:
            return f"{name} is not uint8 samples of shape {SAMPLE_SHAPES[name]}"
    for split in ("train", "test"):
        images, labels = arrays.get(f"{split}_images"), arrays.get(f"{split}_labels")
        if any(a is not None and len(a) == 0 for a in (images, labels)):
            return f"no {split} samples"
        if images is not None and labels is not None and len(images) != len(labels):
            return f"{len(images)} {split} images, {len(labels)} labels"
        if labels is not None and int(labels.max()) > 9:
            return f"{split} label {int(labels.max())}, expected 0 to 9"
    return None


def train_samples(limit_train: int | None, data_dir: Path = DATA_DIR) -> int:
    """How many training samples a run draws from: the fetched set, cut to data.limit_train.
    Only the labels are read, so the launcher can check them and plan the batch before any
    worker loads the images (which every worker checks as it does)."""
    n = len(load_arrays(data_dir, ["train_labels"])["train_labels"])
    return min(n, limit_train) if limit_train is not None else n
