"""How a job's processes split the work: a device mesh with named dimensions, built once per
run beside the `DistContext` (as torchtitan's `ParallelDims`). Pure arithmetic but for `mesh`.

    replicate   data replicas (DDP: each holds every parameter, gradients all-reduced)
    shard       data shards (FSDP2: parameters, gradients and optimizer state sharded)
    pipeline    pipeline stages (each holds a cut of the blocks)
    channel     channel shards (each holds 1/n of every residual block's inner channels and
                sees the whole micro-batch: the notes' 通道并行)

Ranks are laid out with `channel` innermost, then `pipeline`, `shard`, `replicate`: the
dimensions that talk inside every layer sit on neighbouring ranks (one node's GPUs), the
data dimensions, which talk once a step, across them. The data dimensions split each
micro-batch; the model dimensions (pipeline, channel) share one data share between them.

    replicate 2 x channel 2 on 4 ranks:  rank = 2 * replica + channel shard
        ranks 0, 1 train samples 0::2 of each micro-batch, each half of every block's channels
        ranks 2, 3 train samples 1::2, likewise
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from pipeline.errors import UserError

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

# outermost first: the order of the mesh's dimensions and of a rank's coordinates
DIMENSIONS = ("replicate", "shard", "pipeline", "channel")


@dataclass(frozen=True)
class ParallelDims:
    replicate: int = 1
    shard: int = 1
    pipeline: int = 1
    channel: int = 1

    def __post_init__(self) -> None:
        for name in DIMENSIONS:
            if getattr(self, name) < 1:
                raise ValueError(f"ParallelDims.{name}: got {getattr(self, name)}, expected >= 1")

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))

    @property
    def world(self) -> int:
        return math.prod(self.sizes)

    @property
    def data(self) -> int:
        """Ranks that each train a share of every micro-batch."""
        return self.replicate * self.shard

    @property
    def model(self) -> int:
        """Ranks that compute one data share together (pipeline x channel)."""
        return self.pipeline * self.channel

    @property
    def used(self) -> tuple[str, ...]:
        """The dimensions of more than one rank, outermost first."""
        return tuple(n for n in DIMENSIONS if getattr(self, n) > 1)

    def describe(self) -> str:
        """e.g. "replicate 2 x channel 2"; "1 rank" where nothing is split."""
        return " x ".join(f"{n} {getattr(self, n)}" for n in self.used) or "1 rank"

    def coords(self, rank: int) -> dict[str, int]:
        """Rank `rank`'s index along each dimension."""
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} outside 0..{self.world - 1}")
        out: dict[str, int] = {}
        for name in reversed(DIMENSIONS):
            size = getattr(self, name)
            rank, out[name] = divmod(rank, size)
        return {n: out[n] for n in DIMENSIONS}

    def data_rank(self, rank: int) -> int:
        """Which share of each micro-batch rank `rank` trains (0..data-1)."""
        c = self.coords(rank)
        return c["replicate"] * self.shard + c["shard"]

    def group_ranks(self, *names: str) -> list[list[int]]:
        """The ranks of each group along the dimensions `names` (those that differ in them
        alone), every group in rank order: what `dist.new_group` is called with, once per
        group, on every rank."""
        unknown = [n for n in names if n not in DIMENSIONS]
        if unknown:
            raise ValueError(f"unknown dimension(s) {unknown}; expected any of {DIMENSIONS}")
        groups: dict[tuple[int, ...], list[int]] = {}
        for rank in range(self.world):
            c = self.coords(rank)
            key = tuple(c[n] for n in DIMENSIONS if n not in names)
            groups.setdefault(key, []).append(rank)
        return list(groups.values())

    def check_channels(self, widths: list[int], key: str) -> None:
        """Every split layer's channels divide over the channel shards."""
        bad = [w for w in widths if w % self.channel]
        if bad:
            raise UserError(
                f"{key}: {self.channel} channel shard(s) must divide every residual block's "
                f"channels, got {sorted(set(widths))}; expected model.width a multiple of "
                f"{self.channel}"
            )

    def mesh(self, device_type: str) -> DeviceMesh:
        """The job's DeviceMesh over its used dimensions (a 1-D mesh of one rank when
        nothing is split). Collective: every rank builds it."""
        from torch.distributed.device_mesh import init_device_mesh

        names = self.used or ("replicate",)
        shape = tuple(getattr(self, n) for n in names)
        return init_device_mesh(device_type, shape, mesh_dim_names=names)


def factorizations(n: int, names: tuple[str, ...]) -> list[ParallelDims]:
    """Every way to lay n ranks on the dimensions `names`, outer first, each of them alone at
    the ends (8 on two: 1x8, 2x4, 4x2, 8x1): what a prediction of a hybrid at n devices
    compares."""
    if not names:
        return [ParallelDims()] if n == 1 else []
    first, rest = names[0], names[1:]
    return [
        ParallelDims(**{first: a, **{k: getattr(inner, k) for k in rest}})
        for a in range(1, n + 1)
        if n % a == 0
        for inner in factorizations(n // a, rest)
    ]
