"""The end of a train stage, told once the workers are gone (pipeline/train.py calls it once,
after the launcher's `launch`): the run's last push by the stage's publisher, with how it
ended, the run settled here where no publisher could, and the stage's last lines: a result
that did not fit, a user's error, what failed, and where a rerun resumes."""

from __future__ import annotations

import sys
from typing import NamedTuple

from pipeline.did_not_fit import read_did_not_fit
from pipeline.errors import FAILURE_EXIT, NO_SPACE, STOPPED_EXIT, Outcome, first_line
from pipeline.results import CHECKPOINTS, RUN_RECORD, read_checkpoint_record
from pipeline.timeline import mark
from pipeline.tracking.kept_runs import publish_strategy
from pipeline.tracking.mlflow_run import FAILED, KILLED, RUNNING, read_record
from pipeline.tracking.publisher import Publisher


class StageEnd(NamedTuple):
    """How a stage's workers ended (the launcher's answer): the stage's exit code and what
    its last lines say."""

    name: str  # the strategy
    exit_code: int  # the stage's (launcher.stage_exit)
    torchrun_code: int  # the elastic agent's, as torchrun's would be
    signalled: bool  # a stop signal came, and was passed on to the workers
    failure: str  # what failed, in words ("worker rank 1 exited with code 1 (...)")
    user_error: str  # a worker's one line for the user
    outcome: Outcome | None  # how the run's writer said the run ended
    # a job of several nodes: their count as dist.nnodes gave it ("2", "1:4") and how long the
    # others wait for a lost one (dist.join_timeout_s); None on one node
    nodes: tuple[str, int] | None = None


def tell(end: StageEnd, publisher: Publisher) -> int:
    """Push, settle and say how the stage ended; its exit code."""
    name, user_error = end.name, end.user_error
    opened = publisher.opened  # the writer opened the run: the publisher pushes its end
    problem = publisher.finish(ended_as(end), give_up=end.signalled)
    mark("published")
    settled = opened and problem is None
    # a full disk: the stage's own line says it, and its rerun pushes the run
    if problem is not None and not (problem == NO_SPACE and user_error):
        print(
            f"warning: MLflow run of {name} not pushed: {problem}; kept locally: run "
            "`python -m pipeline.publish`",
            file=sys.stderr,
            flush=True,
        )
    if end.exit_code not in (0, STOPPED_EXIT) and not settled:
        settle_run(name, ended_as(end), user_error=bool(user_error))
    if end.outcome is Outcome.DID_NOT_FIT:
        if not settled:
            settle_run(name, FAILED, user_error=True)  # quietly: the line below is the answer
        record = read_did_not_fit(name)
        print(f"train[{name}]: {record.line() if record else 'did not fit'}", flush=True)
    elif user_error:
        print(f"error: {user_error}", file=sys.stderr, flush=True)
    elif end.failure:
        print(f"launch[{name}]: {end.failure}", file=sys.stderr, flush=True)
    if not user_error and end.exit_code == FAILURE_EXIT and (end.signalled or end.nodes):
        committed = read_checkpoint_record(CHECKPOINTS / name)
        at = (committed["epoch"], committed["step"]) if committed else None
        if end.nodes:
            hint = lost_node_hint(name, end.torchrun_code, *end.nodes, at)
        else:
            hint = unsaved_stop_hint(name, at)
        print(f"error: {hint}", file=sys.stderr, flush=True)
    return end.exit_code


def ended_as(end: StageEnd) -> str:
    """The run's MLflow status as its stage ended, where its files do not say it finished:
    KILLED after a stop (checkpointed, to be resumed, or one that came before a checkpoint),
    FAILED after a failure (the agent also stops the surviving workers of a failed job with
    SIGTERM: not a stop to resume from) or a result that did not fit; RUNNING: as the files
    say (a finished run's summary makes it FINISHED)."""
    if end.exit_code == STOPPED_EXIT:
        return KILLED
    if end.exit_code != 0:
        return KILLED if end.signalled else FAILED
    return FAILED if end.outcome is Outcome.DID_NOT_FIT else RUNNING


def lost_node_hint(
    strategy: str, code: int, nnodes: str, join_timeout_s: int, at: tuple[int, int] | None
) -> str:
    """The line a failed multi-node launch ends with: what happened and what to do next.
    `at` is the committed (epoch, step) position, 0-based epoch."""
    where = f"epoch {at[0] + 1} step {at[1]}" if at is not None else "the start (no checkpoint yet)"
    return (
        f"train[{strategy}]: the {nnodes}-node job stopped on this node (torchrun "
        f"exit {code}); if a node was lost, the others waited dist.join_timeout_s="
        f"{join_timeout_s}s for a full set to rejoin (or checkpoint.max_restarts "
        f"ran out). Run the same command on every node again to resume from {where}"
    )


def unsaved_stop_hint(name: str, at: tuple[int, int] | None) -> str:
    where = f"epoch {at[0] + 1} step {at[1]}" if at else "the start"
    return (
        f"train[{name}]: stopped by a signal before it could checkpoint; the next run of "
        f"this stage resumes from {where}"
    )


def settle_run(name: str, status: str, user_error: bool = False) -> None:
    """Record how the stage's MLflow run ended when its workers could not say it themselves
    (SIGKILL, out of memory, a lost node), and push it. Best effort: MLflow may be away too,
    and `python -m pipeline.publish` delivers it later. After a worker's `user_error` only a
    run still RUNNING is marked (workers that had opened theirs marked it FAILED; a record of
    an earlier run, which the refused stage never reopened, stays as that run ended), and
    nothing is said: the error's one line is the stage's answer."""
    try:
        if user_error and read_record(CHECKPOINTS / name / RUN_RECORD).get("status") != RUNNING:
            return
        publish_strategy(name, ended=status)
    except Exception as err:  # noqa: BLE001 - the stage's own exit code is what matters
        if user_error:
            return
        print(
            f"warning: MLflow run of {name} not marked {status} ({first_line(err)})",
            file=sys.stderr,
            flush=True,
        )
