"""Start one strategy's training under torchrun's elastic agent, with the right number of
processes.

`python -m pipeline.train STRATEGY` lands here when it is not yet a worker: the config is
validated, the devices resolved and the outputs checked in this one process, so bad input
fails fast with one line and exit code 2 instead of N tracebacks. Then this process becomes
the job's elastic agent (what `torchrun` runs, as a library: rendezvous, restarts, signal
handling, several nodes) and starts the workers, with the chosen GPUs as
CUDA_VISIBLE_DEVICES. It forks them, so they start with torch and the project already
imported, unless the CUDA driver was initialised here (devices.workers_can_fork): then it
spawns them. A user error a worker finds later comes back the same way (one line, exit 2)
through a file, and the run's writer says how it ended through another (`stage_exit`).
"""

from __future__ import annotations

import errno
import functools
import gc
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

from pipeline import strategies
from pipeline.batch_plan import BatchPlan
from pipeline.checkpoints.identity import code_digests
from pipeline.config import Config, to_yaml
from pipeline.context import PLACEMENT_ENV
from pipeline.core_wait import others_runnable, threads_per_process
from pipeline.data.fashion_mnist import train_samples
from pipeline.errors import (
    DISK_FULL_EXIT,
    ERROR_FILE_ENV,
    FAILURE_EXIT,
    NO_SPACE,
    OUTCOME_FILE_ENV,
    STOPPED_EXIT,
    USER_ERROR_EXIT,
    Outcome,
    UserError,
    first_line,
)
from pipeline.interrupts.faults import ENV as FAULT_ENV
from pipeline.interrupts.faults import parse_faults
from pipeline.launch import horovod_run, one_node_rendezvous, worker
from pipeline.launch.devices import (
    choose_devices,
    cuda_driver_initialised,
    placement,
    workers_can_fork,
)
from pipeline.launch.machine_warmup import MARKERS as WARMUP_MARKERS
from pipeline.launch.machine_warmup import warm_once
from pipeline.launch.topology import (
    Topology,
    check_job,
    check_rendezvous_port,
    launch_settings,
    resolve_topology,
)
from pipeline.locks import holding
from pipeline.results import CHECKPOINTS, RESULTS, RUN_RECORD, read_checkpoint_record
from pipeline.run_spec import resolve_run
from pipeline.strategies.base import Launcher
from pipeline.timeline import mark
from pipeline.tracking.mlflow_run import read_record
from pipeline.tracking.publisher import STORE_READY_WAIT_S, Publisher
from pipeline.tracking.stage_end import StageEnd
from pipeline.tracking.store import tracking_uri
from pipeline.tracking.stream import STREAM_ENV

# how the workers start, where a benchmark compares the two (benchmarks/startup.py): fork
# (the default) or spawn (where the CUDA driver was initialised in the launcher)
START_METHOD_ENV = "PARALLEL_LAB_START_METHOD"
NUMA_DECIDED: Any = object()  # launch_config's numa_options until it sets the one it decided
# torch.compile's caches in the project, outside DVC's outputs (git- and DVC-ignored): inductor's
# compiled graphs and kernels, and Triton's (under it, unless TRITON_CACHE_DIR says otherwise)
COMPILE_CACHE = Path(".cache/torch-compile")


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


class Job(NamedTuple):
    """A validated launch of one strategy's stage."""

    name: str
    nproc: int  # processes on this node
    gpus: list[str]  # the GPUs they use, [] for the CPU
    topology: Topology
    plan: BatchPlan  # the batch as one process trains it
    limit_train: int | None  # data.limit_train: the training samples the run draws from
    max_restarts: int  # checkpoint.max_restarts
    launched_by: Launcher = "torchrun"  # StrategyFacts.launched_by


def validate(name: str, cfg: Config) -> Job:
    """The launch `cfg` asks for (params.yaml with the overrides, its keys already checked),
    or a UserError: the strategies, the faults a test injects, the devices, the processes the
    strategy needs there and the nodes."""
    strategies.check_names(cfg.strategies)
    parse_faults(os.environ.get(FAULT_ENV))
    gpus = choose_devices(cfg.devices, os.environ)
    spec = resolve_run(cfg, name)  # as each worker resolves its own (run_spec.py)
    if spec.facts.launched_by == "horovodrun" and cfg.checkpoint.max_restarts:
        raise UserError(
            f"checkpoint.max_restarts: got {cfg.checkpoint.max_restarts}, but {name}'s workers "
            "are horovodrun's, which restarts none; expected 0 (run the stage again: it "
            "resumes from its last checkpoint)"
        )
    nproc = spec.strategy.nproc(spec.options, spec.plan, len(gpus))
    topology = resolve_topology(cfg.dist, os.environ, name)
    check_job(spec.facts, topology, nproc, spec.plan, spec.options)
    spec.dims(nproc * topology.min_nodes)  # the model's channels split over its shards
    check_rendezvous_port(topology)
    max_restarts = cfg.checkpoint.max_restarts
    return Job(
        name,
        nproc,
        gpus,
        topology,
        spec.plan,
        spec.data.limit_train,
        max_restarts,
        spec.facts.launched_by,
    )


def launch(job: Job, worker_cfg: Config, publisher: Publisher) -> StageEnd:
    """Run the strategy's workers under torchrun's elastic agent, training with `worker_cfg`
    (the stage's config without the dist.* overrides: launch_free), their run's stream
    followed by `publisher`; how they ended. The caller holds the stage's lock
    (`one_run_at_a_time`)."""
    from torch.distributed.launcher.api import elastic_launch

    name, gpus = job.name, job.gpus
    for directory in (RESULTS / name, CHECKPOINTS / name):
        check_writable(directory)
    check_kept_files(name)
    job.plan.drawing_from(train_samples(job.limit_train))  # the data is there, and holds a batch
    where = f"GPUs {','.join(gpus)}" if gpus else "CPU"
    if len(set(gpus)) < len(gpus):
        where += (
            " (ranks share a GPU, over gloo since NCCL refuses that: each rank's memory is "
            "real, their time is turns on one device, not a speed)"
        )
    if job.topology.multi_node:
        where += (
            f", this node of {job.topology.nnodes} (c10d rendezvous {job.topology.rdzv_id} at "
            f"{job.topology.endpoint})"
        )
    print(f"launch[{name}]: {job.nproc} process(es) on {where}", flush=True)
    with (
        tempfile.TemporaryDirectory(prefix="parallel-lab-launch-") as tmp,
        workers_environment(gpus, job.nproc, Path(tmp), publisher.stream) as files,
    ):
        forks = workers_can_fork(gpus, cuda_driver_initialised())
        start = os.environ.get(START_METHOD_ENV) or ("fork" if forks else "spawn")
        if start == "fork":
            prepare_forks()
            warm_up()
        mark("agent")  # validated, torch and the project imported
        before_the_workers(name, gpus, publisher)
        settings = launch_settings(job.nproc, job.max_restarts, job.topology)
        with torchrun_agent() as agent:
            if job.launched_by == "horovodrun":  # Horovod's ranks meet through its own
                params = to_yaml(worker_cfg)
                code, agent.signalled = horovod_run.run(name, job.nproc, params, Path(tmp))
                if code:
                    agent.code, agent.failure = code, f"horovodrun {exit_words(code)}"
            else:
                config = launch_config(settings, start, len(set(gpus)), Path(tmp))
                elastic_launch(config, worker.entry)(name, worker_cfg)
        mark("workers ended")
        user_error = files.error.read_text().strip() if files.error.exists() else ""
        outcome = read_outcome(files.outcome)
    topology = job.topology
    return StageEnd(
        name,
        stage_exit(agent.code, agent.signalled, outcome, user_error),
        agent.code,
        agent.signalled,
        agent.failure,
        user_error,
        outcome,
        (topology.nnodes, topology.join_timeout_s) if topology.multi_node else None,
    )


def before_the_workers(name: str, gpus: list[str], publisher: Publisher) -> None:
    """What no strategy's epochs may pay (issue 51), paid before the workers start and marked
    in the stage's timeline: the machine's cold start on a GPU (once per boot:
    machine_warmup.py) and the MLflow store's making (the publisher's, at once)."""
    if gpus:
        warmed = warm_once(WARMUP_MARKERS, [Path(torch.__file__).parents[1]])
        if warmed is not None:
            print(
                f"launch[{name}]: first CUDA stage since this machine booted: read "
                f"{warmed.files} CUDA libraries ({warmed.mib:.0f} MiB) into the page cache in "
                f"{warmed.seconds:.1f} s, before any epoch",
                flush=True,
            )
    mark("machine warmed")
    if not publisher.make_store():
        print(
            f"warning: the MLflow store at {tracking_uri()} was not ready in "
            f"{STORE_READY_WAIT_S:.0f} s; training starts beside its making",
            file=sys.stderr,
            flush=True,
        )
    mark("MLflow store ready")


@contextmanager
def one_run_at_a_time(name: str, multi_node: bool) -> Iterator[None]:
    """The strategy's stage lock (pipeline/locks.py) while the block runs: a second start of
    the stage in this project is refused at once, naming this one. Not for a job of several
    nodes, whose launchers run the same stage in the same directory where it is shared: its
    rendezvous (dist.rdzv_id) keeps one job's nodes together and another job's apart."""
    if multi_node:
        yield
        return
    with holding(f"train-{name}", f"train[{name}]"):
        yield


class WorkerFiles(NamedTuple):
    """Where a worker's user error, the run's outcome and the run's stream come back."""

    error: Path
    outcome: Path
    stream: Path


@contextmanager
def workers_environment(
    gpus: list[str], nproc: int, tmp: Path, stream: Path
) -> Iterator[WorkerFiles]:
    """This process's environment as the workers get it (they are its children), for the
    launch only: the next launch in the same process (the quickstart's) starts from the
    user's again. Yields the files the workers answer through: two in `tmp`, and `stream`,
    the stage's MLflow publisher's."""
    files = WorkerFiles(tmp / "error.txt", tmp / "outcome", stream)
    saved, saved_tempdir = dict(os.environ), tempfile.tempdir
    # torch.multiprocessing keeps a raised worker's error in a pytorch-errorfile-*.pickle of
    # the temporary directory and never removes it: in the stage's own, it goes with it
    tempfile.tempdir = str(tmp)
    visible, slots = placement(gpus)
    # "" hides every GPU: `devices: cpu` must mean the CPU even on a GPU machine
    os.environ.update(
        {
            "CUDA_VISIBLE_DEVICES": ",".join(visible),
            PLACEMENT_ENV: ",".join(map(str, slots)),
            ERROR_FILE_ENV: str(files.error),
            OUTCOME_FILE_ENV: str(files.outcome),
            STREAM_ENV: str(files.stream),
        }
    )
    # the cores' even share where they are free, one thread a process where other work
    # holds them: OpenMP's threads on a busy core wait for each other (core_wait.py)
    threads = threads_per_process(os.cpu_count() or 1, nproc, others_runnable())
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    # a repeat run loads what an earlier one compiled instead of compiling again (issue 29),
    # in a container too, where the repository is the mount that outlives it; where the user
    # named a cache, theirs
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(COMPILE_CACHE.resolve()))
    try:
        yield files
    finally:
        os.environ.clear()
        os.environ.update(saved)
        tempfile.tempdir = saved_tempdir


def warm_up() -> None:
    """What every worker loads before its first step, loaded once here, before the workers
    are forked, so they inherit it instead of each loading its own: torch._dynamo (the optimizer's
    first call imports it: half a second) and the digests of the run's code (identity.py)."""
    import torch._dynamo  # noqa: F401

    code_digests()


def read_outcome(path: Path) -> Outcome | None:
    """What the run's writer said of how it ended, if it got that far."""
    try:
        return Outcome(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def stage_exit(
    torchrun_code: int, signalled: bool, outcome: Outcome | None, user_error: str
) -> int:
    """The stage's exit code (pipeline/errors.py lists them) from torchrun's, whether this
    process forwarded a stop signal to it, the writer's outcome and a worker's user error
    (its line: a full disk's has a code of its own).
    torchrun exits non-zero whenever it forwarded a signal, whatever its workers did then."""
    if user_error:
        return DISK_FULL_EXIT if user_error.startswith(NO_SPACE) else USER_ERROR_EXIT
    if torchrun_code == 0 or (signalled and outcome is Outcome.FINISHED):
        return 0
    if outcome is Outcome.DID_NOT_FIT:  # a result: dvc repro goes on to compare
        return 0
    if outcome is Outcome.STOPPED:
        return STOPPED_EXIT
    # a crash; also a rank that died after the writer finished, and a stop whose checkpoint
    # did not happen (the grace period ran out)
    return FAILURE_EXIT


def launch_config(settings: dict[str, Any], start_method: str, gpus: int, log_dir: Path) -> Any:
    """torchrun's LaunchConfig for `settings`, its NUMA binding decided as its own default
    would decide it (the torch build's default options where the node's workers use all
    `gpus`), but from the GPU count this launcher already has: LaunchConfig asks
    torch.accelerator.is_available() instead, which initialises the CUDA driver in this
    process, and a worker forked after that cannot use CUDA. The agent's per-rank files go
    under `log_dir`, the stage's temporary directory: by default torch makes a
    /tmp/torchelastic_* directory for them and leaves it behind, one per stage."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig

    logs = DefaultLogsSpecs(log_dir=str(log_dir / "torchelastic"))
    try:
        from torch._utils_internal import get_default_numa_options
    except ImportError:  # a torch from before NUMA binding (2.9), whose LaunchConfig asks nothing
        return LaunchConfig(**settings, start_method=start_method, logs_specs=logs)
    numa = None
    if gpus and gpus == settings["nproc_per_node"]:
        numa = get_default_numa_options()
    # LaunchConfig asks its question only when numa_options is None
    config = LaunchConfig(
        **settings, start_method=start_method, numa_options=NUMA_DECIDED, logs_specs=logs
    )
    config.numa_options = numa
    return config


@dataclass
class AgentEnd:
    """How torchrun's elastic agent ended: its exit code as torchrun's would be, whether a
    stop signal stopped it, and what failed, in words."""

    code: int = 0
    signalled: bool = False
    failure: str = ""


@contextmanager
def torchrun_agent() -> Iterator[AgentEnd]:
    """The block runs torchrun's elastic agent in this process (`elastic_launch`): it
    rendezvouses, starts the workers, restarts them after a failure
    (`checkpoint.max_restarts`) and, on SIGTERM/SIGINT, passes the signal on and waits for
    them (30 s, then SIGKILL). Forked, the workers inherit this process's imports (torch, the
    project) instead of loading them again. What the agent raised becomes the AgentEnd."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    # The agent's log is torchrun's console chatter; a worker prints its own traceback and
    # the launcher the one line that matters.
    for logger in ("torch.distributed.elastic", "torch.multiprocessing"):
        logging.getLogger(logger).setLevel(logging.CRITICAL)
    one_node_rendezvous.register()
    # the agent's handlers (raise SignalException) outlive it: a process that goes on after
    # the launch (the quickstart's) gets its own back
    handlers = {signum: signal.getsignal(signum) for signum in worker.AGENT_SIGNALS}
    end = AgentEnd()
    try:
        yield end
    except SignalException:
        end.code, end.signalled = FAILURE_EXIT, True
    except ChildFailedError as err:
        rank, failure = err.get_first_failure()
        error, trace = worker_error(failure.message)
        if trace:  # the worker's own traceback, which its forked process had no way to print
            print(trace.rstrip(), file=sys.stderr, flush=True)
        words = f"worker rank {rank} {exit_words(failure.exitcode)}"
        end.code = failure.exitcode or FAILURE_EXIT
        end.failure = words + (f" ({error})" if error else "")
    except RendezvousError as err:
        end.code, end.failure = FAILURE_EXIT, f"rendezvous failed ({first_line(err)})"
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def worker_error(message: Any) -> tuple[str, str]:
    """A failed worker's exception as torchelastic recorded it (`ProcessFailure.message`: a
    dict from the worker's error file, or words of torch's own where there was none) ->
    ('Type: message' in one line, the traceback); empty where the worker left no exception
    (a signal, a plain exit)."""
    if not isinstance(message, dict):
        return "", ""
    trace = str(message.get("extraInfo", {}).get("py_callstack", ""))
    error = str(message.get("message", "")).strip()
    return (error.splitlines() or [""])[0], trace


def exit_words(code: int) -> str:
    """A worker's exit code in words: 'exited with code 1', 'was killed by SIGKILL'."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            pass
    return f"exited with code {code}"


@functools.cache
def prepare_forks() -> None:
    """Before each fork: flush what this process buffered (a child would write it again) and
    freeze the objects it has, so a child's garbage collection never finalizes the agent's
    own (its TCP store, whose thread the child does not have)."""

    def before() -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        gc.freeze()

    os.register_at_fork(before=before)
