"""Fixtures every test folder shares, and the markers that sort tests into lanes:
tests/unit/ (pure functions and single-process tests: `make test-fast`) and tests/e2e/ (real
torchrun jobs, DVC, MLflow servers, containers), marked `e2e` by where they live."""

from __future__ import annotations

from pathlib import Path

import pytest

import project_images
from pipeline.strategies import NAMES
from support import (
    IMAGE,
    LEARNED,
    PREDICT,
    TESTS,
    Mirror,
    dvc,
    make_project,
    run,
    serve,
    tiny_params,
    write_raw,
)

# e2e modules whose tests share one session fixture run on one xdist worker, so it is built
# once (`make test` runs two workers)
SHARED_GROUPS = {"test_report": "every_strategy", "test_invariants": "every_strategy"}
# The groups by their measured time on 2 cores, longest first: `make test` hands them out in
# this order (--no-loadscope-reorder), so no long group starts last and the two workers end
# together. Unit tests and unlisted modules come after, spread one test at a time. The
# longest, the container tests, goes third: its image builds (minutes when cold) start at
# collection and run in the background while the first two groups train.
LONGEST_FIRST = [
    "every_strategy",
    "test_reliability",
    "test_compose_e2e",
    "test_sharded_checkpoints",
    "test_parity",
    "test_scale_out",
    "test_dvc_pipeline",
    "test_gpu_check",
    "test_fair_race",
    "test_quickstart",
    "test_bad_files",
]


# fixtures of tests/e2e/test_compose_e2e.py that need a Docker engine or its tools
DOCKER_FIXTURES = {"tools", "engine", "standins", "images", "compose"}


def group_of(item: pytest.Item) -> str | None:
    path = Path(item.path)
    if not path.is_relative_to(TESTS / "e2e"):
        return None
    return SHARED_GROUPS.get(path.stem, path.stem)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark e2e tests, and those that need Docker (`-m "not docker"` leaves them out); keep
    each e2e module on one worker (its module-scoped fixtures, a trained reference run or a
    fetched project, are then built once), longest groups first."""
    for item in items:
        group = group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.xdist_group(group))
        if DOCKER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.docker)

    def rank(item: pytest.Item) -> int:
        group = group_of(item)
        if group in LONGEST_FIRST:
            return LONGEST_FIRST.index(group)
        return len(LONGEST_FIRST) + (group is None)

    items.sort(key=rank)  # stable: each module keeps its own order


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the project's image builds now if a selected test needs them: they run while
    other tests do, instead of in front of the first container test."""
    if session.config.option.collectonly:
        return
    if any("images" in getattr(item, "fixturenames", ()) for item in session.items):
        project_images.start_early(session.config)


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
        mlflow={"log_model": True},  # the report registers the recommended strategy's model
        **PREDICT,  # the report's section of predictions
    )
    project = make_project(tmp_path_factory.mktemp("every") / "project", params)
    dvc(project, "repro", timeout=900, PARALLEL_LAB_IMAGE=IMAGE)
    return project
