"""DVC stage `predict`: each strategy's epoch on N devices like this machine's, PREDICTED, not
measured: a rank's step measured here by the strategy's own code at world size N (under
torch's fake process group), its communication modelled over `predict.link`.

    python -m pipeline.predict                                   # params.yaml's predict section
    python -m pipeline.predict predict.gpus=[8] predict.link=nvlink-h100

The compute is this machine's device: on a GPU, N GPUs of its model; on a CPU, N processes
sharing this CPU's cores (link auto: gloo between them, measured here). Writes
predictions/predicted.json (the compare stage's report shows it as "predicted") and prints a
table per N. Each figure carries the error band its model was checked to on real runs
(pipeline/scaling/checked.py); dp and balanced_dp are not predicted.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from pipeline.cli import parse_args
from pipeline.config import load_config
from pipeline.errors import exit_on_user_error
from pipeline.files import atomic_write
from pipeline.results import PREDICTIONS
from pipeline.scaling.links import check_link


@exit_on_user_error
def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args("pipeline.predict", __doc__, argv, params_help=True)
    cfg = load_config("params.yaml", args.overrides)
    check_link(cfg.predict.link)  # bad input answers before torch loads
    from pipeline.scaling.stage import predict_all, render_text  # torch: seconds to load

    result: dict[str, Any] = predict_all(cfg)
    PREDICTIONS.parent.mkdir(exist_ok=True)
    atomic_write(PREDICTIONS, json.dumps(result, indent=1) + "\n")
    print(render_text(result), end="")
    print(f"predict: wrote {PREDICTIONS}", flush=True)


if __name__ == "__main__":
    main()
