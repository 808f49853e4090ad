"""SLURM's one task per process (pipeline/launch/slurm.py): the first node of a node list as
Lightning reads it, the job's port, and torchrun's variables from srun's."""

import pytest

from pipeline.errors import UserError
from pipeline.launch.slurm import (
    DEFAULT_PORT,
    first_node,
    master_port,
    one_task_per_process,
    torchrun_env,
)


@pytest.mark.parametrize(
    "nodelist, first",
    [
        ("localhost", "localhost"),
        ("127.0.0.1", "127.0.0.1"),
        ("node001", "node001"),
        ("node[001-004,007]", "node001"),
        ("node[007,001-004]", "node007"),
        ("node[5-9]", "node5"),
        ("node[5]", "node5"),
        ("node[05,9]", "node05"),
        ("host0,host1,host3", "host0"),
        ("host0 host1 host3", "host0"),
        ("gpu-a[12-13],gpu-b[1-2]", "gpu-a12"),
        ("compute-0-[0,9]", "compute-0-0"),
        ("rack1-node[3-4]", "rack1-node3"),
        ("a.cluster.org,b.cluster.org", "a.cluster.org"),
    ],
)
def test_first_node_is_lightnings(nodelist, first):
    # the expected values are what Lightning's SLURMEnvironment.resolve_root_node_address
    # returns for these lists (its two regular expressions, then the first of the list)
    assert first_node(nodelist) == first


def test_the_port_is_master_port_else_the_jobs_else_lightnings_default():
    assert master_port({"MASTER_PORT": "29511", "SLURM_JOB_ID": "123456"}) == 29511
    assert master_port({"SLURM_JOB_ID": "123456"}) == 3456 + 15000
    assert master_port({"SLURM_JOB_ID": "7"}) == 7 + 15000
    assert master_port({}) == DEFAULT_PORT == 12910


TASK = {
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "8",
    "SLURM_NNODES": "2",
    "SLURM_NODELIST": "node[001-002]",
    "SLURM_JOB_ID": "90210",
}


def test_a_task_gets_torchruns_variables():
    assert torchrun_env(TASK) == {
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "MASTER_ADDR": "node001",
        "MASTER_PORT": str(210 + 15000),
    }
    # set by hand, MASTER_ADDR and MASTER_PORT win, as in Lightning
    given = torchrun_env({**TASK, "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29400"})
    assert (given["MASTER_ADDR"], given["MASTER_PORT"]) == ("10.0.0.7", "29400")


def test_one_task_per_process_only_with_more_tasks_than_nodes():
    assert one_task_per_process(TASK)
    # today's recipe: one task per node, each the launcher of its node's torchrun
    assert not one_task_per_process({**TASK, "SLURM_NTASKS": "2"})
    # the step's node count is srun's for the tasks it started
    assert not one_task_per_process({**TASK, "SLURM_STEP_NUM_NODES": "8", "SLURM_NNODES": "1"})
    assert not one_task_per_process({})  # not under SLURM
    without_list = {k: v for k, v in TASK.items() if k != "SLURM_NODELIST"}
    assert not one_task_per_process(without_list)
    one_node = {k: v for k, v in TASK.items() if k != "SLURM_NNODES"}
    assert one_task_per_process(one_node)  # no node count: one node


@pytest.mark.parametrize(
    "change, words",
    [
        ({"SLURM_PROCID": "8"}, ["SLURM_PROCID: got 8", "0 to SLURM_NTASKS - 1 = 7"]),
        ({"SLURM_NTASKS": "eight"}, ["SLURM_NTASKS: got 'eight'", "whole number"]),
        ({"SLURM_JOB_ID": "12_3"}, ["SLURM_JOB_ID: got '12_3'", "MASTER_PORT"]),
        ({"SLURM_NODELIST": ""}, ["SLURM_NODELIST: got ''"]),
    ],
)
def test_bad_task_variables_are_one_line(change, words):
    with pytest.raises(UserError) as err:
        torchrun_env({**TASK, **change})
    for word in words:
        assert word in str(err.value)
