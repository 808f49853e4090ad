"""The wheels `make gpu-check WHEELS=DIR` carries to a GPU machine without network.

    python -m benchmarks.gpu_wheels                    # list them, NAME==VERSION a line
    python -m benchmarks.gpu_wheels --download DIR     # fetch them (`make gpu-wheels DIR=...`)

The machine: Linux x86_64, a python3 3.12 with its own CUDA build of torch and what installing
torch brought (MACHINE), no MLflow or omegaconf, no network. What gpu-check runs there beyond
that is ROOTS and everything they require (the Requires-Dist of this environment's installed
packages, markers evaluated for that python), at requirements.lock's pins, less MACHINE.
tests/e2e/test_gpu_check.py runs gpu-check's CPU path on a python that has MACHINE and this
selection and nothing else, so an import the selection misses fails there.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]

# What gpu-check's processes import beyond torch, each with what it is for. The rest comes
# from their requirements.
ROOTS = (
    "mlflow-skinny",  # the MLflow client and store; `mlflow` itself adds only the server and UI
    "omegaconf",  # params.yaml and key=value overrides (pipeline/config/load.py)
    "pyyaml",
    "psutil",  # memory peaks and MLflow's system metrics
    "tqdm",  # the live progress bar
    "nvidia-ml-py",  # pynvml: the GPU's name and MLflow's GPU metrics (not a CUDA library)
    # required by `mlflow`, not by mlflow-skinny, yet imported by what gpu-check uses:
    "sqlalchemy",  # the SQLite tracking store gpu-check gives each run
    "alembic",  # that store's schema, created and migrated on first use
    "cryptography",  # imported by the store's model registry tables (their Fernet keys)
    "pandas",  # imported by mlflow.pytorch and mlflow.models, which log each run's model
)

# What the machine's python has: torch's own requirements, which `pip install torch` (and so
# every CUDA PyTorch image) puts beside it: triton, the CUDA libraries (nvidia-*, cuda-*),
# filelock, typing-extensions, sympy with mpmath, networkx, jinja2 with markupsafe, fsspec,
# setuptools; numpy and pillow, which PyTorch images ship for torchvision; pip. Never carried:
# the carried wheels come first on PYTHONPATH and would shadow the machine's copies, and
# numpy or triton built for another torch can break the one that runs. nvidia-ml-py is no
# CUDA library, and not in them.
MACHINE = re.compile(
    r"torch|triton|cuda-.*|nvidia-(?!ml-py$).*|numpy|pillow|typing-extensions|filelock|sympy"
    r"|mpmath|networkx|jinja2|markupsafe|fsspec|setuptools|pip"
)

PYTHON = "3.12"
# cp312 wheels for Linux x86_64. torch's CUDA 13 wheels are manylinux_2_28, so the machine
# has glibc 2.28 or newer: every manylinux tag up to 2_28 runs there.
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(28, 16, -1)] + [
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]
# Requirement markers as that python evaluates them (PEP 508's variables; its platform
# release and version never decide a requirement of the lock's packages).
TARGET_ENV: dict[str, str] = {
    "os_name": "posix",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "platform_release": "",
    "platform_version": "",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "python_version": PYTHON,
    "python_full_version": f"{PYTHON}.0",
    "implementation_version": f"{PYTHON}.0",
    "extra": "",
}


def normalize(name: str) -> str:
    """PEP 503: names compare lower-case, with runs of -, _ and . as one -."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(text: str) -> dict[str, str]:
    """requirements.lock's NAME==VERSION lines, by normalized name."""
    pins = {}
    for line in text.splitlines():
        name, sep, version = line.strip().partition("==")
        if sep:
            pins[normalize(name)] = version
    return pins


def installed_requires(name: str) -> list[str]:
    return importlib.metadata.requires(name) or []


def select(
    pins: dict[str, str],
    requires: Callable[[str], Iterable[str]] = installed_requires,
    roots: Iterable[str] = ROOTS,
) -> dict[str, str]:
    """`roots` and everything they require on the machine's python, less MACHINE: name ->
    pinned version. ValueError for a needed package the lock does not pin."""
    chosen: dict[str, str] = {}
    todo = list(roots)
    while todo:
        name = normalize(todo.pop())
        if name in chosen or MACHINE.fullmatch(name):
            continue
        if name not in pins:
            raise ValueError(f"{name}: needed by gpu-check, but requirements.lock does not pin it")
        chosen[name] = pins[name]
        for text in requires(name):
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate(TARGET_ENV):
                todo.append(requirement.name)
    return dict(sorted(chosen.items()))


def pip_download(directory: Path, specs: list[str]) -> subprocess.CompletedProcess:
    platforms = [arg for tag in PLATFORMS for arg in ("--platform", tag)]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", PYTHON, "--implementation", "cp", *platforms]
    return subprocess.run(
        [*cmd, "-d", str(directory), *specs], capture_output=True, text=True, check=False
    )


def wheel_key(path: Path) -> tuple[str, str]:
    """(normalized name, version) of a wheel file: NAME-VERSION-TAGS.whl."""
    name, version = path.name.split("-")[:2]
    return normalize(name), version


def download(chosen: dict[str, str], directory: Path) -> int:
    """Fetch every chosen wheel into `directory`; say what is missing (a package with only an
    sdist, or none for this platform) and the total size. 0 when all of them are there."""
    directory.mkdir(parents=True, exist_ok=True)
    specs = [f"{name}=={version}" for name, version in chosen.items()]
    if pip_download(directory, specs).returncode != 0:
        # pip stops at the first package it cannot get: ask for each, to name all of them
        for spec in specs:
            proc = pip_download(directory, [spec])
            if proc.returncode != 0:
                last = (proc.stderr.strip().splitlines() or ["?"])[-1]
                print(f"gpu-wheels: {spec}: no cp{PYTHON.replace('.', '')} wheel ({last})")
    wheels = {wheel_key(p): p for p in directory.glob("*.whl")}
    missing = [s for s in specs if tuple(s.split("==")) not in wheels]
    size = sum(wheels[key].stat().st_size for key in chosen.items() if key in wheels)
    print(
        f"gpu-wheels: {len(chosen) - len(missing)} of {len(chosen)} wheels in {directory}, "
        f"{size / 1e6:.1f} MB"
    )
    if missing:
        print(f"gpu-wheels: missing {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--download", type=Path, metavar="DIR", help="fetch the wheels here")
    args = parser.parse_args(argv)
    chosen = select(read_lock((REPO / "requirements.lock").read_text()))
    if args.download is None:
        print("\n".join(f"{name}=={version}" for name, version in chosen.items()))
        return 0
    return download(chosen, args.download)


if __name__ == "__main__":
    sys.exit(main())
