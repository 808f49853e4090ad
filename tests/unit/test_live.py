"""Live progress without processes: the arithmetic (loss windows, rate, ETA), the log line,
where a bar goes, and an epoch's report points on the CPU (where a copy of `totals` arrives at
once, so every point is reported at its own step)."""

from __future__ import annotations

import io
import re

import pytest
import torch

from pipeline.memory import DevicePeak
from pipeline.numerics.totals import Sums, Totals
from pipeline.recording import live
from pipeline.recording.live import LiveProgress, LiveSettings

LINE = re.compile(
    r"^train\[ddp\] epoch (\d+)/2 step (\d+)/5: loss (\S+) (\S+) samples/s ETA (\S+) "
    r"memory cpu_0 312 MiB RSS$"
)


def test_the_loss_of_a_window_is_its_samples_mean():
    before, now = Sums(10.0, 3.0, 8.0), Sums(22.0, 5.0, 12.0)
    assert now.mean_loss_since(before) == 3.0  # 12 over 4 samples
    assert now.mean_loss_since(now) is None  # no sample in between
    assert now.mean_loss_since(Sums.none()) == pytest.approx(22 / 12)


def test_rate_and_eta_count_only_the_steps_this_process_ran():
    assert live.rate(512, 2.0) == 256.0
    assert live.rate(0, 2.0) is None and live.rate(512, 0.0) is None
    # resumed at step 10 of 100, 30 steps done in 15 s: 60 to go at 0.5 s each
    assert live.eta_s(40, 100, 10, 15.0) == 30.0
    assert live.eta_s(10, 100, 10, 0.0) is None  # nothing ran yet: no pace
    assert live.eta_s(100, 100, 0, 9.0) == 0.0


@pytest.mark.parametrize(
    "seconds, text",
    [
        (None, "?"),
        (0.0, "0:00"),
        (59.4, "0:59"),
        (61, "1:01"),
        (3599.6, "1:00:00"),
        (7322, "2:02:02"),
    ],
)
def test_clock(seconds, text):
    assert live.clock(seconds) == text


def test_the_log_line_names_epoch_step_loss_rate_eta_and_each_devices_memory():
    gpus = [DevicePeak("gpu_3", 1234.4, 2048.0), DevicePeak("gpu_5", 1198.0, 1500.0)]
    line = live.progress_line("dp", 2, 10, 80, 234, live.Reading(0.53214, 5120.4, 95.0, gpus))
    assert line == (
        "train[dp] epoch 2/10 step 80/234: loss 0.5321 5120 samples/s ETA 1:35 "
        "memory gpu_3 1234 MiB gpu_5 1198 MiB"
    )
    cpu = [DevicePeak("cpu_0", 312.2, None)]
    assert live.progress_line("single", 1, 1, 1, 5, live.Reading(None, None, None, cpu)).endswith(
        "loss ? ? samples/s ETA ? memory cpu_0 312 MiB RSS"
    )


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True

    def fileno(self) -> int:
        raise OSError("not a real terminal")


def test_a_bar_only_at_a_terminal():
    assert live.terminal_columns(io.StringIO()) is None
    assert live.terminal_columns(Tty()) == 80  # a pseudo-terminal nobody sized


class Epochs:
    """Two epochs of 5 steps as the loop runs them; step g (1-based over the run) has loss g
    on each of its 4 samples."""

    def __init__(self, settings: LiveSettings):
        self.points: list[tuple[int, dict[str, float], int]] = []
        self.progress = LiveProgress(
            settings,
            "ddp",
            2,
            8,
            lambda step, metrics, ms: self.points.append((step, metrics, ms)),
            lambda: [DevicePeak("cpu_0", 312.0, None)],
        )
        self.totals = Totals.zeros(torch.device("cpu"))

    def run(self, epoch: int, first: int = 0) -> None:
        self.progress.begin(epoch, first, 5, self.totals)
        for step in range(first, 5):
            g = epoch * 5 + step + 1
            self.totals.tensor += torch.tensor([4.0 * g, 4.0, 4.0], dtype=torch.float64)
            self.progress.step(step + 1)
        self.progress.end()
        self.totals.zero_()


def test_lines_every_step_and_mlflow_points_every_3_global_steps(capsys):
    epochs = Epochs(LiveSettings(None, log_every_s=0.0, mlflow_every_steps=3))
    epochs.run(0)
    epochs.run(1)
    lines = [LINE.match(line) for line in capsys.readouterr().out.splitlines()]
    assert all(lines)
    assert [(int(m[1]), int(m[2])) for m in lines] == [(e, s) for e in (1, 2) for s in range(1, 6)]
    # the running loss of the epoch so far: epoch 1 ends at mean(1..5), epoch 2 at mean(6..10)
    assert lines[4][3] == "3.0000" and lines[9][3] == "8.0000"
    assert lines[4][5] == "0:00" and all(m[4] != "?" for m in lines)
    # MLflow: steps 3, 6, 9 of the run; the loss of the steps since the last point, never
    # reaching back into the epoch before (step 6 is epoch 2's first)
    assert [p[0] for p in epochs.points] == [3, 6, 9]
    assert [p[1]["step_train_loss"] for p in epochs.points] == [2.0, 6.0, 8.0]
    assert all(p[1]["step_samples_per_s"] > 0 and p[2] > 0 for p in epochs.points)


def test_a_resumed_epoch_reports_from_where_it_resumed(capsys):
    epochs = Epochs(LiveSettings(None, log_every_s=0.0, mlflow_every_steps=2))
    epochs.totals.tensor += torch.tensor([4.0 * 3, 8.0, 8.0], dtype=torch.float64)  # steps 1, 2
    epochs.run(0, first=2)
    lines = [LINE.match(line) for line in capsys.readouterr().out.splitlines()]
    assert [int(m[2]) for m in lines] == [3, 4, 5]
    assert lines[-1][3] == "3.0000"  # the epoch's loss, the steps before the resume counted
    # step 4's point covers steps 3 and 4 (this process's), not the resumed totals
    assert [(p[0], p[1]["step_train_loss"]) for p in epochs.points] == [(4, 3.5)]


def test_at_a_terminal_a_bar_instead_of_lines(capsys):
    epochs = Epochs(LiveSettings(72, log_every_s=0.0, mlflow_every_steps=None))
    epochs.run(0)
    out, err = capsys.readouterr()
    assert out == "" and epochs.points == []
    # the bar's last state before it is cleared for the epoch line: step, ETA, loss, rate
    last = re.search(r"\repoch 1/2: 100%\|[^\r]*\| 5/5 \[[\d:]+<[\d:]+, [^\r]*\]\r", err)
    assert last, repr(err)
    assert re.search(r"loss 3\.0000, \d+ samples/s\]", last[0]), last[0]
    assert len(last[0]) <= 1 + 72 + 1 and "\n" not in err


def test_nothing_is_reported_when_everything_is_off(capsys):
    epochs = Epochs(LiveSettings(None, log_every_s=None, mlflow_every_steps=0))
    epochs.run(0)
    assert capsys.readouterr() == ("", "") and epochs.points == []
