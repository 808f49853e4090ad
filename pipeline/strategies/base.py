"""What every strategy module provides (`Strategy`), and what it hands the shared training
loop (`Parallel`).

A strategy module (one per file in this package, named in `pipeline.strategies.NAMES`) exposes:

    NAME: str
    def nproc(cfg: Config, n_gpus: int) -> int
        processes torchrun must start; raises UserError if the strategy cannot run as asked
    def parallelize(model: nn.Sequential, cfg: Config, ctx: DistContext) -> Parallel
        applies the parallelism to the plain model (the six blocks of
        pipeline.training.model.resnet18), already on ctx.device

The loop (pipeline/training/loop.py) drives every strategy through `Parallel` and branches on
its capabilities (`pipeline_step`, `data_world`, ...), never on strategy names.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Optional, Protocol

import torch
import torch.distributed as dist
from torch import nn

from pipeline.config import Config
from pipeline.training.context import DistContext


class Strategy(Protocol):
    NAME: str

    def nproc(self, cfg: Config, n_gpus: int) -> int: ...

    def parallelize(self, model: nn.Sequential, cfg: Config, ctx: DistContext) -> Parallel: ...


def _always_reduce(_: bool) -> ContextManager:
    return nullcontext()


@dataclass
class Parallel:
    module: nn.Module  # holds the parameters this rank's optimizer updates
    # images -> logits on the writer's device; None when the strategy is pipelined
    forward: Optional[Callable[[torch.Tensor], torch.Tensor]]
    data_rank: int  # which share of each micro-batch this rank trains on ...
    data_world: int  # ... out of this many (1 = the whole micro-batch)
    writer: bool  # this process logs to MLflow and writes results/ (exactly one does)
    devices: list[str]  # devices this run computes on, e.g. ["cuda:0", "cuda:1"] or ["cpu"]
    batch_split: list[int]  # samples each device gets per forward of one micro-batch
    # reduce_grads_if(is_last_micro_step): context for a micro-step's backward; with gradient
    # accumulation, gradients are reduced across ranks only in the last one's.
    reduce_grads_if: Callable[[bool], ContextManager] = _always_reduce
    # pipelined strategies: (images, labels, training) -> logits on the loss-holding rank,
    # None elsewhere; runs forward (and backward when training) through the schedule.
    pipeline_step: Optional[
        Callable[[torch.Tensor, torch.Tensor, bool], Optional[torch.Tensor]]
    ] = None
    # the whole model's state_dict on the writer (a collective where the model is split)
    full_state_dict: Optional[Callable[[], dict]] = None
    # facts for the record, e.g. "dp on 1 device: runs unsplit"
    notes: list[str] = field(default_factory=list)
    # an eval batch size the strategy needs (pipelines keep their training shapes)
    eval_batch_size: Optional[int] = None
    # values the strategy decided at run time (e.g. an auto-tuned setting), logged as params
    params: dict = field(default_factory=dict)
    # whether torch.compile may replay the forward/backward as CUDA graphs (reduce-overhead)
    cuda_graphs: bool = True
    # called on every rank before each evaluation: ranks whose BatchNorm buffers drifted
    # apart take the writer's, so the reported test accuracy is that of the saved model
    before_eval: Callable[[], None] = lambda: None

    def state_dict(self) -> dict:
        if self.full_state_dict is not None:
            return self.full_state_dict()
        return {k: v.detach().cpu() for k, v in self.module.state_dict().items()}


def writer_buffers(model: nn.Module, writer_rank: int = 0) -> Callable[[], None]:
    """A `before_eval` that gives every rank the writer's buffers (BatchNorm's running
    statistics), for data-parallel ranks without synchronised BatchNorm: each normalised its
    own shard, so their statistics differ, and only the writer's are saved in model.pt."""

    def share() -> None:
        for buffer in model.buffers():
            dist.broadcast(buffer, src=writer_rank)

    return share


def gpu_count_or_nproc(n_gpus: int, cpu_nproc: int) -> int:
    """One process per GPU on GPUs; `cpu_nproc` gloo processes on the CPU."""
    return n_gpus if n_gpus > 0 else cpu_nproc
