"""How one optimizer step's batch divides: into `grad_accum` micro-batches (the forwards of
one step), each shared by `data_world` data-parallel ranks. Built once per process, in three
checked steps: from the train section (`make`), over the strategy's data-parallel world
(`over`, as `of_job` rules), drawing from the training set (`drawing_from`); every plan that
exists divides. Pure arithmetic.

    batch 256, grad_accum 2, 2 ranks:  micro 128, per rank 64; 60000 samples -> 234 steps
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from pipeline.errors import UserError
from pipeline.parallel_dims import ParallelDims


@dataclass(frozen=True)
class BatchPlan:
    batch_size: int  # samples per optimizer step, over every rank (train.batch_size)
    grad_accum: int  # forwards per optimizer step (train.grad_accum)
    data_world: int = 1  # ranks that each train a share of every micro-batch
    # neighbouring ranks that train one share together (a mesh's pipeline x channel ranks:
    # pipeline/parallel_dims.py); kept only where the batch is shared (data_world > 1)
    model_world: int = 1
    n_train: Optional[int] = None  # training samples an epoch draws from; None: not yet known

    @classmethod
    def make(cls, batch_size: int, grad_accum: int) -> BatchPlan:
        """The batch as one process trains it; a UserError names the key that does not fit."""
        if batch_size % grad_accum:
            raise UserError(
                f"train.batch_size: got {batch_size}, expected a multiple of "
                f"train.grad_accum ({grad_accum})"
            )
        return cls(batch_size, grad_accum)

    def over(self, data_world: int, who: str) -> BatchPlan:
        """The same batch shared by `data_world` ranks; `who` (e.g. "ddp", "ddp on 2 node(s)
        x 2 process(es)") names what needs that many, for the message when it does not divide."""
        if self.micro % data_world:
            raise UserError(
                f"train.batch_size: got {self.batch_size}, {who} needs a multiple of "
                f"processes x train.grad_accum = {data_world} x {self.grad_accum}"
            )
        return replace(self, data_world=data_world)

    def of_job(self, dims: ParallelDims, who: str, n_train: Optional[int] = None) -> BatchPlan:
        """The plan of a job whose processes split the work as `dims` says: shared by its
        data ranks (each trains a share of every micro-batch, with the model ranks beside it
        on the same share), else as one process trains it; drawing from `n_train` samples
        where given. The one place that rule is written: the launcher checks it at each world
        size a job may have (topology.check_job), each worker applies it to its own."""
        plan = self
        if dims.data > 1:
            plan = replace(self.over(dims.data, who), model_world=dims.model)
        return plan if n_train is None else plan.drawing_from(n_train)

    def drawing_from(self, n_train: int) -> BatchPlan:
        """The plan for a training set of `n_train` samples, which must hold one batch."""
        if self.batch_size > n_train:
            raise UserError(
                f"train.batch_size: got {self.batch_size}, larger than the {n_train} training "
                "samples; expected at most that"
            )
        return replace(self, n_train=n_train)

    @property
    def micro(self) -> int:
        """Samples in one forward of the step (over every rank)."""
        return self.batch_size // self.grad_accum

    @property
    def per_rank(self) -> int:
        """Samples one data-parallel rank trains in one forward."""
        return self.micro // self.data_world

    @property
    def steps(self) -> int:
        """Optimizer steps per epoch; the last partial batch is dropped."""
        if self.n_train is None:
            raise ValueError("BatchPlan.steps: call drawing_from(n_train) first")
        return self.n_train // self.batch_size

    @property
    def samples_per_epoch(self) -> int:
        return self.steps * self.batch_size

    def samples_from(self, step: int) -> int:
        """Samples (over every rank) of an epoch's steps `step`..end: what a process that
        resumed the epoch at `step` trained of it (every sample of it from step 0)."""
        if not 0 <= step <= self.steps:
            raise ValueError(f"BatchPlan.samples_from: step {step} outside 0..{self.steps}")
        return (self.steps - step) * self.batch_size

    def data_rank(self, rank: int) -> int:
        """Which share of each micro-batch process `rank` trains (0 when one trains it all):
        the ranks of a mesh's model dimensions sit next to each other (ParallelDims)."""
        return rank // self.model_world if self.data_world > 1 else 0
