"""A strategy's run, resolved from the Config once, at the command's boundary (the launcher,
the worker's `train`): the strategy's spec, its own params section, the sections the run
reads, the batch plan and the params it records. Below this point nothing takes the whole
Config, nor looks a section up by name: a run sees only what it runs with.

The launcher and every worker each resolve their own (they are separate processes) with
this one function, `resolve_run`, so the batch plan is built in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Generic

import yaml

from pipeline import strategies
from pipeline.batch_plan import BatchPlan
from pipeline.config import (
    CheckpointConfig,
    Config,
    DataConfig,
    MlflowConfig,
    ModelConfig,
    ReportConfig,
    TrainConfig,
    flatten,
    to_yaml,
)
from pipeline.parallel_dims import ParallelDims
from pipeline.resnet import split_channels
from pipeline.strategies.base import OptionsT, StrategyFacts, StrategySpec


@dataclass(frozen=True)
class RunSpec(Generic[OptionsT]):
    strategy: StrategySpec[OptionsT]
    options: OptionsT  # the strategy's own params section
    seed: int
    data: DataConfig
    model: ModelConfig
    train: TrainConfig
    checkpoint: CheckpointConfig
    report: ReportConfig
    mlflow: MlflowConfig
    # the batch (train.batch_size, train.grad_accum), checked: in a worker, over its job's
    # ranks and training samples (resolve_run's `job`); elsewhere as one process trains it
    plan: BatchPlan
    # what the run records it ran with: every key but the other strategies' sections,
    # flattened (MLflow params, the identity's source) and as YAML (results/<name>/config.yaml)
    params: dict[str, Any]
    config_yaml: str

    @property
    def name(self) -> str:
        return self.strategy.facts.name

    @property
    def facts(self) -> StrategyFacts[OptionsT]:
        return self.strategy.facts

    def job_plan(self, world_size: int, n_train: int) -> BatchPlan:
        """The batch plan of a job of `world_size` processes drawing from `n_train` samples
        (of a spec resolved without one: a prediction's, a benchmark's)."""
        return self.plan.of_job(self.dims(world_size), self.name, n_train)

    def dims(self, world_size: int) -> ParallelDims:
        """How a job of `world_size` processes of this run splits the work; a UserError
        where the model's channels do not split over its channel shards."""
        dims = self.facts.mesh(self.options, world_size)
        dims.check_channels(split_channels(self.model.width), f"{self.name} ({dims.describe()})")
        return dims


def resolve_run(cfg: Config, name: str, job: tuple[int, int] | None = None) -> RunSpec[Any]:
    """The run of strategy `name` that `cfg` asks for; a UserError if its batch does not fit.
    `job`: (world size, training samples) of the job a worker runs in: the plan is then
    that job's (`RunSpec.job_plan`). None: the batch as one process trains it (the launcher,
    which checks it at every world size its job may have)."""
    strategy = strategies.get(name)
    options = getattr(cfg, name)  # the one look-up by name: checked against the spec here
    if not isinstance(options, strategy.facts.options):
        raise TypeError(f"params section {name!r} is not a {strategy.facts.options.__name__}")
    # what the run records it ran with, flattened (MLflow's params) and by section, as
    # --print-config prints it (pipeline/train.py strategy_config)
    params = strategies.own_params(flatten(cfg), name)
    own = strategies.own_params(yaml.safe_load(to_yaml(cfg)), name)
    spec = RunSpec(
        strategy=strategy,
        options=options,
        seed=cfg.seed,
        data=cfg.data,
        model=cfg.model,
        train=cfg.train,
        checkpoint=cfg.checkpoint,
        report=cfg.report,
        mlflow=cfg.mlflow,
        plan=BatchPlan.make(cfg.train.batch_size, cfg.train.grad_accum),
        params=params,
        config_yaml=yaml.safe_dump(own, sort_keys=False),
    )
    return spec if job is None else replace(spec, plan=spec.job_plan(*job))
