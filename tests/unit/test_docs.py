"""The documentation cannot drift from what it documents: every measured table in README.md
and docs/ is what `python -m benchmarks.tables` renders from the committed JSON, every relative
link and anchor resolves, and README.md stays a first screen (at most 300 lines, its Quickstart
at most 40)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from benchmarks import tables
from benchmarks.startup import FIRST_STEP, PHASES, to_first_step
from support import REPO

README = REPO / "README.md"
PAGES = [README, REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """`text` without its fenced code blocks and inline code, where brackets are not links and
    `#` does not start a heading."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def test_the_generated_tables_are_what_their_json_gives(capsys):
    assert tables.main(["--check"]) == 0, capsys.readouterr().err


def copy_docs(tmp_path: Path) -> tuple[list[Path], Path]:
    docs = []
    for page in tables.documents():
        docs.append(tmp_path / page.name)
        shutil.copy(page, docs[-1])
    results = tmp_path / "results"
    shutil.copytree(tables.RESULTS, results)
    return docs, results


def test_the_check_finds_a_number_typed_into_a_block(tmp_path):
    docs, results = copy_docs(tmp_path)
    performance = tmp_path / "performance.md"
    original = performance.read_text()
    block = re.search(r"<!-- tables:h100 -->.*?<!-- /tables:h100 -->", original, re.S)
    assert block and "| 0.88 |" in block.group(0)
    performance.write_text(
        original.replace(block.group(0), block.group(0).replace("| 0.88 |", "| 0.80 |"))
    )
    assert tables.regenerate(docs, results, write=False) == [
        "performance.md: block h100 differs from its JSON"
    ]
    assert tables.regenerate(docs, results, write=True) == []
    assert performance.read_text() == original


def startup_json(runs: int) -> dict:
    return {
        "machine": "cpu2-test",
        "info": {"cpu": "Test CPU", "cpu_cores": 2, "torch": "2.14.1"},
        "date": "unused",
        "settings": {"runs": runs, "overrides": []},
        "median_s": {"single/fork": {phase: 0.25 for phase, _, _ in PHASES}},
        "median_fixed_s": {"single/fork": 3.0},
        "runs": {},
    }


def test_a_committed_startup_json_fills_its_block_with_the_newest(tmp_path):
    docs, results = copy_docs(tmp_path)
    for committed in results.glob("*-startup-*.json"):  # the copy's: these two decide
        committed.unlink()
    # the date decides, not the machine's name
    old, new = results / "z-startup-2026-01-02.json", results / "a-startup-2026-02-01.json"
    old.write_text(json.dumps(startup_json(runs=3)))
    new.write_text(json.dumps(startup_json(runs=9)))
    assert tables.regenerate(docs, results, write=False) == [
        "README.md: block startup differs from its JSON",  # the README shows it too
        "performance.md: block startup differs from its JSON",
    ]
    assert tables.regenerate(docs, results, write=True) == []
    text = (tmp_path / "performance.md").read_text()
    block = text.split("<!-- tables:startup -->")[1].split("<!-- /tables:startup -->")[0]
    words = " ".join(block.split())  # as wrapped
    assert "From `benchmarks/results/a-startup-2026-02-01.json`:" in words
    assert "medians of 9 runs" in words
    assert "| **fixed cost (all but training)** | **3.00** |" in block


def test_the_startup_block_shows_the_first_step_and_the_floor_under_it(tmp_path):
    docs, results = copy_docs(tmp_path)
    for committed in results.glob("*-startup-*.json"):
        committed.unlink()
    result = {
        **startup_json(runs=3),
        "median_first_step_s": {"single/fork": 2.5},
        "floor": {"median_s": {FIRST_STEP: 2.25, "wall": 4.0}, "runs": [{}, {}, {}]},
    }
    (results / "cpu2-test-startup-2026-03-04.json").write_text(json.dumps(result))
    assert tables.regenerate(docs, results, write=True) == []
    block = (tmp_path / "performance.md").read_text().split("<!-- tables:startup -->")[1]
    words = " ".join(block.split("<!-- /tables:startup -->")[0].split())
    assert "| **the command to the end of its first step** | **2.50** |" in words
    assert "median of 3: its first step **2.25 s** after the command" in words
    assert "its wall time **4.00 s**" in words


def test_the_first_step_is_every_phase_up_to_its_end():
    phases = {phase: 2.0**i for i, (phase, _, _) in enumerate(PHASES)}
    through = [phase for phase, _, _ in PHASES].index(FIRST_STEP)
    assert to_first_step(phases) == 2.0 ** (through + 1) - 1  # 1 + 2 + ... + 2**through


def test_a_stress_exit_json_fills_its_block(tmp_path):
    docs, results = copy_docs(tmp_path)
    for committed in results.glob("*-stress-exit-*.json"):  # the copy's: this one decides
        committed.unlink()
    (results / "cpu2-test-stress-exit-2026-03-04.json").write_text(
        json.dumps(
            {
                "info": {"cpu": "Test CPU", "cpu_cores": 2, "torch": "2.14.1"},
                "settings": {"runs": 3, "busy": 2, "overrides": []},
                "bad_runs": [2],
                "median_run_s": 20.04,
                "total_s": 61.2,
                "runs": [{}, {}, {}],
            }
        )
    )
    assert tables.regenerate(docs, results, write=True) == []
    text = (tmp_path / "performance.md").read_text()
    assert "| 3 | 2 | 2 | 20.0 | 61 |" in text


def headings(page: Path) -> set[str]:
    """GitHub's anchors for the page's headings: lower case, punctuation dropped, spaces as
    hyphens, a repeated one numbered."""
    found: set[str] = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        if m := re.match(r"#{1,6} (.*)", line):
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n, unique = 0, slug
            while unique in found:
                n += 1
                unique = f"{slug}-{n}"
            found.add(unique)
    return found


def test_every_relative_link_and_anchor_resolves():
    broken, checked = [], 0
    for page in PAGES:
        for target in LINK.findall(prose(page.read_text())):
            if re.match(r"[a-z]+:", target):  # http(s), mailto: not this test's business
                continue
            checked += 1
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.name}: {target}: no such file")
            elif anchor and anchor not in headings(linked):
                broken.append(f"{page.name}: {target}: no such heading")
    assert checked > 20
    assert broken == []


def test_the_readme_is_a_first_screen():
    lines = README.read_text().splitlines()
    assert len(lines) <= 300
    start = lines.index("## Quickstart")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
    assert end - start <= 40


def test_the_readme_performance_table_prefers_a_gpu_result_to_a_newer_cpu_one(tmp_path):
    docs, results = copy_docs(tmp_path)
    cpu = sorted(results.glob("cpu*-peer-*.json"))[-1]
    gpu = json.loads(cpu.read_text())
    gpu["info"]["gpu"] = "NVIDIA H200"
    (results / "nvidia-h200-peer-2026-01-01.json").write_text(json.dumps(gpu))  # older
    assert tables.regenerate(docs, results, write=False) == [
        "README.md: block performance differs from its JSON"  # docs/performance.md: the newest
    ]
    tables.regenerate(docs, results, write=True)
    readme = (tmp_path / "README.md").read_text()
    block = readme.split("<!-- tables:performance -->")[1].split("<!-- /tables:performance -->")[0]
    assert "From `benchmarks/results/nvidia-h200-peer-2026-01-01.json`: NVIDIA H200" in " ".join(
        block.split()
    )
