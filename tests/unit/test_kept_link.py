"""This machine's link, measured once and kept (pipeline/scaling/kept_link.py): a kept figure
is read back under the same machine and measurement only, and always said to be kept, with
when and where it was measured; never shown as fresh."""

from __future__ import annotations

import dataclasses

import torch

from pipeline.config import load_config
from pipeline.reporting import predicted
from pipeline.scaling import stage
from pipeline.scaling.kept_link import LinkKey, kept_link, read_kept
from pipeline.scaling.links import Link

KEY = LinkKey("host-a", "AMD EPYC", 2, "2.11.0", 2, 16 << 20)
MEASURED = Link("gloo, 2 processes on this machine", 1.5e9, 9e-4, "measured: all-reduce")
AT = "2026-12-01 23:50 UTC"


class Measure:
    """A measurement that counts how often it was taken."""

    def __init__(self, link: Link = MEASURED) -> None:
        self.link, self.times = link, 0

    def __call__(self) -> Link:
        self.times += 1
        return self.link


def test_the_key_is_the_machine_and_the_measurement():
    same = LinkKey("host-a", "AMD EPYC", 2, "2.11.0", 2, 16 << 20)
    assert same.text() == KEY.text()
    others = [
        dataclasses.replace(KEY, machine="host-b"),  # another machine
        dataclasses.replace(KEY, cores=4),
        dataclasses.replace(KEY, torch="2.14.0"),  # another gloo
        dataclasses.replace(KEY, world=4),
        dataclasses.replace(KEY, message_bytes=48 << 20),  # a larger model's gradients
    ]
    assert len({k.text() for k in [KEY, *others]}) == len(others) + 1


def test_a_link_is_measured_once_then_read_back_said_to_be_kept(tmp_path):
    store, measure = tmp_path / "links.json", Measure()
    first = kept_link(KEY, measure, store, now=lambda: AT)
    assert first == MEASURED and measure.times == 1  # fresh: shown as measured
    again = kept_link(KEY, measure, store, now=lambda: "never asked")
    assert measure.times == 1
    assert (again.name, again.busbw, again.latency_s) == (
        MEASURED.name,
        MEASURED.busbw,
        MEASURED.latency_s,
    )
    assert again.source == (
        f"kept from {AT} on host-a (AMD EPYC, 2 cores, torch 2.11.0), not measured in this "
        "run (measured: all-reduce)"
    )
    # another machine's key is measured afresh, and the first stays kept beside it
    other = dataclasses.replace(KEY, machine="host-b")
    assert kept_link(other, measure, store, now=lambda: AT) == MEASURED and measure.times == 2
    assert set(read_kept(store)) == {KEY.text(), other.text()}


def test_a_store_that_cannot_be_read_is_measured_again(tmp_path):
    store, measure = tmp_path / "links.json", Measure()
    store.write_text("{not json")
    assert kept_link(KEY, measure, store, now=lambda: AT) == MEASURED and measure.times == 1
    store.write_text('{"x": {"name": "gloo"}}')  # an entry without its figures
    assert read_kept(store) == {}


def test_the_predict_stage_keeps_this_machines_link_per_message_size(tmp_path, monkeypatch):
    """predict.link auto on a CPU: measured once, then kept; a model whose gradients pass the
    bandwidth message's size is another measurement. A link given is never kept."""
    sizes: list[int] = []

    def measured(size: int) -> Link:
        sizes.append(size)
        return MEASURED

    monkeypatch.setattr(stage, "measure_gloo_link", measured)
    store, cpu = tmp_path / "links.json", torch.device("cpu")
    small = load_config(None, ["model.width=8", "predict.link=auto"])
    assert stage.the_link(small, cpu, store) == MEASURED
    assert stage.the_link(small, cpu, store).source.startswith("kept from ")
    width_4 = load_config(None, ["model.width=4", "predict.link=auto"])  # the same message
    assert stage.the_link(width_4, cpu, store).source.startswith("kept from ")
    large = load_config(None, ["model.width=64", "predict.link=auto"])  # 44 MB of gradients
    assert stage.the_link(large, cpu, store) == MEASURED and len(sizes) == 2
    assert stage.the_link(small, cpu, None) == MEASURED and len(sizes) == 3  # not kept: fresh
    given = load_config(None, ["predict.link=12"])
    assert stage.the_link(given, cpu, store).source == "given on the command line"


def test_the_report_says_a_kept_link_is_kept(tmp_path):
    store, measure = tmp_path / "links.json", Measure()
    kept_link(KEY, measure, store, now=lambda: AT)
    link = kept_link(KEY, measure, store)
    shown = {"name": link.name, "busbw_GBps": link.busbw / 1e9, "source": link.source}
    doc = {
        "measured_on": "CPU processes (x86_64)",
        "link": shown,
        "settings": {
            "model.width": 8,
            "train.batch_size": 64,
            "train.precision": "fp32",
            "train_samples": 1280,
        },
        "single_step_s": 0.15,
    }
    assert f"kept from {AT} on host-a" in predicted.headline(doc)
