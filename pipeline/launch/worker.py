"""One torchrun worker: its process group, the training session, then an orderly exit.

The distributed state comes from torchrun's environment once, here (`DistContext.from_env`:
RANK, LOCAL_RANK, WORLD_SIZE, the visible GPUs) and is passed down explicitly.

The exit happens in a fixed order: the session joins its own threads (MLflow's), the process
groups are destroyed, what still refers to them is freed, and only when no communication
thread is left does the interpreter shut down (`exit_cleanly`).
"""

from __future__ import annotations

import gc
import os
import signal
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import NoReturn, cast

import torch
import torch.distributed as dist

from pipeline.config import Config, load_config
from pipeline.context import DistContext
from pipeline.data.fashion_mnist import train_samples
from pipeline.did_not_fit import RunDidNotFit
from pipeline.errors import (
    BAD_INPUT,
    DISK_FULL_EXIT,
    ERROR_FILE_ENV,
    FAILURE_EXIT,
    OUTCOME_FILE_ENV,
    SIGTERM_EXIT,
    USER_ERROR_EXIT,
    Outcome,
    no_space_line,
    out_of_space,
)
from pipeline.files import atomic_write
from pipeline.interrupts.stop import StopRequest
from pipeline.recording.live import terminal_columns
from pipeline.results import CHECKPOINTS, RESULTS, RunSummary
from pipeline.run_spec import resolve_run
from pipeline.timeline import mark
from pipeline.tracking.stream import STREAM_ENV
from pipeline.training.session import start

TASKS = Path("/proc/self/task")
# Name prefixes of the threads a gloo process group runs (its work loop and its transport's
# event loop): they exist for as long as the group object does.
COMM_THREADS = ("pt_gloo", "gloo_")
# what torchrun's agent handles and passes on (TORCHELASTIC_SIGNALS_TO_HANDLE's default)
AGENT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def entry(
    strategy: str,
    cfg: Config | None = None,
    overrides: list[str] | None = None,
    params: str = "params.yaml",
) -> None:
    """A worker's whole life: its process group, the run built and trained, an orderly end.
    Started by the launcher's elastic agent (pipeline/launch/launcher.py), forked from it,
    `cfg` is what the launcher validated, and the process ends when this returns (a non-zero
    code as SystemExit) without the interpreter's shutdown (multiprocessing's children leave
    through os._exit). Started by `torchrun -m pipeline.train STRATEGY` by hand (`cfg`
    None), it reads params.yaml with `overrides` and its interpreter shuts down at the end
    (`exit_cleanly`); so does one that horovodrun started, which reads `params`, the config
    the launcher validated (launch/horovod_run.py)."""
    by_hand = cfg is None
    if not by_hand:
        # the agent's handlers (raise SignalException) came with the fork; until the run
        # installs its own, a stop signal ends a worker that has nothing to save yet
        for signum in AGENT_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)
    if not by_hand and os.environ.get("OMP_NUM_THREADS", "").isdigit():
        # torch read the variable when the launcher imported it, before the launcher set the
        # workers' share; a forked worker takes its share explicitly
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    answer = Answer()
    with answer.of_run(strategy):
        # the Config is resolved here, once, into the run's spec: nothing below sees the rest
        if cfg is None:  # started by hand: params.yaml is read here
            cfg = load_config(params, overrides or [])
        ctx = DistContext.from_env()
        # the batch as this job trains it, checked before anything is built (as the launcher
        # checked it for every world size the job may have)
        spec = resolve_run(cfg, strategy, (ctx.world_size, train_samples(cfg.data.limit_train)))
        mark("worker", ctx.rank)
        live = os.environ.get(STREAM_ENV)  # the launcher's MLflow publisher follows it
        terminal = terminal_columns(sys.stderr)  # the launcher's: a worker writes to it
        with process_group(ctx) as answer.stop:
            trainer, session = start(spec, ctx, answer.stop, terminal, Path(live) if live else None)
            try:
                answer.ended(trainer.fit(session), trainer.training.run.writer)
            finally:
                # the run's modules hold its process groups: let go of them before the
                # groups are destroyed, so that destroying them frees them and joins their
                # threads (`left_threads_warning`)
                del trainer, session
    if by_hand:
        exit_cleanly(answer.code)
    left_threads_warning()
    if answer.code:
        raise SystemExit(answer.code)
    hand_back_stop_signals(answer.stop)


class Answer:
    """How the run ended in this worker, as the launcher hears it: the exit code, a user's
    error as one line (`leave_line`), and the writer's outcome in a file."""

    def __init__(self) -> None:
        self.code = 0
        self.stop: StopRequest | None = None  # the run's, once its process group is up

    def ended(self, summary: RunSummary | None, writer: bool) -> None:
        """The run returned: finished, or stopped at a checkpoint (`summary` None)."""
        outcome = Outcome.STOPPED if summary is None else Outcome.FINISHED
        if writer:
            tell_outcome(outcome)
        self.code = SIGTERM_EXIT if outcome is Outcome.STOPPED else 0

    @contextmanager
    def of_run(self, strategy: str) -> Iterator[None]:
        """What the run raises and the launcher should hear as one line or an outcome."""
        try:
            yield
        except BAD_INPUT as err:
            leave_line(str(err))
            self.code = USER_ERROR_EXIT
        except RunDidNotFit:
            # its record is in results/; the launcher says it. Non-zero: the agent stops the
            # other ranks, which may wait on this one in a collective
            tell_outcome(Outcome.DID_NOT_FIT)
            self.code = FAILURE_EXIT
        except BaseException as err:  # torch's CheckpointException is not an Exception
            # a full disk under the run's checkpoints or results (a save's, on every rank)
            full = out_of_space(err, CHECKPOINTS / strategy, RESULTS / strategy)
            if full is None:
                raise
            line = no_space_line(full, "run the stage again: it resumes from its last checkpoint")
            leave_line(line)
            self.code = DISK_FULL_EXIT


def tell_outcome(outcome: Outcome) -> None:
    if os.environ.get(OUTCOME_FILE_ENV):
        atomic_write(Path(os.environ[OUTCOME_FILE_ENV]), outcome.value)


def hand_back_stop_signals(stop: StopRequest | None) -> None:
    """A finished run's worker returns to torch's wrapper, which hands the agent its return
    value and waits until the agent has read it. An agent that is stopping (it passed a stop
    signal on) never reads it: it signals the workers it is waiting for and kills them 30 s
    later. So from here a stop signal ends this process, as it ends any process with nothing
    left to do, and one that came while the run was finishing (the run still wrote everything)
    ends it now."""
    for signum in AGENT_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
    if stop is not None and stop.signum is not None:  # read after the reset: none is missed
        signal.raise_signal(stop.signum)


def leave_line(line: str) -> None:
    """The one line of a user's error, for the launcher to say: the agent turns any worker
    exit into its own failure."""
    if os.environ.get(ERROR_FILE_ENV):
        Path(os.environ[ERROR_FILE_ENV]).write_text(line)
    else:
        print(f"error: {line}", file=sys.stderr, flush=True)


@contextmanager
def process_group(ctx: DistContext) -> Iterator[StopRequest]:
    """The job's process group while the block runs, destroyed after it; yields the stop
    request every rank votes on (stop.py)."""
    dist.init_process_group(
        ctx.backend,
        store=attempt_store(os.environ),
        rank=ctx.rank,
        world_size=ctx.world_size,
        device_id=ctx.device if ctx.backend == "nccl" else None,  # NCCL's eager connect
    )
    mark("process group", ctx.rank)
    # the SIGTERM vote travels on a CPU group so it never waits on the GPU
    control = None
    if ctx.on_cuda and ctx.world_size > 1:
        control = cast(dist.ProcessGroup, dist.new_group(backend="gloo"))
    try:
        yield StopRequest(control, ctx.world_size)
    finally:
        dist.destroy_process_group()


def left_threads_warning(tasks: Path = TASKS) -> bool:
    """Where a destroyed process group's threads still run, free what holds the group (a
    reference cycle), whose freeing joins them, and say so if a thread outlived it anyway
    (every test run checks this line never appears). True when one did. Where none is left,
    as after a plain destroy, the collection is skipped: it is a tenth of a second of every
    stage's exit on 2 cores."""
    left = comm_threads(tasks)
    if left or not tasks.is_dir():  # no thread list to go by (not Linux): collect anyway
        gc.collect()
        left = comm_threads(tasks)
    if left:
        print(
            f"warning: {len(left)} communication thread(s) ({', '.join(sorted(set(left)))}) "
            "outlived the process group",
            file=sys.stderr,
            flush=True,
        )
    return bool(left)


def exit_cleanly(code: int) -> NoReturn:
    """Exit once the destroyed process groups are gone with their threads.

    A gloo group's threads end only when the group object is freed, and after each collective
    its thread drops the finished work, and the tensors it holds, a moment after the caller
    has moved on. Where the interpreter is already shutting down by then, freeing a tensor
    Python owned ends that thread inside a C++ destructor and the process aborts ("terminate
    called without an active exception", SIGABRT) after its work was done. So the groups are
    freed first (`left_threads_warning`): the run's modules sit in reference cycles, and the
    strategies' `Run.release` dropped what global caches keep. Should a thread survive, the
    process leaves without the interpreter's shutdown, where that thread can do no harm."""
    if left_threads_warning():
        sys.stdout.flush()
        os._exit(code)
    sys.exit(code)


def comm_threads(tasks: Path = TASKS) -> list[str]:
    """The names of this process's threads that belong to a process group ([] where the
    system does not list threads)."""
    names = []
    for comm in tasks.glob("*/comm"):
        try:
            name = comm.read_text().strip()
        except OSError:  # the thread ended while we looked
            continue
        if name.startswith(COMM_THREADS):
            names.append(name)
    return names


def attempt_store(env: Mapping[str, str]) -> dist.Store:
    """The rendezvous store, with keys scoped to this torchrun attempt. torchrun keeps its
    store across worker restarts but torch 2.14's env:// init assumes a fresh one, so a
    restarted process group would read the dead attempt's addresses and hang connecting.
    Without torchrun's agent (SLURM's one task per process: launch/slurm.py) no process hosts
    the store, so rank 0 does, as torch's env:// init has it."""
    store = dist.TCPStore(
        env["MASTER_ADDR"],
        int(env["MASTER_PORT"]),
        int(env["WORLD_SIZE"]),
        is_master="TORCHELASTIC_RUN_ID" not in env and env.get("RANK") == "0",
        timeout=timedelta(minutes=10),
    )
    return dist.PrefixStore(
        f"parallel-lab/attempt-{env.get('TORCHELASTIC_RESTART_COUNT', '0')}", store
    )
