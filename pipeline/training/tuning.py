"""Settings a run decides once, before its first step: a strategy's `Tuned` (e.g.
balanced_dp.gpu0_bsz: auto).

A fresh run measures them here, after build.py applied the precision, channels_last and
compile (`Training.loop`), so the measurement times the forward the run trains with. The value
and its notes go into `Progress.tuned`, which every checkpoint keeps (and, at once, tuned.json
beside them, for a torchrun restart before the first checkpoint); a resumed run settles with
them instead of measuring again, and says so in one line. So the notes, summary.json and the
MLflow params (logged at the run's start, kept on a resume) all show the one value it trained
with, and the run identity, which holds the param (`auto`), stays the same."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from pipeline.numerics.build import Training


def settle(
    training: Training,
    kept: dict[str, Any],
    keep: Callable[[dict[str, Any]], None] = lambda tuned: None,
    say: Callable[[str], None] = lambda line: None,
) -> Training:
    """`training` with its run's setting decided: the one in `kept` (`Progress.tuned` of a
    resume), else measured now, added to `kept` and handed to `keep` (the policy's
    tuned.json)."""
    tuned = training.run.tuned
    if tuned is None:
        return training
    if tuned.key in kept:
        value, notes = kept[tuned.key]["value"], list(kept[tuned.key]["notes"])
        say(
            f"{tuned.key}={json.dumps(value)}: reused, as this run decided it at its start; "
            "not measured again"
        )
    else:
        value, notes = tuned.measure(training.loop)
        kept[tuned.key] = {"value": value, "notes": notes}
        keep(kept)
    run = tuned.settle(value, notes)
    others = training.notes[len(training.run.notes) :]  # the precision's and compile's
    return replace(training, run=run, notes=(*run.notes, *others))
