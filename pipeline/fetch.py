"""DVC stage `fetch`: download Fashion-MNIST, verify MD5s, convert once to a uint8 tensor file.

Each of the four IDX files is tried on every mirror in `data.mirrors`, in order (http(s)://,
file:// or a plain directory), and must match its sum in `data.md5`. Everything is written
into a temporary directory next to the output and renamed into place at the end, so a
failure leaves no partial `data/fashion-mnist/` behind.

    python -m pipeline.fetch [key=value ...]
"""
from __future__ import annotations

import hashlib
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

from pipeline.config import DataConfig, load_config
from pipeline.errors import UserError, exit_on_user_error
from pipeline.idx import read_idx

OUT_DIR = Path("data/fashion-mnist")
TENSORS = "tensors.pt"
SPLITS = {  # split -> (images file, labels file)
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
TIMEOUT_S = 60


def md5sum(path: Path) -> str:
    digest = hashlib.md5()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def source_url(mirror: str, name: str) -> str:
    """A mirror entry + file name -> a URL urllib opens (plain directories become file://)."""
    if "://" in mirror:
        return mirror.rstrip("/") + "/" + name
    return Path(mirror).expanduser().resolve().joinpath(name).as_uri()


def download(url: str, dest: Path) -> None:
    request = urllib.request.Request(url, headers={"User-Agent": "parallel-lab"})
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response, dest.open("wb") as out:
        shutil.copyfileobj(response, out)


def fetch_file(name: str, data: DataConfig, dest_dir: Path) -> Path:
    """Try each mirror for `name`; return the verified file or raise one error listing why each
    mirror failed."""
    expected = data.md5[name].lower()
    dest = dest_dir / name
    causes = []
    for mirror in data.mirrors:
        url = source_url(mirror, name)
        try:
            download(url, dest)
        except urllib.error.HTTPError as err:
            causes.append(f"{mirror}: HTTP {err.code} {err.reason}")
            continue
        except (urllib.error.URLError, OSError, ValueError) as err:
            reason = getattr(err, "reason", err)
            causes.append(f"{mirror}: {reason}")
            continue
        actual = md5sum(dest)
        if actual == expected:
            return dest
        causes.append(f"{mirror}: MD5 mismatch for {name}: expected {expected}, got {actual}")
    dest.unlink(missing_ok=True)
    raise UserError(f"could not fetch {name} from any of {len(data.mirrors)} mirror(s): "
                    + "; ".join(causes))


def convert(raw_dir: Path) -> dict:
    """IDX files -> {split_images: uint8 [N,28,28], split_labels: uint8 [N]} as torch tensors."""
    import torch

    tensors = {}
    for split, (images_name, labels_name) in SPLITS.items():
        images = read_idx(raw_dir / images_name, ndim=3)
        labels = read_idx(raw_dir / labels_name, ndim=1)
        if len(images) != len(labels):
            raise UserError(f"{images_name} holds {len(images)} images but {labels_name} holds "
                            f"{len(labels)} labels; expected the same count")
        if labels.size and labels.max() > 9:
            raise UserError(f"{labels_name}: label {int(labels.max())} found, expected 0..9")
        tensors[f"{split}_images"] = torch.from_numpy(np.array(images))
        tensors[f"{split}_labels"] = torch.from_numpy(np.array(labels))
    return tensors


def fetch(data: DataConfig, out_dir: Path = OUT_DIR) -> dict:
    """Download, verify, convert and atomically publish `out_dir`. Returns the tensors."""
    import torch

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    work.chmod(0o755)  # mkdtemp makes it private; the published data is not
    try:
        raw = work / "raw"
        raw.mkdir()
        for images_name, labels_name in SPLITS.values():
            for name in (images_name, labels_name):
                fetch_file(name, data, raw)
                print(f"fetch: {name} ok", flush=True)
        tensors = convert(raw)
        torch.save(tensors, work / TENSORS)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        work.rename(out_dir)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return tensors


def load_tensors(out_dir: Path = OUT_DIR) -> dict:
    import torch

    path = out_dir / TENSORS
    if not path.exists():
        raise UserError(f"{path}: not found; run the fetch stage first (dvc repro fetch)")
    return torch.load(path, weights_only=True)


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    cfg = load_config("params.yaml", sys.argv[1:] if argv is None else argv)
    tensors = fetch(cfg.data)
    sizes = {k: tuple(v.shape) for k, v in tensors.items() if k.endswith("images")}
    print(f"fetch: wrote {OUT_DIR} ({sizes})", flush=True)


if __name__ == "__main__":
    main()
