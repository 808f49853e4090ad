"""Live progress of an epoch, for whoever watches a train stage: a bar at a terminal, a line
every `report.log_every_s` seconds off one (logs, Compose), and the step metrics MLflow
charts every `mlflow.log_every_steps` steps. The writer rank alone reports (session.py).

The loss is on the device, in the loop's `totals`; reading it makes the host wait for the GPU,
so the loop never does. At a report point a copy of `totals` is queued into host memory
(`Readback`) and taken up at a later step, once it has arrived: a point's figures are those of
the step it was taken after, and on a GPU they show a few steps later. Times are the host's,
which runs ahead of the GPU by the kernels it has queued: a few steps, nothing over an epoch.

The workers write to the launcher's own stderr (they are its children), so whether it is a
terminal is theirs to see.
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, Optional

import torch
from tqdm import tqdm

from pipeline import memory
from pipeline.context import DistContext
from pipeline.memory import DevicePeak
from pipeline.numerics.build import Training
from pipeline.numerics.totals import Sums, Totals
from pipeline.run_spec import RunSpec

BAR_ROWS = 24  # the screen height tqdm is told: the bar shows at any height
BAR_EVERY_S = 0.5  # the bar's loss and samples/s are refreshed this often (a copy each time)
# tqdm's default without its steps/s: the postfix says loss and samples/s, and a narrow
# terminal cuts the line's end
BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"

# (MLflow step, metrics, Unix time in ms): the writer's RunRecorder.log_steps
StepLog = Callable[[int, dict[str, float], int], None]
MemoryNow = Callable[[], list[DevicePeak]]


def terminal_columns(stderr: IO[str]) -> Optional[int]:
    """The width of the terminal the stage's output goes to, None off a terminal."""
    if not stderr.isatty():
        return None
    try:
        columns = os.get_terminal_size(stderr.fileno()).columns
    except OSError:
        columns = 0
    return columns or 80  # a pseudo-terminal nobody sized (script, CI) says 0


@dataclass(frozen=True)
class LiveSettings:
    """What the writer reports while an epoch runs; read once, from params and the launcher."""

    terminal_columns: Optional[int]  # a bar this wide; None: log lines instead
    log_every_s: Optional[float]  # report.log_every_s (off a terminal only)
    mlflow_every_steps: Optional[int]  # mlflow.log_every_steps; None or 0: off

    @property
    def lines(self) -> bool:
        return self.terminal_columns is None and self.log_every_s is not None


# --- the arithmetic, pure --------------------------------------------------------------------


def rate(samples: int, seconds: float) -> Optional[float]:
    return samples / seconds if seconds > 0 and samples > 0 else None


def eta_s(done: int, steps: int, first: int, seconds: float) -> Optional[float]:
    """Seconds left of an epoch of `steps` steps at the pace of those this process ran
    (`first`..`done`, in `seconds`)."""
    ran = done - first
    return (steps - done) * seconds / ran if ran > 0 and seconds > 0 else None


def clock(seconds: Optional[float]) -> str:
    """ "m:ss", "h:mm:ss" over an hour; "?" while unknown."""
    if seconds is None:
        return "?"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def memory_text(peaks: list[DevicePeak]) -> str:
    """ "gpu3 1234 MiB gpu5 1198 MiB" (peak allocated), "cpu0 312 MiB RSS"."""
    rss = " RSS" if peaks and peaks[0].kind == "cpu" else ""
    return " ".join(f"{p.label} {p.allocated_mib:.0f} MiB" for p in peaks) + rss


def number(value: Optional[float], spec: str) -> str:
    return "?" if value is None else format(value, spec)


@dataclass(frozen=True)
class Reading:
    """What a progress line reports of the steps so far (None: not known yet)."""

    loss: Optional[float]
    samples_per_s: Optional[float]
    eta: Optional[float]  # seconds left of the epoch
    peaks: list[DevicePeak]


def progress_line(
    name: str, epoch: int, epochs: int, done: int, steps: int, reading: Reading
) -> str:
    """The line a log gets every report.log_every_s seconds (`epoch` 1-based)."""
    loss, samples = number(reading.loss, ".4f"), number(reading.samples_per_s, ".0f")
    return (
        f"train[{name}] epoch {epoch}/{epochs} step {done}/{steps}: loss {loss} "
        f"{samples} samples/s ETA {clock(reading.eta)} memory {memory_text(reading.peaks)}"
    )


# --- reading the device without waiting ------------------------------------------------------


class Readback:
    """Copies of the device's totals taken without waiting: `take` queues one into host
    memory, `arrived` hands back, in order, those whose copy has completed. On the CPU a copy
    is complete at once."""

    def __init__(self) -> None:
        self.pending: deque[tuple[Any, torch.Tensor, Optional[torch.cuda.Event]]] = deque()

    def take(self, tag: Any, totals: Totals) -> None:
        tensor = totals.tensor
        if tensor.device.type != "cuda":
            self.pending.append((tag, tensor.detach().clone(), None))
            return
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor.detach(), non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(tensor.device))
        self.pending.append((tag, host, event))

    def arrived(self, wait: bool = False) -> list[tuple[Any, Sums]]:
        """The copies complete so far; with `wait`, all of them (the epoch is over)."""
        out = []
        while self.pending:
            tag, host, event = self.pending[0]
            if event is not None and not event.query():
                if not wait:
                    break
                event.synchronize()
            self.pending.popleft()
            out.append((tag, Totals(host).read()))  # on the host: no wait
        return out


@dataclass(frozen=True)
class Point:
    """A report point: after which step of the epoch it was taken, when, and for whom."""

    done: int  # optimizer steps of the epoch done
    at: float  # time.perf_counter()
    wall: float  # time.time(): MLflow's timestamp
    line: bool  # a log line is due
    mlflow: bool  # a step metric is due


class LiveProgress:
    """The writer's report of each epoch; the loop calls `begin`, `step` after every
    optimizer step, and the session `end` once the device has finished the epoch."""

    def __init__(
        self,
        settings: LiveSettings,
        name: str,
        epochs: int,
        batch_size: int,
        log_steps: StepLog,
        memory_now: MemoryNow,
    ):
        self.settings, self.name, self.epochs, self.batch_size = settings, name, epochs, batch_size
        self.log_steps, self.memory_now = log_steps, memory_now
        self.readback = Readback()
        self.bar: Optional[tqdm] = None

    def begin(self, epoch: int, first_step: int, steps: int, totals: Totals) -> None:
        """Epoch `epoch` (0-based) starts at `first_step` of its `steps` (a resumed one later
        than 0); `totals` hold the epoch's so far, on the device."""
        self.epoch, self.first, self.steps, self.totals = epoch, first_step, steps, totals
        self.t0 = time.perf_counter()
        self.next_bar = self.t0 + BAR_EVERY_S
        self.next_line = self.t0 + (self.settings.log_every_s or 0.0)
        self.start: Optional[Sums] = None  # totals at the first step
        self.last_mlflow: Optional[tuple[Point, Sums]] = None
        self.readback.take(Point(first_step, self.t0, time.time(), False, False), totals)
        if self.settings.terminal_columns is not None:
            self.bar = tqdm(
                total=steps,
                initial=first_step,
                desc=f"epoch {epoch + 1}/{self.epochs}",
                unit="step",
                ncols=self.settings.terminal_columns,
                # the one bar sits on the bottom line; tqdm hides a bar below a screen's last
                # line, and a pseudo-terminal nobody sized (script, CI) reports no height
                nrows=BAR_ROWS,
                bar_format=BAR_FORMAT,
                leave=False,  # the epoch line follows it
                file=sys.stderr,
            )

    def step(self, done: int) -> None:
        """`done` steps of the epoch are queued: host work only, a report point now and then."""
        if self.bar is not None:
            self.bar.update(1)
        now = time.perf_counter()
        bar = self.bar is not None and now >= self.next_bar
        line = self.settings.lines and now >= self.next_line
        every = self.settings.mlflow_every_steps
        mlflow = every is not None and every > 0 and (self.epoch * self.steps + done) % every == 0
        if bar or line or mlflow:
            if bar:
                self.next_bar = now + BAR_EVERY_S
            if line:
                self.next_line = now + (self.settings.log_every_s or 0.0)
            self.readback.take(Point(done, now, time.time(), line, mlflow), self.totals)
        if self.readback.pending:
            self.report(self.readback.arrived())

    def end(self) -> None:
        """The epoch's steps are over (or stopped): the points still in flight, then the bar's
        last figures (a sync costs nothing now), and the bar cleared for the epoch line."""
        self.report(self.readback.arrived(wait=True))
        if self.bar is not None:
            last = Point(self.bar.n, time.perf_counter(), time.time(), False, False)
            self.report([(last, self.totals.read())])
            self.bar.refresh()  # drawn once with them, then cleared
            self.bar.close()
            self.bar = None

    def report(self, readings: list[tuple[Point, Sums]]) -> None:
        for point, totals in readings:
            if self.start is None:
                self.start = totals  # begin's copy, always the first
                continue
            seconds = point.at - self.t0
            samples = rate((point.done - self.first) * self.batch_size, seconds)
            loss = totals.mean_loss_since(Sums.none())  # the epoch's so far (a resumed one's too)
            if self.bar is not None:
                self.bar.set_postfix_str(
                    f"loss {number(loss, '.4f')}, {number(samples, '.0f')} samples/s",
                    refresh=False,
                )
            if point.line:
                eta = eta_s(point.done, self.steps, self.first, seconds)
                print(
                    progress_line(
                        self.name,
                        self.epoch + 1,
                        self.epochs,
                        point.done,
                        self.steps,
                        Reading(loss, samples, eta, self.memory_now()),
                    ),
                    flush=True,
                )
            if point.mlflow:
                self.log_mlflow(point, totals)

    def log_mlflow(self, point: Point, totals: Sums) -> None:
        """The loss and samples/s of the steps since the last point (or the epoch's start)."""
        before = self.last_mlflow or (
            Point(self.first, self.t0, 0.0, False, False),
            self.start or totals,
        )
        self.last_mlflow = (point, totals)
        metrics = {
            "step_train_loss": totals.mean_loss_since(before[1]),
            "step_samples_per_s": rate(
                (point.done - before[0].done) * self.batch_size, point.at - before[0].at
            ),
        }
        self.log_steps(
            self.epoch * self.steps + point.done,
            {k: v for k, v in metrics.items() if v is not None},
            int(point.wall * 1000),
        )


def live_progress(
    spec: RunSpec[Any],
    training: Training,
    ctx: DistContext,
    log_steps: StepLog,
    terminal_columns: int | None,
) -> LiveProgress | None:
    """The writer's report while an epoch runs (`log_steps`: its MLflow run's, for the steps'
    metrics); the other ranks report nothing."""
    if not training.run.writer:
        return None
    settings = LiveSettings(terminal_columns, spec.report.log_every_s, spec.mlflow.log_every_steps)
    devices = training.memory_devices
    return LiveProgress(
        settings,
        spec.name,
        spec.train.epochs,
        training.plan.batch_size,
        log_steps,
        lambda: memory.read_peaks(devices, ctx),  # allocator counters: no device sync
    )
