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
checked to on real runs (pipeline/scaling/checked.py); dp and balanced_dp are not predicted.
"""

from __future__ import annotations

import json
from typing import Optional

from pipeline.cli import parse_args
from pipeline.config import load_config
from pipeline.errors import exit_on_user_error
from pipeline.files import atomic_write
from pipeline.results import PREDICTIONS, read_predictions
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
    # torch, and the strategies' code: seconds to load
    from pipeline.reporting.predicted import combine, text
    from pipeline.scaling.stage import measuring_device, predict_strategy, the_link

    device = measuring_device(cfg.devices)
    link = the_link(cfg, device)
    PREDICTIONS.mkdir(exist_ok=True)
    for name in names:
        doc = predict_strategy(cfg, name, device, link)
        atomic_write(PREDICTIONS / f"{name}.json", json.dumps(doc, indent=1) + "\n")
        print(f"predict: wrote {PREDICTIONS / name}.json", flush=True)
    shown = combine(read_predictions(["single", *names]))  # single's baseline, where it ran
    if shown is not None:
        print(text(shown), end="", flush=True)


if __name__ == "__main__":
    main()
