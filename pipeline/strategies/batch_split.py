"""How one forward's batch is cut into per-device chunks: pure arithmetic, no devices.

Both rules return a list whose entry i is the number of samples device i gets; devices past
the end of the list get none (torch.chunk's convention). The strategies report these lists as
`batch_split`, and tests check them exhaustively without GPUs.
"""

from __future__ import annotations

from typing import Optional


def dp_split(batch: int, n_devices: int) -> list[int]:
    """The chunks nn.DataParallel scatters `batch` samples into over `n_devices` devices.

    torch.chunk semantics: every chunk holds ceil(batch / n) samples except the last, which
    holds the rest, and empty chunks are not made, so fewer than n devices may get work:
    10 over 3 -> [4, 4, 2]; 3 over 4 -> [1, 1, 1]; 6 over 4 -> [2, 2, 2]; 30 over 3 -> [10] * 3.
    """
    _check(batch, n_devices)
    chunk = -(-batch // n_devices)
    full, rest = divmod(batch, chunk)
    return [chunk] * full + ([rest] if rest else [])


def balanced_split(batch: int, n_devices: int, gpu0_bsz: Optional[int]) -> list[int]:
    """BalancedDataParallel's chunks: device 0 gets `gpu0_bsz` samples, the others share the rest.

    The rest (batch - gpu0_bsz) is divided evenly over devices 1..n-1 and the remainder goes
    one each to devices 1, 2, ..., never to device 0: 8 with gpu0_bsz 2 over 3 -> [2, 3, 3];
    9 with 2 over 3 -> [2, 4, 3]. gpu0_bsz 0 leaves device 0 only gathering: 8 with 0 over
    3 -> [0, 4, 4]. When the rest is smaller than n - 1 the last devices get nothing and are
    left off the list (5 with 4 over 3 -> [4, 1]); device 0 still gets what was asked.

    Exactly two cases do not follow the rule:
    - one device: [batch]; it is the only device that can compute, so gpu0_bsz is moot;
    - gpu0_bsz is None, or gpu0_bsz > batch (a batch too small to give device 0 that many):
      the even split of dp_split. Device 0 then gets ceil(batch / n) <= batch < gpu0_bsz, so
      with two or more devices it never gets more than gpu0_bsz, fallback or not.
    """
    _check(batch, n_devices)
    if gpu0_bsz is not None and gpu0_bsz < 0:
        raise ValueError(f"gpu0_bsz must be >= 0 or None, got {gpu0_bsz}")
    if n_devices == 1 or gpu0_bsz is None or gpu0_bsz > batch:
        return dp_split(batch, n_devices)
    share, remainder = divmod(batch - gpu0_bsz, n_devices - 1)
    others = [share + 1] * remainder + [share] * (n_devices - 1 - remainder)
    sizes = [gpu0_bsz, *others]
    while sizes[-1] == 0:  # batch >= 1, so this stops at a device that has samples
        sizes.pop()
    return sizes


def nonempty_chunks(sizes: list[int]) -> list[tuple[int, int]]:
    """(device position, chunk size) for each device that gets samples: exactly what is
    scattered. A device with 0 gets no chunk and no replica runs there (a zero-size chunk
    would still pay for a replica, a forward and a gather for nothing)."""
    return [(device, size) for device, size in enumerate(sizes) if size > 0]


def _check(batch: int, n_devices: int) -> None:
    if batch < 1 or n_devices < 1:
        raise ValueError(f"need batch >= 1 and n_devices >= 1, got {batch} and {n_devices}")
