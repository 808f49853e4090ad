"""Fixtures every test folder shares, and the markers that sort tests into lanes:
tests/unit/ (pure functions and single-process tests: `make test-fast`) and tests/e2e/ (real
torchrun jobs, DVC, MLflow servers, containers), marked `e2e` by where they live."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import TESTS, Mirror, make_project, run, serve, tiny_params, write_raw


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
