"""Scale-out, for real on one machine: two torchrun "nodes" meeting in a c10d rendezvous on
127.0.0.1 (DDP over gloo), a lost node, the Kubernetes and SLURM recipes, and a DVC
experiment sweep compared across experiments.

Every subprocess has a timeout; every process a "node" started is found again by a marker in
its environment (torchrun starts workers in their own sessions, so a process group is not
enough) and killed at the end, whatever happened.
"""
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient

from conftest import REPO, dvc, make_project, project_env, run, tiny_params, wait_for
from pipeline.compare_experiments import build_rows, markdown
from pipeline.config import DistConfig
from pipeline.errors import UserError
from pipeline.launch_args import (Topology, check_multi_node, lost_node_hint, parse_endpoint,
                                  parse_nnodes, resolve_topology, torchrun_args,
                                  worker_overrides)

NODE_MARKER = "PARALLEL_LAB_TEST_NODE"  # in the environment of everything a test node starts


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def latest(project: Path) -> dict | None:
    """The committed checkpoint record of the ddp run, if any."""
    try:
        return json.loads((project / "checkpoints/ddp/latest.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


# --- the pure launch logic ------------------------------------------------------------------

def dist(**kw) -> DistConfig:
    return DistConfig(**kw)


def test_one_node_is_standalone():
    topo = resolve_topology(dist(), {}, "ddp")
    assert not topo.multi_node
    assert torchrun_args(2, 1, topo) == ["--standalone", "--nproc-per-node=2", "--max-restarts=1"]


def test_several_nodes_rendezvous_over_c10d():
    topo = resolve_topology(dist(nnodes=2, node_rank=1, rdzv_endpoint="node0:1234"), {}, "ddp")
    assert torchrun_args(4, 3, topo) == [
        "--nnodes=2", "--nproc-per-node=4", "--max-restarts=3", "--rdzv-backend=c10d",
        "--rdzv-endpoint=node0:1234", "--rdzv-id=parallel-lab-ddp",
        "--rdzv-conf=join_timeout=600,is_host=0"]
    node0 = resolve_topology(dist(nnodes=2, node_rank=0, rdzv_endpoint="node0:1234"), {}, "ddp")
    assert torchrun_args(4, 3, node0)[-1] == "--rdzv-conf=join_timeout=600,is_host=1"


def test_environment_wins_over_params():
    params = dist(nnodes=4, node_rank=0, rdzv_endpoint="params-host:1", rdzv_id="p")
    env = {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "head", "MASTER_PORT": "29500",
           "RDZV_ID": "job-7"}
    topo = resolve_topology(params, env, "fsdp")
    assert (topo.nnodes, topo.node_rank, topo.endpoint, topo.rdzv_id) == \
        ("2", 1, "head:29500", "job-7")
    # RDZV_ENDPOINT beats MASTER_ADDR+MASTER_PORT
    topo = resolve_topology(params, {**env, "RDZV_ENDPOINT": "rdzv:29400"}, "fsdp")
    assert topo.endpoint == "rdzv:29400"


def test_kubeflow_trainer_environment():
    # what the Torch plugin of Kubeflow Trainer puts into every `node` container
    env = {"PET_NNODES": "3", "PET_NPROC_PER_NODE": "auto", "PET_NODE_RANK": "2",
           "PET_MASTER_ADDR": "job-node-0-0.job", "PET_MASTER_PORT": "29400"}
    topo = resolve_topology(dist(), env, "ddp")
    assert (topo.nnodes, topo.node_rank, topo.endpoint, topo.source) == \
        ("3", 2, "job-node-0-0.job:29400", "PET_NNODES")


def test_elastic_range_from_params_or_environment():
    topo = resolve_topology(dist(nnodes=4, min_nnodes=2, rdzv_endpoint="h"), {}, "ddp")
    assert (topo.min_nodes, topo.max_nodes, topo.endpoint) == (2, 4, "h:29400")
    assert "--nnodes=2:4" in torchrun_args(1, 0, topo)
    assert resolve_topology(dist(), {"NNODES": "1:3", "RDZV_ENDPOINT": "h:1"}, "ddp").nnodes \
        == "1:3"


@pytest.mark.parametrize("env, words", [
    ({"NNODES": "2"}, ["dist.rdzv_endpoint", "not set", "NNODES is 2"]),
    ({"NNODES": "0"}, ["NNODES", "'0'"]),
    ({"NNODES": "3:2"}, ["NNODES", "MIN:MAX"]),
    ({"NNODES": "2", "RDZV_ENDPOINT": "h:99999"}, ["RDZV_ENDPOINT", "host:port"]),
    ({"NNODES": "2", "RDZV_ENDPOINT": "h:1", "NODE_RANK": "x"}, ["NODE_RANK", "'x'"]),
    ({"NNODES": "2", "RDZV_ENDPOINT": "h:1", "NODE_RANK": "2"}, ["dist.node_rank", "0..1"]),
])
def test_bad_topology_is_one_line_naming_its_source(env, words):
    with pytest.raises(UserError) as err:
        resolve_topology(dist(), env, "ddp")
    assert "\n" not in str(err.value) and all(w in str(err.value) for w in words), err.value


def test_which_strategies_span_nodes_and_batch_divisibility():
    two = Topology(2, 2, 0, "h:1", "id", 600)
    check_multi_node("single", Topology(1, 1, None, None, "id", 600), 1, 32, 1)
    with pytest.raises(UserError, match="'single' runs on one node"):
        check_multi_node("single", two, 1, 32, 1)
    with pytest.raises(UserError, match="'pipeline' runs on one node"):
        check_multi_node("pipeline", two, 2, 32, 1)
    check_multi_node("fsdp", two, 2, 32, 2)
    # elastic: every world size in the range must split the global batch
    with pytest.raises(UserError, match="on 3 node"):
        check_multi_node("ddp", Topology(2, 4, None, "h:1", "id", 600), 2, 16, 1)


def test_parsers():
    assert parse_nnodes("2") == (2, 2) and parse_nnodes(" 1:4 ") == (1, 4)
    assert parse_endpoint("10.0.0.1") == "10.0.0.1:29400"
    assert parse_endpoint("[::1]:5") == "[::1]:5"
    for bad in ("", "1:2:3", "a"):
        with pytest.raises(UserError):
            parse_nnodes(bad)
    with pytest.raises(UserError):
        parse_endpoint(":80")


def test_workers_never_see_node_specific_overrides():
    assert worker_overrides(["dist.node_rank=1", "train.lr=0.2", "dist.nnodes=2"]) == \
        ["train.lr=0.2"]


def test_lost_node_hint_says_where_a_rerun_resumes():
    two = Topology(2, 2, 0, "h:1", "id", 20)
    hint = lost_node_hint("ddp", 1, two, (1, 0))
    assert "\n" not in hint and "resume from epoch 2 step 0" in hint
    assert "dist.join_timeout_s=20s" in hint
    assert "the start" in lost_node_hint("ddp", 1, two, None)


# --- two "nodes" on this machine ------------------------------------------------------------

# fp64: fp32 training of this net is chaotic, so only fp64 runs can be compared at 1e-9.
# Six short epochs leave room to lose a node mid-run.
TINY64 = {"model": {"width": 4},
          "train": {"epochs": 6, "batch_size": 32, "eval_batch_size": 64, "precision": "fp64"},
          "data": {"limit_train": 128, "limit_test": 64}, "strategies": ["ddp"],
          "report": {"system_metrics_interval_s": None}}
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
            node_env = project_env(project, MLFLOW_TRACKING_URI=uri,
                                   **{NODE_MARKER: f"{self.tag}-{rank}"}, **env)
            cmd = [sys.executable, "-m", "pipeline.train", "ddp", "ddp.nproc=1",
                   f"dist.nnodes={n}", f"dist.node_rank={rank}",
                   f"dist.rdzv_endpoint=127.0.0.1:{self.port}", *overrides]
            with open(log, "w") as out:
                self.procs.append(subprocess.Popen(cmd, cwd=project, env=node_env, stdout=out,
                                                   stderr=subprocess.STDOUT,
                                                   start_new_session=True))

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
    project = make_project(tmp_path_factory.mktemp("scale") / "project",
                           tiny_params(http_mirror, **TINY64))
    run(project, "python", "-m", "pipeline.fetch")
    run(project, "python", "-m", "pipeline.train", "ddp", "ddp.nproc=2",
        MLFLOW_TRACKING_URI=f"sqlite:///{project / 'one-node.db'}", timeout=NODE_TIMEOUT)
    reference = model_of(project)
    assert json.loads((project / "results/ddp/metrics.json").read_text())["world_size"] == 2
    return project, reference


def max_diff(model: dict, reference: dict) -> float:
    assert model.keys() == reference.keys()
    return max((model[k].double() - reference[k].double()).abs().max().item()
               for k in reference)


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


def test_two_nodes_train_the_same_model_as_one_node_with_two_processes(two_node_project,
                                                                       two_node_run):
    _, reference = two_node_project
    logs = two_node_run.logs
    assert "--rdzv-backend=c10d" in logs and "--standalone" not in logs
    assert "this node of 2" in logs
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


def test_a_lost_node_stops_the_job_cleanly_and_a_rerun_resumes(two_node_project, two_node_run,
                                                               tmp_path):
    project, _ = two_node_project
    reset(project)
    uri = f"sqlite:///{project / 'lost-node.db'}"
    epochs = TINY64["train"]["epochs"]
    # max_restarts > 0: the surviving node restarts its worker and waits for the lost node
    # to rejoin, for join_timeout_s; nnodes=2 (not elastic) forbids carrying on alone.
    retry = ("checkpoint.max_restarts=2", "dist.join_timeout_s=20")
    # Global rank 0, on whichever node, waits at the start of epoch 2 (epoch 1 committed)
    # until node 1 is gone, so the node is lost at a known point.
    node_lost = tmp_path / "node-1-lost"
    hold = f"rank=0,epoch=2,action=hold,release={node_lost}"
    with Nodes(project, 2, *retry, uri=uri, PARALLEL_LAB_FAULT=hold) as nodes:
        wait_for(lambda: "fault: rank 0 holding" in nodes.log(0) + nodes.log(1),
                 NODE_TIMEOUT, "global rank 0 holding before epoch 2")
        assert nodes.kill(1) >= 3  # launcher, torchrun agent, worker: the whole node
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

    # the same command on every node again (a requeued job, recreated pods): resumes
    with Nodes(project, 2, *retry, uri=uri) as rerun:
        finish(rerun)
    assert "resuming at epoch 2 step 0" in rerun.log(0) + rerun.log(1)
    # bitwise: on the CPU a resumed run is exactly the undisturbed run of the same topology
    assert max_diff(model_of(project), two_node_run.model) == 0.0
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("tests").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(runs[0].info.run_id, "test_acc")]
    assert steps == list(range(1, epochs + 1))


@pytest.mark.parametrize("args, env, words", [
    (["ddp", "dist.nnodes=2"], {}, ["dist.rdzv_endpoint", "not set"]),
    (["ddp"], {"NNODES": "2"}, ["dist.rdzv_endpoint", "NNODES is 2"]),
    (["single", "dist.nnodes=2", "dist.rdzv_endpoint=127.0.0.1:1"], {},
     ["dist.nnodes", "'single' runs on one node"]),
])
def test_multi_node_mistakes_stop_before_torchrun(two_node_project, args, env, words):
    project, _ = two_node_project
    proc = run(project, "python", "-m", "pipeline.train", *args, check=False, timeout=120,
               **env)
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and all(w in last for w in words), last
    assert "launch[" not in proc.stdout  # nothing was started


# --- Kubernetes and SLURM recipes -----------------------------------------------------------

DEPLOY = REPO / "deploy"
K8S = sorted((DEPLOY / "k8s").glob("*.yaml"))
SBATCH = sorted((DEPLOY / "slurm").glob("*.sbatch"))
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# Torch plugin of Kubeflow Trainer: it sets these itself and refuses a TrainJob that does
TORCHRUN_RESERVED = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR",
                     "PET_MASTER_PORT"}


def k8s_objects() -> list[dict]:
    objects = []
    for path in K8S:
        objects += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return objects


def by_kind(kind: str) -> list[dict]:
    return [o for o in k8s_objects() if o["kind"] == kind]


def test_kubernetes_manifests_parse_and_have_their_required_fields():
    assert K8S, "no manifests under deploy/k8s"
    for obj in k8s_objects():
        assert {"apiVersion", "kind", "metadata"} <= set(obj), obj
        assert DNS_1035.match(obj["metadata"]["name"]) and len(obj["metadata"]["name"]) <= 63
    names = {(o["kind"], o["metadata"]["name"]) for o in k8s_objects()}
    claims = {n for k, n in names if k == "PersistentVolumeClaim"}
    (job,) = by_kind("TrainJob")
    # the documented TrainJob fields (trainer.kubeflow.org/v1alpha1, Kubeflow Trainer v2)
    assert job["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
    spec = job["spec"]
    assert set(spec) <= {"runtimeRef", "initializer", "trainer", "runtimePatches", "suspend",
                         "activeDeadlineSeconds", "managedBy"}
    assert spec["runtimeRef"]["name"] == "torch-distributed"
    trainer = spec["trainer"]
    assert set(trainer) <= {"image", "command", "args", "env", "numNodes", "resourcesPerNode",
                            "numProcPerNode"}
    assert isinstance(trainer["numNodes"], int) and trainer["numNodes"] >= 1
    assert trainer["image"].startswith("parallel-lab:")
    env = {e["name"]: e for e in trainer["env"]}
    assert not TORCHRUN_RESERVED & set(env)
    assert env["MLFLOW_TRACKING_URI"]["value"] == "http://mlflow:5000"
    # the MLflow it names runs in the cluster
    (service,) = [s for s in by_kind("Service") if s["metadata"]["name"] == "mlflow"]
    assert service["spec"]["ports"][0]["port"] == 5000
    (patch,) = spec["runtimePatches"]
    assert patch["manager"]
    pod = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    assert pod["name"] == "node"
    pod_spec = pod["template"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    (node,) = pod_spec["containers"]
    assert node["name"] == "node" and set(node) <= {"name", "env", "volumeMounts",
                                                    "securityContext"}
    mounts = {m["mountPath"]: m for m in node["volumeMounts"]}
    # checkpoints/ and results/ live in the working directory: a shared (RWX) claim
    shared = volumes[mounts["/workspace"]["name"]]["persistentVolumeClaim"]["claimName"]
    assert shared in claims
    (pvc,) = [p for p in by_kind("PersistentVolumeClaim") if p["metadata"]["name"] == shared]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]


def test_sbatch_scripts_are_valid_bash():
    assert SBATCH, "no sbatch script under deploy/slurm"
    for path in SBATCH:
        subprocess.run(["bash", "-n", str(path)], check=True, timeout=30)
        text = path.read_text()
        assert "#SBATCH --ntasks-per-node=1" in text
        assert "scontrol show hostnames" in text and "srun" in text


def train_command(tokens: list[str]) -> tuple[str, str]:
    """(module, strategy argument) of a `python -m pipeline.train STRATEGY ...` command."""
    i = tokens.index("-m")
    assert Path(tokens[i - 1]).name.startswith("python"), tokens
    return tokens[i + 1], tokens[i + 2]


def test_recipes_run_the_same_train_command_as_dvc():
    stage = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["train"]
    module, placeholder = train_command(shlex.split(stage["cmd"]))
    assert (module, placeholder) == ("pipeline.train", "${item.strategy}")
    # DVC reads params.yaml at the repository root; so does the launcher, in its cwd
    assert all(not isinstance(p, dict) for p in stage["params"])

    (job,) = by_kind("TrainJob")
    trainer = job["spec"]["trainer"]
    k8s_module, k8s_strategy = train_command(trainer["command"] + trainer.get("args", []))
    (fetch,) = [j for j in by_kind("Job") if j["metadata"]["name"].endswith("fetch")]
    pod = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"][
        "replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    for pod_spec in (pod, fetch["spec"]["template"]["spec"]):
        volumes = {v["name"]: v for v in pod_spec["volumes"]}
        mounts = {m["mountPath"]: m for c in pod_spec["containers"]
                  for m in c["volumeMounts"]}
        params = mounts["/workspace/params.yaml"]
        assert params["subPath"] == "params.yaml" and "configMap" in volumes[params["name"]]

    for path in SBATCH:
        text = path.read_text()
        srun = next(line for line in text.splitlines() if line.startswith("srun "))
        assert train_command(shlex.split(srun)) == ("pipeline.train", "$STRATEGY")
        assert "[ ! -f params.yaml ]" in text  # runs from the repository root

    assert k8s_module == "pipeline.train" and k8s_strategy in ("ddp", "fsdp")


# --- DVC experiment sweeps ------------------------------------------------------------------

def fake_show() -> list[dict]:
    """The shape of `dvc exp show --json` (DVC 3): workspace, a baseline, its experiments."""
    def rev(lr, strategies=None):
        metrics = {f"results/{s}/metrics.json": {"data": {"test_acc": acc, "world_size": w,
                                                           "best_test_acc": acc}}
                   for s, (acc, w) in (strategies or {}).items()}
        metrics["reports/summary.json"] = {"data": {}}
        return {"params": {"params.yaml": {"data": {"train": {"lr": lr, "batch_size": 256,
                                                              "epochs": 2},
                                                    "seed": 0}}},
                "metrics": metrics}

    missing = rev(0.4)
    missing["metrics"] = {"results/ddp/metrics.json": {"error": {"type": "FileNotFoundError"}}}
    return [
        {"rev": "workspace", "name": None, "data": rev(0.1), "experiments": None},
        {"rev": "abc1234def", "name": "main", "data": rev(0.1), "experiments": [
            {"name": "exp-a", "executor": {"state": "success"},
             "revs": [{"rev": "1111111", "name": "exp-a",
                       "data": rev(0.2, {"single": (0.5, 1), "ddp": (0.6, 2)})}]},
            {"name": "exp-b", "executor": None,
             "revs": [{"rev": "2222222", "name": "exp-b", "data": rev(0.3, {"ddp": (0.7, 2)})}]},
            {"name": "exp-c", "executor": {"state": "failed"},
             "revs": [{"rev": "3333333", "name": "exp-c", "data": missing}]},
        ]},
    ]


def test_experiments_table_has_a_row_per_experiment_and_strategy():
    rows, columns, without = build_rows(fake_show())
    assert [(r["experiment"], r["strategy"]) for r in rows] == \
        [("exp-a", "ddp"), ("exp-a", "single"), ("exp-b", "ddp")]
    assert columns == ["train.batch_size", "train.lr", "train.epochs"]
    assert without == ["exp-c (failed)"]
    table = markdown(rows, columns, without)
    assert "| exp-a | ddp | 256 | 0.2 | 2 | 2 | 0.6000 | 0.6000 |" in table
    assert "exp-c (failed)" in table


def gitignore_committing_metrics(project: Path) -> None:
    """DVC commits an experiment's cache: false metrics only where git may track them: keep
    results/*/metrics.json and reports/summary.json out of the ignore list."""
    text = (project / ".gitignore").read_text()
    text = text.replace("/results/\n", "/results/*/*\n!/results/*/metrics.json\n")
    text = text.replace("/reports/\n", "/reports/*\n!/reports/summary.json\n")
    (project / ".gitignore").write_text(text)


def test_a_queued_sweep_runs_and_compares_across_experiments(tmp_path, http_mirror):
    params = tiny_params(http_mirror, strategies=["single"], model={"width": 4},
                         data={"limit_train": 64, "limit_test": 32},
                         train={"epochs": 1, "batch_size": 32},
                         report={"system_metrics_interval_s": None})
    project = make_project(tmp_path / "project", params)
    gitignore_committing_metrics(project)
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
    out = run(project, "python", "-m", "pipeline.compare_experiments", timeout=300)
    table = (project / "reports/experiments.md").read_text()
    assert table == out.stdout
    rows = [line for line in table.splitlines() if line.startswith("| ")][1:]
    assert len(rows) == 2 and all("| single |" in r for r in rows), table
    assert {r.split(" | ")[3] for r in rows} == {"0.05", "0.2"}  # the train.lr column
    assert "No metrics" not in table
