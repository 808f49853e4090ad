"""Every rank gathers every rank's memory peaks: two real gloo processes."""

import torch.distributed as dist
import torch.multiprocessing as mp

from pipeline import memory
from pipeline.context import DistContext
from pipeline.memory import DevicePeak


def _gather_worker(rank: int, world: int, init_file: str, out: dict) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    ctx = DistContext(rank=rank, local_rank=rank, world_size=world, gpus=())
    local = [DevicePeak(f"gpu_{10 + rank}", 100.0 * (rank + 1), 128.0 * (rank + 1))]
    out[rank] = memory.gather_peaks(local, ctx)
    dist.destroy_process_group()


def test_every_rank_gathers_every_ranks_peaks(tmp_path):
    manager = mp.Manager()
    out = manager.dict()
    mp.spawn(_gather_worker, args=(2, str(tmp_path / "init"), out), nprocs=2)
    expected = [DevicePeak("gpu_10", 100.0, 128.0), DevicePeak("gpu_11", 200.0, 256.0)]
    assert out[0] == expected and out[1] == expected
