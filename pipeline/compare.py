"""DVC stage `compare`: one report comparing every strategy in `strategies`.

Reads results/<strategy>/ (summary.json, history.csv) and writes reports/: index.html (which
strategy to use on this hardware per objective, then the table, the per-device memory table
and the plots in one self-contained page), summary.md, summary.json (the DVC metrics:
accuracy, samples/s, seconds and peak MiB by strategy), comparison.json (every column),
recommendation.json, mlflow_url.txt, accuracy.csv, loss.csv and throughput.csv (DVC plots) and
four PNGs. In MLflow it groups this repro's strategy runs under a parent run "comparison" that
holds the report, logs each strategy's final model as its run's MLflow model
(`mlflow.log_model`), and registers the recommended strategies' models as versions of the
registered model named after the experiment, with aliases (models:/<experiment>@recommended).
Prints the recommendation and a short table, every line within 120 characters.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Optional

from pipeline.cli import parse_args
from pipeline.config import load_config
from pipeline.errors import exit_on_user_error
from pipeline.reporting.predicted import combine
from pipeline.reporting.report import write_report
from pipeline.results import read_predictions
from pipeline.tracking.mlflow_run import ModelSource
from pipeline.tracking.store import check_tracking_uri, tracking_uri


@exit_on_user_error
def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args("pipeline.compare", __doc__, argv, params_help=True)
    cfg = load_config("params.yaml", args.overrides)
    # as train and publish do: a URI that can never work is bad input, not an outage whose
    # report would quietly lose its MLflow links
    check_tracking_uri(tracking_uri())
    model_of = final_models() if cfg.mlflow.log_model else None
    predicted = combine(read_predictions(cfg.strategies))
    print(write_report(cfg.strategies, cfg.report, cfg.mlflow, model_of, predicted), end="")


def final_models() -> Callable[[Path], ModelSource]:
    """results/<strategy>/ -> its final model, as the report logs it in MLflow; the code
    (torch's, 1.3 s on 2 CPU cores) loaded only where the models are logged."""
    from pipeline.tracking.final_model import model_source

    return model_source


if __name__ == "__main__":
    main()
