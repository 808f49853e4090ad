"""How many nodes a train stage spans and the elastic agent settings that say so (pure)."""

from pathlib import Path
from typing import Any

import pytest

from pipeline import strategies
from pipeline.batch_plan import BatchPlan
from pipeline.config import DistConfig, launch_free
from pipeline.errors import UserError
from pipeline.launch.topology import (
    ONE_NODE_BACKEND,
    Topology,
    check_job,
    launch_settings,
    parse_endpoint,
    parse_nnodes,
    resolve_topology,
)
from pipeline.strategies.base import StrategyFacts
from pipeline.tracking.stage_end import lost_node_hint


def dist(**kw) -> DistConfig:
    return DistConfig(**kw)


def test_one_node_is_standalone():
    topo = resolve_topology(dist(), {}, "ddp")
    assert not topo.multi_node
    settings = launch_settings(2, 1, topo)
    run_id = settings.pop("run_id")
    assert len(run_id) == 36  # a fresh uuid per launch, as --standalone makes
    assert settings == {
        "nproc_per_node": 2,
        "max_restarts": 1,
        "rdzv_backend": ONE_NODE_BACKEND,  # a store on a free port (one_node_rendezvous.py)
        "min_nodes": 1,
        "max_nodes": 1,
    }


def test_several_nodes_rendezvous_over_c10d():
    topo = resolve_topology(dist(nnodes=2, node_rank=1, rdzv_endpoint="node0:1234"), {}, "ddp")
    assert launch_settings(4, 3, topo) == {
        "nproc_per_node": 4,
        "max_restarts": 3,
        "rdzv_backend": "c10d",
        "min_nodes": 2,
        "max_nodes": 2,
        "rdzv_endpoint": "node0:1234",
        "run_id": "parallel-lab-ddp",
        "rdzv_configs": {"join_timeout": 600, "is_host": False},
    }
    node0 = resolve_topology(dist(nnodes=2, node_rank=0, rdzv_endpoint="node0:1234"), {}, "ddp")
    assert launch_settings(4, 3, node0)["rdzv_configs"]["is_host"] is True


def test_the_settings_are_the_agents(tmp_path):
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig

    topo = resolve_topology(dist(nnodes=2, node_rank=1, rdzv_endpoint="node0:1234"), {}, "ddp")
    logs = DefaultLogsSpecs(log_dir=str(tmp_path))  # without it, a /tmp/torchelastic_* is made
    settings = launch_settings(4, 3, topo)
    LaunchConfig(**settings, start_method="fork", logs_specs=logs)  # every key is a field


def test_the_launch_config_never_asks_cuda(monkeypatch: pytest.MonkeyPatch, tmp_path):
    """LaunchConfig would ask torch.accelerator.is_available() for its NUMA default, which
    loads the CUDA driver and so rules out forking the workers: launch_config decides that
    default from the launcher's own GPU count, as LaunchConfig would have."""
    import torch
    import torch._utils_internal

    from pipeline.launch.launcher import launch_config

    def asked() -> bool:
        raise AssertionError("torch.accelerator.is_available() was called")

    monkeypatch.setattr(torch.accelerator, "is_available", asked)
    build_default = object()
    monkeypatch.setattr(torch._utils_internal, "get_default_numa_options", lambda: build_default)
    one_node = resolve_topology(dist(), {}, "ddp")
    settings = launch_settings(2, 0, one_node)
    config = launch_config(settings, "fork", gpus=2, log_dir=tmp_path)
    assert config.numa_options is build_default  # every GPU of the node has its worker
    assert config.start_method == "fork" and config.nproc_per_node == 2
    assert launch_config(settings, "fork", gpus=4, log_dir=tmp_path).numa_options is None
    assert launch_config(settings, "spawn", gpus=0, log_dir=tmp_path).numa_options is None


def test_the_agents_files_go_under_the_stages_directory(tmp_path):
    """torch's default makes a /tmp/torchelastic_* directory per agent and leaves it behind
    (thousands of them after a day of stages): the launcher's go under the stage's own
    temporary directory, removed with it."""
    from pipeline.launch.launcher import launch_config

    one_node = resolve_topology(dist(), {}, "ddp")
    config = launch_config(launch_settings(2, 0, one_node), "spawn", gpus=0, log_dir=tmp_path)
    assert Path(config.logs_specs.root_log_dir).parent == tmp_path


def test_environment_wins_over_params():
    params = dist(nnodes=4, node_rank=0, rdzv_endpoint="params-host:1", rdzv_id="p")
    env = {
        "NNODES": "2",
        "NODE_RANK": "1",
        "MASTER_ADDR": "head",
        "MASTER_PORT": "29500",
        "RDZV_ID": "job-7",
    }
    topo = resolve_topology(params, env, "fsdp")
    assert (topo.nnodes, topo.node_rank, topo.endpoint, topo.rdzv_id) == (
        "2",
        1,
        "head:29500",
        "job-7",
    )
    # RDZV_ENDPOINT beats MASTER_ADDR+MASTER_PORT
    topo = resolve_topology(params, {**env, "RDZV_ENDPOINT": "rdzv:29400"}, "fsdp")
    assert topo.endpoint == "rdzv:29400"


def test_kubeflow_trainer_environment():
    # what the Torch plugin of Kubeflow Trainer puts into every `node` container
    env = {
        "PET_NNODES": "3",
        "PET_NPROC_PER_NODE": "auto",
        "PET_NODE_RANK": "2",
        "PET_MASTER_ADDR": "job-node-0-0.job",
        "PET_MASTER_PORT": "29400",
    }
    topo = resolve_topology(dist(), env, "ddp")
    assert (topo.nnodes, topo.node_rank, topo.endpoint, topo.source) == (
        "3",
        2,
        "job-node-0-0.job:29400",
        "PET_NNODES",
    )


def test_elastic_range_from_params_or_environment():
    topo = resolve_topology(dist(nnodes=4, min_nnodes=2, rdzv_endpoint="h"), {}, "ddp")
    assert (topo.min_nodes, topo.max_nodes, topo.endpoint) == (2, 4, "h:29400")
    settings = launch_settings(1, 0, topo)
    assert (settings["min_nodes"], settings["max_nodes"]) == (2, 4)
    assert (
        resolve_topology(dist(), {"NNODES": "1:3", "RDZV_ENDPOINT": "h:1"}, "ddp").nnodes == "1:3"
    )


@pytest.mark.parametrize(
    "env, words",
    [
        ({"NNODES": "2"}, ["dist.rdzv_endpoint", "not set", "NNODES is 2"]),
        ({"NNODES": "0"}, ["NNODES", "'0'"]),
        ({"NNODES": "3:2"}, ["NNODES", "MIN:MAX"]),
        ({"NNODES": "2", "RDZV_ENDPOINT": "h:99999"}, ["RDZV_ENDPOINT", "host:port"]),
        ({"NNODES": "2", "RDZV_ENDPOINT": "h:1", "NODE_RANK": "x"}, ["NODE_RANK", "'x'"]),
        ({"NNODES": "2", "RDZV_ENDPOINT": "h:1", "NODE_RANK": "2"}, ["dist.node_rank", "0..1"]),
    ],
)
def test_bad_topology_is_one_line_naming_its_source(env, words):
    with pytest.raises(UserError) as err:
        resolve_topology(dist(), env, "ddp")
    assert "\n" not in str(err.value) and all(w in str(err.value) for w in words), err.value


def facts(name: str) -> StrategyFacts[Any]:
    return strategies.get(name).facts


def test_which_strategies_span_nodes_and_batch_divisibility():
    two = Topology(2, 2, 0, "h:1", "id", 600)
    one = Topology(1, 1, None, None, "id", 600)
    check_job(facts("single"), one, 1, BatchPlan.make(32, 1))
    with pytest.raises(UserError, match="'single' runs on one node.*multi-node: ddp, fsdp"):
        check_job(facts("single"), two, 1, BatchPlan.make(32, 1))
    with pytest.raises(UserError, match="'pipeline_parallel' runs on one node"):
        check_job(facts("pipeline_parallel"), two, 2, BatchPlan.make(32, 1))
    check_job(facts("fsdp"), two, 2, BatchPlan.make(32, 2))
    with pytest.raises(UserError, match=r"ddp needs a multiple of .* = 3 x 1"):
        check_job(facts("ddp"), one, 3, BatchPlan.make(32, 1))
    # elastic: every world size in the range must split the global batch
    with pytest.raises(UserError, match="on 3 node"):
        check_job(facts("ddp"), Topology(2, 4, None, "h:1", "id", 600), 2, BatchPlan.make(16, 1))


def test_the_strategies_that_span_nodes_say_so_in_their_facts():
    assert [n for n in strategies.NAMES if facts(n).spans_nodes] == ["ddp", "fsdp"]


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
    assert launch_free(["dist.node_rank=1", "train.lr=0.2", "dist.nnodes=2"]) == ["train.lr=0.2"]


def test_lost_node_hint_says_where_a_rerun_resumes():
    two = Topology(2, 2, 0, "h:1", "id", 20)
    hint = lost_node_hint("ddp", 1, two.nnodes, two.join_timeout_s, (1, 0))
    assert "\n" not in hint and "resume from epoch 2 step 0" in hint
    assert "dist.join_timeout_s=20s" in hint
    assert "the start" in lost_node_hint("ddp", 1, two.nnodes, two.join_timeout_s, None)


def test_one_node_rendezvous_hosts_a_store_each_round_apart():
    """What the agent gets from the one-node rendezvous: rank 0 of 1 at once, a store the
    workers reach at the address it gives, and keys of each round (a restart) apart."""
    from torch.distributed import PrefixStore, TCPStore
    from torch.distributed.elastic.rendezvous import (
        RendezvousClosedError,
        RendezvousParameters,
        rendezvous_handler_registry,
    )

    from pipeline.launch import one_node_rendezvous

    one_node_rendezvous.register()
    one_node_rendezvous.register()  # again: the quickstart launches once per strategy
    params = RendezvousParameters(ONE_NODE_BACKEND, "", "job-1", 1, 1)
    handler = rendezvous_handler_registry.create_handler(params)
    assert (handler.get_run_id(), handler.use_agent_store) == ("job-1", True)
    first = handler.next_rendezvous()
    assert (first.rank, first.world_size, handler.num_nodes_waiting()) == (0, 1, 0)
    where = first.bootstrap_store_info
    # the store the agent hosts, reached as the workers reach it (worker.attempt_store)
    worker = TCPStore(where.master_addr, where.master_port, is_master=False)
    PrefixStore("job-1/1", worker).set("from-a-worker", "1")
    assert first.store.get("from-a-worker") == b"1"
    first.store.set("key", "round 1")
    second = handler.next_rendezvous()
    assert second.bootstrap_store_info.master_port == where.master_port  # one store
    assert not second.store.check(["key"])  # a new round's keys start empty
    assert first.store.get("key") == b"round 1"
    handler.shutdown()
    assert handler.is_closed()
    with pytest.raises(RendezvousClosedError):
        handler.next_rendezvous()


def test_the_hosting_node_finds_its_rendezvous_port_in_use_and_says_which_key():
    """Issue 50: node rank 0 hosts the rendezvous' store; a port something else listens on
    is one line naming the port and where it came from, before any worker starts."""
    import socket

    from pipeline.launch.topology import check_rendezvous_port

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = {"NNODES": "2", "NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
        env["MASTER_PORT"] = str(port)
        topology = resolve_topology(DistConfig(), env, "ddp")
        with pytest.raises(UserError) as refused:
            check_rendezvous_port(topology)
        assert str(refused.value).startswith(
            f"MASTER_ADDR+MASTER_PORT: port {port} is already in use on this node"
        )
        joining = resolve_topology(DistConfig(), {**env, "NODE_RANK": "1"}, "ddp")
        check_rendezvous_port(joining)  # a node that joins connects to it: nothing to say
    check_rendezvous_port(topology)  # free again
    check_rendezvous_port(resolve_topology(DistConfig(), {}, "ddp"))  # one node: its own port
