"""`single`: the plain model on one device (the first GPU in `devices`, else the CPU)."""

from __future__ import annotations

from torch import nn

from pipeline.config import Config
from pipeline.strategies.base import Parallel
from pipeline.training.context import DistContext

NAME = "single"


def nproc(cfg: Config, n_gpus: int) -> int:
    return 1


def parallelize(model: nn.Sequential, cfg: Config, ctx: DistContext) -> Parallel:
    micro = cfg.train.batch_size // cfg.train.grad_accum
    return Parallel(
        module=model,
        forward=model,
        data_rank=0,
        data_world=1,
        writer=True,
        devices=[str(ctx.device)],
        batch_split=[micro],
    )
