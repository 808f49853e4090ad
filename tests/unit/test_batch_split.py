"""The split arithmetic of `dp` and `balanced_dp` (pipeline/splits.py), exhaustively on CPU."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.strategies.batch_split import balanced_split, dp_split, nonempty_chunks


@pytest.mark.parametrize(
    "batch, n_devices, expected",
    [
        (10, 3, [4, 4, 2]),  # torch.chunk: ceil(10 / 3) = 4 per chunk, not 4+3+3
        (3, 4, [1, 1, 1]),  # empty trailing chunks are not made
        (30, 3, [10, 10, 10]),
        (6, 4, [2, 2, 2]),  # enough samples for 4 devices, yet only 3 chunks
        (7, 1, [7]),
    ],
)
def test_dp_split_examples(batch, n_devices, expected):
    assert dp_split(batch, n_devices) == expected


@pytest.mark.parametrize(
    "batch, n_devices, gpu0_bsz, expected",
    [
        (8, 3, 2, [2, 3, 3]),
        (16 // 2, 3, 2, [2, 3, 3]),  # global batch 16, grad_accum 2: each micro-batch of 8
        (9, 3, 2, [2, 4, 3]),  # the remainder goes to device 1, never to device 0
        (11, 4, 1, [1, 4, 3, 3]),
        (8, 3, 0, [0, 4, 4]),  # device 0 only gathers
        (5, 3, 4, [4, 1]),  # device 2 would get 0: left out, device 0 still gets 4
        (8, 3, 8, [8]),
        (8, 3, None, [3, 3, 2]),  # None: dp_split
        (3, 3, 5, [1, 1, 1]),  # gpu0_bsz > batch: dp_split
        (8, 1, 2, [8]),  # one device: nothing to divide (and no division by zero)
        (8, 1, 0, [8]),
    ],
)
def test_balanced_split_examples(batch, n_devices, gpu0_bsz, expected):
    assert balanced_split(batch, n_devices, gpu0_bsz) == expected


@pytest.mark.parametrize(
    "call", [lambda: dp_split(0, 2), lambda: dp_split(4, 0), lambda: balanced_split(4, 2, -1)]
)
def test_impossible_inputs_raise(call):
    with pytest.raises(ValueError):
        call()


def test_nonempty_chunks_drops_devices_without_samples():
    assert nonempty_chunks([0, 4, 4]) == [(1, 4), (2, 4)]
    assert nonempty_chunks([2, 3, 3]) == [(0, 2), (1, 3), (2, 3)]


batches = st.integers(1, 4096)
device_counts = st.integers(1, 16)


@settings(max_examples=300, deadline=None)
@given(batches, device_counts)
def test_dp_split_is_torch_chunk(batch, n_devices):
    sizes = dp_split(batch, n_devices)
    assert sizes == [len(c) for c in torch.arange(batch).chunk(n_devices)]
    assert sum(sizes) == batch and len(sizes) <= n_devices and min(sizes) > 0


@st.composite
def balanced_cases(draw):
    batch, n_devices = draw(batches), draw(device_counts)
    # a little past the batch too, to reach the gpu0_bsz > batch fallback
    gpu0_bsz = draw(st.none() | st.integers(0, batch + 16))
    return batch, n_devices, gpu0_bsz


@settings(max_examples=500, deadline=None)
@given(balanced_cases())
def test_balanced_split_properties(case):
    batch, n_devices, gpu0_bsz = case
    sizes = balanced_split(batch, n_devices, gpu0_bsz)
    assert sum(sizes) == batch and 1 <= len(sizes) <= n_devices
    scattered = [size for _, size in nonempty_chunks(sizes)]
    assert sum(scattered) == batch and min(scattered) > 0
    assert all(size > 0 for size in sizes[1:]), "only device 0 may be listed with 0"
    if n_devices >= 2 and gpu0_bsz is not None:
        assert sizes[0] <= gpu0_bsz  # fallback or not
    fallback = n_devices == 1 or gpu0_bsz is None or gpu0_bsz > batch
    if fallback:
        assert sizes == dp_split(batch, n_devices)
        return
    assert sizes[0] == gpu0_bsz  # so no remainder ever lands on device 0
    others = sizes[1:] + [0] * (n_devices - len(sizes))
    share = (batch - gpu0_bsz) // (n_devices - 1)
    assert set(others) <= {share, share + 1}
    assert others == sorted(others, reverse=True), "remainder goes to devices 1, 2, ... first"
