"""A strategy whose builders take another params section than its FACTS name is a type error
where its module builds its SPEC (pipeline/strategies/base.py, `StrategySpec`), so `make
lint` refuses it before any run would call a builder with the wrong section."""

import shutil
import textwrap

from support import REPO, mypy_flags

SNIPPET = textwrap.dedent(
    """
    from torch import nn

    from pipeline.batch_plan import BatchPlan
    from pipeline.config import DdpConfig, FsdpConfig
    from pipeline.context import DistContext
    from pipeline.strategies.base import (
        Autocast,
        DataParallelRun,
        StrategyFacts,
        StrategySpec,
        replicas,
    )

    DDP = StrategyFacts(
        name="ddp",
        options=DdpConfig,
        spans_nodes=True,
        mesh=replicas,
        same_at_any_world_size=lambda options: options.sync_bn,
    )
    FSDP = StrategyFacts(name="fsdp", options=FsdpConfig, spans_nodes=True, mesh=replicas)

    def nproc(options: DdpConfig, plan: BatchPlan, n_gpus: int) -> int:
        return options.nproc

    def parallelize(
        model: nn.Sequential,
        options: DdpConfig,
        plan: BatchPlan,
        ctx: DistContext,
        autocast: Autocast,
    ) -> DataParallelRun:
        raise NotImplementedError

    def parallelize_fsdp(
        model: nn.Sequential,
        options: FsdpConfig,
        plan: BatchPlan,
        ctx: DistContext,
        autocast: Autocast,
    ) -> DataParallelRun:
        raise NotImplementedError

    SPEC = StrategySpec(DDP, nproc, parallelize)
    OTHER_SECTION = StrategySpec(DDP, nproc, parallelize_fsdp)  # error: fsdp's section
    OTHER_FACTS = StrategySpec(FSDP, nproc, parallelize)  # error: ddp's builders
    SWAPPED = StrategySpec(DDP, parallelize, nproc)  # error: each builder in the other's place
    TYPO = StrategyFacts(
        name="ddp",
        options=DdpConfig,
        spans_nodes=True,
        mesh=replicas,
        same_at_any_world_size=lambda options: options.sync_batchnorm,  # error: no such key
    )
    """
)


def test_a_builder_for_another_section_is_a_type_error(tmp_path):
    # A copy of `make lint`'s cache, where it has run (CI runs it first): 1 s instead of 18 s
    # spent reading torch's types again. mypy checks each entry against its source, so a stale
    # one costs time, never a wrong answer.
    if (REPO / ".mypy_cache").is_dir():
        shutil.copytree(REPO / ".mypy_cache", tmp_path / "cache")
    flagged, expected, output = mypy_flags(SNIPPET, tmp_path, timeout=300)
    assert flagged == expected, output
