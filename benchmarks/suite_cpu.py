"""Where the test suite's CPU goes: every process a pytest run starts, summed by kind.

    python -m benchmarks.suite_cpu                   # the whole suite, as `make test` runs it
    python -m benchmarks.suite_cpu -- tests/unit     # pytest arguments after --

On 2 cores the suite is CPU-bound (the JSON's busy share: about 94% of both cores over a whole
run), so its wall time follows the CPU seconds of the processes it starts, not the tests' own
code. While pytest runs, a thread reads /proc every 0.1 s and keeps each process's last
user + system time, then sums them by kind: stage launchers and what they fork (workers, the
MLflow publisher), the other pipeline commands, DVC, MLflow servers, the C++ compiler
(torch.compile), containers, the pytest workers. Processes in containers are seen too (one
kernel). A process that lives under 0.1 s may be missed, with less than 0.1 s of CPU.
Writes benchmarks/results/<machine>-suite-cpu-<date>.json.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from benchmarks.bench import machine, write_result

PERIOD_S = 0.1
LARGEST = 3  # processes named in each kind's row of the JSON
TICKS = os.sysconf("SC_CLK_TCK")
# python's own arguments up to -m MODULE: a module named later (in a -c script, a path) is not it
PYTHON_M = r"^\S*python[\d.]*\s+(?:-\S+\s+)*-m\s+"
# cmdline pattern -> kind, first match wins; a pipeline command forked by the same command (a
# stage's workers and publisher) is "<kind>: forked"
KINDS = [
    (PYTHON_M + r"pytest\b|import sys;exec\(eval\(sys\.stdin", "pytest and its workers"),
    (PYTHON_M + r"(pipeline\.\w+|benchmarks\.\w+)", None),  # the module it runs
    (r"from pipeline( import|\.)", "pipeline in-process (python -c)"),
    (r"\bmlflow (server|ui)\b|gunicorn|uvicorn|huey", "MLflow server"),
    (r"(^|/)dvc\b", "dvc"),
    (r"cc1plus|(^|/)(g\+\+|c\+\+|gcc|collect2|ld|as) ", "C++ compiler"),
    (r"docker|containerd|runc|postgres|pg_", "containers"),
    (r"python", "python, other"),
]


@dataclass
class Proc:
    pid: int
    ppid: int
    cmd: str  # its command line (see `command`)
    cpu_s: float = 0.0  # user + system at the last sample


def command(proc_dir: str, comm: str, ppid: int) -> str:
    """The command line of /proc/<pid>; [comm] for a kernel thread (a child of kthreadd, pid
    2); "" for a process exiting (a zombie has no command line)."""
    if ppid == 2 or proc_dir.endswith("/2"):
        return f"[{comm}]"
    raw = Path(proc_dir, "cmdline").read_bytes()
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:400]


def kind_of(cmd: str, parent_cmd: str | None) -> str:
    if cmd.startswith("["):
        return "kernel threads"
    for pattern, kind in KINDS:
        match = re.search(pattern, cmd)
        if match:
            name = kind or match.group(1)
            # the same command line as its parent: a fork (a stage's workers, its publisher)
            return f"{name}: forked" if parent_cmd == cmd and name.startswith("pipeline") else name
    return Path(cmd.split()[0]).name if cmd.split() else "unknown"


def summarize(procs: list[Proc]) -> dict[str, dict]:
    """kind -> CPU seconds, processes, the median process's CPU seconds and the LARGEST
    processes' (CPU s, command line), most CPU first."""
    by_pid = {p.pid: p for p in procs}
    kinds: dict[str, list[Proc]] = {}
    for p in procs:
        parent = by_pid.get(p.ppid)
        kinds.setdefault(kind_of(p.cmd, parent.cmd if parent else None), []).append(p)
    rows: dict[str, dict] = {
        kind: {
            "cpu_s": round(sum(p.cpu_s for p in members), 2),
            "processes": len(members),
            "median_cpu_s": round(statistics.median(p.cpu_s for p in members), 2),
            "largest": [
                [round(p.cpu_s, 2), p.cmd[:160]]
                for p in sorted(members, key=lambda p: -p.cpu_s)[:LARGEST]
            ],
        }
        for kind, members in kinds.items()
    }
    return dict(sorted(rows.items(), key=lambda kv: -float(kv[1]["cpu_s"])))


def cpu_busy_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    return sum(fields) - idle, sum(fields)


class Sampler:
    """Reads every process's CPU time from /proc each PERIOD_S, on a thread, until stopped;
    `procs` leaves out this process (the sampler's own thread)."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, int], Proc] = {}  # (pid, start time): a reused pid is another
        self.by_pid: dict[int, Proc] = {}  # the latest of each pid
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="suite-cpu-sampler")

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def _run(self) -> None:
        while True:
            self.sample()
            if self.stop.wait(PERIOD_S):
                self.sample()
                return

    def sample(self) -> None:
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                stat = Path(entry.path, "stat").read_text()
                comm = stat[stat.index("(") + 1 : stat.rindex(")")]
                fields = stat[stat.rindex(")") + 2 :].split()
                key, ppid = (int(entry.name), int(fields[19])), int(fields[1])
                known = self.seen.get(key)
                parent = self.by_pid.get(ppid)
                # new, or a fork still its parent's command line: it may have exec'd since;
                # one exiting has none left, and keeps the one it had (a first sight: its comm)
                if known is None or (parent is not None and known.cmd == parent.cmd):
                    cmd = command(entry.path, comm, ppid) or (known.cmd if known else comm)
                    self.seen[key] = known = Proc(key[0], ppid, cmd)
                    self.by_pid[key[0]] = known
                known.cpu_s = (int(fields[11]) + int(fields[12])) / TICKS
            except (OSError, ValueError, IndexError):  # it ended while being read
                continue

    def procs(self, since: dict[tuple[int, int], float]) -> list[Proc]:
        """Every process seen, with the CPU it spent after `since` (a sample taken before)."""
        return [
            Proc(p.pid, p.ppid, p.cmd, p.cpu_s - since.get(key, 0.0))
            for key, p in self.seen.items()
            if p.cpu_s - since.get(key, 0.0) > 0 and p.pid != os.getpid()
        ]


def measure(command: list[str]) -> dict:
    """Run `command` and account for the CPU every process spent while it ran."""
    sampler = Sampler()
    sampler.sample()  # processes already running count only what they spend from now
    since = {key: p.cpu_s for key, p in sampler.seen.items()}
    busy0, total0 = cpu_busy_ticks()
    started = time.monotonic()
    with sampler:
        code = subprocess.run(command).returncode
    wall = time.monotonic() - started
    busy1, total1 = cpu_busy_ticks()
    kinds = summarize(sampler.procs(since))
    return {
        "command": command,
        "exit_code": code,
        "wall_s": round(wall, 1),
        "cpu_s": round(sum(k["cpu_s"] for k in kinds.values()), 1),
        "busy_share": round((busy1 - busy0) / max(total1 - total0, 1), 3),
        "sampler_cpu_s": round(time.process_time(), 1),
        "kinds": kinds,
    }


def table(result: dict) -> str:
    lines = [
        f"{result['wall_s']:.0f} s wall, {result['cpu_s']:.0f} CPU s seen, "
        f"{result['busy_share']:.0%} of the CPUs busy",
        "",
        "| kind | CPU s | share | processes | median process CPU s |",
        "|---|---:|---:|---:|---:|",
    ]
    for kind, row in result["kinds"].items():
        share = row["cpu_s"] / max(result["cpu_s"], 1e-9)
        lines.append(
            f"| {kind} | {row['cpu_s']:.1f} | {share:.0%} | {row['processes']} | "
            f"{row['median_cpu_s']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="JSON path (default benchmarks/results/...)")
    parser.add_argument("pytest_args", nargs="*", help="after --; default: the whole suite")
    args = parser.parse_args(argv)
    import torch

    label, info = machine(torch.device("cpu"))
    # the Makefile's PYTEST: two workers, each e2e module on one, longest first
    pytest = [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup"]
    result = {
        "machine": label,
        "info": info,
        "date": date.today().isoformat(),
        **measure([*pytest, "--no-loadscope-reorder", "-q", *args.pytest_args]),
    }
    out = write_result(result, "suite-cpu", args.out)
    print(table(result), flush=True)
    print(f"suite_cpu: wrote {out}", flush=True)
    return result


if __name__ == "__main__":
    main()
