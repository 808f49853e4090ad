"""`auto` speed settings: on a GPU, each strategy's fastest correct ones as a GPU measurement
chose them (issue 49); on the CPU, what was measured there (eager steps). The one seam
between what params.yaml asks for and what a run applies: a strategy not measured on a GPU
yet runs eagerly there, and its notes say so, until a measurement puts it in MEASURED_ON_GPU
with its evidence: benchmarks/choose_defaults.py on a GPU prints the entries (each strategy
eager against its step captured, at world size 1, the fastest that trained alike).

Pure: tested without a GPU (tests/unit/test_speed_defaults.py).
"""

from __future__ import annotations

from dataclasses import dataclass

AUTO = "auto"


@dataclass(frozen=True)
class Chosen:
    cuda_graph: str  # train.cuda_graph's value that measured fastest and trained correctly
    evidence: str  # where, and what was measured


_H200 = "NVIDIA H200: "
_BY = " (benchmarks/choose_defaults.py, 2026-11-28)"  # its JSON: benchmarks/results/
MEASURED_ON_GPU = {
    # one H200, torch 2.11, params.yaml's settings (bf16, channels_last, width 64, batch 256),
    # world size 1, rows taking turns: nvidia-h200-choose-defaults-2026-11-28.json. The
    # stage's wall with single's step captured: 22.3 s against 33.5 s eager (issue 49's table)
    "single": Chosen("step", _H200 + "steady epoch of 20000 images 0.393 vs 0.912 s eager" + _BY),
    "dp": Chosen("step", _H200 + "steady epoch of 20000 images 0.393 vs 0.925 s eager" + _BY),
    "balanced_dp": Chosen(
        "step", _H200 + "steady epoch of 20000 images 0.393 vs 0.876 s eager" + _BY
    ),
    "ddp": Chosen(
        "none",
        _H200 + "eager, steady epoch of 20000 images 1.2 s; capturing its step failed "
        "(AcceleratorError)" + _BY,
    ),
    "fsdp": Chosen(
        "none",
        _H200 + "eager, steady epoch of 20000 images 2.06 s; it takes no CUDA graphs" + _BY,
    ),
}


def cuda_graph_choice(asked: str, strategy: str, device_type: str) -> tuple[str, list[str]]:
    """train.cuda_graph as the run applies it, and the note saying what auto chose: `asked`
    where it is not auto; auto: on a GPU the measured choice for `strategy`, else none (on
    the CPU quietly: nothing to choose there)."""
    if asked != AUTO:
        return asked, []
    if device_type != "cuda":
        return "none", []
    chosen = MEASURED_ON_GPU.get(strategy)
    if chosen is None:
        return "none", [
            f"cuda_graph auto: none for {strategy}: eager steps, the fastest correct setting "
            "of a strategy not measured on a GPU yet"
        ]
    return chosen.cuda_graph, [
        f"cuda_graph auto: {chosen.cuda_graph} for {strategy}, as measured ({chosen.evidence})"
    ]
