"""How long a train stage takes to end once it is stopped, or once a rank died after its last
step.

    python -m benchmarks.stop_time                    # 3 rounds
    python -m benchmarks.stop_time --tree ../old      # the same rows from another checkout too

Each row is a 2-process ddp stage on synthetic Fashion-MNIST-shaped images in a throw-away
project copy, which a fault (pipeline/interrupts/faults.py) brings to a known point:

- SIGTERM mid-epoch: rank 0 holds before step 2 of epoch 2; the benchmark sends SIGTERM to
  the stage's process group (as Ctrl-C or a container's stop does); the ranks checkpoint and
  the stage exits 75.
- SIGTERM after the last step: rank 0 holds after training, before the results are written;
  the same SIGTERM; the results are written all the same and the stage exits 0.
- rank 0 killed after the last step: rank 0 dies (SIGKILL) there; torchrun restarts the job
  once (checkpoint.max_restarts=1), it resumes from the last checkpoint and exits 0.

What is timed is the seconds from the line the fault prints (the hold, the kill) to the
stage's exit. Every row must end with its exit code, or the benchmark stops. The rows take
turns, each going first in turn; with --tree, each row also runs from that checkout's
pipeline/ (its own project copy), and its ratio is the median over rounds of its seconds over
the same row's from this checkout in the same round. The JSON
(benchmarks/results/<machine>-stop-time-<date>.json unless --out) holds every run, the
medians, the ratios, the settings and the 1-minute load average before and after.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

from benchmarks.bench import machine, write_result
from benchmarks.e2e import (
    checkouts,
    fetched_copy,
    result_head,
    taking_turns,
    torch_device,
    turns_parser,
)
from pipeline.data.synthetic import write_synthetic

JOB = [
    "model.width=8",
    "train.epochs=2",
    "train.batch_size=32",
    "data.limit_train=512",
    "data.limit_test=128",
    "ddp.nproc=2",
    "mlflow.log_model=false",
    "report.system_metrics_interval_s=null",
]
RUN_TIMEOUT_S = 300  # a stage still running then is killed, and the benchmark stops


class Row(NamedTuple):
    fault: str  # PARALLEL_LAB_FAULT
    overrides: list[str]
    signalled: bool  # the benchmark sends SIGTERM when the fault's line appears
    exit_code: int  # what the stage must exit with


ROWS = {
    "SIGTERM mid-epoch": Row("rank=0,epoch=2,step=2,action=hold", [], True, 75),
    "SIGTERM after the last step": Row("rank=0,point=end,action=hold", [], True, 0),
    "rank 0 killed after the last step": Row(
        "rank=0,point=end", ["checkpoint.max_restarts=1"], False, 0
    ),
}


def plan(trees: list[str]) -> list[tuple[str, str, str]]:
    """(label, row, tree) for every row, once per tree; a tree other than this one is named
    in the label."""
    return [
        (row if tree == "this" else f"{row} ({tree})", row, tree) for tree in trees for row in ROWS
    ]


def ratios(rounds: list[dict[str, float]], rows: list[tuple[str, str, str]]) -> dict[str, float]:
    """Each label's median over rounds of its seconds over the same row's from this tree in
    the same round (1 for this tree's own)."""
    return {label: statistics.median(r[label] / r[row] for r in rounds) for label, row, _ in rows}


def seconds_to_exit(project: Path, env: dict[str, str], row: Row) -> float:
    """Run the stage from scratch, and time it from the fault's line to its exit."""
    for name in ("results", "checkpoints"):
        shutil.rmtree(project / name, ignore_errors=True)
    cmd = [sys.executable, "-m", "pipeline.train", "ddp", *JOB, *row.overrides]
    proc = subprocess.Popen(
        cmd,
        cwd=project,
        env={**env, "PARALLEL_LAB_FAULT": row.fault},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's job would be
    )
    watchdog = threading.Timer(RUN_TIMEOUT_S, os.killpg, (proc.pid, signal.SIGKILL))
    watchdog.start()
    try:
        assert proc.stdout is not None
        out, fired = [], None
        for line in proc.stdout:
            out.append(line)
            if fired is None and line.startswith("fault: rank 0 "):
                fired = time.perf_counter()
                if row.signalled:
                    os.killpg(proc.pid, signal.SIGTERM)
        code = proc.wait()
        ended = time.perf_counter()
    finally:
        watchdog.cancel()
    if fired is None or code != row.exit_code:
        sys.exit(
            f"{' '.join(cmd)} with PARALLEL_LAB_FAULT={row.fault}: exit {code} (expected "
            f"{row.exit_code}), fault line {'seen' if fired else 'not seen'}:\n"
            + "".join(out)[-3000:]
        )
    return ended - fired


def table(result: dict) -> str:
    lines = [
        "| row | seconds from the fault to the exit | ratio to this tree's | exit code |",
        "|---|---:|---:|---:|",
    ]
    for label, seconds in result["median_s"].items():
        code = ROWS[result["row_of"][label]].exit_code
        lines.append(f"| {label} | {seconds:.2f} | {result['ratios'][label]:.2f}x | {code} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = turns_parser(__doc__, runs=3)
    args = parser.parse_args(argv)

    trees = checkouts(args.tree)
    rows = plan(list(trees))
    label, info = machine(torch_device())
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="parallel-lab-stop-time-") as tmp:
        mirror = Path(tmp) / "mirror"
        write_synthetic(mirror, 512, 128)
        projects = {
            name: fetched_copy(tree, Path(tmp) / f"project-{i}", mirror)
            for i, (name, tree) in enumerate(trees.items())
        }
        rounds = taking_turns(
            rows,
            args.runs,
            lambda row: seconds_to_exit(*projects[row[2]], ROWS[row[1]]),
            "stop_time",
        )
    settings = {
        "runs": args.runs,
        "job": JOB,
        "faults": {row: ROWS[row].fault for row in ROWS},
        "trees": {name: str(tree) for name, tree in trees.items()},
    }
    result = {
        **result_head(label, info, load_before, settings),
        "row_of": {name: row for name, row, _ in rows},
        "rounds": rounds,
        "median_s": {k: statistics.median(r[k] for r in rounds) for k in rounds[0]},
        "ratios": ratios(rounds, rows),
    }
    out = write_result(result, "stop-time", args.out)
    print(table(result), flush=True)
    print(f"stop_time: wrote {out}", flush=True)
    return result


if __name__ == "__main__":
    main()
