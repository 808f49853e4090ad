"""The DVC experiments side by side, not only the strategies of one run: one row per
experiment x strategy, with the params that tell the experiments apart and the strategy's final
figures.

    dvc exp run --queue -S train.batch_size=256,512 -S train.lr=0.1,0.2   # a 2 x 2 grid
    dvc queue start                        # or, in the foreground: dvc exp run --run-all
    python -m pipeline.experiments         # -> reports/experiments.md (and stdout)

It reads `dvc exp show --json` (or a saved copy: --json FILE). Experiments without metrics
(still queued, failed, or results/*/metrics.json kept out of git) are listed under the table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional

from pipeline.errors import UserError, exit_on_user_error
from pipeline.files import atomic_write
from pipeline.reporting.experiment_table import OUT, build_rows, exp_show, markdown


@exit_on_user_error
def main(argv: Optional[list[str]] = None) -> None:
    summary, _, details = (__doc__ or "").partition("\n\n")
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.experiments",
        description=summary,
        epilog=details,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--json", type=Path, help="saved `dvc exp show --json` output")
    parser.add_argument("--out", type=Path, default=OUT, help=f"default: {OUT}")
    args = parser.parse_args(argv)
    if args.json is not None:
        try:
            shown = json.loads(args.json.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise UserError(
                f"{args.json}: not readable as `dvc exp show --json` output ({err})"
            ) from None
    else:
        shown = exp_show()
    text = markdown(*build_rows(shown))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out, text)
    print(text, end="")


if __name__ == "__main__":
    main()
