"""The rendezvous of a one-node job, for the elastic agent the launcher runs.

`torchrun --standalone` gives one node c10d's dynamic rendezvous, which is made for many
nodes joining at once: before its first round it sleeps a random 0 to 0.3 s to spread
their attempts, and it walks the call stack for each event it records. One node has nothing
to spread or agree on. This handler hosts the job's TCP store on a free port and answers at
once. The agent around it is unchanged: it starts the workers, restarts them
(`checkpoint.max_restarts`: each restart is a new round with keys of its own), forwards
signals and holds the exit barrier. Several nodes still meet through c10d (topology.py).
"""

from __future__ import annotations

from datetime import timedelta

from torch.distributed import PrefixStore, TCPStore
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
    rendezvous_handler_registry,
)

from pipeline.launch.topology import ONE_NODE_BACKEND as BACKEND

HOST = "localhost"  # what --standalone's c10d endpoint names: the workers connect here
TIMEOUT = timedelta(minutes=10)  # as the workers' own connection to the store (worker.py)


class OneNodeRendezvous(RendezvousHandler):
    """The agent of the only node: rank 0 of a world of 1, every round."""

    def __init__(self, run_id: str):
        self._run_id = run_id
        self._store: TCPStore | None = None
        self._round = 0
        self._closed = False

    def get_backend(self) -> str:
        return BACKEND

    @property
    def use_agent_store(self) -> bool:
        return True  # the workers reach the agent's store (MASTER_ADDR, MASTER_PORT)

    def next_rendezvous(self) -> RendezvousInfo:
        if self._closed:
            raise RendezvousClosedError(f"rendezvous {self._run_id} is closed")
        if self._store is None:
            # port 0: the system's choice, so no two jobs on one machine can collide
            self._store = TCPStore(HOST, 0, is_master=True, timeout=TIMEOUT, wait_for_workers=False)
        self._round += 1
        # a restart's agent keys start afresh: nothing of the failed round is read back
        store = PrefixStore(f"{self._run_id}/{self._round}", self._store)
        return RendezvousInfo(store, 0, 1, RendezvousStoreInfo(HOST, self._store.port))

    def is_closed(self) -> bool:
        return self._closed

    def set_closed(self) -> None:
        self._closed = True

    def num_nodes_waiting(self) -> int:
        return 0  # no other node can join

    def get_run_id(self) -> str:
        return self._run_id

    def shutdown(self) -> bool:
        self._closed = True
        return True


def create_handler(params: RendezvousParameters) -> RendezvousHandler:
    return OneNodeRendezvous(params.run_id)


def register() -> None:
    """Make BACKEND a rendezvous backend the agent can be given (`rdzv_backend`); again is
    a no-op."""
    rendezvous_handler_registry.register(BACKEND, create_handler)
