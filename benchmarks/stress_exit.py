"""The 3-process fsdp train stage, run to the end many times beside busy processes: does every
run exit 0? (The abort at exit, docs/reliability.md, showed up only under load.)

    python -m benchmarks.stress_exit                     # 20 runs beside 2 busy processes
    python -m benchmarks.stress_exit --runs 50 --busy 3

Each run trains the tiny fsdp configuration of tests/e2e/test_sharded_checkpoints.py from
scratch (3 gloo processes, 3 epochs of 3 steps, a checkpoint every epoch) on synthetic
Fashion-MNIST, in a throw-away project copy. The JSON
(benchmarks/results/<machine>-stress-exit-<date>.json unless --out) holds each run's exit
code and seconds, the runs whose output has an abort or a left-over communication thread,
and the median and total time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from benchmarks.bench import machine, write_result
from benchmarks.e2e import project_copy, torch_device
from pipeline.data.synthetic import write_synthetic

TINY = [
    "model.width=8",
    "train.epochs=3",
    "train.batch_size=24",
    "train.eval_batch_size=48",
    "train.momentum=0.9",
    "data.limit_train=72",
    "data.limit_test=48",
    "fsdp.nproc=3",
    "report.system_metrics_interval_s=null",
    "mlflow.log_model=false",
]
# what a worker's bad exit looks like in the stage's output
SYMPTOMS = ("terminate called", "outlived the process group", "SIGABRT")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--busy", type=int, default=2, help="busy processes beside the runs")
    parser.add_argument("--out", type=Path, help="JSON path (default benchmarks/results/...)")
    args = parser.parse_args(argv)
    label, info = machine(torch_device())
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="parallel-lab-stress-") as tmp:
        mirror = Path(tmp) / "mirror"
        write_synthetic(mirror, 600, 300)
        project = project_copy(Path(tmp) / "project", mirror)
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{project / 'mlflow.db'}"}
        subprocess.run([sys.executable, "-m", "pipeline.fetch"], cwd=project, env=env, check=True)
        busy = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)
        ]
        try:
            for i in range(args.runs):
                for name in ("results", "checkpoints"):
                    shutil.rmtree(project / name, ignore_errors=True)
                start = time.perf_counter()
                proc = subprocess.run(
                    [sys.executable, "-m", "pipeline.train", "fsdp", *TINY],
                    cwd=project,
                    env=env,
                    capture_output=True,
                    text=True,
                )
                took = time.perf_counter() - start
                output = proc.stdout + proc.stderr
                symptoms = [s for s in SYMPTOMS if s in output]
                runs.append({"exit": proc.returncode, "seconds": took, "symptoms": symptoms})
                print(
                    f"stress_exit: run {i + 1}/{args.runs}: exit {proc.returncode} in "
                    f"{took:.1f} s" + (f" ({', '.join(symptoms)})" if symptoms else ""),
                    flush=True,
                )
                if proc.returncode != 0:
                    print(output[-3000:], file=sys.stderr, flush=True)
        finally:
            for p in busy:
                p.kill()
                p.wait()
    bad = [i + 1 for i, r in enumerate(runs) if r["exit"] != 0 or r["symptoms"]]
    seconds = [r["seconds"] for r in runs]
    result = {
        "machine": label,
        "info": info,
        "date": date.today().isoformat(),
        "settings": {"runs": args.runs, "busy": args.busy, "overrides": TINY},
        "bad_runs": bad,
        "median_run_s": statistics.median(seconds),
        "total_s": sum(seconds),
        "runs": runs,
    }
    out = write_result(result, "stress-exit", args.out)
    print(
        f"stress_exit: {len(runs) - len(bad)}/{len(runs)} clean runs, median "
        f"{result['median_run_s']:.1f} s, total {result['total_s']:.0f} s; wrote {out}",
        flush=True,
    )
    return result


if __name__ == "__main__":
    main()
