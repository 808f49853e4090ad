"""The `horovod` strategy's workers, started by horovodrun instead of torchrun's agent.

Horovod's ranks meet through horovodrun's own Gloo rendezvous, so the launcher runs
`horovodrun -np N -H localhost:N --gloo --network-interfaces lo python -m pipeline.train
horovod` as a child process (lo: on one host its rendezvous otherwise waits on interfaces
it cannot reach; elastic mode hung so until its timeout). Each process it starts is a
worker: `torchrun_env` reads horovodrun's variables once as torchrun's, as slurm.py reads
srun's, so the DistContext is built once, the same way for every strategy (context.py), and
the worker's torch process group (the loop's own collectives) meets at the address the
launcher chose, hosted by rank 0. The workers train with the config the launcher validated,
handed over in a file. This module imports nothing heavy: pipeline/train.py reads it first.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

# the config the launcher validated, as YAML, for horovodrun's workers to train with
WORKER_PARAMS_ENV = "PARALLEL_LAB_WORKER_PARAMS"
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def under_horovodrun(env: Mapping[str, str]) -> bool:
    """Whether this process is one of horovodrun's workers."""
    return "HOROVOD_RANK" in env and "HOROVOD_SIZE" in env


def torchrun_env(env: Mapping[str, str]) -> dict[str, str]:
    """horovodrun's variables as torchrun's, which DistContext.from_env and the worker's
    process group read (MASTER_ADDR and MASTER_PORT came from the launcher)."""
    return {
        "RANK": env["HOROVOD_RANK"],
        "WORLD_SIZE": env["HOROVOD_SIZE"],
        "LOCAL_RANK": env.get("HOROVOD_LOCAL_RANK", "0"),
        "LOCAL_WORLD_SIZE": env.get("HOROVOD_LOCAL_SIZE", env["HOROVOD_SIZE"]),
        "GROUP_RANK": env.get("HOROVOD_CROSS_RANK", "0"),
        "GROUP_WORLD_SIZE": env.get("HOROVOD_CROSS_SIZE", "1"),
    }


def free_port() -> int:
    """A port on the loopback nobody listens on now, for rank 0's torch store."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def command(name: str, nproc: int) -> list[str]:
    """horovodrun, as pip installed it beside this python, starting `nproc` workers here."""
    horovodrun = Path(sys.executable).with_name("horovodrun")
    hosts = f"localhost:{nproc}"
    launch = [str(horovodrun), "-np", str(nproc), "-H", hosts, "--gloo"]
    return [*launch, "--network-interfaces", "lo", sys.executable, "-m", "pipeline.train", name]


def run(name: str, nproc: int, params_yaml: str, tmp: Path) -> tuple[int, bool]:
    """Run the job's workers under horovodrun until it ends, a stop signal to this process
    passed on to it (it passes it to the workers, which checkpoint and stop as under
    torchrun); (its exit code, whether a stop signal was passed on)."""
    params = tmp / "worker-params.yaml"
    params.write_text(params_yaml)
    env_update = {
        WORKER_PARAMS_ENV: str(params),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    proc = subprocess.Popen(command(name, nproc), env={**os.environ, **env_update})
    signalled = False

    def pass_on(signum: int, frame: object) -> None:
        nonlocal signalled
        signalled = True
        proc.send_signal(signum)

    handlers = {signum: signal.signal(signum, pass_on) for signum in SIGNALS}
    try:
        code = proc.wait()
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    return code, signalled
