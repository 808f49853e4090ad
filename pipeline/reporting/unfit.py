"""The report's "Did not fit" section: the strategies whose runs ran out of device memory
(pipeline/did_not_fit.py), listed apart from the ranked ones with the per-device batch, the
device that ran out, its peak before the failure, and the keys that would make it fit. They
rank in no objective: they have no figures."""

from __future__ import annotations

import html

from pipeline.did_not_fit import DidNotFit

HEADER = ["strategy", "per-device batch", "ran out on", "peak before (MiB)", "epoch", "to fit"]


def cells(record: DidNotFit) -> list[str]:
    peak = record.peak_mib.get(record.failed_on)
    return [
        record.strategy,
        "+".join(map(str, record.batch_split)),
        record.failed_on,
        "" if peak is None else f"{peak:.0f}",
        str(record.epoch),
        record.fix.removeprefix("to fit, "),
    ]


INTRO = (
    "Out of device memory at these settings: a result, not a crash. These strategies rank in "
    "no objective above (they have no figures); each row is where it ran out."
)


def markdown(records: list[DidNotFit]) -> str:
    if not records:
        return ""
    lines = ["## Did not fit\n", INTRO + "\n", "| " + " | ".join(HEADER) + " |"]
    lines.append("|" + "---|" * len(HEADER))
    lines += ["| " + " | ".join(cells(r)) + " |" for r in records]
    return "\n".join(lines) + "\n"


def html_section(records: list[DidNotFit]) -> str:
    if not records:
        return ""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in HEADER)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells(r)) + "</tr>" for r in records
    )
    return (
        f'<section class="unfit"><h2>Did not fit</h2><p class="legend">{html.escape(INTRO)}</p>'
        f"<table><tr>{head}</tr>{body}</table></section>"
    )
