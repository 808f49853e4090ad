"""`dp` and `balanced_dp` on CPU: real runs through the CLI, validation, and the parts of
BalancedDataParallel that can be checked without GPUs.

Nothing here splits a batch over real devices: CUDA's scatter, broadcast and gather need >=2
GPUs, which CI lacks. On CPU both strategies run the model unsplit, so with fp64 they must
end with exactly the weights of `single`.
"""

import copy
import threading
from collections import namedtuple

import pytest
import torch
from torch import nn

from pipeline.config import Config
from pipeline.context import DistContext
from pipeline.errors import UserError
from pipeline.strategies import balanced_dp, dp
from pipeline.strategies.balanced_dp import (
    BalancedDataParallel,
    adopt_buffers,
    first_tensor,
    split_inputs,
)
from pipeline.strategies.replica_autocast import InAutocast, keep_autocast
from pipeline.strategies.sync_batchnorm import unsynced_note
from support import parallelize, strategy_nproc

CPU = DistContext(rank=0, local_rank=0, world_size=1, gpus=())


@pytest.fixture(autouse=True)
def no_cuda_in_this_process(monkeypatch):
    """The tests below build DataParallel in this process: hide any GPU so it behaves as in CI
    (the CLI runs above hide them through CUDA_VISIBLE_DEVICES)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def config(batch_size=32, grad_accum=2, gpu0_bsz=None) -> Config:
    cfg = Config()
    cfg.train.batch_size, cfg.train.grad_accum = batch_size, grad_accum
    cfg.balanced_dp.gpu0_bsz = gpu0_bsz
    return cfg


@pytest.mark.parametrize("gpu0_bsz", [None, 0, 16, 32, "auto"])
def test_nproc_is_one_process_for_any_gpu0_bsz_within_the_batch(gpu0_bsz):
    assert strategy_nproc(balanced_dp.SPEC, config(gpu0_bsz=gpu0_bsz), 4) == 1
    assert strategy_nproc(dp.SPEC, config(), 4) == 1


def test_nproc_refuses_gpu0_bsz_above_the_batch():
    with pytest.raises(
        UserError, match=r"^balanced_dp\.gpu0_bsz: got 34, .*train\.batch_size \(32\)"
    ):
        strategy_nproc(balanced_dp.SPEC, config(gpu0_bsz=34), 4)


def test_nproc_refuses_gpu0_bsz_the_steps_forwards_cannot_share():
    with pytest.raises(
        UserError, match=r"^balanced_dp\.gpu0_bsz: got 5, .*train\.grad_accum \(2\)"
    ):
        strategy_nproc(balanced_dp.SPEC, config(gpu0_bsz=5), 4)


def test_gpu0_bsz_is_gpu0s_share_per_optimizer_step_as_in_the_notes():
    """The notes' example: batch 16, gpu0_bsz 4, acc_grad 2 on 3 GPUs gives every forward 2+3+3
    (BalancedDataParallel(gpu0_bsz // acc_grad, ...)); with acc_grad 1, batch 8, gpu0_bsz 2:
    2+3+3 as well."""
    three_gpus = DistContext(rank=0, local_rank=0, world_size=1, gpus=("0", "1", "2"))
    cfg = config(batch_size=16, grad_accum=2, gpu0_bsz=4)
    par = parallelize(balanced_dp.SPEC, nn.Linear(3, 2), cfg, three_gpus)
    assert par.batch_split == [2, 3, 3] and par.forward.gpu0_bsz == 2
    par = parallelize(balanced_dp.SPEC, nn.Linear(3, 2), config(8, 1, gpu0_bsz=2), three_gpus)
    assert par.batch_split == [2, 3, 3]


@pytest.mark.parametrize("strategy", [dp, balanced_dp])
def test_parallelize_on_cpu_calls_the_model(strategy):
    model = nn.Linear(3, 2)
    par = parallelize(strategy.SPEC, model, config(gpu0_bsz=4), CPU)
    x = torch.randn(5, 3)
    assert torch.equal(par.forward(x), model(x))
    assert par.module is model  # state_dict keys match single's: no "module." prefix
    assert par.devices == ["cpu"] and par.batch_split == [16]


def test_parallelize_reports_the_split_of_a_three_gpu_context():
    """What the strategies record for 3 GPUs; nothing runs (splitting needs real GPUs)."""
    three_gpus = DistContext(rank=0, local_rank=0, world_size=1, gpus=("0", "1", "2"))
    devices = ["cuda:0", "cuda:1", "cuda:2"]
    par = parallelize(dp.SPEC, nn.Linear(3, 2), config(batch_size=20), three_gpus)
    assert par.devices == devices and par.batch_split == [4, 4, 2]
    assert par.notes[0] == "dp: each micro-batch of 10 is split 4+4+2 over cuda:0, cuda:1, cuda:2"
    par = parallelize(
        balanced_dp.SPEC, nn.Linear(3, 2), config(batch_size=16, gpu0_bsz=4), three_gpus
    )
    assert par.devices == devices and par.batch_split == [2, 3, 3]
    # what people compare sees that BatchNorm's statistics come from GPU 0's 2 samples
    (note,) = [n for n in par.notes if "BatchNorm" in n]
    assert "2+3+3" in note and "from 2 sample(s) per forward" in note
    par = parallelize(
        balanced_dp.SPEC, nn.Linear(3, 2), config(batch_size=16, gpu0_bsz=0), three_gpus
    )
    assert par.batch_split == [0, 4, 4] and par.notes[0].endswith("; no samples on cuda:0")
    assert any("from 4 sample(s) per forward" in n for n in par.notes)
    # unsplit, BatchNorm sees the whole batch: nothing to say
    par = parallelize(dp.SPEC, nn.Linear(3, 2), config(batch_size=20), CPU)
    assert not any("BatchNorm" in n for n in par.notes)


def test_balanced_forward_takes_keyword_inputs():
    class Scale(nn.Module):
        def forward(self, *, images, factor):
            return images * factor

    x = torch.randn(4, 3)
    assert torch.equal(BalancedDataParallel(Scale(), gpu0_bsz=1)(images=x, factor=2.0), x * 2)


def test_first_tensor_finds_the_batch_by_position_or_keyword():
    x = torch.zeros(6, 2)
    assert first_tensor(((), {"images": x})) is x
    assert first_tensor((("label", [None, x]), {})) is x
    assert first_tensor((("no", "tensor"), {"k": 1})) is None


Pair = namedtuple("Pair", "a b")


def test_split_inputs_cuts_every_tensor_into_the_given_sizes():
    """What the forward's Scatter does, with `t.split(sizes)` standing in for the CUDA copy."""
    sizes = [2, 3, 3]
    x, mask = torch.arange(8), torch.arange(16).view(8, 2)
    inputs = (x, [x, "shared"], Pair(x, 7))
    kwargs = {"mask": mask, "nested": {"m": mask}, "flag": True}
    device_inputs, device_kwargs = split_inputs(
        inputs, kwargs, len(sizes), lambda t: t.split(sizes)
    )
    assert len(device_inputs) == len(device_kwargs) == 3
    starts = [0, 2, 5]
    for args, kw, start, size in zip(device_inputs, device_kwargs, starts, sizes):
        chunk = torch.arange(start, start + size)
        assert torch.equal(args[0], chunk)
        assert isinstance(args[1], list) and torch.equal(args[1][0], chunk)
        assert args[1][1] == "shared"
        assert isinstance(args[2], Pair) and torch.equal(args[2].a, chunk) and args[2].b == 7
        assert torch.equal(kw["mask"], mask[start : start + size])
        assert torch.equal(kw["nested"]["m"], mask[start : start + size]) and kw["flag"] is True


def test_split_inputs_without_inputs_gives_empty_ones_per_chunk():
    assert split_inputs((), {}, 2, lambda t: t.split(1)) == ([(), ()], [{}, {}])


class CpuStandIns:
    """torch's CUDA-only pieces, replaced by CPU equivalents that record what they were given:
    Scatter -> split, replicate's broadcast -> deep copies tagged with their device, gather ->
    cat, parallel_apply -> a loop. What is checked is the orchestration around them."""

    def __init__(self, monkeypatch, balanced: BalancedDataParallel, n_devices: int):
        self.applied: list[tuple[int, int]] = []  # (device, chunk size) per replica run
        balanced.device_ids, balanced.output_device, balanced.dim = list(range(n_devices)), 0, 0
        balanced.replicate = self.replicate
        balanced.gather = lambda outputs, device: torch.cat(outputs)
        monkeypatch.setattr(balanced_dp, "Scatter", self)
        monkeypatch.setattr(balanced_dp, "parallel_apply", self.parallel_apply)

    @staticmethod
    def apply(devices, chunk_sizes, dim, tensor):
        assert len(devices) == len(chunk_sizes) and min(chunk_sizes) > 0
        return tensor.split(chunk_sizes, dim)

    @staticmethod
    def replicate(module, device_ids):
        assert device_ids[0] == 0, "broadcast needs the source device first"
        replicas = [copy.deepcopy(module) for _ in device_ids]
        for device, replica in zip(device_ids, replicas):
            replica.device = device
        return replicas

    def parallel_apply(self, replicas, inputs, kwargs, devices):
        assert len(replicas) == len(inputs) == len(kwargs) == len(devices)
        outputs = []
        for replica, args, kw, device in zip(replicas, inputs, kwargs, devices):
            assert isinstance(replica, InAutocast), "replicas keep the caller's autocast dtype"
            assert replica.module.device == device, "each chunk runs on its own device's replica"
            self.applied.append((device, len(args[0])))
            outputs.append(replica(*args, **kw))
        return outputs


@pytest.mark.parametrize(
    "gpu0_bsz, expected",
    [
        (2, [(0, 2), (1, 3), (2, 3)]),
        (0, [(1, 4), (2, 4)]),
        (8, [(0, 8)]),
        (None, [(0, 3), (1, 3), (2, 2)]),
    ],
)
def test_balanced_forward_runs_only_devices_with_samples(monkeypatch, gpu0_bsz, expected):
    model = nn.Linear(4, 2)
    balanced = BalancedDataParallel(model, gpu0_bsz)
    stand_ins = CpuStandIns(monkeypatch, balanced, n_devices=3)
    x = torch.randn(8, 4)
    assert torch.allclose(balanced(x), model(x))
    assert stand_ins.applied == expected


def test_gpu0_without_samples_still_updates_batchnorm_statistics(monkeypatch):
    """Only GPU 0's replica shares the module's buffers; with gpu0_bsz 0 the first replica
    that ran must hand its running statistics back, or they would never change."""
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    expected = copy.deepcopy(model)
    balanced = BalancedDataParallel(model, gpu0_bsz=0)
    CpuStandIns(monkeypatch, balanced, n_devices=3)
    x = torch.randn(8, 4)
    balanced(x)
    expected(x[:4])  # device 1's chunk: the first replica that ran
    for (name, got), want in zip(model.named_buffers(), expected.buffers()):
        assert torch.equal(got, want), name


def test_adopt_buffers_copies_every_buffer():
    module = nn.BatchNorm1d(3)
    replica = copy.deepcopy(module)
    replica(torch.randn(5, 3))
    adopt_buffers(module, replica)
    assert all(torch.equal(a, b) for a, b in zip(module.buffers(), replica.buffers()))
    assert module.num_batches_tracked.item() == 1


def autocast_dtype_in_a_thread(model: nn.Module) -> torch.dtype:
    """What torch.nn.parallel.parallel_apply does in each replica's thread: re-enter autocast
    with enabled= only, run the replica; the dtype the replica computed in comes back."""
    seen = {}

    def replica_thread(enabled: bool) -> None:
        with torch.amp.autocast("cpu", enabled=enabled):
            seen["dtype"] = model(torch.randn(2, 3)).dtype

    with torch.autocast("cpu", dtype=torch.float16):
        # parallel_apply reads `enabled` in the calling thread and hands it to the workers
        thread = threading.Thread(target=replica_thread, args=(torch.is_autocast_enabled("cpu"),))
        thread.start()
        thread.join()
    return seen["dtype"]


def test_replica_threads_lose_the_autocast_dtype_unless_kept():
    """The autocast dtype is thread-local: a thread that re-enters autocast without one takes
    the device's default (bfloat16 on the CPU, float16 on CUDA), not the caller's float16.
    keep_autocast wraps each replica to re-enter the caller's dtype."""
    model = nn.Linear(3, 2)
    assert autocast_dtype_in_a_thread(model) == torch.bfloat16  # the bug, reproduced

    with torch.autocast("cpu", dtype=torch.float16):
        (kept,) = keep_autocast([model], device_type="cpu")
    assert autocast_dtype_in_a_thread(kept) == torch.float16


def test_unsynced_batchnorm_is_noted_for_the_data_parallel_strategies():
    """ddp and fsdp with sync_bn false: each rank's BatchNorm sees only its share."""
    note = unsynced_note("ddp", per_rank=8, world=2)
    assert note is not None and "each rank's 8 sample(s)" in note and "micro-batch's 16" in note
    assert unsynced_note("fsdp", per_rank=16, world=1) is None  # one rank: the whole batch


def test_a_gpu_named_twice_holds_two_replicas():
    """devices "0,0": dp's and balanced_dp's two replicas on GPU 0, the batch split as over two
    GPUs; nothing runs (replicas need a real GPU: gpu-check's replicas_bf16 runs them)."""
    one_gpu_twice = DistContext(rank=0, local_rank=0, world_size=1, gpus=("0",), placement=(0, 0))
    par = parallelize(dp.SPEC, nn.Linear(3, 2), config(batch_size=20), one_gpu_twice)
    assert par.devices == ["cuda:0", "cuda:0"] and par.batch_split == [5, 5]
    assert one_gpu_twice.shared(par.devices) == {"0": 2}
    par = parallelize(balanced_dp.SPEC, nn.Linear(3, 2), config(20, gpu0_bsz=4), one_gpu_twice)
    assert par.devices == ["cuda:0", "cuda:0"] and par.batch_split == [2, 8]
