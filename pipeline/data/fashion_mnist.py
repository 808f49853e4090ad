"""The dataset's facts: its files and their sums, where the fetch stage puts them, and how
training loads what it wrote."""

from __future__ import annotations

from pathlib import Path

from pipeline.errors import UserError

# torchvision.datasets.FashionMNIST.mirrors / .resources (tests check they still agree).
MIRRORS = ["http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"]
MD5 = {
    "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
}
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
