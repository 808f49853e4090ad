"""What only a GPU shows, in the same suite: each test runs where there is a CUDA device and
skips elsewhere saying so (`run_if`), so `make test` on a GPU host runs them with the rest.
One process each, on cuda:0; the multi-process runs on GPUs are `make gpu-check`'s."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from pipeline import memory
from pipeline.config import Config
from pipeline.context import DistContext
from pipeline.data.device_data import to_device
from pipeline.data.download import convert
from pipeline.interrupts.stop import StopRequest
from pipeline.numerics.build import build_training
from pipeline.numerics.precision import NATIVE_BF16
from pipeline.numerics.totals import Totals
from pipeline.resnet import build_model
from pipeline.run_spec import resolve_run
from pipeline.strategies import pipeline_parallel
from pipeline.strategies.balanced_dp import BalancedDataParallel
from pipeline.strategies.base import PipelinedRun
from pipeline.strategies.replica_autocast import AutocastDataParallel
from pipeline.training.trainer import Trainer
from support import parallelize, run_if, strategy_nproc

pytestmark = run_if(min_gpus=1)

GPU = DistContext(rank=0, local_rank=0, world_size=1, gpus=("0",))


@pytest.fixture
def fp32_kernels(monkeypatch):
    """fp32 matmuls and convolutions in full fp32, whatever an earlier test in this process
    switched (configure_backends sets process-wide flags): chunked and whole-batch results
    then differ only by summation order. Restored afterwards."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)


@pytest.fixture
def one_rank_group(tmp_path):
    """The process group of a one-GPU job's one worker (nccl), as pipeline/launch/worker.py
    starts it; a pipeline stage needs one even when every stage is local."""
    dist.init_process_group(
        "nccl",
        store=dist.FileStore(str(tmp_path / "store"), 1),
        rank=0,
        world_size=1,
        device_id=GPU.device,
    )
    yield
    dist.destroy_process_group()


def test_single_trains_an_epoch_on_the_gpu_in_bf16_autocast(raw_dataset, monkeypatch):
    """The real build and epoch loop on cuda:0 with train.precision bf16: bf16 autocast over
    fp32 parameters, every sample of the epoch trained, the weights moved."""
    if torch.cuda.get_device_capability(0) < NATIVE_BF16:
        pytest.skip(f"bf16 runs natively from compute capability {NATIVE_BF16}")
    for flag in ("benchmark", "allow_tf32"):  # build_training switches them process-wide
        monkeypatch.setattr(torch.backends.cudnn, flag, getattr(torch.backends.cudnn, flag))
    monkeypatch.setattr(
        torch.backends.cuda.matmul, "allow_tf32", torch.backends.cuda.matmul.allow_tf32
    )
    cfg = Config()
    cfg.model.width, cfg.train.batch_size, cfg.train.precision = 4, 16, "bf16"
    data = to_device(convert(raw_dataset[0]), GPU.device, 64, 32)  # 4 steps of 16
    spec = resolve_run(cfg, "single")
    plan = spec.job_plan(1, len(data.train_labels))
    training = build_training(spec, GPU, data, plan)
    assert training.prec.name == "bf16" and training.prec.autocast_dtype == torch.bfloat16
    before = [p.detach().clone() for p in training.run.module.parameters()]
    totals = Totals.zeros(GPU.device)
    assert Trainer(training, GPU, StopRequest()).train_epoch(0, 0, totals) is None
    loss_sum, _, count = totals.read()
    assert count == 64 and math.isfinite(loss_sum)
    after = list(training.run.module.parameters())
    assert all(p.is_cuda and p.dtype == torch.float32 for p in after)
    assert any(not torch.equal(b, a) for b, a in zip(before, after))
    assert training.forward is not None
    with training.prec.autocast():
        logits = training.forward(training.loader.prepare(data.test_images[:8]))
    assert logits.dtype == torch.bfloat16 and logits.device == GPU.device


def test_dp_and_balanced_dp_split_over_two_replicas_on_one_gpu(fp32_kernels):
    """DataParallel's scatter, replicate, replica threads and gather, with two replicas on
    cuda:0: each replica computes in the caller's bf16 (replica_autocast.py: torch's replica
    threads would fall back to fp16), the outputs are the unsplit model's, and the replicas'
    gradients add up in the one model to the whole batch's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(GPU.device)
    x = torch.randn(6, 8, device=GPU.device)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        whole_bf16 = model(x)
    model(x).square().sum().backward()
    whole_grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    wrappers = {
        "dp": AutocastDataParallel(model, device_ids=[0, 0]),  # 3 + 3
        "balanced_dp": BalancedDataParallel(model, 2, device_ids=[0, 0]),  # 2 + 4
    }
    for name, wrapper in wrappers.items():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = wrapper(x)
        assert out.dtype == torch.bfloat16, name
        torch.testing.assert_close(out, whole_bf16, msg=name)
        model.zero_grad(set_to_none=True)
        wrapper(x).square().sum().backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert len(grads) == len(whole_grads), name
        for got, want in zip(grads, whole_grads):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=name)


def test_pipeline_parallel_runs_two_stages_on_one_gpu_as_single_computes(
    one_rank_group, fp32_kernels
):
    """Both stages in the one process of a one-GPU job (a looped schedule): with one pipeline
    micro-batch a training step computes single's logits and gradients."""
    cfg = Config()
    cfg.model.width, cfg.train.batch_size, cfg.train.precision = 4, 8, "fp32"
    cfg.pipeline_parallel.stages, cfg.pipeline_parallel.microbatches = 2, 1
    assert strategy_nproc(pipeline_parallel.SPEC, cfg, 1) == 1
    model = build_model(cfg.model.width, cfg.seed).to(GPU.device)
    reference = copy.deepcopy(model)
    run = parallelize(pipeline_parallel.SPEC, model, cfg, GPU)
    assert isinstance(run, PipelinedRun) and run.devices == ["cuda:0"]
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(8, 1, 28, 28, generator=generator).to(GPU.device)
    y = torch.randint(0, 10, (8,), generator=generator).to(GPU.device)
    logits = run.step(x, y, True)
    expected = reference(x)
    F.cross_entropy(expected, y).backward()
    assert logits is not None
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-5)
    for (name, got), want in zip(model.named_parameters(), reference.parameters()):
        assert got.grad is not None and want.grad is not None, name
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_memory_peaks_are_the_cuda_allocators_counters():
    """pipeline/memory.py on a GPU: the peak since `reset_peaks`, named by physical id, read
    from torch.cuda's counters (a 64 MiB block allocated and freed in between counts)."""
    devices = memory.local_devices(["cuda:0"], GPU)
    assert devices == [torch.device("cuda", 0)]
    memory.reset_peaks(devices)
    base = torch.cuda.memory_allocated(0) / memory.MIB
    block = torch.empty(64 * memory.MIB, dtype=torch.uint8, device=GPU.device)
    del block
    (peak,) = memory.read_peaks(devices, GPU)
    assert peak.label == "gpu_0" and peak.kind == "gpu"
    assert peak.reserved_mib is not None
    assert base + 64 <= peak.allocated_mib <= peak.reserved_mib
    memory.reset_peaks(devices)
    (after,) = memory.read_peaks(devices, GPU)
    assert after.allocated_mib == torch.cuda.memory_allocated(0) / memory.MIB < base + 64
