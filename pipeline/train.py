"""DVC stage `train@STRATEGY`: train one strategy and write results/STRATEGY/.

Run directly (as `dvc repro` does), it validates params.yaml and the overrides, picks the
devices (`devices`: auto, cpu, "0", "0,3") and becomes torchrun's elastic agent, forking as
many workers as the strategy needs there; bad input stops before anything starts, with one
line and exit code 2. Each worker builds the same seeded model, the strategy parallelizes it
and the shared loop trains it. Checkpoints go to checkpoints/STRATEGY/ (a
rerun resumes from them), the run to MLflow (MLFLOW_TRACKING_URI, else sqlite:///mlflow.db).

Strategies: single (the plain model, one device), dp (nn.DataParallel), balanced_dp
(DataParallel with a smaller share of each batch on GPU 0), ddp (DistributedDataParallel),
fsdp (FSDP2: torch.distributed.fsdp.fully_shard), pipeline_parallel (torch.distributed.
pipelining, GPipe or 1F1B).

Examples:
  python -m pipeline.train single
  python -m pipeline.train ddp train.epochs=2 model.width=16
  python -m pipeline.train fsdp --print-config fsdp.mixed_precision=bf16
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Optional

import yaml

from pipeline.cli import exit_code, parse_args
from pipeline.config import Config, config_from, launch_free, read_params, to_yaml
from pipeline.errors import exit_on_user_error
from pipeline.launch import horovod_run, slurm
from pipeline.strategies import KNOWN, check_strategy, own_params
from pipeline.timeline import mark
from pipeline.tracking.publisher import Publisher
from pipeline.tracking.store import check_tracking_uri, tracking_uri


def under_torchrun(env: Mapping[str, str]) -> bool:
    """Whether this process is one of torchrun's workers (torchrun's, or
    torch.distributed.launch's, with or without --use-env), not the launcher that starts
    them."""
    return "TORCHELASTIC_RUN_ID" in env and "LOCAL_RANK" in env


def strategy_config(cfg: Config, strategy: str) -> str:
    """The resolved params `strategy` trains with, as YAML: every key, the other strategies'
    sections left out (its stage depends on none of them); results/<strategy>/config.yaml
    holds the same (pipeline/run_spec.py)."""
    own = own_params(yaml.safe_load(to_yaml(cfg)), strategy)
    text: str = yaml.safe_dump(own, sort_keys=False)  # PyYAML is untyped here
    return text


@exit_on_user_error
def main(argv: Optional[list[str]] = None) -> None:
    mark("command")
    args = parse_args("pipeline.train", __doc__, argv, strategy_names=KNOWN, params_help=True)
    check_strategy(args.strategy)  # the one check of the name in this process
    # torch and the training code are imported only now: they take seconds to load, which
    # --help, a mistyped strategy and a bad params key (checked first) need not wait for.
    if horovod_run.under_horovodrun(os.environ) and not under_torchrun(os.environ):
        # one of horovodrun's workers (the horovod strategy's): its group from horovodrun's
        # variables, read once here as torchrun's; the launcher's config from its file
        os.environ.update(horovod_run.torchrun_env(os.environ))
        from pipeline.launch import worker

        worker.entry(args.strategy, None, [], os.environ[horovod_run.WORKER_PARAMS_ENV])
        return
    if not under_torchrun(os.environ) and slurm.one_task_per_process(os.environ):
        # srun's task per process (note 001): a worker, its group from SLURM's variables,
        # read once here as torchrun's (launch/slurm.py); nothing below reads SLURM_*
        os.environ.update(slurm.torchrun_env(os.environ))
        from pipeline.launch import worker

        worker.entry(args.strategy, None, args.overrides)
        return
    if under_torchrun(os.environ):
        from pipeline.launch import worker

        worker.entry(args.strategy, None, args.overrides)
        return
    raw = read_params("params.yaml")  # read once: the stage's config and its workers'
    cfg = config_from(raw, args.overrides)
    if args.print_config:
        print(strategy_config(cfg, args.strategy), end="")
        return
    check_tracking_uri(tracking_uri())  # like the keys: a mistyped URI needs no torch to say so
    # what the workers train with: all but the dist.* overrides, which only shape the launch
    trained = launch_free(args.overrides)
    worker_cfg = cfg if trained == args.overrides else config_from(raw, trained)
    # the stage's MLflow side, a process of its own (pipeline/tracking/publisher.py), started
    # before torch is imported here
    wait_s = cfg.mlflow.final_sync_wait_s
    with Publisher(args.strategy, wait_s, cfg.mlflow.experiment) as publisher:
        from pipeline.launch import launcher
        from pipeline.tracking import stage_end

        job = launcher.validate(args.strategy, cfg)
        # one run of this stage at a time in the project (issue 50), from here to its end
        with launcher.one_run_at_a_time(job.name, job.topology.multi_node):
            end = launcher.launch(job, worker_cfg, publisher)
            code = stage_end.tell(end, publisher)
    sys.exit(code)


if __name__ == "__main__":
    code = exit_code(main, None)
    # What the stage writes is written and closed by now (its files atomically, the workers
    # reaped, the agent's store shut down): the interpreter's teardown of torch and the rest
    # would take a quarter of a second to free memory the process gives back anyway.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
