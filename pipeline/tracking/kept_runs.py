"""A strategy's run as its files keep it (`kept_run`), and the one way it goes to MLflow
(`publish_strategy`): the stage's publisher pushes it as the run goes (publisher.py),
`python -m pipeline.publish` after an outage or for another store, and the compare and
publish stages with the final models (`log_final_models`).

Each writer keeps its run's identity, params, tags and status in checkpoints/<strategy>/run.json
and its per-epoch history in the checkpoint record (latest.json); the push creates a missing
run, logs the epochs MLflow lacks (never twice), uploads the artifacts and sets the status.
The files must belong to the same run (the same fingerprint): anything else is refused, never
mixed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from pipeline.did_not_fit import read_did_not_fit
from pipeline.errors import UserError, first_line
from pipeline.results import (
    ARTIFACTS,
    CHECKPOINT_RECORD,
    CHECKPOINTS,
    RESULTS,
    RUN_RECORD,
    SUMMARY,
    EpochRow,
    is_older,
    older,
    read_checkpoint_record,
    read_summary,
)
from pipeline.tracking.mlflow_run import (
    FINISHED,
    ModelSource,
    pending,
    publish_run,
    read_record,
    write_record,
)
from pipeline.tracking.store import tracking_uri


@dataclass
class KeptRun:
    """One strategy's run as its files keep it: what a push hands MLflow."""

    record_path: Path
    record: dict[str, Any]  # run.json, its status set as the files say
    history: list[EpochRow]
    finished: bool  # its results are this run's
    artifacts: list[Path]  # results/<strategy>/'s, once it finished
    stale: str  # why results/<strategy>/ were left out, or ""

    def pending(self) -> str:
        """What MLflow still lacks of it, in words."""
        return pending(self.record, self.history, self.artifacts)


def kept_run(
    name: str, ended: Optional[str] = None, live: Sequence[EpochRow] = ()
) -> KeptRun | None:
    """The strategy's run from checkpoints/<strategy>/ and results/<strategy>/; None where
    nothing is recorded. `ended`: how an unfinished run stands where its files cannot say it:
    RUNNING while its stage trains (the publisher's pushes), FAILED or KILLED as its stage
    ended. `live`: the epochs the stage's stream saw end, some perhaps in no checkpoint yet
    (stream.py). The files must belong to the same run (the same fingerprint)."""
    record_path = CHECKPOINTS / name / RUN_RECORD
    latest_path = CHECKPOINTS / name / CHECKPOINT_RECORD
    record = read_record(record_path)
    if not record:
        return None
    key = record["fingerprint"]
    latest = read_checkpoint_record(CHECKPOINTS / name)
    if latest is not None and latest.get("fingerprint") != key:
        if ended is None:
            raise UserError(
                f"{latest_path}: its epochs belong to run {latest.get('fingerprint')}, "
                f"{record_path} to run {key}; not published (run the train stage "
                f"again to settle {name})"
            )
        # a run before its first checkpoint, beside an older run's (its publisher, or the
        # launcher settling a run that died then): none of the older run's epochs
        latest = None
    if latest is not None and is_older(latest):  # its epochs, in a format no reader is kept for
        raise UserError(f"{latest_path}: {older(name)}")
    history = [EpochRow.from_record(r) for r in (latest or {}).get("history", [])]
    checkpointed = {row.epoch for row in history}
    history += sorted((r for r in live if r.epoch not in checkpointed), key=lambda r: r.epoch)
    # a run that did not fit (did_not_fit.py) has no summary of figures: it ended FAILED
    summary = (
        read_summary(name)
        if (RESULTS / name / SUMMARY).exists() and read_did_not_fit(name) is None
        else None
    )
    finished = summary is not None and summary.fingerprint == key
    if finished:
        record["status"] = FINISHED
    elif ended is not None and record.get("status") != FINISHED:
        record["status"] = ended
    stale = (
        f"; results/{name} belong to another run and were left out"
        if summary is not None and not finished
        else ""
    )
    artifacts = [RESULTS / name / a for a in ARTIFACTS] if finished else []
    return KeptRun(record_path, record, history, finished, artifacts, stale)


def publish_strategy(
    name: str,
    ended: Optional[str] = None,
    model_of: Optional[Callable[[Path], ModelSource]] = None,
    live: Sequence[EpochRow] = (),
) -> str:
    """Push one strategy's kept run (`kept_run`, whose `ended` and `live` these are); a
    one-line account of what MLflow now holds. `model_of`: results/<strategy>/ -> its final
    model, logged as the run's MLflow model once the run finished (tracking/final_model.py)."""
    run = kept_run(name, ended, live)
    if run is None:
        return f"{name}: nothing recorded locally (not trained yet)"
    record = run.record
    model = model_of(RESULTS / name) if run.finished and model_of is not None else None
    publish_run(
        record,
        run.history,
        run.artifacts,
        save=lambda: write_record(run.record_path, record),
        model=model,
    )
    epochs = len(run.history)
    return f"{name}: run {record['run_id']} has {epochs} epoch(s), {record['status']}{run.stale}"


def log_final_models(names: list[str], model_of: Callable[[Path], ModelSource]) -> None:
    """Each strategy's final model (`model_of` its results/<strategy>/) as its run's MLflow
    model, where it has none yet: in one process for every strategy (torch's and MLflow's
    model code load once), not in each train stage, where they would cost seconds after its
    last epoch. A strategy whose model cannot be logged says why in a warning; the others
    still go."""
    for name in names:
        try:
            publish_strategy(name, model_of=model_of)
        except Exception as err:  # noqa: BLE001 - its registration then says it has no model
            print(
                f"warning: MLflow model of {name} not logged ({first_line(err)})",
                file=sys.stderr,
                flush=True,
            )


def current_run_id(name: str, fingerprint: str | None) -> str | None:
    """The MLflow run, in the store MLflow is pointed at now, that holds this run of the
    strategy (the one whose results carry `fingerprint`); None when it is not there yet."""
    record = read_record(CHECKPOINTS / name / RUN_RECORD)
    if record.get("fingerprint") == fingerprint and record.get("tracking_uri") == tracking_uri():
        return record.get("run_id")
    return None
