"""Fault injection, for tests only: make one rank die at a chosen point.

    PARALLEL_LAB_FAULT="rank=1,epoch=2,step=3"            # before step 3 of epoch 2 (1-based epoch)
    PARALLEL_LAB_FAULT="rank=0,epoch=1,point=checkpoint"  # mid checkpoint write of epoch 1

Points: `start` (after setup, before training), `step` (before optimizer step `step` of
`epoch`, the default), `eval` (before evaluating `epoch`), `checkpoint` (after this rank's
checkpoint file is written, before the checkpoint is committed), `end` (after training,
before results are written). The process kills itself with SIGKILL (no cleanup, like an OOM
kill or a lost node). It fires only on torchrun's first attempt, so a restarted job runs on.
"""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from pipeline.errors import UserError

ENV = "PARALLEL_LAB_FAULT"
POINTS = ("start", "step", "eval", "checkpoint", "end")


@dataclass(frozen=True)
class Fault:
    rank: int
    point: str = "step"
    epoch: int = 1
    step: int = 0

    def fire_if(self, point: str, rank: int, epoch: int = 1, step: int = 0) -> None:
        if (point, rank) != (self.point, self.rank):
            return
        if point in ("start", "end") or (epoch == self.epoch and
                                         (point != "step" or step == self.step)):
            os.kill(os.getpid(), signal.SIGKILL)


def parse_fault(text: str | None) -> Fault | None:
    if not text:
        return None
    fields: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep:
            raise UserError(f"{ENV}: got {text!r}, expected key=value pairs like rank=1,epoch=2,step=3")
        fields[key.strip()] = value.strip()
    unknown = set(fields) - {"rank", "point", "epoch", "step"}
    if unknown or "rank" not in fields:
        raise UserError(f"{ENV}: got {text!r}, expected rank=R plus any of point, epoch, step")
    point = fields.get("point", "step")
    if point not in POINTS:
        raise UserError(f"{ENV}: point {point!r}, expected one of {', '.join(POINTS)}")
    try:
        return Fault(rank=int(fields["rank"]), point=point, epoch=int(fields.get("epoch", 1)),
                     step=int(fields.get("step", 0)))
    except ValueError:
        raise UserError(f"{ENV}: got {text!r}, expected integers for rank, epoch and step") from None


def fault_from_env(env: dict | None = None) -> Fault | None:
    env = os.environ if env is None else env
    if env.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return None  # a restarted job must be able to finish
    return parse_fault(env.get(ENV))
