"""The fetch stage's work: download Fashion-MNIST, verify the MD5s, convert once to uint8
arrays in one file (without torch: the stage starts in a fraction of a second).

Each of the four IDX files is tried on every mirror in `data.mirrors`, in order (http(s)://,
file:// or a plain directory), and must match its sum in `data.md5`. Everything is written
into a temporary directory next to the output and renamed into place at the end, so a
failure leaves no partial `data/fashion-mnist/` behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

from pipeline.config import DataConfig
from pipeline.data.fashion_mnist import ARRAYS, DATA_DIR, FILES, write_arrays
from pipeline.data.idx import read_idx
from pipeline.errors import UserError, disk_full, out_of_space

TIMEOUT_S = 60


def md5sum(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "md5").hexdigest()


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
            if out_of_space(err, dest) is not None:  # no other mirror mends a full disk
                raise
            reason = getattr(err, "reason", err)
            causes.append(f"{mirror}: {reason}")
            continue
        actual = md5sum(dest)
        if actual == expected:
            return dest
        causes.append(f"{mirror}: MD5 mismatch for {name}: expected {expected}, got {actual}")
    dest.unlink(missing_ok=True)
    raise UserError(
        f"could not fetch {name} from any of {len(data.mirrors)} mirror(s): " + "; ".join(causes)
    )


def convert(raw_dir: Path) -> dict[str, np.ndarray]:
    """IDX files -> {split_images: uint8 [N,28,28], split_labels: uint8 [N]}."""
    arrays = {}
    for split, (images_name, labels_name) in FILES.items():
        images = read_idx(raw_dir / images_name, ndim=3)
        labels = read_idx(raw_dir / labels_name, ndim=1)
        if len(images) != len(labels):
            raise UserError(
                f"{images_name} holds {len(images)} images but {labels_name} holds "
                f"{len(labels)} labels; expected the same count"
            )
        if labels.size and labels.max() > 9:
            raise UserError(f"{labels_name}: label {int(labels.max())} found, expected 0..9")
        # copies: read_idx's arrays are read-only views of the decompressed bytes
        arrays[f"{split}_images"], arrays[f"{split}_labels"] = np.array(images), np.array(labels)
    return arrays


def fetch(data: DataConfig, out_dir: Path = DATA_DIR) -> dict[str, np.ndarray]:
    """Download, verify, convert and atomically publish `out_dir`. Returns the arrays. A
    fetch that fails leaves no directory it made (a new clone's `data/`) behind."""
    made = [d for d in (out_dir.parent, *out_dir.parent.parents) if not d.exists()]
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    work.chmod(0o755)  # mkdtemp makes it private; the published data is not
    try:
        raw = work / "raw"
        raw.mkdir()
        for images_name, labels_name in FILES.values():
            for name in (images_name, labels_name):
                fetch_file(name, data, raw)
                print(f"fetch: {name} ok", flush=True)
        arrays = convert(raw)
        write_arrays(work / ARRAYS, arrays)
        # The previous data stays complete until the new data has replaced it.
        old = out_dir.with_name(f".{out_dir.name}-replaced")
        shutil.rmtree(old, ignore_errors=True)
        if out_dir.exists():
            out_dir.rename(old)
        work.rename(out_dir)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException as err:
        full = out_of_space(err, work)  # read before the space below is given back
        shutil.rmtree(work, ignore_errors=True)
        for directory in made:  # deepest first; one that something else filled meanwhile stays
            with contextlib.suppress(OSError):
                directory.rmdir()
        if full is not None:
            raise disk_full(out_dir) from err
        raise
    return arrays
