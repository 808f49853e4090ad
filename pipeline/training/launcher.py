"""Start one strategy's training under torchrun with the right number of processes.

`python -m pipeline.train STRATEGY` lands here when it is not yet under torchrun: the config
is validated, the devices resolved and the outputs checked in this one process, so bad input
fails fast with one line and exit code 2 instead of N tracebacks; then torchrun starts the
workers with the chosen GPUs as CUDA_VISIBLE_DEVICES (set before any worker initialises CUDA).
A user error a worker finds later comes back the same way (one line, exit 2) through a file.
The workers' stderr comes through this process; at a terminal they are told its width
(live.TERMINAL_ENV), since what they write to is a pipe, and the writer shows a live bar.
"""

from __future__ import annotations

import errno
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import types
from pathlib import Path

from pipeline import strategies
from pipeline.batch_plan import BatchPlan
from pipeline.config import Config
from pipeline.data.fashion_mnist import train_samples
from pipeline.errors import (
    ERROR_FILE_ENV,
    FAILURE_EXIT,
    OUTCOME_FILE_ENV,
    STOPPED_EXIT,
    USER_ERROR_EXIT,
    Outcome,
    UserError,
    first_line,
)
from pipeline.results import CHECKPOINTS, RESULTS, RUN_RECORD, read_checkpoint_record
from pipeline.tracking.mlflow_run import FAILED, KILLED, RUNNING, read_record
from pipeline.tracking.publish import publish_strategy
from pipeline.tracking.store import check_tracking_uri, tracking_uri
from pipeline.training.checkpoint import Checkpointer
from pipeline.training.devices import choose_devices
from pipeline.training.faults import ENV as FAULT_ENV
from pipeline.training.faults import parse_faults
from pipeline.training.final_model import model_source
from pipeline.training.live import TERMINAL_ENV, terminal_columns
from pipeline.training.topology import (
    Topology,
    check_job,
    lost_node_hint,
    resolve_topology,
    torchrun_args,
    worker_overrides,
)


def torchrun_command(
    strategy: str, nproc: int, max_restarts: int, overrides: list[str], topology: Topology
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *torchrun_args(nproc, max_restarts, topology),
        "-m",
        "pipeline.train",
        strategy,
        *worker_overrides(overrides),
    ]


def check_writable(directory: Path) -> None:
    """That the run can write `directory`, without creating it: a refused run leaves no
    directory behind. Where it does not exist yet, its nearest existing ancestor must take a
    new file (and so a new directory)."""
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
        with tempfile.NamedTemporaryFile(dir=existing):
            pass
    except OSError as err:
        raise UserError(
            f"{directory}/: not writable ({err.strerror}); expected a directory "
            "this user can create files in"
        ) from None


def check_kept_files(name: str) -> None:
    """The run's own records of an earlier run, read before any worker starts: a corrupt one
    is refused in one line here rather than in every rank (pipeline/results.py,
    tracking/mlflow_run.py say what is checked and what fixes it)."""
    read_checkpoint_record(CHECKPOINTS / name)
    read_record(CHECKPOINTS / name / RUN_RECORD)


def launch(name: str, cfg: Config, overrides: list[str]) -> int:
    """Validate the rest (`cfg`: params.yaml with `overrides`, already checked), then run the
    strategy's workers under torchrun; the stage's exit code (`stage_exit`), with one line for
    a user error found by a worker."""
    strategy = strategies.get(name)
    strategies.check_names(cfg.strategies)
    check_tracking_uri(tracking_uri())
    parse_faults(os.environ.get(FAULT_ENV))
    gpus = choose_devices(cfg.devices, os.environ)
    plan = BatchPlan.make(cfg.train.batch_size, cfg.train.grad_accum)
    nproc = strategy.nproc(getattr(cfg, name), plan, len(gpus))
    topology = resolve_topology(cfg.dist, os.environ, name)
    check_job(strategy.FACTS, topology, nproc, plan)
    for directory in (RESULTS / name, CHECKPOINTS / name):
        check_writable(directory)
    check_kept_files(name)
    plan.drawing_from(train_samples(cfg.data.limit_train))  # the data is there, and holds a batch
    with tempfile.TemporaryDirectory(prefix="parallel-lab-launch-") as tmp:
        error_file, outcome_file = Path(tmp) / "error.txt", Path(tmp) / "outcome"
        error_file.touch()
        # "" hides every GPU: `devices: cpu` must mean the CPU even on a GPU machine.
        env = {
            **os.environ,
            "CUDA_VISIBLE_DEVICES": ",".join(gpus),
            ERROR_FILE_ENV: str(error_file),
            OUTCOME_FILE_ENV: str(outcome_file),
        }
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
        # the workers write to a pipe: whether the stage's output is a terminal is this
        # process's to tell them (not an outer launcher's)
        env.pop(TERMINAL_ENV, None)
        columns = terminal_columns({}, sys.stderr)
        if columns is not None:
            env[TERMINAL_ENV] = str(columns)
        cmd = torchrun_command(name, nproc, cfg.checkpoint.max_restarts, overrides, topology)
        where = f"GPUs {','.join(gpus)}" if gpus else "CPU"
        if topology.multi_node:
            where += f", this node of {topology.nnodes}"
        print(f"launch[{name}]: {nproc} process(es) on {where}: {shlex.join(cmd[1:])}", flush=True)
        code, signalled = run_forwarding_signals(cmd, env, error_file)
        user_error = error_file.read_text().strip()
        outcome = read_outcome(outcome_file)
    exit_code = stage_exit(code, signalled, outcome, bool(user_error))
    if exit_code not in (0, STOPPED_EXIT):
        # a stop someone asked for that came before a checkpoint, or a failure (torchrun also
        # stops the surviving workers of a failed job with SIGTERM: not a stop to resume from)
        status = KILLED if signalled else FAILED
        settle_run(name, status, cfg.mlflow.log_model, user_error=bool(user_error))
    if user_error:
        print(f"error: {user_error}", file=sys.stderr, flush=True)
    elif exit_code == FAILURE_EXIT and (signalled or topology.multi_node):
        found = Checkpointer(CHECKPOINTS / name, 0, 1, False, "").latest(any_config=True)
        at = (found[0].epoch, found[0].step) if found else None
        if topology.multi_node:
            print(f"error: {lost_node_hint(name, code, topology, at)}", file=sys.stderr, flush=True)
        else:
            print(f"error: {unsaved_stop_hint(name, at)}", file=sys.stderr, flush=True)
    return exit_code


def read_outcome(path: Path) -> Outcome | None:
    """What the run's writer said of how it ended, if it got that far."""
    try:
        return Outcome(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def stage_exit(
    torchrun_code: int, signalled: bool, outcome: Outcome | None, user_error: bool
) -> int:
    """The stage's exit code (pipeline/errors.py lists them) from torchrun's, whether this
    process forwarded a stop signal to it, the writer's outcome and a worker's user error.
    torchrun exits non-zero whenever it forwarded a signal, whatever its workers did then."""
    if user_error:
        return USER_ERROR_EXIT
    if torchrun_code == 0 or (signalled and outcome is Outcome.FINISHED):
        return 0
    if outcome is Outcome.STOPPED:
        return STOPPED_EXIT
    # a crash; also a rank that died after the writer finished, and a stop whose checkpoint
    # did not happen (the grace period ran out)
    return FAILURE_EXIT


def unsaved_stop_hint(name: str, at: tuple[int, int] | None) -> str:
    where = f"epoch {at[0] + 1} step {at[1]}" if at else "the start"
    return (
        f"train[{name}]: stopped by a signal before it could checkpoint; the next run of "
        f"this stage resumes from {where}"
    )


def settle_run(name: str, status: str, log_model: bool, user_error: bool = False) -> None:
    """Record how the stage's MLflow run ended when its workers could not say it themselves
    (SIGKILL, out of memory, a lost node), and push it. Best effort: MLflow may be away too,
    and `python -m pipeline.publish` delivers it later. After a worker's `user_error` only a
    run still RUNNING is marked (workers that had opened theirs marked it FAILED; a record of
    an earlier run, which the refused stage never reopened, stays as that run ended), and
    nothing is said: the error's one line is the stage's answer."""
    try:
        if user_error and read_record(CHECKPOINTS / name / RUN_RECORD).get("status") != RUNNING:
            return
        publish_strategy(name, ended=status, model_of=model_source if log_model else None)
    except Exception as err:  # noqa: BLE001 - the stage's own exit code is what matters
        if user_error:
            return
        print(
            f"warning: MLflow run of {name} not marked {status} ({first_line(err)})",
            file=sys.stderr,
            flush=True,
        )


def run_forwarding_signals(cmd: list[str], env: dict, error_file: Path) -> tuple[int, bool]:
    """Run torchrun; a SIGTERM/SIGINT sent to this process (docker stop, Ctrl-C) goes on to
    it, so the workers checkpoint instead of being orphaned. Its stderr is passed through
    until a worker reports a user error: torchrun's failure report after that is noise around
    the one line the user needs, which the caller prints. Returns torchrun's exit code and
    whether the run was stopped by such a signal."""
    child = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE)

    stderr = child.stderr
    assert stderr is not None  # stderr=PIPE

    def relay() -> None:
        # bytes as they come, not lines: a progress bar redraws itself after a "\r" with no
        # "\n", which a text-mode line reader would turn into a new line at every redraw
        while chunk := os.read(stderr.fileno(), 65536):
            if error_file.stat().st_size == 0:
                sys.stderr.buffer.write(chunk)
                sys.stderr.flush()

    relay_thread = threading.Thread(target=relay, daemon=True)
    relay_thread.start()

    stopped = []

    def forward(signum: int, frame: types.FrameType | None) -> None:
        stopped.append(signum)
        child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = child.wait()
        relay_thread.join(timeout=10)
        return code, bool(stopped)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
