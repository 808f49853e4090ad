"""Push to MLflow whatever the train stages kept locally while the tracking server was away.

Training never waits for MLflow: each strategy's writer keeps its run's identity, params and
tags in checkpoints/<strategy>/run.json and its per-epoch history in the checkpoint record,
and pushes every epoch and at the end of the stage. If the server was still down then, run
this once it is back (MLFLOW_TRACKING_URI names it): it creates missing runs, logs the epochs
MLflow lacks (never twice), uploads the artifacts, logs the final model as an MLflow model
(once) and sets the final status. Safe to run any
number of times.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from pipeline.cli import parse_args
from pipeline.config import load_config
from pipeline.errors import UserError, exit_on_user_error, first_line
from pipeline.locks import holding
from pipeline.strategies import check_names
from pipeline.tracking.store import check_tracking_uri, tracking_uri


@exit_on_user_error
def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args("pipeline.publish", __doc__, argv)
    cfg = load_config("params.yaml", args.overrides)
    check_names(cfg.strategies)
    check_tracking_uri(tracking_uri())
    # Imported once the command line is read: it loads torch (checkpoint records), which
    # --help and bad input need not wait for.
    from pipeline.tracking.final_model import model_source

    model_of = model_source if cfg.mlflow.log_model else None
    with contextlib.ExitStack() as held:
        # no stage of these strategies runs meanwhile (it publishes its own run; issue 50),
        # and none starts until this is done
        for name in cfg.strategies:
            held.enter_context(holding(f"train-{name}", f"train[{name}]"))
        publish_all(cfg.strategies, model_of)


# what a SQLite store whose migration was cut short says ("table _alembic_tmp_experiments
# already exists"): Alembic's batch copy of a table, left behind
HALF_MIGRATED = "_alembic_tmp_"


def publish_all(names: list[str], model_of: Optional[Callable[[Path], Any]]) -> None:
    """Push each strategy's kept run; one line each, then the first refusal or outage as
    the command's error."""
    from pipeline.tracking.kept_runs import publish_strategy

    unreachable, refused, half_made = [], [], False
    for name in names:
        try:
            print(f"publish: {publish_strategy(name, model_of=model_of)}", flush=True)
        except UserError as err:  # this strategy's files disagree: the others still go
            refused.append(str(err))
            # beside the other strategies' lines: stderr's one line is the error at the end
            print(f"publish: {name}: refused: {err}", flush=True)
        except Exception as err:  # noqa: BLE001 - report each strategy, then fail overall
            unreachable.append(name)
            half_made = half_made or HALF_MIGRATED in str(err)
            print(
                f"publish: {name}: MLflow at {tracking_uri()} unreachable: {first_line(err)}",
                file=sys.stderr,
                flush=True,
            )
    if refused:
        raise UserError(refused[0] + (f" (and {len(refused) - 1} more)" if refused[1:] else ""))
    if half_made:  # no later try mends it: MLflow will not migrate over its own leftovers
        raise UserError(
            f"MLFLOW_TRACKING_URI: the store at {tracking_uri()} is half-made (its schema "
            "migration was cut short, as a full disk does); move it aside (to a name of "
            "your choice) and run this again: every run is kept locally and is pushed whole"
        )
    if unreachable:
        raise UserError(
            f"MLFLOW_TRACKING_URI: could not reach {tracking_uri()} for "
            f"{', '.join(unreachable)}; everything is still kept locally, run "
            "again later"
        )


if __name__ == "__main__":
    main()
