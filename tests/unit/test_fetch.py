"""The fetch stage against a real HTTP server on 127.0.0.1, file:// URLs and directories."""

import gzip
import socket

import numpy as np
import pytest

from pipeline.config import DataConfig
from pipeline.data.download import fetch, md5sum, source_url
from pipeline.data.fashion_mnist import ARRAYS, load_arrays
from pipeline.data.idx import idx_bytes, read_idx
from pipeline.errors import UserError
from support import run, write_raw


def data_config(mirrors, md5) -> DataConfig:
    return DataConfig(mirrors=list(mirrors), md5=dict(md5))


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/"  # nothing listens there once the socket closes


def leftovers(parent):
    return sorted(p.name for p in parent.iterdir()) if parent.exists() else []


def test_fetch_over_http_verifies_and_converts(tmp_path, http_mirror):
    out = tmp_path / "data" / "fashion-mnist"
    arrays = fetch(data_config([http_mirror.url], http_mirror.md5), out)
    assert arrays["train_images"].shape == (512, 28, 28)
    assert arrays["train_images"].dtype == np.uint8
    assert arrays["test_labels"].shape == (128,)
    saved = load_arrays(out)
    assert all(np.array_equal(saved[k], arrays[k]) for k in arrays)
    for name, digest in http_mirror.md5.items():
        assert md5sum(out / "raw" / name) == digest
    assert leftovers(out.parent) == ["fashion-mnist"]


def test_file_url_and_plain_directory_mirrors(tmp_path, http_mirror):
    for i, mirror in enumerate([http_mirror.directory.as_uri(), str(http_mirror.directory)]):
        out = tmp_path / f"d{i}" / "fashion-mnist"
        assert fetch(data_config([mirror], http_mirror.md5), out)["test_images"].shape[0] == 128


def test_falls_through_to_the_next_mirror(tmp_path, http_mirror):
    out = tmp_path / "data" / "fashion-mnist"
    fetch(
        data_config(
            [closed_port_url(), http_mirror.url + "missing/", http_mirror.url], http_mirror.md5
        ),
        out,
    )
    assert (out / ARRAYS).exists()


def test_every_mirror_failing_lists_each_cause(tmp_path, http_mirror):
    dead, missing = closed_port_url(), http_mirror.url + "missing/"
    out = tmp_path / "data" / "fashion-mnist"
    with pytest.raises(UserError) as err:
        fetch(data_config([dead, missing], http_mirror.md5), out)
    message = str(err.value)
    assert "\n" not in message and "train-images-idx3-ubyte.gz" in message
    assert dead in message and "refused" in message.lower()
    assert missing in message and "HTTP 404" in message
    assert leftovers(out.parent) == []  # nothing half-written


def test_md5_mismatch_names_file_and_both_sums(tmp_path, http_mirror):
    md5 = dict(http_mirror.md5, **{"t10k-labels-idx1-ubyte.gz": "0" * 32})
    out = tmp_path / "data" / "fashion-mnist"
    with pytest.raises(UserError) as err:
        fetch(data_config([http_mirror.url], md5), out)
    actual = http_mirror.md5["t10k-labels-idx1-ubyte.gz"]
    assert f"MD5 mismatch for t10k-labels-idx1-ubyte.gz: expected {'0' * 32}, got {actual}" in str(
        err.value
    )
    assert leftovers(out.parent) == []


def corrupt_mirror(tmp_path, name, payload: bytes):
    directory = tmp_path / "bad-mirror"
    md5 = write_raw(directory, n_train=64, n_test=32)
    (directory / name).write_bytes(payload)
    md5[name] = md5sum(directory / name)  # the sums match: the content itself is broken
    return directory, md5


def gz(data: bytes) -> bytes:
    """gzip with a fixed timestamp: the bytes name the test cases, and under xdist every
    worker must collect the same names."""
    return gzip.compress(data, mtime=0)


@pytest.mark.parametrize(
    "name, payload, words",
    [
        ("train-images-idx3-ubyte.gz", b"not gzip at all", "not a readable gzip"),
        (
            "train-images-idx3-ubyte.gz",
            gz(b"\x00\x00\x08\x01" + b"\x00" * 8),
            "IDX header says type 0x08 with 1 dimensions",
        ),
        (
            "train-labels-idx1-ubyte.gz",
            gz(b"\x12\x34\x08\x01\x00\x00\x00\x02ab"),
            "bad magic number",
        ),
        (
            "t10k-images-idx3-ubyte.gz",
            gz(idx_bytes(np.zeros((32, 28, 28), np.uint8))[:-100]),
            "truncated or corrupt",
        ),
        (
            "t10k-labels-idx1-ubyte.gz",
            gz(idx_bytes(np.zeros(31, np.uint8))),
            "holds 32 images but t10k-labels-idx1-ubyte.gz holds 31 labels",
        ),
        (
            "t10k-labels-idx1-ubyte.gz",
            gz(idx_bytes(np.full(32, 12, np.uint8))),
            "label 12 found",
        ),
        ("train-labels-idx1-ubyte.gz", gz(b""), "bad magic number"),
    ],
)
def test_corrupt_idx_is_refused_cleanly(tmp_path, name, payload, words):
    directory, md5 = corrupt_mirror(tmp_path, name, payload)
    out = tmp_path / "data" / "fashion-mnist"
    with pytest.raises(UserError) as err:
        fetch(data_config([str(directory)], md5), out)
    assert words in str(err.value) and "\n" not in str(err.value)
    assert leftovers(out.parent) == []


def test_a_failed_refetch_keeps_the_previous_data(tmp_path, http_mirror):
    out = tmp_path / "data" / "fashion-mnist"
    fetch(data_config([http_mirror.url], http_mirror.md5), out)
    with pytest.raises(UserError):
        fetch(data_config([closed_port_url()], http_mirror.md5), out)
    assert (out / ARRAYS).exists() and leftovers(out.parent) == ["fashion-mnist"]


def test_read_idx_round_trip(tmp_path):
    array = np.random.default_rng(0).integers(0, 255, (5, 28, 28)).astype(np.uint8)
    (tmp_path / "x.idx").write_bytes(idx_bytes(array))
    assert np.array_equal(read_idx(tmp_path / "x.idx", 3), array)


def test_source_url_forms(tmp_path):
    assert source_url("http://h/x/", "f.gz") == "http://h/x/f.gz"
    assert source_url("http://h/x", "f.gz") == "http://h/x/f.gz"
    assert source_url(str(tmp_path), "f.gz") == (tmp_path / "f.gz").as_uri()


def test_cli_exit_code_2_and_one_line(tmp_path, http_mirror):
    from support import make_project, tiny_params

    project = make_project(tmp_path / "p", tiny_params(http_mirror))
    proc = run(
        project,
        "python",
        "-m",
        "pipeline.fetch",
        f"data.mirrors=[{closed_port_url()}]",
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: could not fetch")
    assert not (project / "data").exists()  # a new clone's tree, as it was


def test_the_fetch_stage_runs_without_torch(tmp_path, http_mirror):
    """It writes numpy's .npz, so a torch that cannot be imported does not stop it: the
    stage starts in a fraction of a second."""
    from support import make_project, tiny_params

    blocker = tmp_path / "no-torch" / "torch"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('the fetch stage imported torch')\n")
    project = make_project(tmp_path / "p", tiny_params(http_mirror))
    run(project, "python", "-m", "pipeline.fetch", PYTHONPATH=str(blocker.parent))
    assert load_arrays(project / "data" / "fashion-mnist")["train_images"].shape == (512, 28, 28)
    proc = run(project, "python", "-c", "import torch", PYTHONPATH=str(blocker.parent), check=False)
    assert "the fetch stage imported torch" in proc.stderr  # the blocker blocks


@pytest.mark.skipif(
    not __import__("pathlib").Path("../shared/fashion-mnist-labels").exists(),
    reason="real label files from ../shared not present (optional real-data check)",
)
def test_real_label_files_verify_against_torchvision_sums():
    from pathlib import Path

    from pipeline.data.fashion_mnist import MD5 as FASHION_MNIST_MD5

    for path in Path("../shared/fashion-mnist-labels").iterdir():
        assert md5sum(path) == FASHION_MNIST_MD5[path.name]
        assert read_idx(path, 1).max() == 9
