"""The IDX file format of (Fashion-)MNIST: parse and write, with errors that name the file.

Layout: two zero bytes, a type byte (0x08 = uint8), the number of dimensions, each dimension
as a big-endian uint32, then the data. Files are usually gzipped.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

import numpy as np

from pipeline.errors import UserError

UINT8 = 0x08


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """Parse an IDX(.gz) file of uint8 with `ndim` dimensions, or raise `UserError`."""
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, zlib.error) as err:
        raise UserError(f"{path.name}: not a readable gzip file ({err})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise UserError(
            f"{path.name}: bad magic number {raw[:4].hex() or 'empty'}, expected an "
            f"IDX file starting 0000{UINT8:02x}{ndim:02x}"
        )
    dtype, dims_count = raw[2], raw[3]
    if dtype != UINT8 or dims_count != ndim:
        raise UserError(
            f"{path.name}: IDX header says type 0x{dtype:02x} with {dims_count} "
            f"dimensions, expected type 0x{UINT8:02x} with {ndim}"
        )
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise UserError(f"{path.name}: truncated IDX header ({len(raw)} bytes)")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    expected = int(np.prod(shape))
    if len(raw) - header != expected:
        raise UserError(
            f"{path.name}: IDX header promises {expected} bytes of data for shape "
            f"{shape}, file holds {len(raw) - header} (truncated or corrupt)"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def idx_bytes(array: np.ndarray) -> bytes:
    """Encode a uint8 array as IDX (uncompressed)."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    head = bytes([0, 0, UINT8, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return head + array.tobytes()


def write_idx_gz(path: Path, array: np.ndarray) -> None:
    # mtime=0 keeps the bytes (and so the MD5) of a given array the same on every write.
    path.write_bytes(gzip.compress(idx_bytes(array), mtime=0))
