"""Fixtures every test folder shares, and the markers that sort tests into lanes:
tests/unit/ (pure functions and single-process tests: `make test-fast`) and tests/e2e/ (real
torchrun jobs, DVC, MLflow servers, containers), marked `e2e` by where they live."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.strategies import NAMES
from support import (
    IMAGE,
    LEARNED,
    TESTS,
    Mirror,
    dvc,
    make_project,
    run,
    serve,
    tiny_params,
    write_raw,
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(item.path).is_relative_to(TESTS / "e2e"):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def raw_dataset(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    directory = tmp_path_factory.mktemp("raw")
    return directory, write_raw(directory)


@pytest.fixture(scope="session")
def http_mirror(raw_dataset) -> Mirror:
    directory, md5 = raw_dataset
    server, url = serve(directory)
    yield Mirror(url, directory, md5)
    server.shutdown()


@pytest.fixture
def fetched_project(tmp_path, http_mirror):
    """A project copy whose fetch stage has run against the local mirror."""

    def make(**sections) -> Path:
        project = make_project(tmp_path / "project", tiny_params(http_mirror, **sections))
        run(project, "python", "-m", "pipeline.fetch")
        return project

    return make


@pytest.fixture(scope="session")
def every_strategy(tmp_path_factory, http_mirror) -> Path:
    """One tiny `dvc repro` of every strategy, which the report and the invariant tests read
    (tests that change it work on a copy)."""
    params = tiny_params(
        http_mirror,
        strategies=list(NAMES),
        report={"target_accuracy": LEARNED, "system_metrics_interval_s": 0.5},
    )
    project = make_project(tmp_path_factory.mktemp("every") / "project", params)
    dvc(project, "repro", timeout=900, PARALLEL_LAB_IMAGE=IMAGE)
    return project
