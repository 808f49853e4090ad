"""SLURM's one task per process (note 001): `srun --ntasks-per-node=N python -m pipeline.train
ddp`, each task a worker of the job, its process group formed from SLURM's variables instead
of torchrun's.

    SLURM_PROCID   -> RANK             SLURM_NTASKS  -> WORLD_SIZE
    SLURM_LOCALID  -> LOCAL_RANK       SLURM_NODEID  -> GROUP_RANK (0 where unset)
    SLURM_NODELIST -> MASTER_ADDR: its first node, read as Lightning's SLURMEnvironment
                      reads it (`first_node`), unless MASTER_ADDR is set
    MASTER_PORT    as set, else Lightning's: the last 4 digits of SLURM_JOB_ID + 15000,
                   else 12910 (`master_port`)

A job step runs one task per process when it has more tasks than nodes
(`one_task_per_process`); with one task per node (deploy/slurm/train.sbatch), each task is
the launcher and starts torchrun's workers itself, as on any machine. Without torchrun's
agent no process hosts the rendezvous store, so rank 0 does (launch/worker.py
`attempt_store`). Pure functions of the environment: no torch here, so the check costs
nothing on the way to a launcher.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from pipeline.errors import UserError

# Lightning's SLURMEnvironment.main_port without SLURM_JOB_ID
DEFAULT_PORT = 12910
JOB_PORT_BASE = 15000  # + the job id's last 4 digits: two jobs on one node rarely collide
# what a task needs; the rest (SLURM_NODEID, the node count) has a default
TASK_VARIABLES = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODELIST")
# the step's node count first: srun sets it for the tasks it starts
NODE_COUNTS = ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")


def first_node(nodelist: str) -> str:
    """The first host of a SLURM node list, as Lightning's
    `SLURMEnvironment.resolve_root_node_address` takes it: "node[001-004,007]" -> "node001",
    "host0,host1" -> "host0", "host0 host1" -> "host0", "node[5]" -> "node5"."""
    nodes = re.sub(r"\[(.*?)[,-].*\]", "\\1", nodelist)  # the first of each range
    nodes = re.sub(r"\[(.*?)\]", "\\1", nodes)  # a range of one number
    return nodes.split(" ")[0].split(",")[0]


def master_port(env: Mapping[str, str]) -> int:
    """MASTER_PORT where set; else Lightning's port for the job: its id's last 4 digits +
    15000 (every task of a job derives the same); else 12910."""
    if env.get("MASTER_PORT"):
        return _integer(env, "MASTER_PORT")
    job = env.get("SLURM_JOB_ID", "")
    if job:
        if not job.isdigit():
            raise UserError(f"SLURM_JOB_ID: got {job!r}, expected digits (or set MASTER_PORT)")
        return int(job[-4:]) + JOB_PORT_BASE
    return DEFAULT_PORT


def one_task_per_process(env: Mapping[str, str]) -> bool:
    """Whether this process is one of several tasks per node that srun started, each a
    worker: SLURM's task variables are set and the job step has more tasks than nodes."""
    if not all(name in env for name in TASK_VARIABLES):
        return False
    return _integer(env, "SLURM_NTASKS") > _nodes(env)


def torchrun_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables torchrun would give this task's worker, from SLURM's (the module's
    table). A task variable that is not a number, or a rank outside the job, is one line."""
    rank, world = _integer(env, "SLURM_PROCID"), _integer(env, "SLURM_NTASKS")
    local = _integer(env, "SLURM_LOCALID")
    if not 0 <= rank < world:
        raise UserError(f"SLURM_PROCID: got {rank}, expected 0 to SLURM_NTASKS - 1 = {world - 1}")
    nodes = _nodes(env)
    address = env.get("MASTER_ADDR") or first_node(env["SLURM_NODELIST"])
    if not address:
        raise UserError(f"SLURM_NODELIST: got {env['SLURM_NODELIST']!r}, expected a host name")
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(local),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world // nodes),
        "GROUP_RANK": str(_integer(env, "SLURM_NODEID") if env.get("SLURM_NODEID") else 0),
        "GROUP_WORLD_SIZE": str(nodes),
        "MASTER_ADDR": address,
        "MASTER_PORT": str(master_port(env)),
    }


def _nodes(env: Mapping[str, str]) -> int:
    for name in NODE_COUNTS:
        if env.get(name):
            return _integer(env, name)
    return 1


def _integer(env: Mapping[str, str], name: str) -> int:
    text = env[name].strip()
    if not text.isdigit():
        raise UserError(f"{name}: got {env[name]!r}, expected a whole number")
    return int(text)
