"""A train stage's MLflow run, published by a process of its own beside the workers.

`python -m pipeline.train` forks the stage's publisher (`Publisher`) before it imports torch,
so that MLflow's imports run beside the launcher's. It makes the store, then follows the run
from what the run keeps on disk: whenever the run's files change (the checkpoint record, the
summary) or an epoch ends in the stage's stream (stream.py), it pushes the run through the
same idempotent push as `python -m pipeline.publish` (`kept_runs.publish_strategy`'s), and
once more when the launcher says the workers are gone. It sends the stream's step metrics as
they come and runs MLflow's system-metrics sampler. So a training process never imports
MLflow, never shares its interpreter's lock with MLflow's threads and never waits for the
server: on 2 CPU cores a tiny stage's first epoch took 3.7 s with MLflow in the writer against
0.8 s without, and the whole stage 12 s against 9.5 s (docs/performance.md, "A train stage's
fixed cost").

Nothing is lost on the way: run.json, the checkpoint record and results/ are the truth, and
the launcher waits for the publisher before it exits. Whatever a killed stage left unpushed,
its rerun or `python -m pipeline.publish` pushes. A worker started by `torchrun` by hand has
no publisher: its run is pushed by `python -m pipeline.publish` once it ends.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any, NamedTuple, Optional

from pipeline.errors import (
    DISK_FULL_EXIT,
    NO_SPACE,
    UserError,
    first_line,
    no_space_line,
    out_of_space,
)
from pipeline.files import atomic_write
from pipeline.results import CHECKPOINT_RECORD, CHECKPOINTS, RESULTS, SUMMARY
from pipeline.timeline import PUBLISHER_CPU, mark
from pipeline.tracking.kept_runs import kept_run
from pipeline.tracking.mlflow_run import RUNNING, publish_run, write_record
from pipeline.tracking.preload import client_code
from pipeline.tracking.store import (
    client,
    experiment_id,
    sqlite_database,
    store_creation,
    tracking_uri,
)
from pipeline.tracking.stream import Point, Read, opened
from pipeline.tracking.system_metrics import publish_final_sample, system_metrics_monitor

POLL_S = 0.05  # how often the publisher looks at the run's files and stream: well under an epoch
RETRY_S = 5.0  # how often the final push tries again while the server is away
QUEUED_AT_MOST = 1000  # step points waiting for MLflow; later ones are dropped until sent
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# where the kernel refuses SCHED_IDLE (never seen on Linux, which lets any process lower its
# own policy): the lowest niceness, about 1.5% of a core against a training thread's 100%
PUBLISHER_NICENESS = 19
# how long the launcher waits for the store to be made before it starts the workers: a new
# SQLite store takes about 0.8 s of migrations on 2 CPU cores; a server that does not answer
# fails fast (store.HTTP_ENV), and past this the workers start all the same
STORE_READY_WAIT_S = 60.0
# how long the publisher may take past the final push's own wait for the server (its calls'
# timeouts, the step metrics, the last system-metrics sample) before the launcher gives up on
# it: the run is kept locally either way
PUBLISHER_SLACK_S = 120.0


class Follower:
    """The publisher's side: one strategy's run, pushed from its files as they change."""

    def __init__(self, name: str, stream: Path, stop: threading.Event):
        """`stop`: a stop was requested (a SIGTERM), so the final push makes one attempt."""
        self.name, self.stream, self.stop = name, stream, stop
        self.read = Read()
        self.seen: tuple[Any, ...] | None = None  # the files as they were at the last push
        # the run's id in the store MLflow is pointed at, once a push of this stage made it
        self.run_id: str | None = None
        self.monitor: Any = None  # MLflow's system-metrics sampler, once the run exists
        self.client: Any = None  # for the step metrics
        self.steps_warned = False

    def files(self) -> tuple[Any, ...]:
        """What the run's files look like now: a push follows any change."""
        return (
            stamp(CHECKPOINTS / self.name / CHECKPOINT_RECORD),
            stamp(RESULTS / self.name / SUMMARY),
            len(self.read.epochs),
        )

    def follow(self) -> None:
        """Take in what the stream said since the last call, and push what changed."""
        self.read.take(self.stream, QUEUED_AT_MOST)
        if self.read.head is None:
            return  # the writer has not opened the run: run.json may be an older run's
        now = self.files()
        if now != self.seen:
            self.seen = now
            if self.push(RUNNING):
                self.start_system_metrics()
        self.send_points()

    def end(self, ended: str, wait_s: float, give_up: bool) -> None:
        """The workers are gone: the last push, `ended` the run's status where its files do
        not say it finished (RUNNING: as they say), retrying for `wait_s` unless a stop came
        (`give_up`, or one passed on to this process meanwhile)."""
        self.read.take(self.stream, QUEUED_AT_MOST)
        if self.read.head is None:
            return
        self.send_points()  # before the final status
        self.push(ended, wait_s, lambda: give_up or self.stop.is_set())
        self.send_points()  # those still waiting for the run to exist

    def push(
        self, ended: str, wait_s: float = 0.0, give_up: Callable[[], bool] = lambda: False
    ) -> bool:
        """Push what MLflow lacks; True when nothing is left pending. The run's status is
        kept in its run.json first, so a push that fails leaves it for `python -m
        pipeline.publish`. Within `wait_s` it tries again every RETRY_S; never raises on an
        outage (a full local disk does raise)."""
        try:
            run = kept_run(self.name, ended, list(self.read.epochs.values()))
        except UserError as err:  # the run's files disagree: the next stage says so
            print(f"warning: MLflow run of {self.name} not pushed: {err}", file=sys.stderr)
            return False
        if run is None:
            return True
        save = partial(write_record, run.record_path, run.record)
        save()  # its status first, whatever becomes of the push
        deadline = time.monotonic() + wait_s
        while True:
            try:
                publish_run(run.record, run.history, run.artifacts, save=save)
                self.run_id = run.record["run_id"]  # in this store: publish_run made sure
                return True
            except OSError as err:
                if out_of_space(err) is not None:
                    raise  # no outage: a full disk here, no retry mends (the caller says so)
                failure = first_line(err)
            except Exception as err:  # noqa: BLE001 - any failure of the server is an outage
                full = out_of_space(err, Path(sqlite_database(tracking_uri()) or "mlruns"))
                if full is not None:  # the store's disk: training goes on, the run is kept
                    then = "run `python -m pipeline.publish`; kept locally"
                    print(f"warning: {no_space_line(full, then)}", file=sys.stderr, flush=True)
                    return False
                failure = first_line(err)
            left = deadline - time.monotonic()
            if left <= 0 or give_up() or self.stop.wait(min(RETRY_S, left)):
                break
        print(
            f"warning: MLflow at {tracking_uri()} unreachable ({failure}); kept locally, "
            f"pending: {run.pending()}; retrying at the next epoch, at the end of the stage, "
            "or run `python -m pipeline.publish`",
            file=sys.stderr,
            flush=True,
        )
        return False

    def start_system_metrics(self) -> None:
        """MLflow's own sampler (CPU, memory, disk, network and, through NVML, GPU utilisation
        and memory) logging `system/...` into the run every head.system_metrics_s seconds."""
        head, run_id = self.read.head, self.run_id
        if self.monitor is not None or head is None or head.system_metrics_s is None:
            return
        if run_id is None:
            return  # MLflow is away: the timeline is lost, never the run
        try:
            monitor = system_metrics_monitor(
                run_id, head.system_metrics_s, head.gpu_uuids, head.resume, tracking_uri()
            )
            monitor.start()
            self.monitor = monitor
        except Exception as err:  # noqa: BLE001 - a timeline is never worth a failed run
            print(
                f"warning: no MLflow system metrics ({first_line(err)})",
                file=sys.stderr,
                flush=True,
            )

    def send_points(self) -> None:
        """The step metrics that came, in batches; they wait for the run to exist in MLflow. A
        failed send is dropped with one warning: a live chart, never the record."""
        points, run_id = self.read.points, self.run_id
        if not points or run_id is None:
            return
        self.read.points = []
        try:
            self.client = self.client or client()
            log_points(self.client, run_id, points)
        except Exception as err:  # noqa: BLE001 - a live chart is never worth a failed run
            if not self.steps_warned:
                self.steps_warned = True
                print(
                    f"warning: MLflow step metrics not logged ({first_line(err)}); the "
                    "per-epoch metrics are kept and published as usual",
                    file=sys.stderr,
                    flush=True,
                )

    def close(self) -> None:
        """End the system-metrics sampler, its last sample logged."""
        if self.monitor is not None:
            publish_final_sample(self.monitor)
            self.monitor = None


def stamp(path: Path) -> tuple[int, int] | None:
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    return info.st_mtime_ns, info.st_size


def log_points(mlflow_client: Any, run_id: str, points: list[Point]) -> None:
    from mlflow.entities import Metric

    metrics = [Metric(k, v, ts, step) for step, values, ts in points for k, v in values.items()]
    for i in range(0, len(metrics), 1000):  # MLflow takes at most 1000 per batch
        mlflow_client.log_batch(run_id, metrics=metrics[i : i + 1000])


class StoreTurn(NamedTuple):
    """The launcher's word to make the store (`go`: the stage was accepted), the publisher's
    that it is made (`ready`), and the experiment to make in it."""

    go: Any  # multiprocessing events: their type is the fork context's
    ready: Any
    experiment: str


class Ending(NamedTuple):
    """The launcher's word that the workers are gone (`event`), and how the run ended (`file`:
    its status where the files do not say it finished, and whether a stop came)."""

    event: Any
    file: Path

    def read(self) -> tuple[str, bool]:
        said = json.loads(self.file.read_text())
        return said["ended"], said["give_up"]


def publisher_main(
    name: str, stream: Path, parent: int, store: StoreTurn, ending: Ending, wait_s: float
) -> None:
    """The publisher process: idle-priority beside the workers, and stopped by a SIGTERM or
    SIGINT only in its waits: what the run kept is still pushed, one try. Once the launcher
    has accepted the stage (`store.go`), it makes the store and the experiment (a new SQLite
    store's migrations: about a second of CPU) and says so (`store.ready`), for which the
    launcher waits before it starts the workers: the first stage on a new store no longer
    trains beside its creation (issue 51). It follows the run until the launcher's `ending`
    (the final push then waits up to `wait_s` for an absent server), or until the launcher
    is gone (`parent` no longer its parent: one last push)."""
    stop = threading.Event()

    def stopping(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for signum in STOP_SIGNALS:
        signal.signal(signum, stopping)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # blocked by its fork
    follower = Follower(name, stream, stop)
    try:
        # now, while the launcher imports torch on another core (its start is one thread)
        with contextlib.suppress(Exception):  # a broken MLflow says so at its first push
            client_code(tracking_uri())
        # a refused stage makes no store; an opened stream means the stage was accepted
        # (a caller that never says go: the tests' own publishers)
        while not store.go.wait(POLL_S) and not opened(stream):
            if os.getppid() != parent:
                return
        with contextlib.suppress(Exception), store_creation(tracking_uri()):
            experiment_id(client(), store.experiment)  # an outage: the first push reports it
        # Idle priority from here on, beside the workers' epochs. Before, the launcher waits
        # for the store and no epoch runs: at idle priority on a machine whose every core
        # something else kept busy, its making once took over the launcher's 60 s.
        run_when_idle()
        store.ready.set()
        try:
            while not ending.event.wait(POLL_S):
                follower.follow()
                if os.getppid() != parent:
                    return  # the launcher died: what came is pushed, the rest is kept
            ended, give_up = ending.read()
            follower.end(ended, wait_s, give_up)
        except OSError as err:
            if out_of_space(err, CHECKPOINTS) is None:
                raise
            # the disk under the run's record is full: the stage's writer meets it too and
            # its one line says so; the run stays as kept, and the rerun pushes it
            sys.exit(DISK_FULL_EXIT)
    finally:
        follower.close()
        store.ready.set()
        mark(f"{PUBLISHER_CPU} {time.process_time():.3f}")  # what it cost, every thread's
        sys.stdout.flush()
        sys.stderr.flush()


def run_when_idle() -> None:
    """This process and the threads it starts run only on a core no other process wants
    (SCHED_IDLE): MLflow's pushes, the system-metrics sampler and the step metrics never take
    a core from the workers the report times. Niceness alone did not do it: at niceness 10 a
    publisher still has a tenth of a busy core, and on 2 CPU cores a training process whose
    two threads meet at every operator waits for the slower one, so the first stage on a new
    store trained about 15% slower than the same computation later (issue 51). Where cores
    are to spare (a GPU machine's), idle ones are there and it keeps up all the same; what
    it has not pushed when training ends, it pushes then, while the launcher waits for it."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux
        os.nice(PUBLISHER_NICENESS)


class Publisher:
    """The stage's publisher process, from the launcher's side."""

    def __init__(self, name: str, wait_s: float, experiment: str):
        """Fork it now, before the launcher imports torch and starts the workers: its own
        imports (MLflow's, 2 s of CPU) and the store's creation then take a core that the
        launcher's one-thread start leaves idle, and the launcher never forks while a thread
        of its own is busy. CUDA is never touched in it. `name`: the strategy whose run it
        follows; `wait_s`: how long the final push waits for an absent server
        (mlflow.final_sync_wait_s); `experiment`: the MLflow experiment it makes ready."""
        self._dir = Path(tempfile.mkdtemp(prefix="parallel-lab-mlflow-"))
        self.stream = self._dir / "stream.jsonl"  # the writer's (stream.py), made when it opens
        self.bound_s = wait_s + PUBLISHER_SLACK_S  # how long `finish` waits for it at most
        self.finished = False  # finish() has run
        context = multiprocessing.get_context("fork")
        self.store = StoreTurn(context.Event(), context.Event(), experiment)
        self.ending = Ending(context.Event(), self._dir / "ending.json")
        self.process = context.Process(
            target=publisher_main,
            args=(name, self.stream, os.getpid(), self.store, self.ending, wait_s),
            name="mlflow-publisher",
        )
        # a stop signal waits until the child has its own handlers (publisher_main)
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            self.process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.finished:
            self.finish()
        shutil.rmtree(self._dir, ignore_errors=True)

    @property
    def opened(self) -> bool:
        """The run's writer opened the run: the publisher has a run to push."""
        return opened(self.stream)

    def make_store(self, timeout_s: float = STORE_READY_WAIT_S) -> bool:
        """Have it make the store and the experiment now, and wait until they are made (or
        failed to be: an outage is the first push's to report), at most `timeout_s`; False
        if it was still at it."""
        self.store.go.set()
        return bool(self.store.ready.wait(timeout_s))

    def finish(self, ended: str = RUNNING, give_up: bool = False) -> Optional[str]:
        """Tell it the workers are gone, and how the run ended where its files cannot say it
        (`ended`: KILLED, FAILED; RUNNING: as the files say), and wait for its last push, at
        most `bound_s`. `give_up`: a stop came, so the push makes one attempt; a stop signal
        meanwhile is passed on. Where no writer opened the run (a stage refused before its
        workers ran) it is stopped at once. None when it ended well, else what went wrong, in
        words: the run then stays kept locally, for `python -m pipeline.publish`."""
        self.finished = True
        if not self.opened:
            self.process.kill()
            self.process.join()
            return None
        atomic_write(self.ending.file, json.dumps({"ended": ended, "give_up": give_up}))
        self.ending.event.set()
        with forwarding_stops(self.process.pid):
            self.process.join(self.bound_s)
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join()
            return f"its publisher was still at it after {self.bound_s:.0f} s"
        if self.process.exitcode == DISK_FULL_EXIT:
            return NO_SPACE
        if self.process.exitcode != 0:
            return f"its publisher exited with {self.process.exitcode}"
        return None


@contextlib.contextmanager
def forwarding_stops(pid: int | None) -> Iterator[None]:
    """SIGTERM and SIGINT passed on to `pid` meanwhile, instead of ending this process."""

    def forward(signum: int, frame: FrameType | None) -> None:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    previous = {signum: signal.signal(signum, forward) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
