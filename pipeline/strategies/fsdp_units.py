"""FSDP2's units of the model and its gradient sync: what `fsdp` applies over all its ranks
and the hybrid's FSDP x channel and HSDP over the mesh's data dimensions (mesh_plan.py), in
a module of its own so that an edit to fsdp.py re-runs fsdp's stage alone."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from pipeline.resnet import RESIDUAL_STAGES

PARAM_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def shard(model: nn.Sequential, mesh: DeviceMesh, mixed_precision: str) -> None:
    """fully_shard each residual stage, then the root (it takes the stem and the head)."""
    policy = MixedPrecisionPolicy()
    if mixed_precision != "none":
        low = PARAM_DTYPES[mixed_precision]
        policy = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)
        # BatchNorm keeps its parameters in the model's dtype, as FSDP1's MixedPrecision does
        # by default: statistics of low-precision activations are computed at full precision,
        # and the output is cast back to `low` for the next convolution (the CPU sync
        # BatchNorm returns full precision, which a `low` convolution would refuse).
        keep_full = MixedPrecisionPolicy(output_dtype=low)
        for module in list(model.modules()):
            if isinstance(module, (nn.BatchNorm2d, nn.SyncBatchNorm)):
                fully_shard(module, mesh=mesh, mp_policy=keep_full)
    for index in RESIDUAL_STAGES:
        fully_shard(model[index], mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


def gradient_sync_if(sharded: FSDPModule) -> Callable[[bool], AbstractContextManager[None]]:
    """A run's reduce_grads_if: FSDP2 reduce-scatters gradients in the step's last micro-step
    alone."""

    @contextmanager
    def reduce_grads_if(is_last: bool) -> Iterator[None]:
        sharded.set_requires_gradient_sync(is_last)
        yield

    return reduce_grads_if
