"""Horovod for the `horovod` strategy (docs/horovod.md): opt-in, built here from its last
release's sdist with two one-line C++ standard changes, cached by what went into it.

    python deploy/horovod/build_wheel.py            # the cached wheel's path (built if absent)
    python deploy/horovod/build_wheel.py --install  # ... then pip-installed into this python

`make install HOROVOD=1` (or `make horovod`) runs the second with the venv's python.

Horovod 0.28.1 (2023-06, no release since) does not build against torch 2.14 as it is: its
torch extension is compiled as C++14 (torch's headers need C++20), and its bundled gloo as
C++14 beside it (a C++17 extension then fails to link). The two changes below raise both
standards; no source line changes, and the sdist bundles every third_party library, so the
build downloads nothing. The wheel is kept under .cache/horovod/<key>/, the key a digest of
the sdist's sha256, this python's torch version and CUDA toolkit, the changes and the
build's environment: a second install of the same inputs takes seconds.

Bad input or a missing tool: one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "0.28.1"
# PyPI's sha256 of horovod-0.28.1.tar.gz (pip download, 2026-12-02): the build's input, pinned
SDIST_SHA256 = "92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0"
SDIST = f"horovod-{VERSION}.tar.gz"
# the wheels, by their inputs, and the sdist (PARALLEL_LAB_HOROVOD_CACHE: elsewhere, e.g. a
# CI cache directory)
CACHE = Path(
    os.environ.get("PARALLEL_LAB_HOROVOD_CACHE")
    or Path(__file__).resolve().parents[2] / ".cache" / "horovod"
)

# (file in the sdist, its line as released, the line built) -- each must occur exactly once.
# Top level: the common library and the bundled gloo at C++17, so that gloo's
# `Store::kDefaultTimeout` (an inline constexpr member from C++17 on) is defined once; at
# C++14 it is emitted in each object and the link fails with "multiple definition of
# gloo::rendezvous::Store::kDefaultTimeout" once the extension is C++17 or later.
# The torch extension: torch 2.14's ATen/ATen.h says "#error C++20 or later compatible
# compiler is required to use ATen" (2.13 asked for C++17; Horovod master's C++17 fix,
# PR #3998, is not enough for 2.14).
CHANGES = (
    ("CMakeLists.txt", "set(CMAKE_CXX_STANDARD 14)\n", "set(CMAKE_CXX_STANDARD 17)\n"),
    (
        "horovod/torch/CMakeLists.txt",
        "    set(CMAKE_CXX_STANDARD 14)\n",
        "    set(CMAKE_CXX_STANDARD 20)\n",
    ),
)
# What the build compiles: PyTorch over Gloo, the CPU's collectives on Gloo, no MPI,
# TensorFlow or MXNet (the project has none of them)
BUILD_ENV = {
    "HOROVOD_WITH_PYTORCH": "1",
    "HOROVOD_WITH_GLOO": "1",
    "HOROVOD_WITHOUT_MPI": "1",
    "HOROVOD_WITHOUT_TENSORFLOW": "1",
    "HOROVOD_WITHOUT_MXNET": "1",
    "HOROVOD_CPU_OPERATIONS": "GLOO",
}
# what the build runs, each with the package that has it on Debian/Ubuntu
TOOLS = (("cmake", "cmake"), ("make", "make"), ("c++", "g++"))


class BuildError(Exception):
    """A build that cannot go on, in one line."""


def missing_tools() -> list[tuple[str, str]]:
    return [(tool, package) for tool, package in TOOLS if shutil.which(tool) is None]


def torch_facts(python: str) -> tuple[str, str | None]:
    """(torch's version, its CUDA version or None) as `python` has them."""
    code = "import json, torch; print(json.dumps([torch.__version__, torch.version.cuda]))"
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"{python} cannot import torch; `make install` makes the pinned venv")
    version, cuda = json.loads(proc.stdout.strip().splitlines()[-1])
    return version, cuda


def cuda_toolkit(torch_cuda: str | None) -> str | None:
    """The CUDA toolkit a CUDA build of torch makes Horovod compile against, or None.

    Horovod's configure takes torch's CUDA_HOME (torch.utils.cpp_extension) and, finding
    one, compiles its CUDA parts; without HOROVOD_CUDA_HOME it then looks for the toolkit
    on its own and fails where nvcc is a wrapper outside the toolkit (this machine's
    /usr/local/bin/nvcc). So it is named: CUDA_HOME where set, else /usr/local/cuda, else the
    directory above the first nvcc on PATH."""
    if torch_cuda is None:
        return None
    candidates = [os.environ.get("CUDA_HOME"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(Path(nvcc).resolve().parents[1]))
    for home in candidates:
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home).resolve())
    return None


def cache_key(torch_version: str, toolkit: str | None) -> str:
    inputs = {
        "sdist_sha256": SDIST_SHA256,
        "torch": torch_version,
        "cuda_toolkit": toolkit,
        "changes": CHANGES,
        "env": BUILD_ENV,
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def fetch_sdist(python: str, into: Path) -> Path:
    """The pinned sdist, from PyPI through pip, kept in the cache; its sha256 checked."""
    path = into / SDIST
    if not path.exists():
        command = [python, "-m", "pip", "download", "--quiet", "--no-binary", ":all:"]
        command += ["--no-deps", "--dest", str(into), f"horovod=={VERSION}"]
        if subprocess.run(command).returncode != 0:
            raise BuildError(f"pip could not download horovod=={VERSION}'s sdist from PyPI")
    if sha256(path) != SDIST_SHA256:
        path.unlink()
        raise BuildError(f"{path}: sha256 is not the pinned {SDIST_SHA256}; removed, run again")
    return path


def apply_changes(source: Path) -> None:
    """The two one-line changes, each on the one line it replaces, or the build stops."""
    for name, before, after in CHANGES:
        path = source / name
        text = path.read_text()
        if text.count(before) != 1:
            raise BuildError(
                f"{name} in the sdist has {text.count(before)} lines {before.strip()!r}; "
                f"expected exactly 1 (is this horovod {VERSION}?)"
            )
        path.write_text(text.replace(before, after))


def build(python: str, sdist: Path, out: Path, toolkit: str | None) -> Path:
    """The wheel, built from `sdist` with the changes into `out`; its path."""
    with tempfile.TemporaryDirectory(prefix="horovod-build-") as tmp:
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        source = Path(tmp) / f"horovod-{VERSION}"
        apply_changes(source)
        env = {**os.environ, **BUILD_ENV}
        # setup.py runs `make -j8` unless MAKEFLAGS is set: one job per core instead
        env.setdefault("MAKEFLAGS", f"-j{os.cpu_count() or 1}")
        if toolkit is not None:
            env["HOROVOD_CUDA_HOME"] = env["CUDA_HOME"] = toolkit
        command = [python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps"]
        command += ["--wheel-dir", str(out), str(source)]
        print(f"horovod: building {VERSION} ({' '.join(command)}); minutes", flush=True)
        if subprocess.run(command, env=env).returncode != 0:
            raise BuildError(f"horovod {VERSION}'s build failed (its output is above)")
    wheels = sorted(out.glob(f"horovod-{VERSION}-*.whl"))
    if len(wheels) != 1:
        raise BuildError(f"{out}: expected one horovod wheel after the build, found {len(wheels)}")
    return wheels[0]


def cached_wheel(python: str) -> Path:
    """The wheel of these inputs: the cached one, else built now and cached."""
    missing = missing_tools()
    torch_version, torch_cuda = torch_facts(python)
    toolkit = cuda_toolkit(torch_cuda)
    slot = CACHE / cache_key(torch_version, toolkit)
    wheels = sorted(slot.glob(f"horovod-{VERSION}-*.whl"))
    if wheels:
        return wheels[-1]
    if missing:  # only a build needs them
        tools = ", ".join(tool for tool, _ in missing)
        packages = " ".join(package for _, package in missing)
        raise BuildError(
            f"building Horovod needs {tools}, not found on PATH "
            f"(Debian/Ubuntu: apt-get install {packages})"
        )
    CACHE.mkdir(parents=True, exist_ok=True)
    sdist = fetch_sdist(python, CACHE)
    with tempfile.TemporaryDirectory(dir=CACHE, prefix="wheel-") as tmp:
        wheel = build(python, sdist, Path(tmp), toolkit)
        slot.mkdir(exist_ok=True)
        kept = slot / wheel.name
        wheel.replace(kept)  # the slot holds a wheel only once it is whole
    (slot / "inputs.json").write_text(
        json.dumps({"torch": torch_version, "cuda_toolkit": toolkit, "changes": CHANGES}) + "\n"
    )
    return kept


def install(python: str, wheel: Path) -> None:
    """The wheel into `python`'s environment; its dependencies (cloudpickle, psutil, pyyaml,
    packaging) are in the lock already, so none moves."""
    command = [python, "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall"]
    if subprocess.run([*command, str(wheel)]).returncode != 0:
        raise BuildError(f"pip could not install {wheel}")
    check = subprocess.run([python, "-c", "import horovod.torch"], capture_output=True, text=True)
    if check.returncode != 0:
        why = (check.stderr.strip().splitlines() or ["no output"])[-1]
        raise BuildError(f"{wheel} installed, but `import horovod.torch` fails: {why}")
    print(f"horovod: {VERSION} installed from {wheel}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--install", action="store_true", help="pip-install the wheel too")
    parser.add_argument("--python", default=sys.executable, help="whose torch it builds for")
    args = parser.parse_args(argv)
    try:
        wheel = cached_wheel(args.python)
        print(wheel, flush=True)
        if args.install:
            install(args.python, wheel)
    except BuildError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
