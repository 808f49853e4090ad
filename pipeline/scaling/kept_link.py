"""This machine's own link, measured once and kept (issue 71): what gloo between two of its
processes does depends on the machine and on what was measured, not on the strategy, so each
predict stage after the first reads it back instead of starting two processes to measure it
again (a second or more of a stage that is mostly fixed cost).

A kept figure is never shown as fresh: its `source`, which every prediction shows beside its
link, says where and when it was measured (`kept_source`). A different machine, another torch
or another measurement (the world, the message size) has another key (`LinkKey`), so it is
measured again. Remove .cache/links.json to measure afresh.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipeline.scaling.links import Link

KEPT_LINKS = Path(".cache/links.json")  # git- and DVC-ignored, as all of .cache/


@dataclass(frozen=True)
class LinkKey:
    """What a measured link holds for: the machine it was measured on and how."""

    machine: str  # the host's name: another machine (or container) measures again
    cpu: str
    cores: int
    torch: str  # gloo is torch's: another version may move bytes differently
    world: int  # processes measured
    message_bytes: int  # the large all-reduce's size (the bandwidth's message)

    def text(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    def where(self) -> str:
        return f"{self.machine} ({self.cpu}, {self.cores} cores, torch {self.torch})"


def this_machine(torch_version: str, world: int, message_bytes: int) -> LinkKey:
    return LinkKey(
        machine=platform.node(),
        cpu=cpu_model(),
        cores=os.cpu_count() or 1,
        torch=torch_version,
        world=world,
        message_bytes=message_bytes,
    )


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def kept_source(source: str, measured_at: str, key: LinkKey) -> str:
    """A kept link's source as every prediction shows it: kept, from when and where."""
    return f"kept from {measured_at} on {key.where()}, not measured in this run ({source})"


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")


def kept_link(
    key: LinkKey,
    measure: Callable[[], Link],
    store: Path = KEPT_LINKS,
    now: Callable[[], str] = utc_now,
) -> Link:
    """The link kept in `store` under `key`, said to be kept; where none is, `measure()`'s,
    kept there with when it was measured and returned as measured."""
    kept = read_kept(store).get(key.text())
    if kept is not None:
        return Link(
            kept["name"],
            kept["busbw"],
            kept["latency_s"],
            kept_source(kept["source"], kept["measured_at"], key),
        )
    link = measure()
    entries = read_kept(store)  # as it is now: another stage may have kept its own since
    entries[key.text()] = {**asdict(link), "measured_at": now()}
    write_kept(store, entries)
    return link


FIELDS = {"name": str, "busbw": float, "latency_s": float, "source": str, "measured_at": str}


def read_kept(store: Path) -> dict[str, dict[str, Any]]:
    """The kept links by key; none where the file is missing or not what `write_kept` writes
    (a kept figure never stops a stage: the link is measured again)."""
    try:
        entries = json.loads(store.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(entries, dict):
        return {}
    return {
        key: entry
        for key, entry in entries.items()
        if isinstance(entry, dict) and all(isinstance(entry.get(f), t) for f, t in FIELDS.items())
    }


def write_kept(store: Path, entries: dict[str, dict[str, Any]]) -> None:
    """Replace `store` at once (a file of this process's own first, so two stages writing
    together leave one whole file); where it cannot be written, the next stage measures."""
    with contextlib.suppress(OSError):
        store.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=store.parent, prefix=f".{store.name}.")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(entries, f, indent=1)
            os.replace(tmp, store)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
