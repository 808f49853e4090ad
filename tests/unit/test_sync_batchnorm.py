"""The CPU's synchronised BatchNorm computes what one BatchNorm2d computes over the whole
micro-batch: two forked gloo ranks, each with its share, against the plain layer on all of it
(fp64: the same sums in another order, so a bound, not bitwise; bitwise between the ranks)."""

from __future__ import annotations

import multiprocessing
import queue
import time
import traceback
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch import nn

from pipeline.strategies.sync_batchnorm import GlooSyncBatchNorm, convert_sync_batchnorm

CHANNELS = 3
# fp64: the largest difference measured was 3e-13 (a running variance near 100), relative
# differences about 1e-15; a wrong formula is off by 1e-2 or more
BOUND = {"rtol": 1e-9, "atol": 1e-9}


def layer(seed: int, **options) -> nn.BatchNorm2d:
    torch.manual_seed(seed)
    plain = nn.BatchNorm2d(CHANNELS, **options).double()
    if plain.affine:
        with torch.no_grad():
            plain.weight.uniform_(0.5, 1.5)
            plain.bias.uniform_(-0.5, 0.5)
    return plain


def batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs far from zero mean (where a sum of squares would cancel) and an upstream
    gradient that is not a constant."""
    generator = torch.Generator().manual_seed(1)
    x = 100 + 3 * torch.randn(n, CHANNELS, 5, 4, dtype=torch.float64, generator=generator)
    dy = torch.randn(x.shape, dtype=torch.float64, generator=generator)
    return x, dy


def two_steps(bn: nn.BatchNorm2d, x: torch.Tensor, dy: torch.Tensor) -> dict[str, torch.Tensor]:
    """Two training forwards and backwards (the running statistics move twice), then one in
    eval mode: what the layer computed and what it holds."""
    x = x.clone().requires_grad_()
    seen = {}
    for step in range(2):
        y = bn(x * (step + 1))
        y.backward(dy)
        seen[f"y{step}"] = y.detach()
    seen["grad_x"] = x.grad
    if bn.affine:
        seen["grad_weight"], seen["grad_bias"] = bn.weight.grad, bn.bias.grad
    bn.eval()
    seen["eval"] = bn(x.detach())
    seen.update({f"buffer.{k}": v for k, v in bn.state_dict().items() if "running" in k})
    seen["tracked"] = bn.num_batches_tracked.clone()
    return seen


def rank_main(rank: int, store_path: str, split: list[int], options: dict, out) -> None:
    try:
        store = dist.FileStore(store_path, len(split))
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=len(split), timeout=timedelta(seconds=60)
        )
        synced = convert_sync_batchnorm(nn.Sequential(layer(0, **options)), on_cuda=False)[0]
        assert isinstance(synced, GlooSyncBatchNorm)
        x, dy = batch(sum(split))
        start = sum(split[:rank])
        mine = slice(start, start + split[rank])
        seen = two_steps(synced, x[mine], dy[mine])
        grads = {k: seen.pop(k) for k in ("grad_weight", "grad_bias") if k in seen}
        for grad in grads.values():  # each rank's share; DDP sums (averages) them
            dist.all_reduce(grad)
        seen.update(grads)
        seen.pop("eval")  # each rank evaluates its own rows, compared below as a whole
        seen["eval_rows"] = synced(x[mine])
        dist.destroy_process_group()
        # as numpy arrays: a tensor would travel in shared memory this process takes along
        out.put((rank, mine.start, mine.stop, {k: v.detach().numpy() for k, v in seen.items()}))
    except Exception:  # noqa: BLE001 (whatever failed, the parent shows it)
        out.put((rank, None, None, traceback.format_exc()))


def synced_run(tmp_path, split: list[int], options: dict) -> list[tuple]:
    # Forked from a server that imported torch and ran nothing: a process forked after
    # running a torch kernel (this one, an earlier test's) can hang in OpenMP's thread pool.
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "pipeline.strategies.sync_batchnorm"])
    out = context.Queue()
    store = str(tmp_path / "store")
    procs = [
        context.Process(target=rank_main, args=(r, store, split, options, out))
        for r in range(len(split))
    ]
    for proc in procs:
        proc.start()
    results = []
    try:
        deadline = time.monotonic() + 120
        while len(results) < len(procs):
            try:
                results.append(out.get(timeout=1))
            except queue.Empty:  # a rank that died without a word would leave us waiting
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                assert not dead and time.monotonic() < deadline, f"ranks exited {dead}"
        for proc in procs:
            proc.join(timeout=60)
            assert proc.exitcode == 0
    finally:  # on a failure, a rank still waiting on its peer is not left behind
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
    results.sort()
    for _, _, _, seen in results:
        assert not isinstance(seen, str), seen
    return [(*head, {k: torch.from_numpy(v) for k, v in seen.items()}) for *head, seen in results]


@pytest.mark.parametrize(
    "split, options",
    [
        ([4, 4], {}),
        ([5, 3], {}),  # uneven shares weigh by their counts
        ([0, 6], {}),  # a rank with no samples adds nothing
        ([3, 3], {"momentum": None}),  # cumulative averages of the statistics
        ([2, 5], {"affine": False}),
    ],
)
def test_two_ranks_compute_what_one_batchnorm_computes_over_the_whole_batch(
    tmp_path, split, options
):
    results = synced_run(tmp_path, split, options)
    x, dy = batch(sum(split))
    plain = two_steps(layer(0, **options), x, dy)
    whole = {}
    for _, start, stop, seen in results:
        for key in ("y0", "y1", "grad_x", "eval_rows"):
            whole.setdefault(key, torch.empty_like(plain["grad_x"]))[start:stop] = seen[key]
    plain["eval_rows"] = plain.pop("eval")
    for key in ("y0", "y1", "grad_x", "eval_rows"):
        torch.testing.assert_close(whole[key], plain[key], **BOUND, msg=key)
    for key in plain:
        if key in whole:
            continue
        first = results[0][3][key]
        torch.testing.assert_close(first, plain[key], **BOUND, msg=key)
        # the statistics and the reduced gradients are bitwise the same on every rank
        assert all(torch.equal(seen[key], first) for _, _, _, seen in results), key
