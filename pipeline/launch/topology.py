"""How many nodes a train stage spans, and the elastic agent's settings that say so. Pure.

One node runs as `torchrun --standalone` would. Several nodes run the same command each, and
their elastic agents (torchrun's, inside each node's launcher) meet in a c10d rendezvous at
`dist.rdzv_endpoint`, a TCP store hosted by one of them. What differs from node to node
comes from the environment, which wins over params.yaml's `dist` section, so one params.yaml
serves every node:

    NNODES        or PET_NNODES         dist.nnodes         "2", or "MIN:MAX" (elastic;
                                                            params: dist.min_nnodes)
    NODE_RANK     or PET_NODE_RANK      dist.node_rank      0 on the node that hosts the store
    RDZV_ENDPOINT or PET_RDZV_ENDPOINT  dist.rdzv_endpoint  host[:port]; else
    MASTER_ADDR + MASTER_PORT (or PET_MASTER_ADDR + PET_MASTER_PORT)
    RDZV_ID       or PET_RDZV_ID        dist.rdzv_id

The PET_ names are torchrun's own environment defaults, which Kubeflow Trainer sets.
"""

from __future__ import annotations

import errno
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

from pipeline import strategies
from pipeline.batch_plan import BatchPlan
from pipeline.errors import UserError
from pipeline.strategies.base import StrategyFacts

DEFAULT_RDZV_PORT = 29400  # torchrun's default for a c10d endpoint without a port
ONE_NODE_BACKEND = "parallel-lab-one-node"  # one_node_rendezvous.py registers it

ENV_NAMES = {  # dist.<field> -> environment variables, first set wins
    "nnodes": ("NNODES", "PET_NNODES"),
    "node_rank": ("NODE_RANK", "PET_NODE_RANK"),
    "rdzv_endpoint": ("RDZV_ENDPOINT", "PET_RDZV_ENDPOINT"),
    "rdzv_id": ("RDZV_ID", "PET_RDZV_ID"),
}
MASTER_NAMES = (("MASTER_ADDR", "MASTER_PORT"), ("PET_MASTER_ADDR", "PET_MASTER_PORT"))


@dataclass(frozen=True)
class Topology:
    min_nodes: int
    max_nodes: int
    node_rank: Optional[int]  # None: the node whose address matches the endpoint hosts it
    endpoint: Optional[str]
    rdzv_id: str
    join_timeout_s: int
    source: str = "dist.nnodes"  # where the node count came from, for messages
    endpoint_source: str = "dist.rdzv_endpoint"  # where the endpoint came from, likewise

    @property
    def multi_node(self) -> bool:
        return self.max_nodes > 1

    @property
    def nnodes(self) -> str:
        if self.min_nodes == self.max_nodes:
            return str(self.min_nodes)
        return f"{self.min_nodes}:{self.max_nodes}"


def parse_nnodes(text: Any, source: str = "dist.nnodes") -> tuple[int, int]:
    """ "2" -> (2, 2); "1:4" -> (1, 4); anything else is a UserError naming `source`."""
    parts = str(text).strip().split(":")
    try:
        lo, hi = (int(parts[0]), int(parts[-1])) if len(parts) <= 2 else (0, 0)
    except ValueError:
        lo = hi = 0
    if not 1 <= lo <= hi:
        raise UserError(
            f"{source}: got {text!r}, expected a node count like 2 or an elastic "
            "range MIN:MAX like 1:4 (1 <= MIN <= MAX)"
        )
    return lo, hi


def parse_endpoint(text: str, source: str = "dist.rdzv_endpoint") -> str:
    """host[:port] of the rendezvous store; the port defaults to torchrun's 29400."""
    host, sep, port = str(text).strip().rpartition(":")
    if not sep:
        host, port = port, str(DEFAULT_RDZV_PORT)
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise UserError(
            f"{source}: got {text!r}, expected host:port of the node that hosts "
            "the rendezvous, e.g. node0.cluster:29400"
        )
    return f"{host}:{port}"


def _from_env(env: Mapping[str, str], names: tuple[str, ...]) -> tuple[Optional[str], str]:
    for name in names:
        if env.get(name, "").strip():
            return env[name].strip(), name
    return None, ""


def resolve_topology(dist: Any, env: Mapping[str, str], strategy: str) -> Topology:
    """params.yaml's `dist` section with the environment on top, checked."""
    nnodes, source = _from_env(env, ENV_NAMES["nnodes"])
    if nnodes is None:
        nnodes, source = dist.nnodes, "dist.nnodes"
        if dist.min_nnodes is not None:
            nnodes = f"{dist.min_nnodes}:{dist.nnodes}"
    lo, hi = parse_nnodes(nnodes, source)

    rank_text, rank_source = _from_env(env, ENV_NAMES["node_rank"])
    node_rank = dist.node_rank
    if rank_text is not None:
        if not rank_text.isdigit():
            raise UserError(f"{rank_source}: got {rank_text!r}, expected a node index 0, 1, ...")
        node_rank = int(rank_text)

    endpoint, ep_source = _from_env(env, ENV_NAMES["rdzv_endpoint"])
    for addr, port in MASTER_NAMES:
        if endpoint is None and env.get(addr) and env.get(port):
            endpoint, ep_source = f"{env[addr]}:{env[port]}", f"{addr}+{port}"
    if endpoint is None and dist.rdzv_endpoint:
        endpoint, ep_source = dist.rdzv_endpoint, "dist.rdzv_endpoint"
    rdzv_id = _from_env(env, ENV_NAMES["rdzv_id"])[0] or dist.rdzv_id or f"parallel-lab-{strategy}"

    if hi == 1:  # one node: torchrun --standalone; endpoint and rank have nothing to do
        return Topology(1, 1, None, None, rdzv_id, dist.join_timeout_s, source)
    if endpoint is None:
        raise UserError(
            f"dist.rdzv_endpoint: not set, but {source} is {nnodes}; expected "
            "host:port of the node that hosts the rendezvous (or RDZV_ENDPOINT, "
            "or MASTER_ADDR and MASTER_PORT, in the environment)"
        )
    if node_rank is not None and node_rank >= hi:
        raise UserError(
            f"dist.node_rank: got {node_rank}, expected 0..{hi - 1} for {source} = {nnodes}"
        )
    endpoint = parse_endpoint(endpoint, ep_source)
    return Topology(lo, hi, node_rank, endpoint, rdzv_id, dist.join_timeout_s, source, ep_source)


def check_rendezvous_port(topology: Topology) -> None:
    """The node that hosts a job's rendezvous (node_rank 0: the agent then hosts its TCP
    store, `launch_settings`) finds the endpoint's port free, or says so in one line naming
    the key it came from (issue 50): in use, the store could not listen and the stage ended
    in torch's "The connection to the C10d store has failed" after its start-up. Nodes that
    join (another node_rank, or none: torch then decides by the endpoint's address) connect
    to the port instead, and need it taken."""
    if not topology.multi_node or topology.node_rank != 0 or topology.endpoint is None:
        return
    port = int(topology.endpoint.rpartition(":")[2])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # as the store's own socket: a port left in TIME_WAIT by the last job is free
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError as err:
            if err.errno != errno.EADDRINUSE:
                return  # not ours to judge: the store says what it finds
            raise UserError(
                f"{topology.endpoint_source}: port {port} is already in use on this node "
                "(another job's rendezvous, or another program), and this node (node rank 0) "
                f"hosts the rendezvous there; expected a free port: name another in "
                f"{topology.endpoint_source}, or stop what listens on {port}"
            ) from None


def check_job(
    facts: StrategyFacts[Any], topology: Topology, nproc: int, plan: BatchPlan, options: Any = None
) -> None:
    """The strategy can span the nodes asked for, and its batch splits evenly over its data
    ranks at every world size the elastic range allows. `plan`: the batch as one process
    trains it; `options`: the strategy's own section, which its mesh may read."""
    if topology.multi_node and not facts.spans_nodes:
        spanning = [n for n in strategies.NAMES if strategies.get(n).facts.spans_nodes]
        raise UserError(
            f"{topology.source}: got {topology.nnodes}, but strategy {facts.name!r} "
            f"runs on one node; expected 1 (multi-node: {', '.join(spanning)})"
        )
    for nodes in range(topology.min_nodes, topology.max_nodes + 1):
        who = facts.name
        if topology.multi_node:
            who += f" on {nodes} node(s) x {nproc} process(es)"
        plan.of_job(facts.mesh(options, nodes * nproc), who)


def launch_settings(nproc: int, max_restarts: int, topology: Topology) -> dict[str, Any]:
    """The elastic agent's settings (torch.distributed.launcher.api.LaunchConfig's fields):
    one node is `torchrun --standalone` with a rendezvous that has no other node to wait
    for (one_node_rendezvous.py: a store on a free local port, a fresh run id); several meet
    at the endpoint under the job's id, as `torchrun --rdzv-backend=c10d` would."""
    common = {"nproc_per_node": nproc, "max_restarts": max_restarts}
    if not topology.multi_node:
        return {
            **common,
            "rdzv_backend": ONE_NODE_BACKEND,
            "min_nodes": 1,
            "max_nodes": 1,
            "run_id": str(uuid.uuid4()),
        }
    configs: dict[str, Any] = {"join_timeout": topology.join_timeout_s}
    if topology.node_rank is not None:
        # Say which agent hosts the store instead of letting each guess from its hostname:
        # deterministic when several "nodes" share a host. c10d numbers the nodes itself.
        configs["is_host"] = topology.node_rank == 0
    return {
        **common,
        "rdzv_backend": "c10d",
        "min_nodes": topology.min_nodes,
        "max_nodes": topology.max_nodes,
        "rdzv_endpoint": topology.endpoint,
        "run_id": topology.rdzv_id,
        "rdzv_configs": configs,
    }
