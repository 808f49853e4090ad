"""The Kubernetes (Kubeflow Trainer) and SLURM recipes run the same train command as DVC."""

import re
import shlex
import subprocess
from pathlib import Path

import yaml

from support import REPO

DEPLOY = REPO / "deploy"
K8S = sorted((DEPLOY / "k8s").glob("*.yaml"))
SBATCH = sorted((DEPLOY / "slurm").glob("*.sbatch"))


DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


# Torch plugin of Kubeflow Trainer: it sets these itself and refuses a TrainJob that does
TORCHRUN_RESERVED = {
    "PET_NNODES",
    "PET_NPROC_PER_NODE",
    "PET_NODE_RANK",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
}


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
    assert set(spec) <= {
        "runtimeRef",
        "initializer",
        "trainer",
        "runtimePatches",
        "suspend",
        "activeDeadlineSeconds",
        "managedBy",
    }
    assert spec["runtimeRef"]["name"] == "torch-distributed"
    trainer = spec["trainer"]
    assert set(trainer) <= {
        "image",
        "command",
        "args",
        "env",
        "numNodes",
        "resourcesPerNode",
        "numProcPerNode",
    }
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
    assert node["name"] == "node" and set(node) <= {
        "name",
        "env",
        "volumeMounts",
        "securityContext",
    }
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
    # one torchrun per node (the per-GPU recipe beside it: the next test)
    text = (DEPLOY / "slurm" / "train.sbatch").read_text()
    assert "#SBATCH --ntasks-per-node=1" in text
    assert "scontrol show hostnames" in text and "srun" in text


def test_the_per_gpu_recipe_starts_one_task_per_gpu_and_no_torchrun():
    text = (DEPLOY / "slurm" / "train-per-gpu.sbatch").read_text()
    tasks = re.search(r"^#SBATCH --ntasks-per-node=(\d+)$", text, re.M)
    gpus = re.search(r"^#SBATCH --gpus-per-node=(\d+)$", text, re.M)
    assert tasks and gpus and tasks[1] == gpus[1] and int(tasks[1]) > 1
    # the tasks are the workers (pipeline/launch/slurm.py reads srun's variables)
    commands = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    assert "torchrun" not in commands and "NNODES" not in commands and "RDZV" not in commands


def train_command(tokens: list[str]) -> tuple[str, str]:
    """(module, strategy argument) of a `python -m pipeline.train STRATEGY ...` command."""
    i = tokens.index("-m")
    assert Path(tokens[i - 1]).name.startswith("python"), tokens
    return tokens[i + 1], tokens[i + 2]


def test_recipes_run_the_same_train_command_as_dvc():
    stage = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["train"]["do"]
    module, placeholder = train_command(shlex.split(stage["cmd"]))
    assert (module, placeholder) == ("pipeline.train", "${item}")
    # DVC reads params.yaml at the repository root; so does the launcher, in its cwd
    assert all(not isinstance(p, dict) for p in stage["params"])

    (job,) = by_kind("TrainJob")
    trainer = job["spec"]["trainer"]
    k8s_module, k8s_strategy = train_command(trainer["command"] + trainer.get("args", []))
    (fetch,) = [j for j in by_kind("Job") if j["metadata"]["name"].endswith("fetch")]
    pod = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"][
        "replicatedJobs"
    ][0]["template"]["spec"]["template"]["spec"]
    for pod_spec in (pod, fetch["spec"]["template"]["spec"]):
        volumes = {v["name"]: v for v in pod_spec["volumes"]}
        mounts = {m["mountPath"]: m for c in pod_spec["containers"] for m in c["volumeMounts"]}
        params = mounts["/workspace/params.yaml"]
        assert params["subPath"] == "params.yaml" and "configMap" in volumes[params["name"]]

    for path in SBATCH:
        text = path.read_text()
        srun = next(line for line in text.splitlines() if line.startswith("srun "))
        assert train_command(shlex.split(srun)) == ("pipeline.train", "$STRATEGY")
        assert "[ ! -f params.yaml ]" in text  # runs from the repository root

    assert k8s_module == "pipeline.train" and k8s_strategy in ("ddp", "fsdp")
