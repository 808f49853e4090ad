"""A first result in minutes on any machine: every strategy on a Fashion-MNIST subset at a
small width, the report and the MLflow runs to compare, as `dvc repro` would make them.

Runs the fetch stage, the train stage of every strategy in `strategies`, the predict stage
(each strategy on N devices, predicted) and the compare stage
with params.yaml's `quick` overrides on top (a subset, a small width, few epochs: edit them
there), then pushes the runs to MLflow. It leaves params.yaml as it is: `dvc repro` (or
`make run`, `docker compose up`) runs the full experiment, and retrains from scratch rather
than resume a quick run's checkpoints.

The stages run one after the other in this one process, each as its own command would run
it (`python -m pipeline.train ddp ...`: the same code, the same files, each strategy's
workers under torchrun's elastic agent), so torch, MLflow and the project are loaded once
instead of once per stage: most of a small stage's time.

Examples:
  python -m pipeline.quickstart                      # = make quick
  python -m pipeline.quickstart train.epochs=1       # overrides on top of `quick`
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Optional

from pipeline.cli import exit_code, parse_args
from pipeline.config import load_config
from pipeline.errors import STOPPED_EXIT, USER_ERROR_EXIT, UserError, exit_on_user_error
from pipeline.locks import holding
from pipeline.strategies import check_names
from pipeline.tracking.store import check_tracking_uri, tracking_uri

Stage = Callable[[Optional[list[str]]], None]  # a stage module's main(argv)


@exit_on_user_error
def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args("pipeline.quickstart", __doc__, argv, params_help=True)
    cfg = load_config("params.yaml", args.overrides)
    overrides = [*cfg.quick, *args.overrides]
    quick = load_config("params.yaml", overrides)  # the quick overrides themselves are valid
    check_names(cfg.strategies)
    check_tracking_uri(tracking_uri())  # before minutes of fetching and training, not after
    # one quickstart at a time in the project (issue 50): refused before seconds of imports
    with holding("quickstart", "the quickstart (python -m pipeline.quickstart)"):
        started = time.monotonic()
        took = run_steps(stages(cfg.strategies, quick.mlflow.log_model), overrides)
    print(
        f"quickstart: done in {time.monotonic() - started:.0f} s ({', '.join(took)} s): "
        "reports/index.html; the runs side by side in MLflow: the link above (`make ui` "
        "serves the embedded store)",
        flush=True,
    )


def stages(strategies: list[str], log_model: bool) -> list[tuple[list[str], Stage]]:
    """The stages in order, each its command and its main. Loaded before the first worker is
    forked, so that every worker inherits them: the stages' code, torch, and the MLflow
    client, store and model logging that the writers and the publish step use."""
    import mlflow.entities  # noqa: F401

    from pipeline import compare, fetch, predict, publish, train
    from pipeline.tracking import preload

    preload.client_code(tracking_uri())
    if log_model:
        preload.final_model_code()
    return [
        (["pipeline.fetch"], fetch.main),
        *((["pipeline.train", name], train.main) for name in strategies),
        (["pipeline.predict"], predict.main),
        (["pipeline.compare"], compare.main),
        (["pipeline.publish"], publish.main),
    ]


def run_steps(steps: list[tuple[list[str], Stage]], overrides: list[str]) -> list[str]:
    """Each stage in turn, as its command would run it; each one's seconds, in words. A
    stage's user error or stop ends the quickstart with its exit code (it said why)."""
    print(f"quickstart: every stage with {' '.join(overrides)}", flush=True)
    took = []
    for command, stage in steps:
        print(f"quickstart: python -m {' '.join(command)}", flush=True)
        t0 = time.monotonic()
        code = exit_code(stage, [*command[1:], *overrides])
        took.append(f"{command[-1].removeprefix('pipeline.')} {time.monotonic() - t0:.1f}")
        if code in (USER_ERROR_EXIT, STOPPED_EXIT):
            sys.exit(code)  # the stage said why, in one line
        if code != 0:
            raise UserError(
                f"python -m {' '.join(command)} failed (exit {code}); its output above says why"
            )
    return took


if __name__ == "__main__":
    main()
