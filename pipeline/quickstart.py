"""A first result in minutes on any machine: every strategy on a Fashion-MNIST subset at a
small width, the report and the MLflow runs to compare, as `dvc repro` would make them.

Runs the fetch stage, the train stage of every strategy in `strategies` and the compare stage
with params.yaml's `quick` overrides on top (a subset, a small width, few epochs: edit them
there), then pushes the runs to MLflow. It leaves params.yaml as it is: `dvc repro` (or
`make run`, `docker compose up`) runs the full experiment, and retrains from scratch rather
than resume a quick run's checkpoints.

Examples:
  python -m pipeline.quickstart                      # = make quick
  python -m pipeline.quickstart train.epochs=1       # overrides on top of `quick`
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Optional

from pipeline.cli import parse_args
from pipeline.config import load_config
from pipeline.errors import USER_ERROR_EXIT, UserError, exit_on_user_error
from pipeline.strategies import check_names
from pipeline.tracking.store import check_tracking_uri, tracking_uri


@exit_on_user_error
def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args("pipeline.quickstart", __doc__, argv, params_help=True)
    cfg = load_config("params.yaml", args.overrides)
    overrides = [*cfg.quick, *args.overrides]
    load_config("params.yaml", overrides)  # the quick overrides themselves are valid
    check_names(cfg.strategies)
    check_tracking_uri(tracking_uri())  # before minutes of fetching and training, not after
    started = time.monotonic()
    steps = [
        ["pipeline.fetch"],
        *(["pipeline.train", name] for name in cfg.strategies),
        ["pipeline.compare"],
        ["pipeline.publish"],
    ]
    for step in steps:
        print(f"quickstart: python -m {' '.join(step)} {' '.join(overrides)}", flush=True)
        code = subprocess.run([sys.executable, "-m", *step, *overrides]).returncode
        if code == USER_ERROR_EXIT:
            sys.exit(code)  # the stage said why, in one line
        if code != 0:
            raise UserError(
                f"python -m {' '.join(step)} failed (exit {code}); its output above says why"
            )
    print(
        f"quickstart: done in {time.monotonic() - started:.0f} s: reports/index.html; the "
        "runs side by side in MLflow: the link above (`make ui` serves the embedded store)",
        flush=True,
    )


if __name__ == "__main__":
    main()
