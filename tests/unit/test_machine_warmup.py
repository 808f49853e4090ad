"""The machine's cold start paid once per boot (pipeline/launch/machine_warmup.py, issue
51): which files a CUDA worker would load, read once, and a marker per boot so that no later
stage reads them again."""

from pathlib import Path

from pipeline.launch import machine_warmup


def site(tmp_path: Path) -> Path:
    root = tmp_path / "site-packages"
    for name, size in {
        "torch/lib/libtorch_cuda.so": 3000,
        "nvidia/cudnn/lib/libcudnn.so.9": 5000,
        "nvidia/cu13/lib/libcublas.so.13": 7000,
        "nvidia/cudnn/include/cudnn.h": 10,  # not a library
        "numpy/core/_multiarray.so": 10,  # not CUDA's
    }.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)
    return root


def test_the_cuda_libraries_are_torchs_and_the_nvidia_wheels_shared_objects(tmp_path):
    root = site(tmp_path)
    found = [p.relative_to(root).as_posix() for p in machine_warmup.cuda_libraries([root])]
    assert found == [
        "nvidia/cu13/lib/libcublas.so.13",
        "nvidia/cudnn/lib/libcudnn.so.9",
        "torch/lib/libtorch_cuda.so",
    ]
    assert machine_warmup.cuda_libraries([tmp_path / "none"]) == []


def test_reading_counts_what_it_read_and_skips_what_it_cannot(tmp_path):
    root = site(tmp_path)
    paths = [*machine_warmup.cuda_libraries([root]), root / "vanished.so"]
    warmed = machine_warmup.read_into_cache(paths)
    assert warmed.files == 3 and warmed.mib == 15000 / 2**20 and warmed.seconds >= 0


def test_once_per_boot(tmp_path):
    root, markers = site(tmp_path), tmp_path / "markers"
    first = machine_warmup.warm_once(markers, [root])
    assert first is not None and first.files == 3
    marker = machine_warmup.boot_marker(markers)
    assert marker is not None and marker.read_text().startswith("3 files")
    assert machine_warmup.warm_once(markers, [root]) is None  # the same boot: nothing to do
    marker.unlink()  # as after a reboot: another boot id, no marker
    assert machine_warmup.warm_once(markers, [root]) is not None


def test_no_boot_id_no_marker(tmp_path):
    assert machine_warmup.boot_marker(tmp_path, boot_id=tmp_path / "absent") is None
