"""The measured tables of the documentation, generated from the committed benchmark JSON.

    python -m benchmarks.tables            # rewrite every generated block
    python -m benchmarks.tables --check    # exit 1 naming each block that differs (a unit test)

A generated block is the text between `<!-- tables:NAME -->` and `<!-- /tables:NAME -->` in
README.md or docs/*.md; BLOCKS below says which file of benchmarks/results/ each NAME is
rendered from. The numbers are never typed by hand: a new measurement is a new JSON, then one
run of this command. The startup, stress-exit, peer, suite-cpu, sync-bn, stop-time and
fair-race blocks take the newest `*-startup-*.json` / `*-stress-exit-*.json` / `*-peer-*.json` /
`*-suite-cpu-*.json` / `*-sync-bn-*.json` / `*-stop-time-*.json` / `*-fair-race-*.json`
(benchmarks/startup.py, stress_exit.py, peer.py, suite_cpu.py, sync_bn.py, stop_time.py and
fair_race.py write them); while none is committed their blocks stay empty.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


def documents(repo: Path = REPO) -> list[Path]:
    """Every Markdown file a block may live in."""
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]


# ---- formatting


def flops(value: float) -> str:
    return f"{value / 1e12:.1f} TFLOP/s" if value >= 1e12 else f"{value / 1e9:.0f} GFLOP/s"


def paragraph(text: str) -> str:
    """Wrapped as the hand-written Markdown around it is; inline code is never split."""
    return textwrap.fill(text, 95, break_long_words=False, break_on_hyphens=False)


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def source(path: Path) -> str:
    return f"`benchmarks/results/{path.name}`"


# ---- benchmarks/bench.py


def bench_caption(path: Path, result: dict) -> str:
    info, s, load = result["info"], result["settings"], result["load_average"]
    rows = [r for r in result["rows"].values() if r["status"] == "ok"]
    device = info.get("gpu") or info["cpu"]
    host = (
        f"{info['cpu_cores']} {info['cpu']} cores"
        if "gpu" in info
        else f"{info['cpu_cores']} cores"
    )
    # the baseline keeps the last partial batch, so its samples are the data set's size
    images = result["rows"]["baseline"].get("samples_per_epoch", s["limit_train"])
    peaks = {r["precision"]: (r["peak_flops"], r["peak_source"]) for r in rows}
    peak_text = "; ".join(
        f"{precision} {flops(value)} ({how})" for precision, (value, how) in peaks.items()
    )
    fast = ", ".join(f"`{setting}`" for setting in s["fast"])
    return (
        f"From {source(path)}: {device}, {host}, torch {info['torch']}; "
        f"width {s['width']}, {images} training images, batch {s['batch_size']}; medians of "
        f"{s['timed_epochs']} epochs after {s['warmup_epochs']} warm-up, rows taking turns; "
        f"1-minute load average {load['before'][0]:.1f} before, {load['after'][0]:.1f} after. "
        f"Fast settings: {fast}. {result['flops_per_image'] / 1e9:.3g} GFLOP per training "
        f"image; MFU against the peak of the row's precision: {peak_text}."
    )


def mfu_cell(name: str, row: dict, info: dict) -> str:
    mfu = f"{100 * row['mfu']:.1f}%"
    if name == "baseline" and "gpu" in info and row["precision"] == "fp32":
        # The notes' loop runs its convolutions on TF32 tensor cores (PyTorch's default on a
        # GPU); JSON written before bench.py recorded that holds its MFU against the fp32
        # peak, so it is restated against the TF32 peak, as bench.py now computes it.
        from benchmarks.bench import GPU_PEAKS

        sheet = next((v for k, v in GPU_PEAKS.items() if k in info["gpu"]), None)
        if sheet is not None:
            return f"{100 * row['mfu'] * row['peak_flops'] / sheet['tf32']:.1f}% (TF32 peak)"
    return mfu


def row_label(name: str, row: dict) -> str:
    if name == "baseline":
        return "baseline (the notes' loop)"
    if "reference" in row and not name.startswith("single"):
        return f"{name} (world size 1)"
    return name.replace("+mlflow", " + MLflow")


def bench_rows(result: dict) -> list[list[str]]:
    out = []
    for name, r in result["rows"].items():
        if r["status"] != "ok":
            out.append([name, f"{r['status']}: {r['reason']}", *[""] * 6])
            continue
        out.append(
            [
                row_label(name, r),
                f"{r['epoch_s']:.2f}",
                f"{r['first_epoch_s']:.2f}",
                f"{r['samples_per_s']:.0f}",
                f"{r['speedup']:.2f}x",
                f"{r['vs_ref']:.2f}x {r['reference']}" if "vs_ref" in r else "",
                mfu_cell(name, r, result["info"]),
                r["precision"],
            ]
        )
    return out


def target_value(target: dict) -> str:
    value = target["value"]
    if value is None:
        return "not measured"
    if target["target"].startswith("MFU"):
        return f"{100 * value:.1f}%"
    if "epoch" in target["target"]:
        return f"{value:.2f} s"
    return f"{value:.2f}x"


def targets(result: dict) -> list[str]:
    rows = [[t["target"], target_value(t), t["status"]] for t in result["targets"]]
    return table(["target (bench.py's, as judged then)", "measured", "status"], rows)


def bench_block(path: Path) -> list[str]:
    result = json.loads(path.read_text())
    header = [
        "row",
        "s/epoch",
        "1st epoch s",
        "samples/s",
        "x baseline",
        "vs reference",
        "MFU",
        "precision",
    ]
    return [
        paragraph(bench_caption(path, result)),
        "",
        *table(header, bench_rows(result)),
        "",
        *targets(result),
    ]


def strategies_block(path: Path) -> list[str]:
    """Each strategy at world size 1 against `single` with the same effective settings."""
    from benchmarks.bench import TARGETS

    result = json.loads(path.read_text())
    bounds = {key: bound for _, key, bound in TARGETS["cuda"]}
    rows = []
    for name in result["ratios_to_single"]:
        r = result["rows"][name]
        ref = result["rows"][r["reference"]]
        bound = bounds.get(name)
        rows.append(
            [
                row_label(name, r),
                f"{r['epoch_s']:.2f}",
                f"{r['reference']} {ref['epoch_s']:.2f}",
                f"{r['vs_ref']:.2f}x",
                r["precision"],
                "" if bound is None else f"<= {bound:.2f}x",
            ]
        )
    header = ["strategy", "s/epoch", "its single, s/epoch", "ratio", "precision", "GPU target"]
    return [
        paragraph(
            bench_caption(path, result)
            + " Ratio: the median over the timed rounds of the strategy's epoch over its"
            " single's in the same round; GPU target: bench.py's `TARGETS` for a GPU."
        ),
        "",
        *table(header, rows),
    ]


# ---- benchmarks/dp_batchnorm.py


def batchnorm_block(path: Path) -> list[str]:
    result = json.loads(path.read_text())
    s = result["settings"]
    rows = []
    for split, r in result["results"].items():
        sizes = [int(n) for n in split.split(",")]
        label = f"{sizes[0]} (single: unsplit)" if len(sizes) == 1 else "+".join(split.split(","))
        accs = r["test_acc"]
        rows.append(
            [
                label,
                str(len(sizes)),
                f"{r['test_acc_median']:.3f}",
                f"{min(accs):.3f} to {max(accs):.3f}",
            ]
        )
    batch = sum(int(n) for n in next(iter(result["results"])).split(","))
    return [
        paragraph(
            f"From {source(path)}: width {s['width']}, batch {batch}, {s['epochs']} epochs, "
            f"lr {s['lr']}, medians of {s['seeds']} seeds."
        ),
        "",
        *table(
            ["samples per device per forward", "devices", "median test accuracy", "over the seeds"],
            rows,
        ),
    ]


# ---- benchmarks/startup.py and benchmarks/stress_exit.py


def startup_block(path: Path) -> list[str]:
    from benchmarks.startup import table as startup_table

    result = json.loads(path.read_text())
    info = result["info"]
    return [
        paragraph(
            f"From {source(path)}: {info.get('gpu') or info['cpu']}, {info['cpu_cores']} "
            f"cores, torch {info['torch']}; medians of {result['settings']['runs']} runs of "
            "each strategy and start method (forked, spawned), each `python -m pipeline.train "
            f"STRATEGY {' '.join(result['settings']['overrides'])}`, params.yaml's defaults "
            "otherwise (system and step metrics; the compare stage logs the model)."
        ),
        "",
        startup_table(result),
    ]


def stress_exit_block(path: Path) -> list[str]:
    result = json.loads(path.read_text())
    info, s = result["info"], result["settings"]
    runs = len(result["runs"])
    bad = ", ".join(str(i) for i in result["bad_runs"]) or "none"
    return [
        paragraph(
            f"From {source(path)}: {info.get('gpu') or info['cpu']}, {info['cpu_cores']} "
            f"cores, torch {info['torch']}; {s['busy']} busy processes beside the runs."
        ),
        "",
        *table(
            ["runs", "clean runs", "bad runs", "median s per run", "total s"],
            [
                [
                    str(runs),
                    str(runs - len(result["bad_runs"])),
                    bad,
                    f"{result['median_run_s']:.1f}",
                    f"{result['total_s']:.0f}",
                ]
            ],
        ),
    ]


# ---- benchmarks/peer.py


def peer_block(path: Path) -> list[str]:
    from benchmarks.peer import table as peer_table

    result = json.loads(path.read_text())
    info, load = result["info"], result["load_average"]
    return [
        paragraph(
            f"From {source(path)}: {info.get('gpu') or info['cpu']}, {info['cpu_cores']} "
            f"cores, torch {info['torch']}, Lightning {info['lightning']}; medians of "
            f"{result['settings']['runs']} runs of each, taking turns, batch "
            f"{next(iter(result['settings']['sizes'].values()))['batch']}; 1-minute load "
            f"average {load['before'][0]:.1f} before, {load['after'][0]:.1f} after."
        ),
        "",
        peer_table(result),
    ]


def performance_block(path: Path) -> list[str]:
    """The README's table: one size's three jobs side by side, the default job where the
    result has it (a GPU's), else its first size."""
    from benchmarks.peer import job_table

    result = json.loads(path.read_text())
    info, sizes = result["info"], result["settings"]["sizes"]
    name = "default job" if "default job" in sizes else next(iter(sizes))
    s, size = sizes[name], result["sizes"][name]
    runs = len(size["runs"])
    warm = result["settings"].get("warmup", 1)
    peak = result.get("peak")
    mfu = (
        f"MFU against {flops(peak['flops'])}, the {peak['precision']} peak "
        f"({peak['source']}), at {size['flops_per_image'] / 1e9:.3g} GFLOP per training image"
        if peak
        else "no MFU: this result predates it"
    )
    return [
        paragraph(
            f"From {source(path)}: {info.get('gpu') or info['cpu']}, {info['cpu_cores']} "
            f"cores, torch {info['torch']}, Lightning {info['lightning']}; {name}: width "
            f"{s['width']}, {s['train']} training images, {s['epochs']} epochs, batch "
            f"{s['batch']}; median of {runs} run{'s' * (runs != 1)} of each, taking turns, "
            f"after {warm} untimed round{'s' * (warm != 1)}; {mfu}."
        ),
        "",
        job_table(result, name),
    ]


# ---- benchmarks/suite_cpu.py


def suite_cpu_block(path: Path) -> list[str]:
    from benchmarks.suite_cpu import table as suite_table

    result = json.loads(path.read_text())
    info = result["info"]
    pytest_args = result["command"][result["command"].index("pytest") + 1 :]
    return [
        paragraph(
            f"From {source(path)}: {info['cpu']}, {info['cpu_cores']} cores, torch "
            f"{info['torch']}; `pytest {' '.join(pytest_args)}` (exit code "
            f"{result['exit_code']}), CPU seconds of every process it started, by kind; "
            f"the sampling itself took {result['sampler_cpu_s']:.0f} CPU s."
        ),
        "",
        suite_table(result),
    ]


# ---- benchmarks/sync_bn.py and stop_time.py: rows taking turns, another tree beside them


def turns_block(path: Path, each: str, render: Callable[[dict], str]) -> list[str]:
    """The caption and table of a benchmark whose rows took turns (benchmarks.e2e.taking_turns),
    `each` saying what each row ran and what its figure is."""
    result = json.loads(path.read_text())
    info, load, settings = result["info"], result["load_average"], result["settings"]
    others = [name for name in settings["trees"] if name != "this"]
    return [
        paragraph(
            f"From {source(path)}: {info['cpu']}, {info['cpu_cores']} cores, torch "
            f"{info['torch']}; {settings['runs']} rounds, the rows taking turns, each {each}; "
            f"1-minute load average {load['before'][0]:.1f} before, {load['after'][0]:.1f} "
            "after."
            + "".join(
                f" Rows marked ({name}) ran from another checkout (`--tree`)." for name in others
            )
        ),
        "",
        render(result),
    ]


def stage_turns(path: Path, stage: str, timed_by: str) -> str:
    """What each row of sync_bn.py and stop_time.py is: a whole 2-process train stage."""
    job = " ".join(json.loads(path.read_text())["settings"]["job"])
    return (
        f"a whole `python -m pipeline.train {stage} {job}` (2 gloo processes){timed_by}; the "
        "medians of the rounds"
    )


def sync_bn_block(path: Path) -> list[str]:
    from benchmarks.sync_bn import table as sync_bn_table

    each = stage_turns(path, "STRATEGY", ", timed by its steady epoch (metrics.json)")
    return turns_block(path, each, sync_bn_table)


def stop_time_block(path: Path) -> list[str]:
    from benchmarks.stop_time import table as stop_time_table

    timed_by = " brought to its point by a fault, timed from the fault's line to the stage's exit"
    return turns_block(path, stage_turns(path, "ddp", timed_by), stop_time_table)


def fair_race_block(path: Path) -> list[str]:
    from benchmarks.fair_race import table as fair_race_table

    quick = ", ".join(json.loads(path.read_text())["settings"]["quick"])
    each = (
        f"a whole `python -m pipeline.quickstart` (params.yaml's quick: {quick}) on a new MLflow "
        "store, the strategies forward (single first) or reversed; medians of the rounds' "
        "steady samples/s and speed floors; the orders agree when every objective's picks "
        "share a strategy"
    )
    return turns_block(path, each, fair_race_table)


def scaling_check_block(path: Path) -> list[str]:
    from benchmarks.scaling_check import table as scaling_table

    result = json.loads(path.read_text())
    info, load = result["info"], result["load_average"]
    links = "; ".join(
        f"{r['link']['busbw_GBps']:.2f} GB/s, {r['link']['latency_us']:.0f} us a ring step"
        for r in result["rounds"]
    )
    return [
        paragraph(
            f"From {source(path)}: {info['cpu']}, {info['cpu_cores']} cores, torch "
            f"{info['torch']}; {result['settings']['runs']} rounds, each predicting every "
            f"strategy at {result['world_size']} processes by the predict stage's own work, "
            "then running its train stage for real as that many processes (single: its "
            "profile on one device, the baseline, against its own stage); the gloo link "
            f"measured each round ({links}); settings "
            f"{', '.join(result['settings']['overrides'])}; 1-minute load average "
            f"{load['before'][0]:.1f} before, {load['after'][0]:.1f} after."
        ),
        "",
        scaling_table(result),
    ]


# ---- the blocks


@dataclass(frozen=True)
class Block:
    name: str
    render: Callable[[Path], list[str]]
    file: str = ""  # a fixed file of benchmarks/results/, which must exist
    newest: str = ""  # or the newest file matching this pattern, if any
    prefer: str = ""  # ... of those matching this one, if any

    def path(self, results: Path) -> Optional[Path]:
        if self.file:
            return results / self.file
        # the writers end each name with the date, <machine>-startup-YYYY-MM-DD.json
        for pattern in filter(None, (self.prefer, self.newest)):
            found = sorted(results.glob(pattern), key=lambda p: p.name[-len("YYYY-MM-DD.json") :])
            if found:
                return found[-1]
        return None

    def text(self, results: Path) -> str:
        path = self.path(results)
        return "" if path is None else "\n" + "\n".join(self.render(path)) + "\n\n"


BLOCKS = [
    Block("cpu-avx512", bench_block, file="cpu2-amd-epyc-2026-11-21.json"),
    Block("cpu-avx2", bench_block, file="cpu2-amd-epyc-2026-11-23.json"),
    Block("cpu-strategies", strategies_block, file="cpu2-amd-epyc-2026-11-24.json"),
    Block("h100", bench_block, file="nvidia-h100-80gb-hbm3-2026-11-23.json"),
    Block("dp-batchnorm", batchnorm_block, file="dp-batchnorm-cpu2-real-sample-2026-11-23.json"),
    Block("startup", startup_block, newest="*-startup-*.json"),
    Block("stress-exit", stress_exit_block, newest="*-stress-exit-*.json"),
    Block("peer", peer_block, newest="*-peer-*.json"),
    Block("performance", performance_block, newest="*-peer-*.json", prefer="nvidia-*-peer-*.json"),
    Block("suite-cpu", suite_cpu_block, newest="*-suite-cpu-*.json"),
    Block("sync-bn", sync_bn_block, newest="*-sync-bn-*.json"),
    Block("stop-time", stop_time_block, newest="*-stop-time-*.json"),
    Block("fair-race", fair_race_block, newest="*-fair-race-*.json"),
    Block("scaling-check", scaling_check_block, newest="*-scaling-check-*.json"),
]
MARKED = re.compile(r"<!-- tables:([a-z0-9-]+) -->\n(.*?)<!-- /tables:\1 -->\n", re.S)
OPENING = re.compile(r"<!-- tables:([a-z0-9-]+) -->")


def fill(doc: str, text: str, results: Path, write: bool) -> tuple[str, list[str], set[str]]:
    """`text` with its blocks rendered afresh, what is wrong with them (`doc` names the file),
    and the names of the blocks it holds. Without `write` a block that differs is one of the
    problems; with it, only what cannot be rewritten is."""
    known = {block.name: block for block in BLOCKS}
    problems, seen, out, at = [], set(), [], 0
    closed = {m.group(1) for m in MARKED.finditer(text)}
    for name in OPENING.findall(text):
        if name not in closed:
            problems.append(f"{doc}: block {name} has no `<!-- /tables:{name} -->`")
    for m in MARKED.finditer(text):
        name, current = m.group(1), m.group(2)
        out.append(text[at : m.start(2)])
        at = m.end(2)
        path = known[name].path(results) if name in known else None
        if name not in known:
            problems.append(f"{doc}: block {name}: no such table in benchmarks/tables.py")
        elif path is not None and not path.exists():
            problems.append(f"{doc}: block {name}: {path} is missing")
        else:
            seen.add(name)
            fresh = known[name].text(results)
            if fresh != current and not write:
                problems.append(f"{doc}: block {name} differs from its JSON")
            current = fresh if write else current
        out.append(current)
    out.append(text[at:])
    return "".join(out), problems, seen


def regenerate(docs: list[Path], results: Path, write: bool) -> list[str]:
    """What differs between the docs' blocks and the JSON, one line each ([] when none);
    with `write`, the blocks are rewritten first, and what cannot be (an unknown or unclosed
    block, a missing JSON, a JSON whose block is in no document) is still reported."""
    problems, seen = [], set()
    for doc in docs:
        if not doc.exists():
            continue
        text = doc.read_text()
        new, wrong, found = fill(doc.name, text, results, write)
        problems += wrong
        seen |= found
        if write and new != text:
            doc.write_text(new)
    for block in BLOCKS:
        path = block.path(results)
        if block.name not in seen and path is not None and path.exists():
            problems.append(f"block {block.name}: in no document, yet its JSON exists")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    problems = regenerate(documents(), RESULTS, write=not args.check)
    for line in problems:
        print(f"tables: {line}", file=sys.stderr)
    if problems and args.check:
        print("tables: run `python -m benchmarks.tables` to regenerate", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
