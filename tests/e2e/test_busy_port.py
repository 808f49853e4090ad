"""A rendezvous port already in use (issue 50, goal 4): the node that hosts a job of several
nodes' rendezvous is refused in one line naming the port and the key, exit 2, before any
worker starts and with nothing written."""

import socket

from support import refused


def test_a_busy_rendezvous_port_is_one_line_naming_the_port_and_the_key(fetched_project):
    project = fetched_project()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()  # as another job's rendezvous store would
        port = busy.getsockname()[1]
        args = ("pipeline.train", "ddp", "ddp.nproc=1", "dist.nnodes=2", "dist.node_rank=0")
        line = refused(project, *args, f"dist.rdzv_endpoint=127.0.0.1:{port}")
        assert line == (
            f"error: dist.rdzv_endpoint: port {port} is already in use on this node (another "
            "job's rendezvous, or another program), and this node (node rank 0) hosts the "
            "rendezvous there; expected a free port: name another in dist.rdzv_endpoint, or "
            f"stop what listens on {port}"
        )
        env = dict(NNODES="2", NODE_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        line = refused(project, "pipeline.train", "ddp", "ddp.nproc=1", **env)
        assert line.startswith(f"error: MASTER_ADDR+MASTER_PORT: port {port} is already in use")
