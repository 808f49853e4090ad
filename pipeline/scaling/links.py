"""The link between devices a prediction assumes: a named preset, a number (GB/s), or the
output of nccl-tests' `all_reduce_perf` (its largest message's bus bandwidth).

Bus bandwidth is nccl-tests' figure: the bytes each rank moves per second, which makes one
number describe a ring of any size (docs: nccl-tests' PERFORMANCE.md). A collective of S bytes
over n ranks costs steps x latency + moved(S, n) / busbw (collective_seconds)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import UserError

GB = 1e9


@dataclass(frozen=True)
class Link:
    name: str
    busbw: float  # bytes per second per rank (nccl-tests' busbw)
    latency_s: float  # per ring step: what a small message costs
    source: str  # where the figure comes from, shown beside every prediction


# Typical all-reduce bus bandwidths at large messages (nccl-tests all_reduce_perf, 8 GPUs
# unless said); the latencies are the order of a small all_reduce_perf message's time per
# ring step on that link, an assumption the report states.
PRESETS = {
    "nvlink-h100": Link(
        "nvlink-h100", 370 * GB, 10e-6, "8x H100 SXM over NVLink/NVSwitch, nccl-tests busbw"
    ),
    "pcie": Link(
        "pcie", 116 * GB, 15e-6, "a pair of PCIe H100s joined by an NVLink bridge, nccl-tests busbw"
    ),
    "ib-ndr": Link("ib-ndr", 46 * GB, 25e-6, "one NDR InfiniBand NIC per node, nccl-tests busbw"),
    "ethernet-100g": Link("ethernet-100g", 12 * GB, 50e-6, "100 Gb/s Ethernet, nccl-tests busbw"),
}
DEFAULT_LATENCY_S = 20e-6  # for a link given as a number or an nccl-tests file


def check_link(text: str) -> Link | None:
    """params.yaml's predict.link: None for auto (resolved where the device is known), else
    the link; a UserError naming the key."""
    if text == "auto":
        return None
    try:
        return parse_link(text)
    except UserError as err:
        raise UserError(f"predict.link: {err}") from None


def parse_link(text: str) -> Link:
    """`text`: a preset's name, a bus bandwidth in GB/s ("25" or "25GB/s"), or the path of an
    `all_reduce_perf` output. A UserError naming what was expected otherwise."""
    if text in PRESETS:
        return PRESETS[text]
    number = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(GB/s)?\s*", text, re.IGNORECASE)
    if number:
        busbw = float(number.group(1))
        if busbw <= 0:
            raise UserError(f"--link: got {text!r}, expected a bus bandwidth above 0 GB/s")
        return Link(f"{busbw:g} GB/s", busbw * GB, DEFAULT_LATENCY_S, "given on the command line")
    path = Path(text)
    if path.is_file():
        return Link(
            path.name,
            nccl_tests_busbw(path.read_text(), path.name),
            DEFAULT_LATENCY_S,
            f"measured: nccl-tests output {path.name}",
        )
    raise UserError(
        f"--link: got {text!r}, expected one of {', '.join(PRESETS)}, a bus bandwidth in "
        "GB/s (e.g. 25), or the path of an nccl-tests all_reduce_perf output"
    )


def nccl_tests_busbw(text: str, name: str) -> float:
    """Bytes/s: the out-of-place busbw of the largest message in an all_reduce_perf table
    (columns: size count type redop root time algbw busbw #wrong, out-of-place first)."""
    rows = []
    for line in text.splitlines():
        cells = line.split()
        if (
            len(cells) >= 8
            and cells[0].isdigit()
            and cells[2] in {"float", "half", "bfloat16", "double", "int32", "int8"}
        ):
            try:
                rows.append((int(cells[0]), float(cells[7])))
            except ValueError:
                continue
    if not rows:
        raise UserError(
            f"--link {name}: no all_reduce_perf rows found; expected nccl-tests' table "
            "(size count type redop root time algbw busbw ...)"
        )
    return max(rows)[1] * GB
