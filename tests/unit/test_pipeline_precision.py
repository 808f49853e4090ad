"""pipeline_parallel under bf16 autocast, its stages in one process (the looped schedule one
GPU runs): every convolution computes in bf16, and with one pipeline micro-batch the training
is exactly single's under the same autocast. (Its stages in processes of their own, talking
over gloo: tests/e2e/test_parity.py.)"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from pipeline.batch_plan import BatchPlan
from pipeline.config import PipelineParallelConfig
from pipeline.context import DistContext
from pipeline.numerics.precision import build_precision
from pipeline.resnet import build_model
from pipeline.strategies import pipeline_parallel

CPU = torch.device("cpu")
BATCH = 32


def test_one_process_pipeline_trains_in_bf16_exactly_as_single_does(tmp_path):
    store = f"file://{tmp_path / 'store'}"
    dist.init_process_group("gloo", init_method=store, rank=0, world_size=1)
    try:
        autocast = build_precision("bf16", CPU).autocast
        single, piped = build_model(8, 0), build_model(8, 0)
        options = PipelineParallelConfig(stages=2, nproc=1, microbatches=1)
        run = pipeline_parallel.parallelize(
            piped, options, BatchPlan.make(BATCH, 1), DistContext(0, 0, 1, ()), autocast
        )
        dtypes: set[torch.dtype] = set()
        for module in piped.modules():
            if isinstance(module, nn.Conv2d):
                module.register_forward_hook(lambda _m, _i, out: dtypes.add(out.dtype))
        optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (single, run.module)]
        generator = torch.Generator().manual_seed(1)
        for _ in range(3):
            x = torch.randn(BATCH, 1, 28, 28, generator=generator)
            y = torch.randint(0, 10, (BATCH,), generator=generator)
            with autocast():
                loss = F.cross_entropy(single(x), y)
                logits = run.step(x, y, True)  # the schedule runs forward and backward
            loss.backward()
            for optimizer in optimizers:
                optimizer.step()
                optimizer.zero_grad()
            assert logits is not None and logits.dtype == torch.bfloat16
        assert dtypes == {torch.bfloat16}
        trained, reference = piped.state_dict(), single.state_dict()
        assert list(trained) == list(reference)
        assert all(torch.equal(trained[k], reference[k]) for k in reference)
        assert not torch.equal(reference["0.0.weight"], build_model(8, 0)[0][0].weight)
    finally:
        dist.destroy_process_group()
