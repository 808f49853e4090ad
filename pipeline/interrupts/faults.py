"""Fault injection, for tests only: make one rank die, or wait, at a chosen point.

    PARALLEL_LAB_FAULT="rank=1,epoch=2,step=3"            # before step 3 of epoch 2 (1-based epoch)
    PARALLEL_LAB_FAULT="rank=1,point=start;rank=0,epoch=1,step=2"  # one fault per attempt
    PARALLEL_LAB_FAULT="rank=0,epoch=1,point=checkpoint"  # mid checkpoint write of epoch 1
    PARALLEL_LAB_FAULT="rank=0,epoch=2,step=2,action=hold"          # wait there for SIGTERM
    PARALLEL_LAB_FAULT="rank=0,epoch=2,action=hold,release=/tmp/go"  # ... or for that file
    PARALLEL_LAB_FAULT="rank=0,step=2,action=oom,strategy=dp"  # in dp's stage alone
    PARALLEL_LAB_FAULT="rank=0,point=optimizer,action=trace"  # the stack at optimizer.step

Points: `start` (after setup, before training), `step` (before optimizer step `step` of
`epoch`, the default), `eval` (before evaluating `epoch`), `checkpoint` (after this rank's
checkpoint file is written, before the checkpoint is committed), `end` (after training,
before results are written), `optimizer` (inside the optimizer's step of step `step` of
`epoch`, through torch's global optimizer-step hook: where the training code hands over).

Actions: `kill` (the default) kills the process with SIGKILL (no cleanup, like an OOM kill or
a lost node); it prints `fault: rank R killed ...` first. `raise` raises a RuntimeError there,
as a bug in the training code would. `oom` raises torch's OutOfMemoryError there, as a batch
too large for the device does. `hold` prints one line, `fault: rank R holding before
step S of epoch E ...`, and waits there until a SIGTERM has arrived (at `step`) or the
`release` file exists: a test waits for that line and then acts (sends SIGTERM, kills a node,
stops a server) at a known point of the run, instead of guessing where a running job is.
`trace` prints the project's frames on the stack there, outermost first, in one line (`fault:
rank R stack at ...: pipeline/train.py:main > ...`), and goes on: tests count them.

`strategy` limits the fault to that strategy's stage (a `dvc repro` runs several in one
environment).

Faults separated by `;` belong to torchrun's attempts in turn: the first to the first attempt,
the second to the first restart, and so on (list them in the order training reaches them, as
each restart resumes from the last checkpoint); an attempt past the list runs on undisturbed.

The run reaches its points through its `Hooks` (`hooks.at(point, epoch, step)`), which do
nothing unless this attempt has a fault (`hooks_from_env`): the training code never asks
whether a test is running.
"""

from __future__ import annotations

import os
import signal
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from pipeline.errors import UserError

ENV = "PARALLEL_LAB_FAULT"
POINTS = ("start", "step", "eval", "checkpoint", "end", "optimizer")
ACTIONS = ("kill", "hold", "raise", "oom", "trace")
HOLD_POLL_S = 0.02


@dataclass(frozen=True)
class Fault:
    rank: int
    point: str = "step"
    epoch: int = 1
    step: int = 0
    action: str = "kill"
    release: Optional[str] = None  # hold: the file whose appearance ends the wait
    strategy: Optional[str] = None  # only in this strategy's stage; None: in any

    def fire_if(
        self,
        point: str,
        rank: int,
        epoch: int = 1,
        step: int = 0,
        signalled: Callable[[], bool] = lambda: False,
    ) -> None:
        """Fire when (point, rank, epoch, step) is this fault's place. `signalled` tells a
        hold that SIGTERM has arrived."""
        if (point, rank) != (self.point, self.rank):
            return
        if not (
            point in ("start", "end")
            or (epoch == self.epoch and (point not in ("step", "optimizer") or step == self.step))
        ):
            return
        where = {
            "step": f"before step {step} of epoch {epoch}",
            "optimizer": f"at the optimizer step of step {step} of epoch {epoch}",
            "start": "at the start",
            "end": "at the end",
        }.get(point, f"at {point} of epoch {epoch}")
        if self.action == "kill":
            print(f"fault: rank {rank} killed {where}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if self.action == "raise":
            raise RuntimeError(f"fault: rank {rank} raised {where}")
        if self.action == "trace":
            print(f"fault: rank {rank} stack {where}: {' > '.join(project_frames())}", flush=True)
            return
        if self.action == "oom":
            import torch  # the stages that fire it have it loaded

            raise torch.OutOfMemoryError(f"fault: rank {rank} out of memory {where}")
        print(
            f"fault: rank {rank} holding {where} until SIGTERM"
            f"{' or ' + self.release if self.release else ''}",
            flush=True,
        )
        while not signalled() and not (self.release and Path(self.release).exists()):
            time.sleep(HOLD_POLL_S)


class Hooks:
    """What a run calls at each of its POINTS: nothing, by default."""

    def at(self, point: str, epoch: int = 1, step: int = 0) -> None:
        """The run reached `point` (of 1-based `epoch`, before optimizer step `step`)."""


@dataclass(frozen=True)
class FaultHooks(Hooks):
    """This attempt's fault, fired in process `rank`. `signalled`: a SIGTERM has arrived."""

    fault: Fault
    rank: int
    signalled: Callable[[], bool]

    def at(self, point: str, epoch: int = 1, step: int = 0) -> None:
        if point == "step" and self.fault.point == "optimizer":
            self.before_optimizer(epoch, step)
        # a hold before a step or at the end also ends with a SIGTERM (the stop it waits
        # for); elsewhere only its release file ends it
        signalled = self.signalled if point in ("step", "end") else lambda: False
        self.fault.fire_if(point, self.rank, epoch, step, signalled)

    def before_optimizer(self, epoch: int, step: int) -> None:
        """Before step `step` of `epoch`: the fault's `optimizer` point is inside this step's
        optimizer step, reached through torch's global hook, once."""
        if (epoch, step) != (self.fault.epoch, self.fault.step):
            return
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        def fire(optimizer: object, args: object, kwargs: object) -> None:
            handle.remove()
            self.fault.fire_if("optimizer", self.rank, epoch, step)

        handle = register_optimizer_step_pre_hook(fire)


def hooks_from_env(
    rank: int,
    signalled: Callable[[], bool],
    strategy: str,
    env: Mapping[str, str] | None = None,
) -> Hooks:
    """The hooks of this attempt in process `rank` of `strategy`'s stage: its fault's, if it
    has one there."""
    fault = fault_from_env(env)
    if fault is None or fault.strategy not in (None, strategy):
        return Hooks()
    return FaultHooks(fault, rank, signalled)


def parse_faults(text: str | None) -> list[Fault]:
    """Every fault in `text`, one per torchrun attempt."""
    return [parse_fault(part) for part in (text or "").split(";") if part.strip()]


def parse_fault(text: str) -> Fault:
    fields: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep:
            raise UserError(
                f"{ENV}: got {text!r}, expected key=value pairs like rank=1,epoch=2,step=3"
            )
        fields[key.strip()] = value.strip()
    unknown = set(fields) - {"rank", "point", "epoch", "step", "action", "release", "strategy"}
    if unknown or "rank" not in fields:
        raise UserError(
            f"{ENV}: got {text!r}, expected rank=R plus any of point, epoch, step, action, "
            "release, strategy"
        )
    point = fields.get("point", "step")
    if point not in POINTS:
        raise UserError(f"{ENV}: point {point!r}, expected one of {', '.join(POINTS)}")
    action = fields.get("action", "kill")
    if action not in ACTIONS:
        raise UserError(f"{ENV}: action {action!r}, expected one of {', '.join(ACTIONS)}")
    try:
        return Fault(
            rank=int(fields["rank"]),
            point=point,
            epoch=int(fields.get("epoch", 1)),
            step=int(fields.get("step", 0)),
            action=action,
            release=fields.get("release"),
            strategy=fields.get("strategy"),
        )
    except ValueError:
        raise UserError(
            f"{ENV}: got {text!r}, expected integers for rank, epoch and step"
        ) from None


def fault_from_env(env: Mapping[str, str] | None = None) -> Fault | None:
    """This attempt's fault: torchrun counts its restarts in TORCHELASTIC_RESTART_COUNT."""
    source = os.environ if env is None else env
    faults = parse_faults(source.get(ENV))
    attempt = int(source.get("TORCHELASTIC_RESTART_COUNT", "0"))
    return faults[attempt] if attempt < len(faults) else None


def project_frames() -> list[str]:
    """The stack's frames in the project's own files, outermost first, as "path:function"
    relative to the repository (this module's own left out)."""
    here = Path(__file__).resolve()
    root = here.parents[2]
    frames = []
    for frame in traceback.extract_stack():
        path = Path(frame.filename).resolve()
        if path.is_relative_to(root / "pipeline") and path != here:
            frames.append(f"{path.relative_to(root)}:{frame.name}")
    return frames
