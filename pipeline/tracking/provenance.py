"""Where a run came from, as MLflow tags: inputs, software stack, hardware, container.

Every lookup is None-safe: on a machine without GPUs (or without NVML) the GPU-side tags say
"none" instead of failing the run.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import socket
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Optional

IMAGE_ENV = "PARALLEL_LAB_IMAGE"  # set by whoever builds the container to its image reference


def file_sha256(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return "absent"


def _safe(get: Callable[[], object]) -> str:
    try:
        value = get()
    except Exception:  # noqa: BLE001 - a missing library or device is a fact to record
        return "none"
    return "none" if value is None else str(value)


def nvidia_driver() -> Optional[str]:
    import pynvml

    pynvml.nvmlInit()
    try:
        version: str = pynvml.nvmlSystemGetDriverVersion()  # pynvml is untyped
        return version
    finally:
        pynvml.nvmlShutdown()


def stack_tags(root: Path = Path(".")) -> dict[str, str]:
    """Tags for every run: input hashes and the software stack, whether or not it uses GPUs."""
    return {**input_tags(root), **torch_stack_tags()}


def input_tags(root: Path = Path(".")) -> dict[str, str]:
    """What the run was given: the params and the lock, and the container it ran in."""
    return {
        # dvc.lock as it stood when the run began: during `dvc repro` it gains each stage's
        # entry as the stage finishes
        "params_sha256": file_sha256(root / "params.yaml"),
        "dvc_lock_sha256": file_sha256(root / "dvc.lock"),
        "container_image": os.environ.get(IMAGE_ENV) or "none",
    }


# what torch_stack_tags says: the compare stage reads these from the runs it compares
TORCH_STACK = ("torch", "cuda", "cudnn", "nccl", "nvidia_driver")


def torch_stack_tags() -> dict[str, str]:
    """The torch build and what it runs on; imports torch."""
    import torch

    return {
        "torch": torch.__version__,
        "cuda": _safe(lambda: torch.version.cuda),
        "cudnn": _safe(torch.backends.cudnn.version),
        "nccl": _safe(lambda: ".".join(map(str, torch.cuda.nccl.version()))),
        "nvidia_driver": _safe(nvidia_driver),
    }


def shared_tags(runs: list[Mapping[str, str]], keys: tuple[str, ...]) -> dict[str, str]:
    """Each key's value across runs: the value where they agree, "mixed: a, b" where they do
    not; a key no run has is left out."""
    out = {}
    for key in keys:
        values = sorted({run[key] for run in runs if key in run})
        if values:
            out[key] = values[0] if len(values) == 1 else "mixed: " + ", ".join(values)
    return out


def gpu_tags(gpus: Mapping[int, str]) -> dict[str, str]:
    """Names of the GPUs the run uses (CUDA index -> physical id), by physical id:
    "3: NVIDIA H100, 5: NVIDIA H100"."""
    if not gpus:
        return {"gpu_names": "none (CPU)"}
    import torch

    names = {j: _safe(functools.partial(torch.cuda.get_device_name, j)) for j in gpus}
    return {"gpu_names": ", ".join(f"{g}: {names[j]}" for j, g in gpus.items())}


def gpu_uuids(gpus: Mapping[int, str]) -> Optional[dict[str, str]]:
    """Physical id -> NVML UUID ("GPU-..."), so an NVML sampler can pick exactly these GPUs
    (NVML numbers GPUs in PCI order, which need not be CUDA's); None if CUDA cannot say."""
    import torch

    try:
        return {g: f"GPU-{torch.cuda.get_device_properties(j).uuid}" for j, g in gpus.items()}
    except Exception:  # noqa: BLE001 - then the sampler keeps MLflow's choice of GPUs
        return None


def git_state(cwd: Path | None = None) -> dict[str, str]:
    """Commit and dirty flag of the repository, or 'unknown' outside one."""

    def git(*args: str) -> str | None:
        try:
            return subprocess.run(
                ["git", *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {
        "git_commit": commit or "unknown",
        "git_dirty": "unknown" if status is None else str(bool(status)).lower(),
    }


def base_tags(torch_stack: bool = True) -> dict[str, str]:
    """Where a run came from; `torch_stack=False` leaves out TORCH_STACK (and so the import of
    torch), for a run that computes nothing with torch and takes them from its runs."""
    git = git_state()
    return {
        **git,
        "mlflow.source.git.commit": git["git_commit"],
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        **(stack_tags() if torch_stack else input_tags()),
        # the DVC experiment a queued or -S run belongs to (`dvc exp show` names it)
        **({"dvc_experiment": os.environ["DVC_EXP_NAME"]} if "DVC_EXP_NAME" in os.environ else {}),
    }
