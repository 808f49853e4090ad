"""What the tests share besides fixtures: a synthetic Fashion-MNIST in real IDX format, a
real HTTP mirror on 127.0.0.1, throw-away copies of the project to run stages and `dvc repro`
in, and processes to start, watch and stop."""

from __future__ import annotations

import atexit
import functools
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from pipeline.data.synthetic import write_synthetic

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
PROJECT_FILES = [
    "pipeline",
    "dvc.yaml",
    "params.yaml",
    ".dvc/config",
    ".dvc/.gitignore",  # as in a clone: .dvc/cache and .dvc/tmp stay out of a commit
    ".dvcignore",
    ".gitignore",
    "pyproject.toml",
    "stage_code",  # links (pipeline/stage_code.py): copied as links, so edits reach DVC
]


def run_if(*, min_gpus: int) -> pytest.MarkDecorator:
    """lightning-hydra-template's RunIf: the test runs where the machine has what it needs,
    and elsewhere skips saying what is missing, so `make test` on a GPU host runs the CUDA
    tests too. GPUs are counted as the launcher counts them (NVML: no CUDA is initialised in
    the test process, which may later fork)."""
    from pipeline.launch.devices import visible_gpu_count

    found = visible_gpu_count()
    return pytest.mark.skipif(
        found < min_gpus,
        reason=f"needs {min_gpus} CUDA device(s); "
        + ("no CUDA device here" if found == 0 else f"{found} here"),
    )


def code_deps(deps: list[str], item: str | None = None) -> set[str]:
    """A stage's code deps (dvc.yaml), as the project's .py files DVC hashes: `${item}` filled
    in, directories expanded, and stage_code/'s links followed to the modules they name."""
    files = set()
    for dep in deps:
        path = REPO / (dep.replace("${item}", item) if item else dep)
        if dep.startswith(("pipeline/", "stage_code/")):
            found = path.rglob("*.py") if path.is_dir() else [path]
            files |= {p.resolve().relative_to(REPO).as_posix() for p in found}
    return files


def write_raw(directory: Path, n_train: int = 512, n_test: int = 128) -> dict[str, str]:
    """Write the four IDX gz files; return their MD5s (file name -> sum)."""
    return write_synthetic(directory, n_train, n_test)


@dataclass
class Mirror:
    url: str
    directory: Path
    md5: dict[str, str]


def serve(directory: Path):
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


IMAGE = "registry.example/parallel-lab:test"  # what the container would record as its image
# Chance is 0.1. On the synthetic data (a class-dependent band in noise) tiny_params' config
# (width 8, 512 samples, 2 epochs of 16 steps) measured test_acc 1.0 for every strategy, both
# with this VM's AVX-512 kernels and with AVX2 ones (ATEN_CPU_CAPABILITY=avx2
# ONEDNN_MAX_CPU_ISA=AVX2), 2026-11-24: far above this bound, which a run that learned
# nothing (about 0.1) cannot reach.
LEARNED = 0.5


# the parity tests' run: 10 optimizer steps of a global batch of 32 on the tiny network, from
# one seed; each test adds its strategies' sections and its precision
TEN_STEPS = [
    "seed=0",
    "model.width=8",
    "data.limit_train=320",
    "train.batch_size=32",
    "train.epochs=1",
]


# what the tests that read predictions add to tiny_params: predict stages in seconds, one N,
# a short timing, a given link (no gloo measured)
PREDICT = {"predict": {"gpus": [2]}}


def tiny_params(mirror: Mirror, **sections) -> dict:
    """params.yaml for a run that takes seconds and learns: width 8, 512 training samples,
    2 epochs of 16 steps."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["data"].update(
        mirrors=[mirror.url], md5=dict(mirror.md5), limit_train=512, limit_test=128
    )
    params["model"]["width"] = 8
    params["train"].update(epochs=2, batch_size=32, eval_batch_size=64)
    params["mlflow"].update(experiment="tests", log_model=False)  # tests that log it say so
    # The predict stages say at once that none were asked for (4 s less each): the tests
    # that read predictions ask for them (PREDICT: one N, a short timing, a given link)
    params["predict"].update(gpus=[], time_s=0.2, link="12")
    params["strategies"] = ["single", "ddp"]  # tests that want others say so
    for key, value in sections.items():
        if isinstance(value, dict):
            params.setdefault(key, {}).update(value)
        else:
            params[key] = value
    return params


def make_project(dest: Path, params: dict) -> Path:
    """A copy of the project as a fresh git + DVC repository with `params` as params.yaml."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in PROJECT_FILES:
        src = REPO / name
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(
                src, target, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            shutil.copy2(src, target)
    (dest / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=dest, check=True)
    subprocess.run([*git, "add", "-A"], cwd=dest, check=True)
    subprocess.run([*git, "commit", "-qm", "test project"], cwd=dest, check=True)
    return dest


_TEMPLATE_STORE: list[Path] = []


def empty_store(path: Path) -> None:
    """An empty MLflow SQLite store at `path`: a copy of one made once per test process.
    (MLflow builds a new store's tables by running its migrations, seconds each time.)"""
    if not _TEMPLATE_STORE:
        from mlflow.tracking import MlflowClient  # only the processes that need a store

        folder = Path(tempfile.mkdtemp(prefix="mlflow-template-"))
        atexit.register(shutil.rmtree, folder, True)  # the test process's, gone with it
        template = folder / "mlflow.db"
        MlflowClient(tracking_uri=f"sqlite:///{template}").search_experiments()
        _TEMPLATE_STORE.append(template)
    shutil.copyfile(_TEMPLATE_STORE[0], path)


def project_temp(project: Path) -> Path:
    """The TMPDIR of a project copy's stages, beside it: what a stage a test SIGKILLs leaves
    (its launcher's and publisher's temporary folders) goes with the test's files, not into
    the machine's /tmp."""
    return project.parent / f"{project.name}-tmp"


def project_env(project: Path, **extra: str | None) -> dict[str, str]:
    """Environment for stage processes: the project copy's code first, its own MLflow store,
    no GPUs (CI has none; hiding them keeps runs identical on a GPU machine), one thread per
    process (2 cores shared by several processes: OpenMP's spinning threads would make every
    run many times slower and its timing a matter of luck). An `extra` value of None removes
    the variable. A SQLite store it names that does not exist yet starts as an empty copy."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PARALLEL_LAB_"))}
    env.update(
        PYTHONPATH=str(project),
        CUDA_VISIBLE_DEVICES="",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        MLFLOW_TRACKING_URI=f"sqlite:///{project / 'mlflow.db'}",
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@t",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@t",
    )
    temp = project_temp(project)
    temp.mkdir(exist_ok=True)
    env["TMPDIR"] = str(temp)
    env.update({k: v for k, v in extra.items() if v is not None})
    uri = env.get("MLFLOW_TRACKING_URI", "")
    store = Path(uri.removeprefix("sqlite:///"))
    # (only an absolute path, in a folder that exists: a test may name a malformed store)
    if uri.startswith("sqlite:////") and not store.exists() and store.parent.is_dir():
        empty_store(store)
    return {k: v for k, v in env.items() if extra.get(k, "") is not None}


def run(
    project: Path, *args: str, timeout: float = 300, check: bool = True, **env: str
) -> subprocess.CompletedProcess:
    """Run a command (e.g. `python -m pipeline.train single`) in a project copy."""
    cmd = [sys.executable if a == "python" else a for a in args]
    proc = subprocess.run(
        cmd,
        cwd=project,
        env=project_env(project, **env),
        text=True,
        capture_output=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} exited {proc.returncode}\n"
            f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-6000:]}"
        )
    assert_torn_down(proc.stdout + proc.stderr)
    return proc


# Train stages one after the other in one process, as the quickstart runs them (its e2e test
# checks that a stage run so equals the command run alone, bitwise): each stage's results and
# checkpoint record copied to kept/<label>/ before the next run of the same strategy.
STAGES_IN_ONE_PROCESS = """
import json, shutil, sys
from pathlib import Path
from pipeline import train
from pipeline.cli import exit_code
for label, strategy, overrides in json.loads(sys.argv[1]):
    code = exit_code(train.main, [strategy, *overrides])
    if code:
        sys.exit(f"{label}: python -m pipeline.train {strategy} exited {code}")
    kept = Path("kept") / label
    shutil.copytree(Path("results") / strategy, kept)
    shutil.copy(Path("checkpoints") / strategy / "latest.json", kept / "latest.json")
"""


def train_in_one_process(
    project: Path, stages: list[tuple[str, str, list[str]]], timeout: float = 600, **env: str
) -> Path:
    """Run `python -m pipeline.train STRATEGY OVERRIDES` for each (label, strategy, overrides)
    in one process, torch and the project loaded once; kept/ holds each one's results."""
    run(project, "python", "-c", STAGES_IN_ONE_PROCESS, json.dumps(stages), timeout=timeout, **env)
    return project / "kept"


# What a run keeps between runs: a refused command must leave every file (and directory) of
# these as it was, and add none.
KEPT = ("results", "checkpoints", "data", "reports")


def kept_files(project: Path) -> dict[str, bytes | None]:
    """Every file and directory under the project's KEPT folders: path -> its bytes (None
    for a directory)."""
    found: dict[str, bytes | None] = {}
    for top in KEPT:
        root = project / top
        for path in [root, *root.rglob("*")] if root.exists() else []:
            found[str(path.relative_to(project))] = None if path.is_dir() else path.read_bytes()
    return found


def refused(project: Path, *args: str, timeout: float = 300, **env: str | None) -> str:
    """Run `python -m ARGS` in `project`, which must refuse its input (docs/reliability.md "Failure
    handling"): exit code 2, stderr exactly one `error: ...` line, no traceback anywhere, and
    everything KEPT byte-identical, no directory added. Returns the line."""
    before = kept_files(project)
    proc = run(project, "python", "-m", *args, timeout=timeout, check=False, **env)
    assert proc.returncode == 2, (
        f"exit {proc.returncode}\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    )
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    after = kept_files(project)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed and before.keys() == after.keys(), f"changed by the refusal: {changed}"
    return lines[0]


# what a worker says when a process group's threads survived its teardown (worker.py)
LEFT_THREADS = "outlived the process group"


def assert_torn_down(output: str) -> None:
    """Every worker of every run a test starts exits in order: no process group's thread
    outlives the group (pipeline/launch/worker.py `exit_cleanly`)."""
    assert LEFT_THREADS not in output, output[-4000:]


def dvc(project: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    return run(project, str(Path(sys.executable).with_name("dvc")), *args, **kw)


class Background:
    """A command started in its own session, its output (stdout and stderr) going to a log
    file that tests can wait on line by line."""

    def __init__(self, project: Path, *args: str, log: Path, **env: str):
        self.log_path = log
        self._tree: list[psutil.Process] = []
        cmd = [sys.executable if a == "python" else a for a in args]
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                cmd,
                cwd=project,
                env=project_env(project, **env),
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )

    def output(self) -> str:
        return self.log_path.read_text()

    def wait_for_output(self, text: str, timeout: float) -> None:
        wait_for(
            lambda: text in self.output() or self.proc.poll() is not None,
            timeout,
            f"{text!r} in the output",
        )
        assert text in self.output(), (
            f"exited {self.proc.returncode} before printing {text!r}\n{self.output()[-4000:]}"
        )

    def wait(self, timeout: float) -> int:
        """The command's exit code, once it and every process it had started when it was
        signalled have exited (torchrun's workers outlive a launcher that exits first)."""
        code = self.proc.wait(timeout=timeout)
        gone, alive = psutil.wait_procs(self._tree, timeout=timeout)
        assert not alive, f"still running after {timeout} s: {alive}"
        assert_torn_down(self.output())
        return code

    def signal_group(self, signum: int) -> None:
        """Signal the command's process group, as `docker stop` signals a container."""
        self._tree = descendants(self.proc.pid)
        os.killpg(self.proc.pid, signum)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        kill_tree(self.proc.pid)
        self.proc.wait(timeout=30)


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def kill_tree(pid: int) -> None:
    """SIGKILL a process and every descendant (torchrun starts its workers in sessions of
    their own, so killing a process group would leave them running)."""
    try:
        tree = [psutil.Process(pid), *descendants(pid)]
    except psutil.NoSuchProcess:
        return
    for proc in tree:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass


def wait_for(predicate, timeout: float, what: str) -> None:
    """Poll `predicate` until it holds; fail the test naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """A real `mlflow server` process on 127.0.0.1 with a sqlite store."""

    def __init__(self, root, port: int):
        self.root, self.port, self.proc = root, port, None
        self.uri = f"http://127.0.0.1:{port}"

    def start(self):
        if self.proc is not None and self.proc.poll() is None:
            return  # already serving
        mlflow = shutil.which("mlflow", path=os.path.dirname(sys.executable))
        self.proc = subprocess.Popen(
            [
                mlflow,
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--backend-store-uri",
                f"sqlite:///{self.root / 'server.db'}",
                "--artifacts-destination",
                str(self.root / "artifacts"),
                "--workers",
                "1",
            ],
            cwd=self.root,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            # as in docker-compose.yml: no GenAI job runner processes
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        )
        wait_for(self.healthy, 90, "mlflow server")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def kill(self):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


def batch_plan(cfg: Any, data_world: int = 1) -> Any:
    """The BatchPlan a strategy gets for `cfg` (its train section), without a data set."""
    from pipeline.batch_plan import BatchPlan

    plan = BatchPlan.make(cfg.train.batch_size, cfg.train.grad_accum)
    return plan.over(data_world, "test") if data_world > 1 else plan


def strategy_nproc(spec: Any, cfg: Any, n_gpus: int) -> int:
    """A strategy's SPEC.nproc as the launcher calls it: its own section and the one-process
    plan."""
    return spec.nproc(getattr(cfg, spec.facts.name), batch_plan(cfg), n_gpus)


def parallelize(spec: Any, model: Any, cfg: Any, ctx: Any) -> Any:
    """A strategy's SPEC.parallelize as build_training calls it (the run's precision's
    autocast)."""
    from pipeline.numerics.precision import build_precision

    world = spec.facts.mesh(getattr(cfg, spec.facts.name), ctx.world_size).data
    autocast = build_precision(cfg.train.precision, ctx.device).autocast
    return spec.parallelize(
        model, getattr(cfg, spec.facts.name), batch_plan(cfg, world), ctx, autocast
    )


def run_summary(
    name: str, devices: list[str], steady: float, acc: float, memory: dict[str, Any]
) -> Any:
    """A RunSummary of a 2-epoch run of 64-sample epochs: a 9 s warm-up, then `steady` s."""
    from pipeline.results import RunSummary

    return RunSummary(
        strategy=name,
        world_size=len(devices),
        devices=devices,
        batch_split=[64 // len(devices)] * len(devices),
        epochs=2,
        test_acc=acc,
        best_test_acc=acc,
        test_loss=1.0,
        train_loss=1.0,
        epoch_seconds=steady,
        samples_per_s=6400 / steady,
        total_seconds=9.0 + steady,
        warmup_epoch_seconds=9.0,
        steady_epoch_seconds=steady,
        steady_samples_per_s=6400 / steady,
        memory=memory,
    )


_EAGER = {"precision": "fp32", "channels_last": False, "compile": "off", "cuda_graphs": "none"}


def finished_run(
    name: str,
    seconds: list[float],
    devices: list[str] | None = None,
    features: dict | None = None,
    accuracy: list[float] | None = None,
    waits: list[float] | None = None,
) -> tuple[Any, list[Any]]:
    """A finished run's summary and history (6000 samples an epoch, fp32, eager, unless
    `features` says otherwise): its epochs took `seconds` (the first a warm-up), reached
    `accuracy` (0.8 every epoch unless given) and waited `waits` for a core (unmeasured
    unless given)."""
    from pipeline.results import EpochRow, RunSummary, speed_figures

    devices = devices or ["cpu"]
    accuracy = accuracy or [0.8] * len(seconds)
    waits = waits or [None] * len(seconds)
    history, wall = [], 0.0
    for epoch, (s, acc, w) in enumerate(zip(seconds, accuracy, waits), 1):
        wall += s
        row = EpochRow(epoch, 1.0, 0.5, 1.0, acc, s, 6000 / s, wall, warmup=epoch == 1, core_wait=w)
        history.append(row)
    summary = RunSummary(
        strategy=name,
        world_size=1,
        devices=devices,
        batch_split=[256 // len(devices)] * len(devices),
        epochs=len(seconds),
        test_acc=accuracy[-1],
        best_test_acc=max(accuracy),
        test_loss=1.0,
        train_loss=1.0,
        epoch_seconds=seconds[-1],
        samples_per_s=6000 / seconds[-1],
        total_seconds=wall,
        **speed_figures(history),
        speed_features=dict(features or _EAGER),
        memory={"memory_kind": "cpu", "peak_memory_mib": {"cpu0": 100.0}, "mem_imbalance": 1.0},
    )
    return summary, history


def fresh_python(code: str) -> Any:
    """What `code`, run in a fresh interpreter of the checkout (no imports carried over from
    the test process), prints as JSON."""
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    ).stdout
    return json.loads(out)


def mypy_flags(source: str, tmp_path: Path, timeout: int = 300) -> tuple[list[int], list[int], str]:
    """mypy (the project's config, its plugin too) on `source` written to tmp_path: -> the
    lines it flags, the lines marked `# error:` in the source, and mypy's output."""
    snippet = tmp_path / "snippet.py"
    snippet.write_text(source)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(REPO / "pyproject.toml"),
            "--cache-dir",
            str(tmp_path / "cache"),
            str(snippet),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    flagged = sorted(
        {int(line.split(":")[1]) for line in proc.stdout.splitlines() if ": error:" in line}
    )
    marked = [i for i, line in enumerate(source.splitlines(), 1) if "# error:" in line]
    return flagged, marked, proc.stdout


class KeptRecord:
    """A run's run.json, opened as its writer opens it (`open_record`) and pushed as its
    publisher pushes it (`publish_run`, saving the record after each step): the tests' way
    into MLflow without a stage."""

    def __init__(self, path: Path, fingerprint: str = "f", name: str = "run", **kw: Any):
        from pipeline.tracking.mlflow_run import new_record, open_record

        self.path = path
        params = kw.pop("params", {"lr": 0.1})
        new = new_record(fingerprint, kw.pop("experiment", "tests"), name, {}, params)
        open_record(path, new, fresh=kw.pop("fresh", True))
        assert not kw, kw

    @property
    def record(self) -> dict[str, Any]:
        from pipeline.tracking.mlflow_run import read_record

        return read_record(self.path)

    @property
    def run_id(self) -> str | None:
        return self.record["run_id"]

    def publish(self, history=(), artifacts=(), status=None, model=None) -> None:
        from pipeline.tracking.mlflow_run import publish_run, write_record

        record = self.record
        if status is not None:
            record["status"] = status
        save = functools.partial(write_record, self.path, record)
        publish_run(record, list(history), list(artifacts), save=save, model=model)
