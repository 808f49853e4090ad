"""Assembling a run: the seeded model, parallelized by its strategy, with the speed options
applied, its optimizer, training batches and loss. What the train stage trains and what
benchmarks/bench.py and benchmarks/profile_step.py time, built the same way."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, Optional

import torch
from torch.distributed.tensor import DTensor

from pipeline.config import Config
from pipeline.data.device_data import DeviceData
from pipeline.data.fashion_mnist import DATA_DIR
from pipeline.data.loaders import Batches, make_batches
from pipeline.strategies.base import Parallel, Strategy
from pipeline.training.context import DistContext
from pipeline.training.model import build_model
from pipeline.training.optim import loss_function, make_optimizer
from pipeline.training.precision import (
    Precision,
    build_precision,
    compile_forward,
    configure_backends,
    fallback,
)


class Training(NamedTuple):
    par: Parallel
    prec: Precision
    loader: Batches
    optimizer: torch.optim.Optimizer
    loss_fn: Callable[..., torch.Tensor]


def build_training(
    cfg: Config,
    strategy: Strategy,
    ctx: DistContext,
    data: DeviceData,
    raw_dir: Path = DATA_DIR / "raw",
) -> Training:
    """`raw_dir`: the fetched IDX files, which data.loader=dataloader reads via torchvision."""
    device = ctx.device
    prec = build_precision(cfg.train.precision, device)
    model = build_model(cfg.model.width, cfg.seed).to(device, prec.dtype)
    par = strategy.parallelize(model, cfg, ctx)
    prec, channels_last = fit_to_strategy(prec, par, cfg.train.channels_last)
    configure_backends(prec, device)
    par.forward, compile_notes = compile_forward(
        par.forward, cfg.train.compile, cfg.train.compile_mode, par.cuda_graphs
    )
    par.notes += prec.notes + compile_notes
    loss_fn = loss_function(cfg.train, schedule_owns_loss=par.pipeline_step is not None)
    optimizer = make_optimizer(par.module.parameters(), cfg.train)
    loader = make_batches(
        data, cfg, par.data_rank, par.data_world, prec.dtype, channels_last, device, raw_dir
    )
    return Training(par, prec, loader, optimizer, loss_fn)


def fit_to_strategy(
    precision: Precision, par: Parallel, channels_last: Optional[bool]
) -> tuple[Precision, bool]:
    """Apply to the parallelized model what its strategy can take; note what it cannot.

    A pipeline schedule sends activations between stages through buffers it allocates for the
    model's dtype, as contiguous NCHW tensors: no autocast and no channels_last there. Sharded
    (DTensor) parameters must stay contiguous (FSDP2): no channels_last. Elsewhere the
    parameters are converted to channels_last in place, after wrapping, so DDP/DP keep the
    same Parameter objects; DDP warns once that gradient strides do not match its buckets,
    then lays the buckets out again after the first step.
    channels_last None (auto) means on for CUDA, off on the CPU.
    Returns the precision that runs and whether inputs should be channels_last.
    """
    if channels_last is None:
        channels_last = precision.device_type == "cuda"
    pipelined = par.pipeline_step is not None
    if pipelined and precision.autocast_dtype is not None:
        precision = fallback(
            precision.name,
            precision.device_type,
            "the pipeline schedule passes activations between stages in the model's dtype",
        )
    if not channels_last:
        return precision, False
    if pipelined or any(isinstance(p, DTensor) for p in par.module.parameters()):
        why = (
            "pipeline stages send activations"
            if pipelined
            else "sharded (DTensor) parameters must be"
        )
        precision.notes.append(f"channels_last: not applied; {why} contiguous NCHW")
        return precision, False
    par.module.to(memory_format=torch.channels_last)
    return precision, True
