"""Every rank gathers every rank's memory peaks and machine load, in the meter's one
collective per epoch (pipeline/training/meter.py): two real gloo processes."""

import torch.distributed as dist
import torch.multiprocessing as mp

from pipeline.context import DistContext
from pipeline.memory import DevicePeak
from pipeline.training.meter import Meter


def _gather_worker(rank: int, world: int, init_file: str, out: dict) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    ctx = DistContext(rank=rank, local_rank=rank, world_size=world, gpus=())
    meter = Meter([], ctx)
    # what `trained` read on this rank: its training peak and its wait for a core
    meter._train_peaks = [DevicePeak(f"gpu_{10 + rank}", 100.0 * (rank + 1), 128.0 * (rank + 1))]
    meter._waited = 0.1 * (rank + 1)
    out[rank] = meter.gathered()
    dist.destroy_process_group()


def test_every_rank_gathers_every_ranks_peaks_and_the_busiest_wait(tmp_path):
    manager = mp.Manager()
    out = manager.dict()
    mp.spawn(_gather_worker, args=(2, str(tmp_path / "init"), out), nprocs=2)
    assert out[0] == out[1]
    metrics, core_wait = out[0]
    assert metrics["memory/gpu_10_peak_allocated_mib"] == 100.0
    assert metrics["memory/gpu_11_peak_allocated_mib"] == 200.0
    assert metrics["memory/gpu_11_peak_reserved_mib"] == 256.0
    assert core_wait == 0.2  # the busiest rank's
