"""dp's and balanced_dp's N devices, predicted (issue 48 goals 2 and 3): each device's share of
a forward measured as the whole model at that share (the strategy's own split), their
scatter, replicate, gather and gradient reduce modelled, each device's memory built from its
share's peak. Pure arithmetic exhaustively; the measurement once, on the CPU."""

import pytest
import torch

from pipeline.config import load_config
from pipeline.run_spec import resolve_run
from pipeline.scaling.links import Link
from pipeline.scaling.prediction import DataSize, peak_mib, replica_memories, replica_traffic
from pipeline.scaling.profile import ReplicaProfile, Replicas, measure_replicas, replica_split
from pipeline.scaling.step_time import (
    BROADCAST,
    GATHER,
    REDUCE,
    SCATTER,
    Call,
    Traffic,
    moved,
    replicated_step,
)

CPU = torch.device("cpu")
LINK = Link("test", busbw=1e9, latency_s=1e-5, source="a test's")


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_device_0s_collectives_move_what_nccl_tests_counts(n):
    size = 1000
    # scatter and gather: device 0's link carries every other device's chunk
    for kind in (SCATTER, GATHER):
        assert moved(kind, size, n) == ((n - 1, (n - 1) / n * size) if n > 1 else (0, 0.0))
    # broadcast and reduce: busbw = algbw, the whole message
    for kind in (BROADCAST, REDUCE):
        assert moved(kind, size, n) == ((n - 1, float(size)) if n > 1 else (0, 0.0))


def test_a_replicated_step_waits_for_every_phase_and_the_slowest_share():
    calls = (Call(SCATTER, 4000, False), Call(BROADCAST, 10**6, False))
    traffic = Traffic(calls)
    comm = sum(traffic.seconds(2, LINK, overlappable=False))
    assert comm == pytest.approx((1e-5 + 2000 / 1e9) + (1e-5 + 10**6 / 1e9))
    step = replicated_step([0.03, 0.05], 0.002, traffic, 2, LINK, grad_accum=2)
    assert step.compute_s == pytest.approx(2 * 0.05 + 0.002)  # the slowest share, twice
    assert step.comm_s == step.exposed_s == pytest.approx(2 * comm)  # nothing overlaps
    assert step.step_s == pytest.approx(step.compute_s + 2 * comm)


def profile(shares: list[int]) -> ReplicaProfile:
    kinds = {"Parameter": 100, "Buffer": 2, "Gradient": 100, "Optstate": 100, "Temp": 5}
    memory = {
        s: {**kinds, "Activation": 10 * s, "Total": sum(kinds.values()) + 10 * s}
        for s in set(shares)
        if s > 0
    }
    times = {s: 0.001 * s for s in memory}
    return ReplicaProfile(shares, times, 0.002, memory, 102, 4 * 784 * sum(shares), 40)


def test_device_0_holds_the_optimizer_the_gathered_outputs_and_the_data_the_others_a_replica():
    devices = replica_memories(profile([8, 24]))
    zero, one = devices
    assert (zero.rank, one.rank) == (0, 1)
    assert zero.tensors["Optstate"] == 100 and zero.tensors["Gathered output"] == 40
    assert zero.tensors["Total"] == 100 + 2 + 100 + 100 + 5 + 80 + 40
    assert one.tensors["Optstate"] == 0 and "Gathered output" not in one.tensors
    assert one.tensors["Total"] == 100 + 2 + 100 + 5 + 240
    data = DataSize(train=100, test=10)
    assert peak_mib(zero, data) * 2**20 == zero.tensors["Total"] + data.resident_bytes
    assert peak_mib(one, data) * 2**20 == one.tensors["Total"]  # no data: GPU 0 keeps it


def test_a_device_with_no_share_holds_the_module_alone():
    """balanced_dp.gpu0_bsz 0: GPU 0 computes nothing, but holds the module and the gather."""
    zero = replica_memories(profile([0, 16, 16]))[0]
    assert zero.tensors == {
        "Parameter": 100,
        "Buffer": 2,
        "Gradient": 100,
        "Optstate": 100,
        "Gathered output": 40,
        "Total": 342,
    }


def test_the_traffic_is_one_forwards_scatter_broadcast_gather_and_reduce():
    p = profile([16, 16])
    assert [(c.kind, c.size, c.overlappable) for c in replica_traffic(p).calls] == [
        (SCATTER, p.input_bytes, False),
        (BROADCAST, 102, False),
        (GATHER, 40, False),
        (REDUCE, 102, False),
    ]


def test_the_strategies_own_splits_are_what_is_measured():
    cfg = load_config(None, ["model.width=4", "train.batch_size=32", "balanced_dp.gpu0_bsz=8"])
    for name, shares in (("dp", [16, 16]), ("balanced_dp", [8, 24])):
        spec = resolve_run(cfg, name)
        split = replica_split(name)
        assert split is not None and split(spec.options, spec.plan, 2) == shares
    assert replica_split("ddp") is None and replica_split("single") is None


def test_measured_on_the_cpu_a_larger_share_holds_more_activations():
    cfg = load_config(None, ["model.width=4", "train.batch_size=32", "train.precision=fp32"])
    spec = resolve_run(cfg, "balanced_dp")
    measured = measure_replicas(spec, [8, 24], CPU, 1e-6)
    assert set(measured.share_s) == {8, 24} and measured.optimizer_s > 0
    small, large = measured.memory[8], measured.memory[24]
    assert large["Activation"] > 2 * small["Activation"]  # activations grow with the share
    assert small["Parameter"] == large["Parameter"] > 0  # the same module at every share
    assert measured.output_bytes == 32 * 10 * 4  # fp32 logits of the whole micro-batch
    assert measured.input_bytes == 32 * 28 * 28 * 4


def test_each_share_and_the_optimizer_step_are_measured_once_for_every_device_count():
    cfg = load_config(None, ["model.width=4", "train.batch_size=32", "train.precision=fp32"])
    replicas = Replicas(resolve_run(cfg, "dp"), CPU, 1e-6)
    at_2, at_4 = replicas.profile([16, 16]), replicas.profile([8, 8, 8, 8])
    assert set(at_2.memory) == {16} and set(at_4.memory) == {8}  # each N sees its own shares
    again = replicas.profile([16, 16])  # another N asking for a share already measured
    assert again.share_s == at_2.share_s and again.memory == at_2.memory
    assert at_2.optimizer_s == at_4.optimizer_s > 0  # N does not change device 0's step
    assert set(replicas.share_s) == {8, 16}


def test_on_a_cpu_the_replicas_are_measured_for_memory_alone():
    cfg = load_config(None, ["model.width=4", "train.batch_size=32", "train.precision=fp32"])
    measured = measure_replicas(resolve_run(cfg, "dp"), [16, 16], CPU, None)
    assert measured.share_s == {} and measured.optimizer_s is None  # nothing timed
    assert measured.memory[16]["Activation"] > 0
