"""The comparison table's row, typed: one strategy's summary.json figures and the
cross-strategy ones (table.comparison_rows makes it; every reporting module reads it). A
TypedDict, not a dataclass: the row stays the plain dict comparison.json writes key by key,
and mypy checks every key read from it, with [] or (tools/mypy_typeddict_keys.py) .get, so a
misspelled key fails `make lint` (tests/unit/test_row_types.py holds that)."""

# no `from __future__ import annotations`: as strings, Python 3.11's TypedDict cannot see
# NotRequired, and Row.__required_keys__ (which tests/unit/test_row_types.py reads) would be
# wrong
from typing import Literal, NotRequired, Optional, TypedDict

from pipeline.results import SpeedFeatures

# pipeline.memory.run_summary's memory_kind: "gpu" (allocated by tensors), "cpu" (peak RSS
# per process), "none" (epochs recorded before memory was measured)
MemoryKind = Literal["gpu", "cpu", "none"]


class MemoryFigures(TypedDict, total=False):
    """summary.json's memory part (RunSummary.memory, as pipeline.memory.run_summary writes
    it): per device label ("gpu_0", "cpu_1", "node1_gpu_0") the training steps' peaks, and the
    same of evaluation prefixed "eval_". Results written before memory was measured lack them:
    every key may be absent."""

    memory_kind: MemoryKind
    peak_memory_mib: dict[str, float]  # device label -> MiB
    peak_reserved_mib: dict[str, float]
    mem_imbalance: Optional[float]  # max / mean of the devices' peaks
    # device 0's share of the peaks: memory.share_key names it after the memory kind, so a
    # run has one of these two, the other is absent
    gpu0_share: float
    cpu0_share: float
    # evaluation's: on the CPU the peak is results.NOT_SEPARABLE (text) and there is no share
    eval_peak_memory_mib: dict[str, float] | str
    eval_peak_reserved_mib: dict[str, float]
    eval_mem_imbalance: Optional[float]
    eval_gpu0_share: float
    # max - min over the epochs (memory.spreads): the noise of one run's memory figures
    peak_memory_spread_mib: Optional[float]
    mem_imbalance_spread: Optional[float]


class Row(MemoryFigures):
    """One strategy's row (table.comparison_rows says what each figure is)."""

    strategy: str
    world_size: int
    devices: list[str]
    n_devices: int
    shared_devices: dict[str, int]
    batch_split: list[int]
    warmup_epoch_s: Optional[float]
    steady_epoch_s: Optional[float]
    steady_samples_per_s: Optional[float]
    steady_samples_per_s_spread: Optional[float]
    steady_core_wait: Optional[float]
    core_wait: Optional[float]
    speed_features: SpeedFeatures  # RunSummary.speed_features
    steady_basis: str
    speed_note: Optional[str]
    speedup_vs_single: Optional[float]
    scaling_efficiency: Optional[float]
    above_linear: Optional[str]
    test_acc: float
    best_test_acc: float
    test_acc_by_epoch: list[float]
    acc_delta_vs_single: Optional[float]
    total_seconds: float
    epoch_to_target: Optional[int]
    time_to_target_s: Optional[float]
    mlflow_run_id: Optional[str]
    notes: list[str]
    # set by the compare stage once the answer's speed floor is known (report.py)
    speedup_within_noise: NotRequired[Optional[bool]]


# the row's own figures that are None where not measured (MLflow's child metrics are some)
OptionalFigure = Literal[
    "warmup_epoch_s",
    "steady_epoch_s",
    "steady_samples_per_s",
    "steady_samples_per_s_spread",
    "steady_core_wait",
    "core_wait",
    "speedup_vs_single",
    "scaling_efficiency",
    "acc_delta_vs_single",
    "time_to_target_s",
]
