"""The distributed context: built once from torchrun's environment, passed explicitly.

Nothing below `train.main` reads RANK/WORLD_SIZE/CUDA_VISIBLE_DEVICES from the environment;
it gets a `DistContext`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DistContext:
    rank: int  # global rank of this process
    local_rank: int  # rank on this node: picks this process's GPU
    world_size: int  # processes in the job
    gpus: tuple[str, ...]  # physical ids of the GPUs the run uses, in cuda:i order; () = CPU
    node: int = 0  # this node's index in a multi-node job (torchrun's GROUP_RANK)
    nodes: int = 1  # nodes in the job (torchrun's GROUP_WORLD_SIZE)
    restart: int = 0  # torchrun's restarts of this job so far (TORCHELASTIC_RESTART_COUNT)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def on_cuda(self) -> bool:
        return len(self.gpus) > 0

    @property
    def device(self) -> torch.device:
        """This process's device: its own GPU (one process per GPU), else the CPU."""
        if not self.on_cuda:
            return torch.device("cpu")
        return torch.device("cuda", self.local_rank % len(self.gpus))

    def devices_of_ranks(self) -> list[str]:
        """The device of every rank of a one-process-per-device job, in rank order."""
        if not self.on_cuda:
            return ["cpu"] * self.world_size
        return [f"cuda:{r % len(self.gpus)}" for r in range(self.world_size)]

    def physical_gpus(self, devices: list[str]) -> dict[int, str]:
        """The GPUs among `devices`, as CUDA index -> physical id (the id CUDA_VISIBLE_DEVICES
        gave it), each once, in order: what a run uses, not all that it can see."""
        indexes = sorted({int(d[5:]) for d in devices if d.startswith("cuda:")})
        return {i: self.gpus[i] for i in indexes}

    @property
    def backend(self) -> str:
        return "nccl" if self.on_cuda else "gloo"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> DistContext:
        source = os.environ if env is None else env
        visible = source.get("CUDA_VISIBLE_DEVICES")
        gpus: tuple[str, ...] = ()
        if torch.cuda.is_available() and torch.cuda.device_count() > 0:
            ids = [v for v in (visible or "").split(",") if v.strip()]
            gpus = (
                tuple(ids) if visible else tuple(str(i) for i in range(torch.cuda.device_count()))
            )
        return cls(
            rank=int(source.get("RANK", 0)),
            local_rank=int(source.get("LOCAL_RANK", 0)),
            node=int(source.get("GROUP_RANK", 0)),
            nodes=int(source.get("GROUP_WORLD_SIZE", 1)),
            world_size=int(source.get("WORLD_SIZE", 1)),
            restart=int(source.get("TORCHELASTIC_RESTART_COUNT", 0)),
            gpus=gpus,
        )
