"""Writing a file so that a crash or a kill never leaves half of it: the one way the project
writes anything another process or a later run reads (results, checkpoints, run records,
reports)."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


@contextmanager
def staged(directory: Path) -> Iterator[Path]:
    """Files that belong together (a report: its pages, tables and the plots the pages show),
    written as a set: the block writes them into a staging folder inside `directory`
    (`.staged/`, on the same filesystem), and only once every one is whole are they moved
    in, a rename each. A full disk or an error on the way removes the staging folder and
    leaves `directory`'s files as they were: never some old and some new. A full disk is
    said of the file it was writing, as it will be named."""
    stage = directory / ".staged"
    shutil.rmtree(stage, ignore_errors=True)  # a killed run's
    try:
        stage.mkdir(parents=True)
        yield stage
        for path in sorted(stage.iterdir()):
            os.replace(path, directory / path.name)
    except OSError as err:
        written = Path(err.filename) if err.filename else None
        if err.errno == errno.ENOSPC and written is not None:
            if written == stage:
                raise disk_full(directory) from err
            if stage in written.parents:
                raise disk_full(directory / written.relative_to(stage)) from err
        raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)
