"""Writing a file so that a crash or a kill never leaves half of it: the one way the project
writes anything another process or a later run reads (results, checkpoints, run records,
reports)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Union

from pipeline.errors import disk_full, out_of_space

Content = Union[str, bytes, Callable[[Path], None]]


def atomic_write(path: Path, content: Content) -> None:
    """Write `content` (text, bytes, or a function that writes a given path, e.g.
    `lambda p: torch.save(obj, p)`) beside `path`, flush it to disk and rename it into place:
    readers see the old file or the new one, never a mix."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        if callable(content):
            content(tmp)
        else:
            tmp.write_bytes(content.encode() if isinstance(content, str) else content)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
    except BaseException as err:  # a full disk, a kill: no half-written file left behind
        full = out_of_space(err, path.parent)  # read before its space is given back
        tmp.unlink(missing_ok=True)
        if full is not None:  # whatever the writer raised (torch.save: a RuntimeError)
            raise disk_full(path) from err
        raise
    os.replace(tmp, path)
