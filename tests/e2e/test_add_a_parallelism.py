"""Adding a parallelism is one module plus its params section (CONTRIBUTING.md, "Adding a
strategy"): in a copy of the project, a new composition of the mesh's dimensions (data
replicas that average their gradients in one all-reduce after the backward, the notes' 001
description of data parallelism) is written as a strategy module, named in the registry and
given its section; `python -m pipeline.stage_code` regenerates what is generated, and it then
trains as `single` does (fp64, 1e-9) with no other file touched."""

from __future__ import annotations

import subprocess

import torch
import yaml

from support import make_project, run, tiny_params

MODULE = '''"""`allreduce_dp`: data replicas averaging their gradients in one all-reduce after the
backward (note 001's data parallelism, without DDP's overlap)."""

from __future__ import annotations

from torch import nn

from pipeline.batch_plan import BatchPlan
from pipeline.config import AllreduceDpConfig
from pipeline.context import DistContext
from pipeline.parallel_dims import ParallelDims
from pipeline.strategies.base import (
    Autocast,
    DataParallelRun,
    StrategyFacts,
    StrategySpec,
    gpu_count_or_nproc,
)
from pipeline.strategies.mesh_plan import apply_mesh

FACTS = StrategyFacts(
    name="allreduce_dp",
    options=AllreduceDpConfig,
    spans_nodes=False,
    mesh=lambda options, world_size: ParallelDims(replicate=world_size),
)


def nproc(options: AllreduceDpConfig, plan: BatchPlan, n_gpus: int) -> int:
    return gpu_count_or_nproc(n_gpus, options.nproc)


def parallelize(
    model: nn.Sequential,
    options: AllreduceDpConfig,
    plan: BatchPlan,
    ctx: DistContext,
    autocast: Autocast,
) -> DataParallelRun:
    dims = ParallelDims(replicate=ctx.world_size)
    return apply_mesh(model, dims, plan, ctx, sync_bn=True)


SPEC = StrategySpec(FACTS, nproc, parallelize)
'''

SECTION = '''@dataclass
class AllreduceDpConfig:
    """`allreduce_dp`: data replicas, one all-reduce of the gradients after the backward."""

    nproc: int = field(default=2, metadata=_min(1))
    """Processes on CPU (on GPUs one per device)."""


@dataclass
class Config:'''

FIELD = '''    hybrid: HybridConfig = field(default_factory=HybridConfig)
    """Options of the hybrid strategy."""
    allreduce_dp: AllreduceDpConfig = field(default_factory=AllreduceDpConfig)
    """Options of the allreduce_dp strategy."""'''


def edit(path, old, new):
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


def test_a_new_parallelism_is_one_module_and_its_section(tmp_path, http_mirror):
    project = make_project(tmp_path / "project", tiny_params(http_mirror))  # committed

    (project / "pipeline/strategies/allreduce_dp.py").write_text(MODULE)
    edit(
        project / "pipeline/strategies/__init__.py",
        '    "hybrid",\n',
        '    "hybrid",\n    "allreduce_dp",\n',
    )
    schema = project / "pipeline/config/schema.py"
    edit(schema, "@dataclass\nclass Config:", SECTION)
    edit(schema, FIELD.split("\n    allreduce_dp")[0], FIELD)
    edit(
        project / "pipeline/config/__init__.py",
        "    BalancedDpConfig,\n",
        "    AllreduceDpConfig,\n    BalancedDpConfig,\n",
    )
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["allreduce_dp"] = {"nproc": 2}
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run(project, "python", "-m", "pipeline.stage_code")

    changed = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=project,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    paths = sorted(line[3:] for line in changed)
    hand = [p for p in paths if not p.startswith("stage_code/") and p != "dvc.yaml"]
    assert hand == [
        "params.yaml",
        "pipeline/config/__init__.py",
        "pipeline/config/schema.py",
        "pipeline/strategies/__init__.py",
        "pipeline/strategies/allreduce_dp.py",
    ]
    assert "stage_code/allreduce_dp/allreduce_dp.py" in paths  # generated: a link to it

    run(project, "python", "-m", "pipeline.fetch")
    fp64 = ["train.precision=fp64", "train.epochs=1", "data.limit_train=160"]
    for name in ("single", "allreduce_dp"):
        run(project, "python", "-m", "pipeline.train", name, *fp64, timeout=300)
    single = torch.load(project / "results/single/model.pt", weights_only=True)
    added = torch.load(project / "results/allreduce_dp/model.pt", weights_only=True)
    assert list(added) == list(single)
    diff = max((added[k].double() - single[k].double()).abs().max().item() for k in single)
    assert diff < 1e-9, diff  # the same computation: sync_bn over the replicas' samples
