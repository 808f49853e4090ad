"""The distributed context: built once from torchrun's environment, passed explicitly.

Nothing below `train.main` reads RANK/WORLD_SIZE/CUDA_VISIBLE_DEVICES from the environment;
it gets a `DistContext`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch

PLACEMENT_ENV = "PARALLEL_LAB_PLACEMENT"  # the workers' CUDA index of each rank or replica


@dataclass(frozen=True)
class DistContext:
    rank: int  # global rank of this process
    local_rank: int  # rank on this node: picks this process's GPU
    world_size: int  # processes in the job
    gpus: tuple[str, ...]  # physical ids of the GPUs the run uses, in cuda:i order; () = CPU
    node: int = 0  # this node's index in a multi-node job (torchrun's GROUP_RANK)
    nodes: int = 1  # nodes in the job (torchrun's GROUP_WORLD_SIZE)
    restart: int = 0  # torchrun's restarts of this job so far (TORCHELASTIC_RESTART_COUNT)
    # the CUDA index of each rank on this node, or of each DataParallel replica, where
    # `devices` names a GPU more than once ("0,0": (0, 0), two on GPU 0); () = one per GPU
    placement: tuple[int, ...] = ()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def on_cuda(self) -> bool:
        return len(self.gpus) > 0

    @property
    def slots(self) -> tuple[int, ...]:
        """The CUDA index of each rank on this node (or replica), in order."""
        return self.placement or tuple(range(len(self.gpus)))

    @property
    def shares_devices(self) -> bool:
        """Whether ranks or replicas share a GPU (devices: "0,0"): NCCL refuses two ranks on
        one GPU, and their time measures turns on one device, not N of them."""
        return len(set(self.slots)) < len(self.slots)

    @property
    def device(self) -> torch.device:
        """This process's device: its own GPU (one process per entry of `devices`), else the
        CPU."""
        if not self.on_cuda:
            return torch.device("cpu")
        return torch.device("cuda", self.slots[self.local_rank % len(self.slots)])

    def devices_of_ranks(self) -> list[str]:
        """The device of every rank of a one-process-per-device job, in rank order."""
        if not self.on_cuda:
            return ["cpu"] * self.world_size
        return [f"cuda:{self.slots[r % len(self.slots)]}" for r in range(self.world_size)]

    def shared(self, devices: list[str]) -> dict[str, int]:
        """The GPUs that `devices` (a run's, one entry per rank or replica) puts more than
        one on, as physical id -> how many: {} on the CPU, whose processes get cores of
        their own, and where each rank has a GPU of its own."""
        counts: dict[str, int] = {}
        for d in devices:
            if d.startswith("cuda:"):
                gpu = self.gpus[int(d[5:])]
                counts[gpu] = counts.get(gpu, 0) + 1
        return {gpu: n for gpu, n in counts.items() if n > 1}

    def physical_gpus(self, devices: list[str]) -> dict[int, str]:
        """The GPUs among `devices`, as CUDA index -> physical id (the id CUDA_VISIBLE_DEVICES
        gave it), each once, in order: what a run uses, not all that it can see."""
        indexes = sorted({int(d[5:]) for d in devices if d.startswith("cuda:")})
        return {i: self.gpus[i] for i in indexes}

    @property
    def backend(self) -> str:
        """NCCL between GPUs; gloo on the CPU, and between ranks that share a GPU, which
        NCCL refuses ("Duplicate GPU detected") and gloo takes CUDA tensors for."""
        return "nccl" if self.on_cuda and not self.shares_devices else "gloo"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> DistContext:
        source = os.environ if env is None else env
        visible = source.get("CUDA_VISIBLE_DEVICES")
        gpus: tuple[str, ...] = ()
        placement: tuple[int, ...] = ()
        if torch.cuda.is_available() and torch.cuda.device_count() > 0:
            ids = [v for v in (visible or "").split(",") if v.strip()]
            gpus = (
                tuple(ids) if visible else tuple(str(i) for i in range(torch.cuda.device_count()))
            )
            # set by the launcher where `devices` names a GPU twice (launch/devices.py)
            placement = tuple(int(i) for i in source.get(PLACEMENT_ENV, "").split(",") if i)
        return cls(
            rank=int(source.get("RANK", 0)),
            local_rank=int(source.get("LOCAL_RANK", 0)),
            node=int(source.get("GROUP_RANK", 0)),
            nodes=int(source.get("GROUP_WORLD_SIZE", 1)),
            world_size=int(source.get("WORLD_SIZE", 1)),
            restart=int(source.get("TORCHELASTIC_RESTART_COUNT", 0)),
            gpus=gpus,
            placement=placement,
        )
