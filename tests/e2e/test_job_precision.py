"""`precision: auto` is decided once for the job: two real gloo processes, each faking the
compute capability of its GPU (an A100 on rank 0, a T4 on rank 1), build the same precision."""

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pipeline.numerics.precision import build_precision, job_capabilities

A100, T4 = (8, 0), (7, 5)


def _build_worker(rank: int, world: int, init_file: str, faked: list, out: dict) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    capabilities = job_capabilities(faked[rank], world)
    # the device is never touched (no GPU here): its type and the capabilities decide
    built = {
        asked: build_precision(asked, torch.device("cuda", 0), capabilities)
        for asked in ("auto", "bf16")
    }
    out[rank] = (
        capabilities,
        {a: (p.name, p.autocast_dtype, p.scaler is not None, p.notes) for a, p in built.items()},
    )
    dist.destroy_process_group()


def test_every_rank_of_a_mixed_job_builds_the_same_precision(tmp_path):
    manager = mp.Manager()
    out = manager.dict()
    mp.spawn(_build_worker, args=(2, str(tmp_path / "init"), [A100, T4], out), nprocs=2)
    assert out[0] == out[1]
    capabilities, built = out[0]
    assert capabilities == [A100, T4]
    name, autocast_dtype, scaled, notes = built["auto"]
    assert (name, autocast_dtype, scaled) == ("fp16", torch.float16, True)
    assert notes == [
        "precision auto: fp16 with loss scaling for the job: the lowest compute capability "
        "among its GPUs is 7.5 (rank 1), which has no native bfloat16"
    ]
    assert built["bf16"][:3] == ("fp32", None, False)  # the T4 has no bf16: neither rank runs it
