"""Scale-out, for real on one machine: two torchrun "nodes" meeting in a c10d rendezvous on
127.0.0.1 (DDP over gloo), a lost node, the Kubernetes and SLURM recipes, and a DVC
experiment sweep compared across experiments.

Every subprocess has a timeout; every process a "node" started is found again by a marker in
its environment (torchrun starts workers in their own sessions, so a process group is not
enough) and killed at the end, whatever happened.
"""

import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import torch
from mlflow.tracking import MlflowClient

from support import dvc, free_port, make_project, project_env, run, tiny_params, wait_for

NODE_MARKER = "PARALLEL_LAB_TEST_NODE"  # in the environment of everything a test node starts


def latest(project: Path) -> dict | None:
    """The committed checkpoint record of the ddp run, if any."""
    try:
        return json.loads((project / "checkpoints/ddp/latest.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


# --- the pure launch logic ------------------------------------------------------------------


# --- two "nodes" on this machine ------------------------------------------------------------

# fp64: fp32 training of this net is chaotic, so only fp64 runs can be compared at 1e-9.
# Six short epochs leave room to lose a node mid-run.
TINY64 = {
    "model": {"width": 4},
    "train": {"epochs": 6, "batch_size": 32, "eval_batch_size": 64, "precision": "fp64"},
    "data": {"limit_train": 128, "limit_test": 64},
    "strategies": ["ddp"],
    "report": {"system_metrics_interval_s": None},
}
NODE_TIMEOUT = 300


def kill_node(marker: str) -> int:
    """SIGKILL every process started with this marker: launcher, torchrun agent, workers."""
    killed = 0
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get(NODE_MARKER) == marker:
                proc.kill()
                killed += 1
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return killed


class Nodes:
    """`python -m pipeline.train ddp` once per node, concurrently, in one project copy."""

    def __init__(self, project: Path, n: int, *overrides: str, uri: str, **env: str):
        self.project, self.tag = project, uuid.uuid4().hex
        self.port = free_port()
        self.procs, self.logs = [], []
        for rank in range(n):
            log = project / f"node{rank}-{self.tag}.log"
            self.logs.append(log)
            node_env = project_env(
                project, MLFLOW_TRACKING_URI=uri, **{NODE_MARKER: f"{self.tag}-{rank}"}, **env
            )
            cmd = [
                sys.executable,
                "-m",
                "pipeline.train",
                "ddp",
                "ddp.nproc=1",
                f"dist.nnodes={n}",
                f"dist.node_rank={rank}",
                f"dist.rdzv_endpoint=127.0.0.1:{self.port}",
                *overrides,
            ]
            with open(log, "w") as out:
                self.procs.append(
                    subprocess.Popen(
                        cmd,
                        cwd=project,
                        env=node_env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )

    def kill(self, rank: int) -> int:
        return kill_node(f"{self.tag}-{rank}")

    def wait(self, rank: int, timeout: float = NODE_TIMEOUT) -> int:
        return self.procs[rank].wait(timeout=timeout)

    def log(self, rank: int) -> str:
        return self.logs[rank].read_text()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for rank in range(len(self.procs)):
            self.kill(rank)
        for proc in self.procs:
            proc.wait(timeout=30)


def finish(nodes: Nodes) -> None:
    for rank in range(len(nodes.procs)):
        code = nodes.wait(rank)
        assert code == 0, f"node {rank} exited {code}\n{nodes.log(rank)[-6000:]}"


def reset(project: Path) -> None:
    import shutil

    for name in ("results", "checkpoints"):
        shutil.rmtree(project / name, ignore_errors=True)


def model_of(project: Path) -> dict:
    return torch.load(project / "results/ddp/model.pt", weights_only=True)


@pytest.fixture(scope="module")
def two_node_project(tmp_path_factory, http_mirror):
    """A fetched project copy, and the reference: the same job as 1 node x 2 processes."""
    project = make_project(
        tmp_path_factory.mktemp("scale") / "project", tiny_params(http_mirror, **TINY64)
    )
    run(project, "python", "-m", "pipeline.fetch")
    run(
        project,
        "python",
        "-m",
        "pipeline.train",
        "ddp",
        "ddp.nproc=2",
        MLFLOW_TRACKING_URI=f"sqlite:///{project / 'one-node.db'}",
        timeout=NODE_TIMEOUT,
    )
    reference = model_of(project)
    assert json.loads((project / "results/ddp/summary.json").read_text())["world_size"] == 2
    return project, reference


def max_diff(model: dict, reference: dict) -> float:
    assert model.keys() == reference.keys()
    return max((model[k].double() - reference[k].double()).abs().max().item() for k in reference)


@dataclass
class TwoNodeRun:
    model: dict  # results/ddp/model.pt
    logs: str  # both nodes' output
    uri: str  # its MLflow store


@pytest.fixture(scope="module")
def two_node_run(two_node_project) -> TwoNodeRun:
    """The job on two "nodes", one process each, undisturbed."""
    project, _ = two_node_project
    reset(project)
    uri = f"sqlite:///{project / 'two-nodes.db'}"
    with Nodes(project, 2, uri=uri) as nodes:
        finish(nodes)
    return TwoNodeRun(model_of(project), nodes.log(0) + nodes.log(1), uri)


def test_two_nodes_train_the_same_model_as_one_node_with_two_processes(
    two_node_project, two_node_run
):
    _, reference = two_node_project
    logs = two_node_run.logs
    assert "this node of 2 (c10d rendezvous parallel-lab-ddp at 127.0.0.1:" in logs
    diff = max_diff(two_node_run.model, reference)
    print(f"fp64 max |2 nodes x 1 process - 1 node x 2 processes| = {diff:.3e}")
    # another topology sums the gradients in another order: equal to rounding, not bitwise
    assert diff < 1e-9
    # one writer for the whole job: one MLflow run, whichever node held global rank 0
    client = MlflowClient(tracking_uri=two_node_run.uri)
    runs = client.search_runs([client.get_experiment_by_name("tests").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert runs[0].data.tags["world_size"] == "2"
    assert runs[0].data.params["train.epochs"] == str(TINY64["train"]["epochs"])


def test_a_lost_node_stops_the_job_cleanly_at_its_last_checkpoint(two_node_project, tmp_path):
    """nnodes=2, not elastic: the survivor gives up after dist.join_timeout_s, saying where a
    rerun resumes (a resumed run is bitwise the undisturbed one: test_reliability; resuming
    after a lost node: the elastic test below)."""
    project, _ = two_node_project
    reset(project)
    uri = f"sqlite:///{project / 'lost-node.db'}"
    # max_restarts > 0: the surviving node restarts its worker and waits for the lost node
    # to rejoin, for join_timeout_s; nnodes=2 (not elastic) forbids carrying on alone.
    retry = ("checkpoint.max_restarts=2", "dist.join_timeout_s=20")
    # Global rank 0, on whichever node, waits at the start of epoch 2 (epoch 1 committed)
    # until node 1 is gone, so the node is lost at a known point.
    node_lost = tmp_path / "node-1-lost"
    hold = f"rank=0,epoch=2,action=hold,release={node_lost}"
    with Nodes(project, 2, *retry, uri=uri, PARALLEL_LAB_FAULT=hold) as nodes:
        wait_for(
            lambda: "fault: rank 0 holding" in nodes.log(0) + nodes.log(1),
            NODE_TIMEOUT,
            "global rank 0 holding before epoch 2",
        )
        assert nodes.kill(1) >= 2  # the launcher (the node's agent) and its worker: all of it
        node_lost.touch()
        started = time.monotonic()
        code = nodes.wait(0, timeout=240)
        waited = time.monotonic() - started
    survivor = nodes.log(0)
    print(f"node 1 lost in epoch 2; node 0 exited {code} after {waited:.0f}s")
    assert code not in (0, 2), survivor[-4000:]
    last = survivor.strip().splitlines()[-1]
    print(last)
    assert last.startswith("error: train[ddp]: the 2-node job stopped on this node"), last
    record = latest(project)
    assert (record["epoch"], record["step"]) == (1, 0), record
    assert "resume from epoch 2 step 0" in last
    assert not (project / "results/ddp/metrics.json").exists()


def test_an_elastic_job_that_loses_a_node_carries_on_with_fewer_processes(
    two_node_project, two_node_run, tmp_path
):
    """dist.min_nnodes=1: node 0 restarts its worker, the rendezvous closes with the one node
    left, and ddp (SyncBN: the same trajectory at any world size) resumes the epoch-1
    checkpoint resharded over 1 process instead of starting over."""
    project, _ = two_node_project
    reset(project)
    uri = f"sqlite:///{project / 'elastic.db'}"
    node_lost = tmp_path / "node-1-lost"
    hold = f"rank=0,epoch=2,action=hold,release={node_lost}"
    elastic = ("checkpoint.max_restarts=2", "dist.min_nnodes=1", "dist.join_timeout_s=60")
    with Nodes(project, 2, *elastic, uri=uri, PARALLEL_LAB_FAULT=hold) as nodes:
        wait_for(
            lambda: "fault: rank 0 holding" in nodes.log(0) + nodes.log(1),
            NODE_TIMEOUT,
            "global rank 0 holding before epoch 2",
        )
        assert nodes.kill(1) >= 2
        node_lost.touch()
        code = nodes.wait(0, timeout=NODE_TIMEOUT)
    survivor = nodes.log(0)
    assert code == 0, survivor[-6000:]
    assert "resuming at epoch 2 step 0" in survivor and "resharded over 1" in survivor
    metrics = json.loads((project / "results/ddp/summary.json").read_text())
    assert metrics["world_size"] == 1
    assert any(n.startswith("world size 2 -> 1 at epoch 2 step 0") for n in metrics["notes"])
    # fp64: SyncBN over 2 processes of 16 samples or 1 of 32 is the same sum, rounded
    # differently
    assert max_diff(model_of(project), two_node_run.model) <= 1e-9
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("tests").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(runs[0].info.run_id, "test_acc")]
    assert steps == list(range(1, TINY64["train"]["epochs"] + 1))


@pytest.mark.parametrize(
    "args, env, words",
    [
        (["ddp", "dist.nnodes=2"], {}, ["dist.rdzv_endpoint", "not set"]),
        (["ddp"], {"NNODES": "2"}, ["dist.rdzv_endpoint", "NNODES is 2"]),
        (
            ["single", "dist.nnodes=2", "dist.rdzv_endpoint=127.0.0.1:1"],
            {},
            ["dist.nnodes", "'single' runs on one node"],
        ),
    ],
)
def test_multi_node_mistakes_stop_before_torchrun(two_node_project, args, env, words):
    project, _ = two_node_project
    proc = run(project, "python", "-m", "pipeline.train", *args, check=False, timeout=120, **env)
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and all(w in last for w in words), last
    assert "launch[" not in proc.stdout  # nothing was started


# --- Kubernetes and SLURM recipes -----------------------------------------------------------


# --- DVC experiment sweeps ------------------------------------------------------------------


def test_a_queued_sweep_runs_and_compares_across_experiments(tmp_path, http_mirror):
    params = tiny_params(
        http_mirror,
        strategies=["single"],
        model={"width": 4},
        data={"limit_train": 64, "limit_test": 32},
        train={"epochs": 1, "batch_size": 32},
        report={"system_metrics_interval_s": None},
    )
    project = make_project(tmp_path / "project", params)
    dvc(project, "repro", "fetch", timeout=300)
    run(project, "git", "add", "-A")
    run(project, "git", "commit", "-qm", "fetched")
    queued = dvc(project, "exp", "run", "--queue", "-S", "train.lr=0.05,0.2", timeout=300)
    assert queued.stdout.count("Queued experiment") == 2, queued.stdout
    dvc(project, "exp", "run", "--run-all", timeout=600)
    shown = json.loads(dvc(project, "exp", "show", "--json", timeout=300).stdout)
    experiments = [e for b in shown for e in (b.get("experiments") or [])]
    assert len(experiments) == 2
    assert all(e["executor"] is None or e["executor"]["state"] == "success" for e in experiments)
    out = run(project, "python", "-m", "pipeline.experiments", timeout=300)
    table = (project / "reports/experiments.md").read_text()
    assert table == out.stdout
    rows = [line for line in table.splitlines() if line.startswith("| ")][1:]
    assert len(rows) == 2 and all("| single |" in r for r in rows), table
    assert {r.split(" | ")[3] for r in rows} == {"0.05", "0.2"}  # the train.lr column
    assert "No metrics" not in table
    # DVC ran them in temporary copies: their MLflow runs are in the repository's own store,
    # each tagged with its experiment's name
    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    (exp_id,) = [e.experiment_id for e in client.search_experiments() if e.name == "tests"]
    trained = client.search_runs([exp_id], "tags.dvc_stage = 'train@single'")
    names = {e["name"] for e in experiments}
    assert {r.data.tags.get("dvc_experiment") for r in trained} == names, names
    assert sorted(r.data.params["train.lr"] for r in trained) == ["0.05", "0.2"]
