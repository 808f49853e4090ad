"""`single`: the plain model on one device (the first GPU in `devices`, else the CPU)."""

from __future__ import annotations

from torch import nn

from pipeline.batch_plan import BatchPlan
from pipeline.config import SingleConfig
from pipeline.context import DistContext
from pipeline.strategies.base import (
    Autocast,
    DataParallelRun,
    StrategyFacts,
    StrategySpec,
    alone,
)

FACTS = StrategyFacts(name="single", options=SingleConfig, spans_nodes=False, mesh=alone)


def nproc(options: SingleConfig, plan: BatchPlan, n_gpus: int) -> int:
    return 1


def parallelize(
    model: nn.Sequential,
    options: SingleConfig,
    plan: BatchPlan,
    ctx: DistContext,
    autocast: Autocast,
) -> DataParallelRun:
    return DataParallelRun(
        module=model,
        forward=model,
        writer=True,
        devices=[str(ctx.device)],
        batch_split=[plan.micro],
    )


SPEC = StrategySpec(FACTS, nproc, parallelize)
