"""The source notes' commands, run as written: the legacy launcher (note 000, note 002) with and
without --use-env, and SLURM's one task per process (note 001) started as srun starts it.

Each is a real 2-process ddp job on the CPU (gloo), 1 epoch of the tests' tiny config.
"""

import json
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from support import free_port, project_env, run

ONE_EPOCH = ("train.epochs=1",)


def summary(project) -> dict:
    return json.loads((project / "results/ddp/summary.json").read_text())


@pytest.mark.parametrize("use_env", [False, True], ids=["--local-rank", "--use-env"])
def test_the_legacy_launcher_runs_a_two_process_ddp_job(fetched_project, use_env):
    """`python -m torch.distributed.launch --nproc_per_node=2 -m pipeline.train ddp`: without
    --use-env each worker gets `--local-rank=K` before the strategy, which restates its
    LOCAL_RANK and is taken as that."""
    project = fetched_project()
    proc = run(
        project,
        "python",
        "-m",
        "torch.distributed.launch",
        "--nproc_per_node=2",
        *(["--use-env"] if use_env else []),
        "-m",
        "pipeline.train",
        "ddp",
        *ONE_EPOCH,
    )
    assert "unrecognized arguments" not in proc.stdout + proc.stderr
    done = summary(project)
    assert done["world_size"] == 2 and done["epochs"] == 1, done
    # workers of the user's own launcher have no MLflow publisher: the run says what pushes it
    assert "`python -m pipeline.publish` pushes it" in proc.stdout
    run(project, "python", "-m", "pipeline.publish", "strategies=[ddp]")
    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    (pushed,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert pushed.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(pushed.info.run_id, "test_acc")] == [1]


def test_srun_tasks_form_the_process_group_from_slurm_variables(fetched_project):
    """Two tasks with the variables srun gives `srun --ntasks-per-node=2 python -m
    pipeline.train ddp` on one node: each is a worker (no torchrun), rank 0 hosts the store
    at the first node of SLURM_NODELIST, and together they train one 2-rank job."""
    project = fetched_project()
    port = str(free_port())
    tasks = []
    for rank in (0, 1):
        env = project_env(
            project,
            SLURM_JOB_ID="4242",
            SLURM_PROCID=str(rank),
            SLURM_LOCALID=str(rank),
            SLURM_NODEID="0",
            SLURM_NTASKS="2",
            SLURM_NNODES="1",
            SLURM_STEP_NUM_NODES="1",
            SLURM_NODELIST="localhost",
            MASTER_PORT=port,  # configurable; the job id's port is unit-tested (test_slurm)
        )
        tasks.append(
            subprocess.Popen(
                [sys.executable, "-m", "pipeline.train", "ddp", *ONE_EPOCH],
                cwd=project,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = [task.communicate(timeout=300)[0] for task in tasks]
    assert [task.returncode for task in tasks] == [0, 0], "\n---\n".join(outputs)
    done = summary(project)
    assert done["world_size"] == 2 and done["epochs"] == 1, done
    assert "launch[ddp]" not in "".join(outputs)  # no launcher, no torchrun agent
