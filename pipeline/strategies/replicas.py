"""Data replicas: each rank holds the whole model and trains a share of every micro-batch, its
gradients averaged over the replicas before the optimizer step. The mesh's `replicate`
dimension (pipeline/parallel_dims.py), applied by `replicate`: ddp's over every rank, a
hybrid's over its data group around channel shards, data x pipeline's over each stage's.

A plain model's replicas are DDP's, whose reducer all-reduces gradient buckets behind the
backward. A channel-split model's parameters are DTensors, which DDP's reducer cannot take:
its replicas reduce after the step's last backward, every gradient in one bucket, blocking
(the prediction measures and models it so).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

from pipeline.context import DistContext
from pipeline.strategies.base import local
from pipeline.strategies.sync_batchnorm import Group

# a DataParallelRun's reduce_grads_if: the context of a micro-step's backward, given whether it
# is the step's last
ReduceGradsIf = Callable[[bool], AbstractContextManager[None]]


def replicate(
    model: nn.Module, group: Group, replicas: int, ctx: DistContext
) -> tuple[nn.Module, ReduceGradsIf]:
    """`replicas` data replicas of `model` over `group` (None: the whole job): -> the module
    to train and its `reduce_grads_if`. A plain model is DDP's (its reducer all-reduces
    gradient buckets behind the backward; with gradient accumulation only the last micro-step
    reduces, `no_sync` on the others); a channel-split one reduces after the last backward
    (`replicated_sync`)."""
    if any(isinstance(p, DTensor) for p in model.parameters()):
        return model, replicated_sync(model, group, replicas)
    # DDP's defaults on purpose: static_graph=True fails on the first no_sync() step of
    # gradient accumulation (reducer.cpp "expect_autograd_hooks_", torch 2.14), and
    # broadcast_buffers=False, pointless work saved under SyncBN, warns as deprecated.
    ddp = DDP(model, device_ids=[ctx.device.index] if ctx.on_cuda else None, process_group=group)

    def reduce_grads_if(is_last: bool) -> AbstractContextManager[None]:
        return nullcontext() if is_last else ddp.no_sync()

    return ddp, reduce_grads_if


def replicated_sync(model: nn.Module, group: Group, replicas: int) -> ReduceGradsIf:
    """The step's last backward followed by `replica_reduction`; the others reduce nothing."""

    @contextmanager
    def reduce_grads_if(is_last: bool) -> Iterator[None]:
        if is_last:
            yield from replica_reduction(model, group, replicas)
        else:
            yield

    return reduce_grads_if


def replica_reduction(model: nn.Module, group: Group, replicas: int) -> Iterator[None]:
    """After the last micro-step's backward, every gradient averaged over the data replicas
    in one bucket (its own shard of a channel-split one)."""
    yield
    grads = [local(p.grad) for p in model.parameters() if p.grad is not None]
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat, group=group)
    flat /= replicas
    for grad, reduced in zip(grads, _unflatten_dense_tensors(flat, grads)):
        grad.copy_(reduced)


@contextmanager
def no_sync_needed(is_last: bool) -> Iterator[None]:
    """One data rank: nothing to reduce."""
    yield
