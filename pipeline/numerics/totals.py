"""The run's totals: what an epoch's training (or an evaluation) has summed so far over this
rank's samples: their loss, how many were classified right, and how many there were.

They stay on the device, so that nothing in an epoch waits for the GPU: the step adds each
batch's (`add`, a few kernels), the writer's live report copies them to the host without
waiting (recording/live.py), a checkpoint keeps them as they are (`tensor`), and once per
epoch they are summed over the ranks and read (`reduced`), the one host sync. `Sums` names
the fields; the layout of the tensor underneath lives here alone.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F

from pipeline.context import DistContext


class Sums(NamedTuple):
    """The totals as read on the host."""

    loss_sum: float  # the summed loss (cross-entropy, without label smoothing)
    correct: float  # samples whose top logit is their label
    samples: float

    @classmethod
    def none(cls) -> Sums:
        """Before the first sample."""
        return cls(0.0, 0.0, 0.0)

    def mean_loss_since(self, before: Sums) -> Optional[float]:
        """Mean loss of the samples between `before` and this reading (None: no sample)."""
        samples = self.samples - before.samples
        return (self.loss_sum - before.loss_sum) / samples if samples > 0 else None


class Totals:
    """The running `Sums` of this rank, one float64 tensor on the device underneath."""

    def __init__(self, tensor: torch.Tensor) -> None:
        # [loss_sum, correct, samples], added into in place; a checkpoint keeps it bit for bit
        self.tensor = tensor

    @classmethod
    def zeros(cls, device: torch.device) -> Totals:
        return cls(torch.zeros(len(Sums._fields), dtype=torch.float64, device=device))

    @staticmethod
    def state_problem(state: Any) -> Optional[str]:
        """Why a checkpoint's saved totals (`state`) are not totals; None: they are."""
        if not isinstance(state, torch.Tensor) or state.shape != (len(Sums._fields),):
            return f"expected [{', '.join(Sums._fields)}]"
        return None

    def add(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Add one batch's, from its logits: kernels only, no host sync."""
        labels = labels.to(logits.device)
        loss_sum = F.cross_entropy(logits.float(), labels, reduction="sum")
        correct = (logits.argmax(1) == labels).sum()
        # a fill kernel, not torch.tensor(): a host->device copy would wait for the GPU
        samples = torch.full((), len(labels), dtype=torch.float64, device=logits.device)
        batch = torch.stack([loss_sum.double(), correct.double(), samples])
        self.tensor += batch.to(self.tensor.device)  # a pipeline's last stage may be elsewhere

    def zero_(self) -> None:
        self.tensor.zero_()  # in place: a captured step graph adds into this tensor

    def read(self) -> Sums:
        """The sums on the host: waits for the device."""
        return Sums(*self.tensor.tolist())

    def reduced(self, ctx: DistContext) -> tuple[float, float]:
        """Summed over the ranks (a collective) -> (mean loss, accuracy). One host sync."""
        if ctx.world_size > 1:
            dist.all_reduce(self.tensor)
        sums = self.read()
        samples = max(sums.samples, 1.0)
        return sums.loss_sum / samples, sums.correct / samples
