"""Push to MLflow whatever a stage kept locally while the tracking server was away.

    python -m pipeline.sync [key=value ...]

Training never waits for MLflow: each writer keeps its run's identity, params and tags in
checkpoints/<strategy>/run.json and its per-epoch history in the checkpoint record, and
syncs every epoch and at the end of the stage. If the server was still down then, run this
once it is back: it creates missing runs, logs the epochs MLflow lacks (never twice),
uploads the artifacts and sets the final status. Safe to run any number of times.
"""
from __future__ import annotations

import json
import sys

from pipeline.checkpoint import ROOT as CHECKPOINTS
from pipeline.config import load_config
from pipeline.errors import UserError, exit_on_user_error
from pipeline.tracking import check_tracking_uri, push, tracking_uri
from pipeline.train import RESULTS

ARTIFACTS = ("metrics.json", "history.csv", "config.yaml", "model.pt")


def sync_strategy(name: str) -> str:
    record_path = CHECKPOINTS / name / "run.json"
    latest_path = CHECKPOINTS / name / "latest.json"
    if not record_path.exists():
        return f"{name}: nothing recorded locally (not trained yet)"
    record = json.loads(record_path.read_text())
    history = json.loads(latest_path.read_text())["history"] if latest_path.exists() else []
    out = RESULTS / name
    finished = (out / "metrics.json").exists()
    artifacts = [out / a for a in ARTIFACTS if (out / a).exists()] if finished else []

    def save() -> None:
        record_path.write_text(json.dumps(record, indent=1))

    push(record, history, artifacts, finished, "FINISHED", save)
    state = "finished" if finished else "in progress"
    return f"{name}: run {record['run_id']} has {len(history)} epoch(s), {state}"


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    cfg = load_config("params.yaml", sys.argv[1:] if argv is None else argv)
    check_tracking_uri(tracking_uri())
    failed = []
    for name in cfg.strategies:
        try:
            print(f"sync: {sync_strategy(name)}", flush=True)
        except UserError:
            raise
        except Exception as err:  # noqa: BLE001 - report each strategy, then fail overall
            failed.append(name)
            print(f"sync: {name}: MLflow at {tracking_uri()} unreachable: "
                  f"{str(err).splitlines()[0][:300]}", file=sys.stderr, flush=True)
    if failed:
        raise UserError(f"MLFLOW_TRACKING_URI: could not reach {tracking_uri()} for "
                        f"{', '.join(failed)}; everything is still kept locally, run again later")


if __name__ == "__main__":
    main()
