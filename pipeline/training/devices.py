"""`devices` in params.yaml -> which hardware a run uses.

The spec is `auto` (every visible GPU, or the CPU when there is none), `cpu`, or a list of
GPU indices such as "0" or "0,3". The list decides CPU vs one GPU vs several. Indices count
the GPUs this process can see, so under an outer CUDA_VISIBLE_DEVICES="2,3,5" the spec "0,2"
means physical GPUs 2 and 5. The choice is applied as CUDA_VISIBLE_DEVICES for the training
processes, before CUDA initialises, so inside them the chosen GPUs are cuda:0..n-1.
Everything here except `visible_gpu_count` is pure, so it is tested without GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import UserError


@dataclass(frozen=True)
class DeviceSpec:
    """Parsed `devices`: `auto`, `cpu`, or explicit GPU indices."""

    mode: str  # "auto" | "cpu" | "gpus"
    indices: tuple[int, ...] = ()


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
    indices = tuple(int(p) for p in parts)
    if len(set(indices)) != len(indices):
        raise UserError(f"devices: got {spec!r}, which names a GPU twice")
    return DeviceSpec("gpus", indices)


def parent_visible_ids(env_value: str | None, count: int) -> list[str]:
    """The ids (as CUDA_VISIBLE_DEVICES entries) of the GPUs this process sees, in order."""
    if env_value is None or env_value.strip() == "":
        return [str(i) for i in range(count)] if env_value is None else []
    return [p.strip() for p in env_value.split(",") if p.strip() != ""][:count]


def resolve_devices(spec: DeviceSpec, visible: list[str]) -> list[str]:
    """The CUDA_VISIBLE_DEVICES entries to use ([] = CPU); errors list what is visible."""
    if spec.mode == "cpu":
        return []
    if spec.mode == "auto":
        return list(visible)
    missing = [i for i in spec.indices if i >= len(visible)]
    if missing:
        seen = ", ".join(f"{i} (id {v})" for i, v in enumerate(visible)) or "none"
        raise UserError(f"devices: GPU {missing[0]} is not there; visible GPUs: {seen}")
    return [visible[i] for i in spec.indices]


def visible_gpu_count() -> int:
    """GPUs this process can see, without creating a CUDA context (NVML-based count)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def choose_devices(spec_text: str, env_value: str | None) -> list[str]:
    """`devices` + the inherited CUDA_VISIBLE_DEVICES -> the entries the run will use."""
    spec = parse_devices(spec_text)
    if spec.mode == "cpu":
        return []
    return resolve_devices(spec, parent_visible_ids(env_value, visible_gpu_count()))
