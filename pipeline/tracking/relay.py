"""A train stage's MLflow run, published by a process of its own beside the workers.

`python -m pipeline.train` forks the stage's publisher (`Publisher`) before it imports
torch, so that MLflow's imports run beside the launcher's; the run's writer hands it each
event of the run (`Relay`: opened, an epoch, a few step metrics, the final push, closed) as
one line of JSON appended to a file, and the publisher replays them on the writer's
`MlflowTracker` (mlflow_run.py), which does what it always did: run.json, the idempotent pushes,
system metrics. (The final model is logged by the compare and publish stages, which load
torch and MLflow's model code once for every strategy: here they would cost a stage on 2 CPU
cores 3.5 s of imports after its last epoch.) So a training process never imports MLflow,
never shares its interpreter's lock with MLflow's threads and never waits for the server: on
2 CPU cores a tiny stage's first epoch took 3.7 s with MLflow in the writer against 0.8 s
without, and the whole stage 12 s against 9.5 s (docs/performance.md, "A train stage's fixed
cost").

Nothing is lost on the way: run.json, the checkpoint record and results/ stay the truth, as
before; the events file lives until the publisher has replayed it, the launcher waits for the
publisher before it exits, and `python -m pipeline.publish` delivers whatever a killed stage
left pending. A worker started by `torchrun` by hand has no publisher and keeps its
MlflowTracker in process (`open_tracker`).
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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, NamedTuple, Optional

from pipeline.errors import DISK_FULL_EXIT, NO_SPACE, out_of_space
from pipeline.results import EpochRow
from pipeline.timeline import PUBLISHER_CPU, mark
from pipeline.tracking.mlflow_run import (
    MlflowTracker,
    ModelSource,
    Tracker,
    never,
    read_record,
)
from pipeline.tracking.preload import client_code
from pipeline.tracking.store import client, experiment_id, store_creation, tracking_uri

EVENTS_ENV = "PARALLEL_LAB_RUN_EVENTS"  # the file a worker's writer appends the run's events to
POLL_S = 0.05  # how often the publisher looks for new events: well under an epoch
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# where the kernel refuses SCHED_IDLE (never seen on Linux, which lets any process lower its
# own policy): the lowest niceness, about 1.5% of a core against a training thread's 100%
PUBLISHER_NICENESS = 19
# how long the launcher waits for the store to be made before it starts the workers: a new
# SQLite store takes about 0.8 s of migrations on 2 CPU cores; a server that does not answer
# fails fast (store.HTTP_ENV), and past this the workers start all the same
STORE_READY_WAIT_S = 60.0
# how long the publisher may take past the final push's own wait for the server (its
# calls' timeouts, the step metrics' flush, the last system-metrics sample) before the
# launcher gives up on it: the run is kept locally either way
PUBLISHER_SLACK_S = 120.0


@dataclass(frozen=True)
class Opening:
    """What opens a writer's MLflow run: the record it would have were it new
    (mlflow_run.new_record), whether it trains from its first step, the epochs a resumed run
    already has, and the system metrics' interval (None: off) and GPUs."""

    new: dict[str, Any]
    fresh: bool
    history: list[EpochRow]
    system_metrics_s: Optional[float]
    gpu_uuids: Optional[dict[str, str]]

    def to_event(self) -> dict[str, Any]:
        return {
            "event": "open",
            "new": self.new,
            "fresh": self.fresh,
            "history": [r.to_record() for r in self.history],
            "system_metrics_s": self.system_metrics_s,
            "gpu_uuids": self.gpu_uuids,
        }

    @classmethod
    def from_event(cls, event: dict[str, Any]) -> Opening:
        return cls(
            event["new"],
            event["fresh"],
            rows(event["history"]),
            event["system_metrics_s"],
            event["gpu_uuids"],
        )


def rows(records: list[dict[str, Any]]) -> list[EpochRow]:
    return [EpochRow.from_record(r) for r in records]


def open_tracker(record_path: Path, opening: Opening) -> MlflowTracker:
    """The run's MlflowTracker, its run opened in MLflow on a background thread, then its
    system metrics started and the final model's code loaded while training runs."""
    tracker = MlflowTracker(record_path, opening.new, fresh=opening.fresh)

    def then() -> None:  # on the open's background thread, once the run is open
        resume = bool(opening.history)
        tracker.start_system_metrics(opening.system_metrics_s, opening.gpu_uuids, resume)

    tracker.open_soon(opening.history, then)
    return tracker


def append_event(events: Path, event: dict[str, Any]) -> None:
    """One line, one write: the publisher reads whole lines only."""
    with open(events, "a") as f:
        f.write(json.dumps(event) + "\n")


class Relay:
    """The writer's side, a `Tracker`: each call handed to the publisher at once."""

    def __init__(self, events: Path, record_path: Path, opening: Opening):
        self.events, self.record_path = events, record_path
        append_event(events, opening.to_event())

    @property
    def run_id(self) -> str | None:
        """The MLflow run as the publisher recorded it so far (None: not created yet)."""
        run_id: str | None = read_record(self.record_path).get("run_id")
        return run_id

    def publish_soon(self, history: list[EpochRow]) -> None:
        append_event(self.events, {"event": "epochs", "history": [r.to_record() for r in history]})

    def log_steps_soon(self, step: int, metrics: dict[str, float], timestamp_ms: int) -> None:
        event = {"event": "steps", "step": step, "metrics": metrics, "at": timestamp_ms}
        append_event(self.events, event)

    def publish(
        self,
        history: list[EpochRow],
        artifacts: Sequence[Path] = (),
        status: Optional[str] = None,
        wait_s: float = 0.0,
        give_up: Callable[[], bool] = never,
        model: Optional[ModelSource] = None,
    ) -> bool:
        """Hand over the push; True: handed over (what becomes of it, the publisher says).
        `give_up` is asked now: a stop requested by then makes the publisher's push one
        attempt. `model` is not handed over: an event is a line of JSON, and a model is a
        closure over torch objects that the publisher process could not take (nor should it
        import torch for it). The compare and publish stages log the run's final model from
        results/<strategy>/ (kept_runs.log_final_models) where it has none."""
        event = {
            "event": "publish",
            "history": [r.to_record() for r in history],
            "artifacts": [str(p) for p in artifacts],
            "status": status,
            "wait_s": wait_s,
            "give_up": give_up(),
        }
        append_event(self.events, event)
        return True

    def close(self) -> None:
        append_event(self.events, {"event": "close"})


def read_events(events: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """The whole lines appended to `events` since `offset`, and the offset after them."""
    try:
        with open(events, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    complete = data[: data.rfind(b"\n") + 1]  # a line still being written waits
    return [json.loads(line) for line in complete.splitlines()], offset + len(complete)


class Replay:
    """The publisher's side: the writer's events, replayed on its MlflowTracker in order."""

    def __init__(self, record_path: Path, stop: threading.Event):
        """`stop`: a stop was requested (a SIGTERM), so the final push makes one attempt
        instead of waiting."""
        self.record_path, self.stop = record_path, stop
        self.tracker: Tracker | None = None

    def apply(self, event: dict[str, Any]) -> None:
        kind = event["event"]
        if kind == "open":  # a restarted job's new writer opens the same run again
            self.close()
            self.tracker = open_tracker(self.record_path, Opening.from_event(event))
            return
        tracker = self.tracker
        if tracker is None:
            return  # every other event follows an open
        if kind == "epochs":
            tracker.publish_soon(rows(event["history"]))
        elif kind == "steps":
            tracker.log_steps_soon(event["step"], event["metrics"], event["at"])
        elif kind == "publish":
            given_up = event["give_up"]
            tracker.publish(
                rows(event["history"]),
                [Path(p) for p in event["artifacts"]],
                status=event["status"],
                wait_s=event["wait_s"],
                give_up=lambda: given_up or self.stop.is_set(),
            )
        elif kind == "close":
            tracker.close()

    def close(self) -> None:
        if self.tracker is not None:
            self.tracker.close()
            self.tracker = None


END = {"event": "end"}  # the launcher's, once every worker has exited


class StoreTurn(NamedTuple):
    """The launcher's word to make the store (`go`: the stage was accepted), the publisher's
    that it is made (`ready`), and the experiment to make in it."""

    go: Any  # multiprocessing events: their type is the fork context's
    ready: Any
    experiment: str


def publisher_main(events: Path, record_path: Path, parent: int, store: StoreTurn) -> None:
    """The publisher process: idle-priority beside the workers, and stopped by a SIGTERM or
    SIGINT only in its waits: what the writer handed over is still pushed, one try each.
    Once the launcher has accepted the stage (`store.go`), and before any event, it makes
    the store and the experiment (a new SQLite store's migrations: about a second of CPU)
    and says so (`store.ready`), for which the launcher waits before it starts the workers:
    the first stage on a new store no longer trains beside its creation (issue 51)."""
    stop = threading.Event()

    def stopping(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for signum in STOP_SIGNALS:
        signal.signal(signum, stopping)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # blocked by its fork
    try:
        # now, while the launcher imports torch on another core (its start is one thread)
        with contextlib.suppress(Exception):  # a broken MLflow says so at its first push
            client_code(tracking_uri())
        # a refused stage makes no store; a writer's first event means the stage was accepted
        # (a caller that never says go: the tests' own publishers)
        while not store.go.wait(POLL_S) and not events.stat().st_size:
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
            publish_events(events, Replay(record_path, stop), parent)
        except OSError as err:
            if out_of_space(err, record_path.parent) is None:
                raise
            # the disk under the run's record is full: the stage's writer meets it too and
            # its one line says so; the run stays as kept, and the rerun pushes it
            sys.exit(DISK_FULL_EXIT)
    finally:
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


def publish_events(events: Path, replay: Replay, parent: int) -> None:
    """Replay `events` as they come until the launcher's END, or until the launcher is gone
    (`parent` is no longer this process's parent), then end the run's threads."""
    offset = 0
    try:
        while True:
            batch, offset = read_events(events, offset)
            if END in batch:
                for event in batch[: batch.index(END)]:
                    replay.apply(event)
                return
            for event in batch:
                replay.apply(event)
            if not batch:
                if os.getppid() != parent:
                    return
                time.sleep(POLL_S)
    finally:
        replay.close()


class Publisher:
    """The stage's publisher process, from the launcher's side."""

    def __init__(self, record_path: Path, bound_s: float, experiment: str):
        """Fork it now, before the launcher imports torch and starts the workers: its own
        imports (MLflow's, 2 s of CPU) and the store's creation then take a core that the
        launcher's one-thread start leaves idle, and the launcher never forks while a thread
        of its own is busy. CUDA is never touched in it. `bound_s`: how long `finish` waits
        for it at most; `experiment`: the MLflow experiment it makes ready."""
        self._dir = Path(tempfile.mkdtemp(prefix="parallel-lab-mlflow-"))
        self.events = self._dir / "events.jsonl"
        self.events.touch()
        self.bound_s = bound_s
        self.finished = False  # finish() has run
        context = multiprocessing.get_context("fork")
        self.store = StoreTurn(context.Event(), context.Event(), experiment)
        self.process = context.Process(
            target=publisher_main,
            args=(self.events, record_path, os.getpid(), self.store),
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

    def make_store(self, timeout_s: float = STORE_READY_WAIT_S) -> bool:
        """Have it make the store and the experiment now, and wait until they are made (or
        failed to be: an outage is the first push's to report), at most `timeout_s`; False
        if it was still at it."""
        self.store.go.set()
        return bool(self.store.ready.wait(timeout_s))

    def finish(self) -> str | None:
        """Tell it the workers are gone and wait for it to push what they handed over, at
        most `bound_s`; a stop signal meanwhile is passed on (its push then gives up waiting
        for the server). Where nothing was handed over (a stage refused before its workers
        ran) it is stopped at once. None when it ended well, else what went wrong, in words:
        the run then stays kept locally, for `python -m pipeline.publish`."""
        if self.events.stat().st_size == 0:
            self.process.kill()
            self.process.join()
            self.finished = True
            return None
        append_event(self.events, END)
        with forwarding_stops(self.process.pid):
            self.process.join(self.bound_s)
        self.finished = True
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
