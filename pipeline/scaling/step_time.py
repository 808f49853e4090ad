"""A strategy's optimizer step on N devices: the computation one rank does (measured, see
profile.py) plus the communication it waits for (modelled here). Pure arithmetic, no torch.

Communication, nccl-tests' model: a ring all-reduce of S bytes over n ranks moves
2(n-1)/n x S per rank in 2(n-1) steps; an all-gather or a reduce-scatter (n-1)/n x S in n-1;
a pipeline send S in one. Its time is steps x latency + moved / busbw.

What overlaps the computation:
- on a GPU, communication runs on its own stream and link: DDP's buckets are reduced while
  the backward goes on, FSDP's all-gathers are prefetched ahead of the blocks that need them,
  so only what sticks out past that computation counts, and never less than the last
  collective (it waits for the last gradient);
- on a CPU, the ranks' threads already take every core, and gloo's transfers take cores of
  their own: nothing overlaps (what the 2-core check measures).

DataParallel (dp, balanced_dp): one process, each forward a scatter, a broadcast of the
parameters, the replicas' computation, a gather and, in the backward, a reduce of the
gradients onto device 0, one after the other (`replicated_step`); unchecked on real GPUs.

A pipeline of p stages over m micro-batches: each stage runs its m forwards and backwards,
and the whole step waits for the slowest stage across the fill and the drain (GPipe and
1F1B alike): (m + p - 1) x the slowest stage's time per micro-batch, a send of its
activations and one of their gradients included, so the bubble is (p-1)/(m+p-1) of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.scaling.links import Link

# kinds of collective -> (steps, fraction of the message each rank moves), for n ranks
ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, SEND = "all_reduce", "all_gather", "reduce_scatter", "send"
# DataParallel's, from and to device 0: its scatter of the inputs and gather of the outputs
# (device 0's link carries the other devices' chunks), replicate's broadcast of the parameters
# and the backward's reduce of their gradients (nccl-tests: busbw = algbw for both)
SCATTER, GATHER, BROADCAST, REDUCE = "scatter", "gather", "broadcast", "reduce"


def moved(kind: str, size: int, n: int) -> tuple[int, float]:
    """(ring steps, bytes each rank moves) of one collective of `size` bytes over n ranks."""
    if kind == SEND:
        return 1, float(size)
    if n <= 1:
        return 0, 0.0
    if kind == ALL_REDUCE:
        return 2 * (n - 1), 2 * (n - 1) / n * size
    if kind in (ALL_GATHER, REDUCE_SCATTER, SCATTER, GATHER):
        return n - 1, (n - 1) / n * size
    if kind in (BROADCAST, REDUCE):
        return n - 1, float(size)
    raise ValueError(f"unknown collective {kind!r}")


def collective_seconds(kind: str, size: int, n: int, link: Link) -> float:
    steps, volume = moved(kind, size, n)
    return steps * link.latency_s + volume / link.busbw


@dataclass(frozen=True)
class Call:
    kind: str
    size: int  # bytes of the whole message (an all-gather's gathered result)
    # may run beside the computation: DDP's buckets, FSDP's prefetched gathers; a collective
    # inside a layer (SyncBatchNorm's statistics) blocks it
    overlappable: bool = True


@dataclass(frozen=True)
class Traffic:
    """What one rank's optimizer step sends, in the order it is sent."""

    calls: tuple[Call, ...] = ()

    def seconds(self, n: int, link: Link, overlappable: bool) -> list[float]:
        return [
            collective_seconds(c.kind, c.size, n, link)
            for c in self.calls
            if c.overlappable == overlappable
        ]


@dataclass(frozen=True)
class StepPrediction:
    step_s: float
    compute_s: float  # one rank's computation, measured on this device
    comm_s: float  # all its communication, modelled
    exposed_s: float  # the communication the step waits for
    bubble_s: float = 0.0  # a pipeline's fill and drain


def data_parallel_step(
    compute_s: float, overlap_window_s: float, traffic: Traffic, n: int, link: Link, overlaps: bool
) -> StepPrediction:
    """ddp, fsdp: each rank computes its share (`compute_s`, measured at world size n), and
    waits for what of its communication the computation does not hide (`overlap_window_s`:
    DDP's backward, FSDP's whole step)."""
    blocking = sum(traffic.seconds(n, link, overlappable=False))
    hideable = traffic.seconds(n, link, overlappable=True)
    if overlaps and hideable:
        exposed = max(sum(hideable) - overlap_window_s, hideable[-1])
    else:
        exposed = sum(hideable)
    return StepPrediction(
        compute_s + blocking + exposed, compute_s, blocking + sum(hideable), blocking + exposed
    )


def replicated_step(
    share_s: list[float], optimizer_s: float, traffic: Traffic, n: int, link: Link, grad_accum: int
) -> StepPrediction:
    """dp, balanced_dp: one process drives n devices, each forward in turn: the micro-batch
    scattered from device 0, the parameters broadcast to every replica, the replicas run side
    by side (the forward waits for the slowest share: `share_s`, each device's forward and
    backward, measured), their outputs gathered to device 0, their gradients reduced onto it
    in the backward; then device 0's optimizer step. Nothing overlaps: DataParallel's threads
    meet after every phase. `traffic`: one forward's, every call blocking."""
    comm = sum(traffic.seconds(n, link, overlappable=False))
    compute = grad_accum * max(share_s) + optimizer_s
    return StepPrediction(
        compute + grad_accum * comm, compute, grad_accum * comm, grad_accum * comm
    )


def pipeline_step(
    stage_s: list[float],
    boundary_bytes: list[int],
    microbatches: int,
    grad_accum: int,
    optimizer_s: float,
    link: Link,
) -> StepPrediction:
    """pipeline_parallel with one process per stage: `stage_s[i]`, stage i's forward and
    backward of one pipeline micro-batch (measured); `boundary_bytes[i]`, the activations
    stage i sends to stage i+1 per micro-batch (their gradient comes back the same size);
    `optimizer_s`, the largest stage's optimizer step."""
    p, m = len(stage_s), microbatches
    if len(boundary_bytes) != p - 1:
        raise ValueError(f"{p} stages have {p - 1} boundaries, got {len(boundary_bytes)}")
    sends = [2 * collective_seconds(SEND, b, 2, link) for b in boundary_bytes] + [0.0]
    # the stage every micro-batch waits for: its computation and its sends
    k = max(range(p), key=lambda i: stage_s[i] + sends[i])
    slowest = stage_s[k] + sends[k]
    compute = grad_accum * m * stage_s[k] + optimizer_s
    exposed = grad_accum * m * sends[k]
    bubble = grad_accum * (p - 1) * slowest
    return StepPrediction(
        step_s=compute + exposed + bubble,  # = grad_accum (m + p - 1) slowest + optimizer
        compute_s=compute,
        comm_s=grad_accum * m * sum(sends),
        exposed_s=exposed,
        bubble_s=bubble,
    )
