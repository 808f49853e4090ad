"""The report's "On N devices (predicted)" section, from the predict stage's
predictions/predicted.json: per N, each strategy's predicted s/epoch, speedup, scaling
efficiency and the communication it waits for, with the link assumed, the band each figure
was checked to and what the model leaves out. Where this comparison holds a run on that many
devices of the same kind at the same settings, the measured epoch stands beside the
prediction, with the error: real runs check the model for everyone."""

from __future__ import annotations

import html
from typing import Any

from pipeline.reporting.table import Row

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
                and measured_at(predicted, row, int(n))
                and same_settings(predicted, configs.get(row["strategy"], {}))
            ):
                out[(n, row["strategy"])] = (p["predicted_epoch_s"], row["steady_epoch_s"])
    return out


def headline(predicted: dict[str, Any]) -> str:
    link = predicted["link"]
    s = predicted["settings"]
    return (
        f"PREDICTED, not measured: each strategy on N x {predicted['measured_on']}, linked by "
        f"{link['name']} ({link['busbw_GBps']:.3g} GB/s bus bandwidth; {link['source']}), at "
        f"width {s['model.width']}, batch {s['train.batch_size']}, {s['train.precision']}, "
        f"{s['train_samples']} samples an epoch. A rank's step is measured on this machine "
        f"by the strategy's own code at world size N (torch's fake process group); its "
        f"communication is modelled. Baseline: single on one device, "
        f"{predicted['single_step_s'] * 1000:.1f} ms a step (measured)."
    )


def footer(predicted: dict[str, Any]) -> list[str]:
    lines = [f"{name}: {why}" for name, why in predicted["not_predicted"].items()]
    bands = sorted(
        {
            row["checked"]
            for rows in predicted["by_devices"].values()
            for row in rows.values()
            if "checked" in row
        }
    )
    lines += [f"Error band: {b}" for b in bands]
    lines.append("Left out of every prediction: " + "; ".join(predicted["leaves_out"]) + ".")
    return lines


def cells(row: dict[str, Any], checked: tuple[float, float] | None) -> list[str]:
    if "not_predicted" in row:
        return [row["strategy"], row["not_predicted"], "", "", "", "", ""]
    band = f"±{row['band']:.0%}" if row.get("band") is not None else "unchecked"
    measured = "" if checked is None else f"{checked[1]:.2f} ({checked[0] / checked[1] - 1:+.0%})"
    return [
        row["strategy"],
        str(row["devices_used"]),
        f"{row['predicted_epoch_s']:.2f} {band}",
        f"{row['predicted_speedup']:.2f}x",
        f"{row['predicted_efficiency']:.0%}",
        f"{row['exposed_communication_s'] * 1000:.1f}",
        measured,
    ]


HEADER = [
    "strategy",
    "devices",
    "s/epoch (predicted)",
    "speedup (predicted)",
    "efficiency (predicted)",
    "comm waited, ms/step (predicted)",
    "measured s/epoch (error)",
]


def tables(
    predicted: dict[str, Any], rows: list[Row], configs: dict[str, dict[str, Any]]
) -> list[tuple[str, list[list[str]]]]:
    checked = comparisons(predicted, rows, configs)
    return [
        (n, [cells(row, checked.get((n, name))) for name, row in by_name.items()])
        for n, by_name in predicted["by_devices"].items()
        if by_name
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
            if "predicted_epoch_s" in row:
                prefix = f"predicted_{n}dev_{name}"
                out[f"{prefix}_epoch_s"] = row["predicted_epoch_s"]
                out[f"{prefix}_speedup"] = row["predicted_speedup"]
                out[f"{prefix}_efficiency"] = row["predicted_efficiency"]
    return out
