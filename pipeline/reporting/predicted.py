"""The report's "On N devices (predicted)" section, from the predict stages' documents
(predictions/<strategy>.json, put together by `combine`): per N, each strategy's predicted
s/epoch, speedup, scaling efficiency and the communication it waits for, with the link
assumed, the band each figure was checked to and what the model leaves out. Where this
comparison holds a run on that many devices of the same kind at the same settings, the
measured epoch stands beside the prediction, with the error: real runs check the model for
everyone. A run of N ranks sharing GPUs (devices "0,0") checks the per-device memory only: its
ranks' peaks are real, their time is turns on one device."""

from __future__ import annotations

import html
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the predict stage shows these tables too, and runs none of table.py
    from pipeline.reporting.row import Row

# the settings a prediction was made at, as the run's config.yaml names them
SETTINGS = ("model.width", "train.batch_size", "train.grad_accum", "train.precision")


def same_settings(predicted: dict[str, Any], run_config: dict[str, Any]) -> bool:
    """Whether a run trained at the settings the prediction was made for."""

    def value(key: str) -> Any:
        section, _, name = key.partition(".")
        return (run_config.get(section) or {}).get(name)

    return all(value(k) == predicted["settings"][k] for k in SETTINGS)


def measured_at(predicted: dict[str, Any], row: Row, n: int) -> bool:
    """Whether `row` ran on n devices of the kind the prediction was measured on: n processes
    on a CPU, n distinct GPUs on GPUs."""
    devices = row["devices"] or []
    if predicted["device"] == "cpu":
        return row["world_size"] == n and all(d == "cpu" for d in devices)
    return len({d for d in devices if d.startswith("cuda")}) == n


def comparisons(
    predicted: dict[str, Any], rows: list[Row], configs: dict[str, dict[str, Any]]
) -> dict[tuple[str, str], tuple[float, float]]:
    """(N, strategy) -> (predicted s/epoch, measured steady s/epoch) where a run checks it."""
    out = {}
    for n, by_name in predicted["by_devices"].items():
        for row in rows:
            p = by_name.get(row["strategy"])
            if (
                p is not None
                and "predicted_epoch_s" in p
                and row["steady_epoch_s"] is not None
                and not row.get("shared_devices")  # turns on one GPU: no speed
                and measured_at(predicted, row, int(n))
                and same_settings(predicted, configs.get(row["strategy"], {}))
            ):
                out[(n, row["strategy"])] = (p["predicted_epoch_s"], row["steady_epoch_s"])
    return out


def shared_memory_checks(
    predicted: dict[str, Any], rows: list[Row], configs: dict[str, dict[str, Any]]
) -> dict[tuple[str, str], tuple[float, float]]:
    """(N, strategy) -> (predicted per-device peak, the busiest rank's measured peak), MiB,
    where a run of N ranks sharing GPUs (devices "0,0") at the same settings checks the
    memory prediction: each rank's allocator peak is real, though their time is not. On GPUs
    only: a CPU run's figure is its process's RSS, torch itself included."""
    out: dict[tuple[str, str], tuple[float, float]] = {}
    if predicted["device"] != "cuda":
        return out
    for n, by_name in predicted["by_devices"].items():
        for row in rows:
            p = by_name.get(row["strategy"])
            if (
                p is not None
                and p.get("predicted_peak_mib")
                and row.get("shared_devices")
                and row["world_size"] == int(n)
                and row.get("peak_memory_mib")
                and same_settings(predicted, configs.get(row["strategy"], {}))
            ):
                mine = max(p["predicted_peak_mib"].values())
                out[(n, row["strategy"])] = (mine, max(row["peak_memory_mib"].values()))
    return out


def combine(docs: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The strategies' documents as one: per N, each strategy's row with its band, and its
    speedup over single's baseline (where single's document is among them, at the same
    settings); None where none of them predicts anything."""
    # the settings, device and link of the predictions (single's document holds only the
    # baseline, dp's only why not)
    first = next((d for n, d in docs.items() if n != "single" and "link" in d), None)
    if first is None:
        return None
    single = docs.get("single")
    baseline = (
        single["baseline_step_s"]
        if single is not None and single["settings"] == first["settings"]
        else None
    )
    by_devices: dict[str, dict[str, Any]] = {}
    for name, doc in docs.items():
        for n, each in doc.get("by_devices", {}).items():
            # a hybrid's layouts of n devices, a row each, named by its layout
            laid_out = {f"{name} ({k})": r for k, r in each.get("layouts", {}).items()}
            for label, row in (laid_out or {name: each}).items():
                # a layout's own band where its strategy's does not cover it (checked.py)
                row = {"band": doc["band"], "checked": doc["checked"], **row, "strategy": label}
                if baseline is not None and "predicted_step_s" in row:
                    row["predicted_speedup"] = baseline / row["predicted_step_s"]
                    row["predicted_efficiency"] = row["predicted_speedup"] / row["devices_used"]
                by_devices.setdefault(n, {})[label] = row
    return {
        **{k: first[k] for k in ("measured_on", "device", "link", "settings", "leaves_out")},
        "single_step_s": baseline,
        "by_devices": dict(sorted(by_devices.items(), key=lambda item: int(item[0]))),
        "not_predicted": {n: d["not_predicted"] for n, d in docs.items() if "not_predicted" in d},
    }


def headline(predicted: dict[str, Any]) -> str:
    link = predicted["link"]
    s = predicted["settings"]
    base = predicted["single_step_s"]
    baseline = (
        f"Baseline: single on one device, {base * 1000:.1f} ms a step (measured)."
        if base is not None
        else "No baseline: single was not measured, so no speedups."
    )
    return (
        f"PREDICTED, not measured: each strategy on N x {predicted['measured_on']}, linked by "
        f"{link['name']} ({link['busbw_GBps']:.3g} GB/s bus bandwidth; {link['source']}), at "
        f"width {s['model.width']}, batch {s['train.batch_size']}, {s['train.precision']}, "
        f"{s['train_samples']} samples an epoch. A rank's step is measured on this machine "
        f"by the strategy's own code at world size N (torch's fake process group); its "
        f"communication is modelled. {baseline}"
    )


def layout_picks(predicted: dict[str, Any]) -> list[str]:
    """Per N, each laid-out strategy's best layout by predicted time and by predicted peak
    memory per device, with the band it is shown with: a hybrid's factorization to take."""
    lines = []
    for n, by_name in predicted["by_devices"].items():
        laid: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        for label, row in by_name.items():
            name, _, layout = label.partition(" (")
            if layout and "not_predicted" not in row:
                laid.setdefault(name, []).append((layout.rstrip(")"), row))
        for name, rows in laid.items():
            timed = [
                (r["predicted_epoch_s"], lay, r) for lay, r in rows if "predicted_epoch_s" in r
            ]
            sized = [
                (max(r["predicted_peak_mib"].values()), lay)
                for lay, r in rows
                if r.get("predicted_peak_mib")
            ]
            parts = []
            if timed:
                epoch_s, lay, row = min(timed, key=lambda t: t[0])
                band = f" ±{row['band']:.0%}" if row.get("band") is not None else ", unchecked"
                parts.append(f"fastest {lay} ({epoch_s:.2f} s/epoch{band})")
            if sized:
                peak, lay = min(sized)
                parts.append(f"least memory per device {lay} ({peak:.0f} MiB)")
            if parts:
                lines.append(f"On {n} devices, {name}'s layout (predicted): " + "; ".join(parts))
    return lines


def footer(predicted: dict[str, Any]) -> list[str]:
    lines = layout_picks(predicted)
    for n, by_name in predicted["by_devices"].items():  # what N's table leaves out, and why
        skipped: dict[str, list[str]] = {}
        for name, row in by_name.items():
            if "not_predicted" in row:
                skipped.setdefault(row["not_predicted"], []).append(name)
        if by_name and not predicted_at(by_name):  # no table at all at N
            lines.append(f"On {n} devices: not predicted: " + "; ".join(sorted(skipped)))
        else:
            lines += [
                f"On {n} devices, not predicted for {', '.join(names)}: {why}"
                for why, names in skipped.items()
            ]
    lines += [f"{name}: {why}" for name, why in predicted["not_predicted"].items()]
    lines += sorted(
        {
            f"{name}: {row['time_not_predicted']}"
            for rows in predicted["by_devices"].values()
            for name, row in rows.items()
            if "time_not_predicted" in row
        }
    )
    bands = {
        name: row["checked"]
        for rows in predicted["by_devices"].values()
        for name, row in rows.items()
        if "checked" in row and "not_predicted" not in row  # a row not predicted: said above
    }
    lines += [f"Error band of {name}: {checked}" for name, checked in bands.items()]
    lines += above_linear(predicted)
    memory = memory_line(predicted)
    if memory is not None:
        lines.append(memory)
    lines.append("Left out of every prediction: " + "; ".join(predicted["leaves_out"]) + ".")
    return lines


def peak_cell(row: dict[str, Any]) -> str:
    """The busiest device's predicted training peak, MiB; "" where not predicted."""
    peaks = row.get("predicted_peak_mib")
    return f"{max(peaks.values()):.0f}" if peaks else ""


def memory_line(predicted: dict[str, Any]) -> str | None:
    """How the per-device peaks were predicted and checked; None where none was."""
    rows = [r for by_name in predicted["by_devices"].values() for r in by_name.values()]
    rows = [r for r in rows if r.get("predicted_peak_mib")]
    if not rows:
        return None
    data = rows[0]["resident_data_mib"]
    unpredicted = sorted(
        {
            r["strategy"]
            for by_name in predicted["by_devices"].values()
            for r in by_name.values()
            if "predicted_epoch_s" in r and not r.get("predicted_peak_mib")
        }
    )
    checked = (
        "On a CPU it is tensor memory (torch's MemTracker), checked rank by rank against real "
        "N-process gloo runs: within 0.3% (benchmarks/memory_check.py); a CPU run's own figure "
        "is its process's RSS, torch itself included, so none stands beside it."
        if predicted["device"] == "cpu"
        else "On a GPU it is the allocator's peak over the step; not yet checked against "
        "real ranks sharing one GPU (benchmarks/memory_check.py --device cuda has not run on "
        'one): unchecked. A run of N ranks on your GPU (devices "0,0") at these settings '
        "stands beside it, its busiest rank's peak and the error."
    )
    missing = f" Not predicted yet: {', '.join(unpredicted)}'s." if unpredicted else ""
    return (
        f"Peak MiB per device (predicted): the busiest rank's training step at its peak, "
        f"stepped by the strategy's own code at world size N (rank 0, and FSDP's last rank), "
        f"plus the {data:.0f} MiB of data every device holds (DataParallel's: device 0 "
        f"only). dp and balanced_dp: each device's share of the batch stepped as the whole "
        f"model, device 0 holding the optimizer state and the gathered outputs, the others "
        f"a replica; no real multi-GPU run has checked it: unchecked. {checked}{missing}"
    )


def cells(
    row: dict[str, Any],
    checked: tuple[float, float] | None,
    memory_checked: tuple[float, float] | None = None,
) -> list[str]:
    """A strategy's row; `checked`: (predicted, measured) s/epoch where a real run on N
    devices checks it; `memory_checked`: the same of the peak MiB, by N ranks sharing a GPU."""
    if "predicted_epoch_s" not in row:  # its memory alone (DataParallel on a CPU): footer
        devices, peak = str(row["devices_used"]), f"{peak_cell(row)} unchecked"
        return [row["strategy"], devices, "not predicted on a CPU", "", "", "", peak, ""]
    peak = peak_cell(row)
    if memory_checked is not None:
        mine, theirs = memory_checked
        peak += f" (shared-device {theirs:.0f}, {mine / theirs - 1:+.0%})"
    band = f"±{row['band']:.0%}" if row.get("band") is not None else "unchecked"
    measured = "" if checked is None else measured_cell(*checked, row.get("band"))
    speedup = row.get("predicted_speedup")
    return [
        row["strategy"],
        str(row["devices_used"]),
        f"{row['predicted_epoch_s']:.2f} {band}",
        "" if speedup is None else f"{speedup:.2f}x",
        "" if speedup is None else efficiency_cell(row["predicted_efficiency"]),
        f"{row['exposed_communication_s'] * 1000:.1f}",
        peak,
        measured,
    ]


# why a predicted efficiency above 100% (N devices more than N times faster) is no scaling:
# the speedup is single's measured step over the rank's measured one plus the modelled
# communication, which only adds time
ABOVE_LINEAR = (
    "a predicted efficiency above 100% is none the link model makes (it only adds "
    "communication): single's baseline step ran slower per sample than the rank's step at its "
    "share of the batch, both measured here; likely the machine's load or threads when one "
    "of them was timed (a busy machine's baseline inflates every speedup), else a smaller "
    "batch's caches"
)


def efficiency_cell(efficiency: float) -> str:
    """The predicted efficiency, flagged above 100% (the footer says its likely cause)."""
    return f"{efficiency:.0%}" + (" (above 100%: see below)" if efficiency > 1 else "")


def above_linear(predicted: dict[str, Any]) -> list[str]:
    """(the footer's line) the strategies whose predicted efficiency is above 100%, where N
    is, and its likely cause."""
    cells = [
        f"{name} on {n}"
        for n, by_name in predicted["by_devices"].items()
        for name, row in by_name.items()
        if row.get("predicted_efficiency") is not None and row["predicted_efficiency"] > 1
    ]
    return [f"Above 100% ({', '.join(cells)}): {ABOVE_LINEAR}."] if cells else []


def measured_cell(predicted_s: float, measured_s: float, band: float | None) -> str:
    """A real run's steady s/epoch beside the prediction: the error (predicted / measured - 1,
    as the band was checked: checked.py) and whether it fell inside the band shown."""
    error = predicted_s / measured_s - 1
    inside = band is not None and abs(error) <= band
    verdict = "" if band is None else f", {'within' if inside else 'outside'} its band"
    return f"{measured_s:.2f} ({error:+.0%}{verdict})"


HEADER = [
    "strategy",
    "devices",
    "s/epoch (predicted)",
    "speedup (predicted)",
    "efficiency (predicted)",
    "comm waited, ms/step (predicted)",
    "peak MiB per device (predicted)",
    "measured s/epoch (error)",
]


def predicted_at(by_name: dict[str, Any]) -> bool:
    return any(
        "predicted_epoch_s" in row or "predicted_peak_mib" in row for row in by_name.values()
    )


def tables(
    predicted: dict[str, Any], rows: list[Row], configs: dict[str, dict[str, Any]]
) -> list[tuple[str, list[list[str]]]]:
    """A table per N with a prediction in it (those without: `footer` says why)."""
    checked = comparisons(predicted, rows, configs)
    memory = shared_memory_checks(predicted, rows, configs)
    return [
        (
            n,
            [
                cells(row, checked.get((n, name)), memory.get((n, name)))
                for name, row in by_name.items()
                if "not_predicted" not in row  # said once below the tables (`footer`)
            ],
        )
        for n, by_name in predicted["by_devices"].items()
        if predicted_at(by_name)
    ]


def markdown(predicted: dict[str, Any], rows: list[Row], configs: dict[str, dict[str, Any]]) -> str:
    parts = ["## On N devices (predicted)\n", headline(predicted) + "\n"]
    for n, body in tables(predicted, rows, configs):
        parts.append(f"### On {n} devices (predicted)\n")
        parts.append("| " + " | ".join(HEADER) + " |")
        parts.append("|" + "---|" * len(HEADER))
        parts += ["| " + " | ".join(r) + " |" for r in body]
        parts.append("")
    parts += [f"- {line}" for line in footer(predicted)]
    return "\n".join(parts) + "\n"


def html_section(
    predicted: dict[str, Any], rows: list[Row], configs: dict[str, dict[str, Any]]
) -> str:
    out = [
        '<section class="predicted"><h2>On N devices (predicted)</h2>',
        f'<p class="legend">{html.escape(headline(predicted))}</p>',
    ]
    for n, body in tables(predicted, rows, configs):
        head = "".join(f"<th>{html.escape(h)}</th>" for h in HEADER)
        trs = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in body
        )
        out.append(
            f"<h3>On {html.escape(n)} devices (predicted)</h3><table><tr>{head}</tr>{trs}</table>"
        )
    out.append(
        '<ul class="legend">'
        + "".join(f"<li>{html.escape(line)}</li>" for line in footer(predicted))
        + "</ul></section>"
    )
    return "\n".join(out)


def mlflow_metrics(predicted: dict[str, Any]) -> dict[str, float]:
    """For the comparison run: names no one can read as a measurement."""
    out = {}
    for n, by_name in predicted["by_devices"].items():
        for name, row in by_name.items():
            # a layout's row, "hybrid (replicate 2 x channel 2)", as MLflow takes a name:
            # hybrid_replicate_2_x_channel_2 (no parentheses)
            metric_name = re.sub(r"[^\w.\-]+", "_", name).strip("_")
            prefix = f"predicted_{n}dev_{metric_name}"
            for figure in ("epoch_s", "speedup", "efficiency"):
                if f"predicted_{figure}" in row:
                    out[f"{prefix}_{figure}"] = row[f"predicted_{figure}"]
            if row.get("predicted_peak_mib"):
                out[f"{prefix}_peak_mib"] = max(row["predicted_peak_mib"].values())
    return out


def text(predicted: dict[str, Any]) -> str:
    """The terminal's view (python -m pipeline.predict): a table per N."""
    lines = [headline(predicted)]
    for n, body in tables(predicted, [], {}):
        lines.append(f"on {n} devices (predicted):")
        for cell in [["strategy", "devices", "s/epoch", "speedup", "efficiency"], *body]:
            name, devices, epoch, speedup, efficiency = cell[:5]
            lines.append(f"  {name:<18} {devices:>7} {epoch:>16} {speedup:>8} {efficiency:>10}")
    lines += footer(predicted)
    return "\n".join(lines) + "\n"
