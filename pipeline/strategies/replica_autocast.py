"""DataParallel's replicas in the autocast dtype the run asked for.

torch's `parallel_apply` runs each replica in a thread of its own and re-enters autocast
there as `torch.amp.autocast(device_type, enabled=...)`, with no dtype. The autocast dtype is
thread-local, so the replica threads would fall back to the device's default (fp16 on CUDA):
a run that asks for bf16 would compute in fp16, without loss scaling. `keep_autocast` wraps
each replica so that it re-enters autocast with the dtype the calling thread had.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn


class InAutocast(nn.Module):
    """A replica that runs under the given autocast state, whatever its thread's is."""

    def __init__(self, module: nn.Module, device_type: str, dtype: torch.dtype, enabled: bool):
        super().__init__()
        self.module, self.device_type, self.dtype, self.enabled = (
            module,
            device_type,
            dtype,
            enabled,
        )

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(self.device_type, dtype=self.dtype, enabled=self.enabled):
            return self.module(*args, **kwargs)


def keep_autocast(replicas: Sequence[nn.Module], device_type: str = "cuda") -> list[nn.Module]:
    """The replicas, each wrapped to run in this (the calling) thread's autocast state."""
    enabled = torch.is_autocast_enabled(device_type)
    dtype = torch.get_autocast_dtype(device_type)
    return [InAutocast(replica, device_type, dtype, enabled) for replica in replicas]


class AutocastDataParallel(nn.DataParallel[nn.Module]):
    """nn.DataParallel whose replicas compute in the caller's autocast dtype."""

    def parallel_apply(
        self, replicas: Sequence[nn.Module], inputs: Sequence[Any], kwargs: Any
    ) -> list[Any]:
        return super().parallel_apply(keep_autocast(replicas), inputs, kwargs)
