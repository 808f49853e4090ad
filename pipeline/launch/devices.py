"""`devices` in params.yaml -> which hardware a run uses.

The spec is `auto` (every visible GPU; the CPU when there is none, but never where the host
has NVIDIA GPUs this torch cannot use: that is an error naming the driver and the CUDA
version torch needs), `cpu`, or a list of
GPU indices such as "0" or "0,3". The list decides CPU vs one GPU vs several. Indices count
the GPUs this process can see, so under an outer CUDA_VISIBLE_DEVICES="2,3,5" the spec "0,2"
means physical GPUs 2 and 5. The choice is applied as CUDA_VISIBLE_DEVICES for the training
processes, before CUDA initialises, so inside them the chosen GPUs are cuda:0..n-1.

A GPU named more than once holds that many ranks (or DataParallel replicas): "0,0" runs ddp,
fsdp or a pipeline's stages as two processes on GPU 0, and dp's two replicas there. That is
how one GPU rehearses a job of several (issue 48): each rank's memory is its own and real,
but the ranks take turns on one device, so their time says nothing of N GPUs. CUDA cannot
list a GPU twice in CUDA_VISIBLE_DEVICES, so the launcher gives the workers each GPU once and
the CUDA index of every rank apart (`placement`; context.PLACEMENT_ENV).
Everything here but `visible_gpu_count`, `nvidia_host` and `choose_devices` is pure, so it
is tested without GPUs.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from pipeline.errors import UserError


@dataclass(frozen=True)
class DeviceSpec:
    """Parsed `devices`: `auto`, `cpu`, or explicit GPU indices."""

    mode: str  # "auto" | "cpu" | "gpus"
    indices: tuple[int, ...] = ()  # one per rank or replica: a GPU named twice holds two


def parse_devices(spec: object) -> DeviceSpec:
    text = str(spec).strip().lower()
    if text == "auto":
        return DeviceSpec("auto")
    if text == "cpu":
        return DeviceSpec("cpu")
    parts = text.split(",")
    if any(not p.strip().isdigit() for p in parts):
        raise UserError(
            f'devices: got {spec!r}, expected auto, cpu or GPU indices like "0" or "0,3"'
        )
    return DeviceSpec("gpus", tuple(int(p) for p in parts))


def parent_visible_ids(env_value: str | None, count: int) -> list[str]:
    """The ids (as CUDA_VISIBLE_DEVICES entries) of the GPUs this process sees, in order."""
    if env_value is None or env_value.strip() == "":
        return [str(i) for i in range(count)] if env_value is None else []
    return [p.strip() for p in env_value.split(",") if p.strip() != ""][:count]


def resolve_devices(spec: DeviceSpec, visible: list[str]) -> list[str]:
    """The GPUs to use as CUDA_VISIBLE_DEVICES entries, one per rank or replica, so a GPU
    holding two is there twice ([] = CPU); errors list what is visible."""
    if spec.mode == "cpu":
        return []
    if spec.mode == "auto":
        return list(visible)
    missing = [i for i in spec.indices if i >= len(visible)]
    if missing:
        seen = ", ".join(f"{i} (id {v})" for i, v in enumerate(visible)) or "none"
        raise UserError(f"devices: GPU {missing[0]} is not there; visible GPUs: {seen}")
    return [visible[i] for i in spec.indices]


def placement(gpus: list[str]) -> tuple[list[str], tuple[int, ...]]:
    """`resolve_devices`' entries -> (CUDA_VISIBLE_DEVICES entries, each GPU once in the
    order first named; the CUDA index, inside the workers, of each rank or replica):
    ["3", "5", "3"] -> (["3", "5"], (0, 1, 0))."""
    unique = list(dict.fromkeys(gpus))
    return unique, tuple(unique.index(g) for g in gpus)


# The oldest Linux driver a torch built for CUDA <major>.x runs on. NVIDIA's minor-version
# compatibility (CUDA 11 onwards) runs a build from any toolkit of a major release on that
# major's first driver, not only on the newer one its toolkit ships with: torch for CUDA 12.6
# runs on 525, not just on 12.6's own 560 (NVIDIA's CUDA Compatibility guide, "Minor Version
# Compatibility"). It does not cover PTX the driver must compile itself: that fails on a
# driver older than the toolkit ("the provided PTX was compiled with an unsupported
# toolchain"), which the toolkit's own driver (560 for 12.6) avoids.
MIN_DRIVER = {"13": 580, "12": 525, "11": 450}
# The way to a torch for an older driver, as the error says it (docs/docker.md "Older drivers"):
# torch 2.14's only CUDA 12 build is 12.6.
CUDA12_ROUTE = (
    "on driver 525 to 579, torch for CUDA 12.6: PIPELINE_TORCH_CUDA=cu126 in .env (the "
    "image's build arg TORCH_CUDA) then docker compose build, or on the host make install "
    "TORCH_CUDA=cu126 (docs/docker.md 'Older drivers')"
)
NO_GPUS = ("", "void", "none")  # NVIDIA_VISIBLE_DEVICES values that ask for no GPU


@dataclass(frozen=True)
class NvidiaHost:
    """What says NVIDIA GPUs should be usable here, whatever torch sees."""

    device_files: tuple[str, ...] = ()  # /dev/nvidia0, ...
    nvidia_smi: bool = False  # the tool is installed
    driver: Optional[str] = None  # e.g. "535.104.05", from nvidia-smi or /proc
    visible_env: Optional[str] = None  # NVIDIA_VISIBLE_DEVICES (set by CUDA images)

    @property
    def has_gpus(self) -> bool:
        wanted = self.visible_env is not None and self.visible_env.strip().lower() not in NO_GPUS
        return bool(self.device_files) or self.driver is not None or wanted


def unusable_gpus(
    host: NvidiaHost, torch_cuda: Optional[str], cuda_visible: Optional[str], gpus_seen: int
) -> Optional[str]:
    """Why `devices: auto` must not quietly train on the CPU here (None: it may): the host
    has NVIDIA GPUs that this torch cannot use. CUDA_VISIBLE_DEVICES="" hides GPUs on
    purpose, and then the CPU is what was asked for."""
    if gpus_seen > 0 or not host.has_gpus or cuda_visible == "":
        return None
    found = []
    if host.device_files:
        found.append(", ".join(host.device_files))
    if host.driver:
        found.append(f"driver {host.driver}")
    if host.visible_env and not host.device_files:
        found.append(
            f"NVIDIA_VISIBLE_DEVICES={host.visible_env} but no /dev/nvidia* (no "
            "NVIDIA runtime in this container: docker run --gpus all, or compose's "
            "GPU service)"
        )
    if torch_cuda is None:
        why = "this torch is a CPU-only build"
    else:
        need = MIN_DRIVER.get(torch_cuda.split(".")[0])
        needs = f", which needs driver >= {need}" if need else ""
        why = f"this torch is built for CUDA {torch_cuda}{needs}"
        major = host.driver.split(".")[0] if host.driver else ""
        if need and major.isdigit() and int(major) < need:
            why += f"; driver {host.driver} is older"
    return (
        f"devices: auto found NVIDIA GPUs ({'; '.join(found)}) but torch sees none: "
        f"{why}; expected GPUs this torch can use: driver >= 580 for the default torch "
        f"(CUDA 13.0), or {CUDA12_ROUTE}; or set devices=cpu to train on the CPU on purpose"
    )


def nvidia_host(env: Mapping[str, str]) -> NvidiaHost:
    """Read this machine's NVIDIA evidence: device files, nvidia-smi and its driver."""
    files = tuple(sorted(str(p) for p in Path("/dev").glob("nvidia[0-9]*")))
    smi = shutil.which("nvidia-smi")
    driver = None
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout.split()
            driver = out[0] if out else None
        except (OSError, subprocess.SubprocessError):
            pass
    if driver is None:
        try:
            match = re.search(
                r"Kernel Module\s+([\d.]+)", Path("/proc/driver/nvidia/version").read_text()
            )
            driver = match.group(1) if match else None
        except OSError:
            pass
    return NvidiaHost(files, smi is not None, driver, env.get("NVIDIA_VISIBLE_DEVICES"))


def visible_gpu_count() -> int:
    """GPUs this process can see: NVML's count where NVML answers (torch.cuda.device_count()),
    else the CUDA runtime's."""
    import torch

    return torch.cuda.device_count()


def workers_can_fork(gpus: list[str], driver_initialised: bool | None) -> bool:
    """Whether the workers may be forked from this process (they then inherit its imports
    instead of loading torch again): on the CPU always, on GPUs only while the CUDA driver
    is known not to be initialised here (`cuda_driver_initialised`). A worker forked after
    that fails at its first CUDA call, whatever torch.cuda.is_initialized() says: on an
    H200 (torch 2.11), after torch.cuda.is_available() or torch.accelerator.is_available()
    in the parent, but not after torch.cuda.device_count(), which asks NVML."""
    return not gpus or driver_initialised is False


CUDA_ERROR_NOT_INITIALIZED = 3


def cuda_driver_initialised() -> bool | None:
    """Whether cuInit has run in this process, asked without running it: the driver's
    cuDeviceGetCount answers CUDA_ERROR_NOT_INITIALIZED until then. False where the driver
    library is not even loaded; None where this cannot be asked."""
    if not hasattr(os, "RTLD_NOLOAD"):
        return None
    try:  # the library this process already has, never a fresh load
        driver = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD)
    except OSError:
        return False
    count = ctypes.c_int()
    return bool(driver.cuDeviceGetCount(ctypes.byref(count)) != CUDA_ERROR_NOT_INITIALIZED)


def choose_devices(spec_text: str, env: Mapping[str, str]) -> list[str]:
    """`devices` + this process's environment (CUDA_VISIBLE_DEVICES) -> the entries the run
    will use. `auto` never falls back to the CPU where the host has GPUs torch cannot use."""
    import torch

    spec = parse_devices(spec_text)
    if spec.mode == "cpu":
        return []
    count = visible_gpu_count()
    if spec.mode == "auto":
        problem = unusable_gpus(
            nvidia_host(env), torch.version.cuda, env.get("CUDA_VISIBLE_DEVICES"), count
        )
        if problem:
            raise UserError(problem)
    return resolve_devices(spec, parent_visible_ids(env.get("CUDA_VISIBLE_DEVICES"), count))
