"""A stand-in for Fashion-MNIST where the real set cannot be downloaded (the tests, and
`make gpu-check` on a machine without the data): noisy 28x28 images whose class shows as a
bright band at a class-dependent height, so a tiny model learns it in a few steps. Written
as the real IDX files are, so the fetch stage serves and checks them like the real ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.data.download import md5sum
from pipeline.data.fashion_mnist import FILES
from pipeline.data.idx import write_idx_gz


def synthetic_split(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [n, 28, 28], labels uint8 [n]): the band of class c is rows 2+2c, 3+2c."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=n).astype(np.uint8)
    images = rng.integers(0, 120, size=(n, 28, 28)).astype(np.uint8)
    rows = 2 + 2 * labels[:, None].astype(np.int64) + np.arange(2)
    images[np.arange(n)[:, None], rows, 4:24] = 230
    return images, labels


def write_synthetic(directory: Path, n_train: int, n_test: int) -> dict[str, str]:
    """The four IDX gz files in `directory`; their MD5s (file name -> sum)."""
    directory.mkdir(parents=True, exist_ok=True)
    for split, n, seed in (("train", n_train, 1), ("test", n_test, 2)):
        images, labels = synthetic_split(n, seed)
        images_name, labels_name = FILES[split]
        write_idx_gz(directory / images_name, images)
        write_idx_gz(directory / labels_name, labels)
    return {name: md5sum(directory / name) for pair in FILES.values() for name in pair}
