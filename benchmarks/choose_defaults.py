"""Which `train.cuda_graph` each strategy gets from `auto` on a GPU (issue 49, goal 2): the
measurement behind pipeline/numerics/speed_defaults.py's MEASURED_ON_GPU.

    python -m benchmarks.choose_defaults                                # on a GPU
    python -m benchmarks.choose_defaults --set model.width=4 --limit-train 1024   # CPU trial

Every strategy built exactly as its train stage builds it (benchmarks/bench.py's ProjectRow),
at world size 1 on one device, with params.yaml's settings, once stepping eagerly
(`train.cuda_graph=none`) and once with its whole step captured (`step`) where the strategy
takes graphs. In one process the rows take turns epoch by epoch on synthetic
Fashion-MNIST-shaped data; each row's first --warmup epochs (the capture, cuDNN's autotuning)
are left out of the median of the --epochs after them.

A setting is correct when the row trained alike: its last epoch's mean training loss within
LOSS_BOUND of the eager row's (a step that did not train stays near ln 10 = 2.3). The choice
for each strategy is its fastest setting that applied (the run's `speed_features` say so) and
trained alike; with it, each strategy's epoch over single's (issue 49's ratios at world size
1: ddp 1.05, fsdp 1.15, dp and balanced_dp 1.02, pipeline_parallel 1.25). On a CPU no capture
applies, so the choice is eager everywhere, as `auto` already says there. The JSON
(benchmarks/results/<machine>-choose-defaults-<date>.json unless --out) holds every row, the
choices, the ratios, and the lines for MEASURED_ON_GPU, which it prints.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from datetime import date
from pathlib import Path

import torch

from benchmarks.bench import REPO, ProjectRow, machine, one_rank_group, take_turns, write_result
from pipeline.config import load_config
from pipeline.context import DistContext
from pipeline.scaling.profile import synthetic_data
from pipeline.strategies import NAMES, get

SETTINGS = ("none", "step")  # train.cuda_graph's values a measurement chooses between
LOSS_BOUND = 0.1  # |mean training loss - the eager row's|, the last epoch
GOALS = {"ddp": 1.05, "fsdp": 1.15, "dp": 1.02, "balanced_dp": 1.02, "pipeline_parallel": 1.25}


def settings_of(strategy: str) -> tuple[str, ...]:
    """The settings worth measuring: a strategy that takes no CUDA graphs has one."""
    return SETTINGS if get(strategy).facts.cuda_graphs else ("none",)


def choose(rows: dict[str, dict]) -> dict[str, dict]:
    """Each strategy's fastest setting that applied and trained alike, from `rows` (row name
    -> strategy, setting, applied, epoch_s, last_loss): its setting, epoch, and the eager
    row's. Pure."""
    out: dict[str, dict] = {}
    for strategy in dict.fromkeys(r["strategy"] for r in rows.values()):
        mine = {r["setting"]: r for r in rows.values() if r["strategy"] == strategy}
        eager = mine.get("none")
        if eager is None:
            continue  # the eager row failed: nothing to hold the others against
        fit = [
            r
            for r in mine.values()
            if r["applied"] and abs(r["last_loss"] - eager["last_loss"]) <= LOSS_BOUND
        ]
        best = min(fit, key=lambda r: r["epoch_s"])
        out[strategy] = {
            "cuda_graph": best["setting"],
            "epoch_s": best["epoch_s"],
            "eager_epoch_s": eager["epoch_s"],
        }
    return out


def ratios(chosen: dict[str, dict]) -> dict[str, float]:
    """Each strategy's epoch at its chosen setting over single's at its own. Pure."""
    if "single" not in chosen:
        return {}
    base = chosen["single"]["epoch_s"]
    return {name: c["epoch_s"] / base for name, c in chosen.items() if name != "single"}


def speed_default_lines(
    chosen: dict[str, dict], gpu: str, when: str, images: int, failed: dict[str, str]
) -> list[str]:
    """MEASURED_ON_GPU's entries for what was measured: the epochs compared, or why eager is
    the choice (the strategy takes no graphs, its captured step failed, or it was no
    faster or trained otherwise). Pure."""
    source = f"benchmarks/choose_defaults.py, {when}"
    lines = []
    for name, c in chosen.items():
        epoch = f"steady epoch of {images} images"
        if c["cuda_graph"] != "none":
            what = f"{epoch} {c['epoch_s']:.3g} vs {c['eager_epoch_s']:.3g} s eager"
        elif "step" not in settings_of(name):
            what = f"eager, {epoch} {c['eager_epoch_s']:.3g} s; it takes no CUDA graphs"
        elif f"{name}/step" in failed:
            error = failed[f"{name}/step"].split(":")[0]
            what = f"eager, {epoch} {c['eager_epoch_s']:.3g} s; capturing its step failed ({error})"
        else:
            what = f"eager, {epoch} {c['eager_epoch_s']:.3g} s; captured, no faster or not alike"
        lines.append(f'    "{name}": Chosen("{c["cuda_graph"]}", "{gpu}: {what} ({source})"),')
    return lines


def main(argv: list[str] | None = None) -> dict:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategies", nargs="*", default=list(NAMES), choices=NAMES)
    parser.add_argument("--set", nargs="*", default=[], help="key=value params overrides")
    parser.add_argument("--limit-train", type=int, default=20000 if cuda else 2048)
    parser.add_argument("--warmup", type=int, default=1, help="untimed epochs per row")
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs per row")
    parser.add_argument("--out", type=Path, help="JSON path (default benchmarks/results/...)")
    args = parser.parse_args(argv)

    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    ctx = DistContext(rank=0, local_rank=0, world_size=1, gpus=("0",) if cuda else ())
    rounds = args.warmup + args.epochs
    data = synthetic_data(args.limit_train, device)
    label, info = machine(device)
    with tempfile.TemporaryDirectory() as work, one_rank_group(device, Path(work)):
        built, unbuilt = [], {}
        for name in args.strategies:
            for setting in settings_of(name):
                extra = [f"train.epochs={rounds}", f"train.cuda_graph={setting}"]
                cfg = load_config(REPO / "params.yaml", [*args.set, *extra])
                try:
                    row = ProjectRow(f"{name}/{setting}", name, cfg, ctx, data, Path(work))
                except Exception as err:  # noqa: BLE001 - one row must not sink the run
                    unbuilt[f"{name}/{setting}"] = f"{type(err).__name__}: {err}"[:300]
                    continue
                built.append((row, name, setting))
        times, failed = take_turns([row for row, _, _ in built], rounds, "choose_defaults")
        failed.update(unbuilt)

    rows = {
        row.name: {
            "strategy": name,
            "setting": setting,
            "applied": row.training.features["cuda_graphs"] == setting,
            "epoch_s": statistics.median(times[row.name][args.warmup :]),
            "epochs_s": times[row.name],
            "last_loss": row.losses[-1],
            "notes": row.notes,
        }
        for row, name, setting in built
        if row.name not in failed
    }
    chosen = choose(rows)
    x_single = ratios(chosen)
    when = date.today().isoformat()
    gpu = info.get("gpu", "")
    lines = speed_default_lines(chosen, gpu, when, args.limit_train, failed) if cuda else []
    result = {
        "machine": label,
        "info": info,
        "date": when,
        "settings": {**vars(args), "out": None, "rounds": rounds, "loss_bound": LOSS_BOUND},
        "rows": rows,
        "failed": failed,
        "chosen": chosen,
        "x_single": x_single,
        "goals": GOALS,
        "speed_defaults": lines,
    }
    out = write_result(result, "choose-defaults", args.out)
    for name, ratio in x_single.items():
        goal = GOALS[name]
        against = f"goal <= {goal}: {'met' if ratio <= goal else 'not met'}"
        if not cuda:
            against = f"on a GPU the goal is <= {goal}"
        print(f"choose_defaults: {name}: {chosen[name]['cuda_graph']}, x{ratio:.2f} ({against})")
    for line in lines:
        print(line)
    print(f"choose_defaults: wrote {out}", flush=True)
    return result


if __name__ == "__main__":
    main()
