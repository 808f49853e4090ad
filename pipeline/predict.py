"""DVC stage `predict@STRATEGY`: the strategy's epoch on N devices like this machine's,
PREDICTED, not measured: a rank's step measured here by the strategy's own code at world size
N (under torch's fake process group), its communication modelled over `predict.link`.

    python -m pipeline.predict                          # every strategy in `strategies`
    python -m pipeline.predict ddp fsdp predict.gpus=[8] predict.link=nvlink-h100

The compute is this machine's device: on a GPU, N GPUs of its model; on a CPU, N processes
sharing this CPU's cores (link auto: gloo between them, measured here). Writes
predictions/<strategy>.json for each (the compare stage's report shows them, marked
predicted) and prints a table per N; single's holds the baseline every speedup divides, its
step on one device measured the same way. Each figure carries the error band its model was
checked to on real runs (pipeline/scaling/checked.py); dp's and balanced_dp's have none (on a
CPU only their memory is predicted: DataParallel runs unsplit there).
"""

from __future__ import annotations

import functools
import json
from typing import Any, Optional

from pipeline.cli import parse_args
from pipeline.config import load_config
from pipeline.errors import exit_on_user_error
from pipeline.files import atomic_write
from pipeline.reporting.predicted import combine, text
from pipeline.results import PREDICTIONS, read_predictions
from pipeline.scaling.checked import NONE_ASKED, not_predicted_document
from pipeline.scaling.links import check_link
from pipeline.strategies import check_names


@exit_on_user_error
def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args("pipeline.predict", __doc__, argv, params_help=True)
    # the strategies named, then the key=value overrides (as train's STRATEGY and its own)
    names = [a for a in args.overrides if "=" not in a]
    cfg = load_config("params.yaml", [a for a in args.overrides if "=" in a])
    names = names or cfg.strategies
    check_names(names)
    check_link(cfg.predict.link)  # bad input answers before torch loads
    PREDICTIONS.mkdir(exist_ok=True)
    measured = names
    if not cfg.predict.gpus:  # none asked for: said so, without torch
        for name in measured:
            write(name, not_predicted_document(name, NONE_ASKED))
        measured = []
    if measured:
        # torch, and the strategies' code: seconds to load
        from pipeline.scaling.stage import measuring_device, predict_strategy, the_link

        device = measuring_device(cfg.devices)
        link = functools.cache(lambda: the_link(cfg, device))  # once, where a strategy needs it
        done: dict[str, dict[str, Any]] = {}  # a layout that is a preset's run reuses its row
        for name in measured:
            done[name] = predict_strategy(cfg, name, device, link, done)
            write(name, done[name])
    shown = combine(read_predictions(["single", *names]))  # single's baseline, where it ran
    if shown is not None:
        print(text(shown), end="", flush=True)


def write(name: str, document: dict[str, Any]) -> None:
    atomic_write(PREDICTIONS / f"{name}.json", json.dumps(document, indent=1) + "\n")
    print(f"predict: wrote {PREDICTIONS / name}.json", flush=True)


if __name__ == "__main__":
    main()
