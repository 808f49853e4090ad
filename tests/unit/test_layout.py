"""The layout's promises: no import cycles (and no imports of the project's own modules hidden
in functions to dodge one), each DVC stage depending on exactly the code it runs, the
strategy names kept in one place, and a `--help` on every command."""

from __future__ import annotations

import ast
import functools
import importlib
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml

from pipeline import stage_code, strategies
from pipeline.config import Config
from pipeline.reporting.table import WIDE_PLOTS
from pipeline.strategies.base import StrategySpec
from support import REPO, code_deps, fresh_python

PACKAGE = REPO / "pipeline"
DVC = yaml.safe_load((REPO / "dvc.yaml").read_text())
STAGE_MODULES = {  # stage -> the module its cmd runs, and what else it imports as it runs
    "fetch": ("pipeline.fetch", ()),
    # and, train@X, the module of strategy X (strategies.get)
    "train": (
        "pipeline.train",
        ("pipeline.launch.launcher", "pipeline.launch.worker", "pipeline.tracking.stage_end"),
    ),
    "predict": ("pipeline.predict", ("pipeline.scaling.stage", "pipeline.reporting.predicted")),
    "compare": ("pipeline.compare", ("pipeline.tracking.final_model",)),
}
STAGES = [
    "fetch",
    *(f"train@{name}" for name in strategies.KNOWN),
    *(f"predict@{name}" for name in strategies.KNOWN),
    "compare",
]
COMMANDS = [
    "pipeline.fetch",
    "pipeline.train",
    "pipeline.compare",
    "pipeline.publish",
    "pipeline.experiments",
    "pipeline.quickstart",
    "pipeline.stage_code",
    "pipeline.predict",
]


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(node: ast.AST) -> list[str]:
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    elif isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        return []
    return [n for n in names if n == "pipeline" or n.startswith("pipeline.")]


def project_imports(path: Path) -> tuple[set[str], list[str]]:
    """(modules of the project imported when the module is, those imported inside functions).
    Imports under `if TYPE_CHECKING:` never run, so they count as neither."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(n)
        for block in tree.body
        if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
        for n in ast.walk(block)
    }
    top = {name for node in tree.body for name in imported(node)}
    nested = [
        name
        for node in ast.walk(tree)
        if id(node) not in typing_only and node not in tree.body
        for name in imported(node)
    ]
    return top, nested


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def test_no_import_cycles():
    """Counting the imports under `if TYPE_CHECKING:` too: a circle that only the type checker
    sees is still a circle in the design."""
    known = modules()
    graph = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text())
        top = {n for block in tree.body for node in ast.walk(block) for n in imported(node)}
        top -= set(project_imports(path)[1])  # imports inside functions: the commands' own
        # `from pipeline.x import y` imports pipeline.x (and pipeline.x.y if y is a module)
        graph[name] = {m for m in top if m in known and m != name}
    order, state = [], {}

    def visit(node: str, trail: list[str]) -> None:
        if state.get(node) == "done":
            return
        assert state.get(node) != "open", "import cycle: " + " -> ".join([*trail, node])
        state[node] = "open"
        for dep in sorted(graph[node]):
            visit(dep, [*trail, node])
        state[node] = "done"
        order.append(node)

    for name in sorted(graph):
        visit(name, [])
    assert len(order) == len(graph)


def test_no_project_module_is_imported_inside_a_function():
    """Inside the library, a lazy import of the project's own code only ever hides a cycle
    (lazy imports of heavy third-party libraries, mlflow or torchvision, for start-up time
    are fine). The commands may import their work after parsing the command line, so that
    `--help` and usage errors answer without loading torch."""
    commands = {PACKAGE / f"{c.split('.')[1]}.py" for c in COMMANDS}
    hidden = {
        str(path.relative_to(REPO)): nested
        for path in PACKAGE.rglob("*.py")
        if path not in commands and (nested := project_imports(path)[1])
    }
    assert hidden == {}


def stage_body(stage: str) -> dict:
    """The stage as written: a foreach stage's template is under `do`."""
    body = DVC["stages"][stage.partition("@")[0]]
    return body.get("do", body)


def stage_deps(stage: str) -> set[str]:
    """The code deps of a stage (train@X: the foreach's for item X), as the files DVC hashes."""
    return code_deps(stage_body(stage)["deps"], stage.partition("@")[2] or None)


# Run in a fresh interpreter: what the stage's command imports, then each strategy's module
# alone, as the worker does (strategies.get), unloading what it brought before the next.
LOADED = """
import importlib, json, sys

def loaded():
    return sorted(m.__file__ for n, m in sys.modules.items()
                  if (n == "pipeline" or n.startswith("pipeline.")) and m.__file__)

for name in MODULES:
    importlib.import_module(name)
before, found = set(sys.modules), {"": loaded()}
for strategy in STRATEGIES:
    importlib.import_module("pipeline.strategies." + strategy)
    found[strategy] = loaded()
    for name in set(sys.modules) - before:
        if name.startswith("pipeline."):
            del sys.modules[name]
            parent, _, child = name.rpartition(".")
            if hasattr(sys.modules.get(parent), child):  # else `from parent import child`
                delattr(sys.modules[parent], child)  # would take it without importing it
print(json.dumps(found))
"""


@functools.cache
def imported_files(modules: tuple[str, ...], with_strategies: bool) -> dict[str, set[str]]:
    """ "" -> the project's files loaded by importing `modules`; each strategy's name -> those
    loaded by importing its module too (with_strategies)."""
    names = strategies.KNOWN if with_strategies else ()
    code = f"MODULES = {list(modules)!r}\nSTRATEGIES = {list(names)!r}\n{LOADED}"
    found: dict[str, list[str]] = fresh_python(code)
    return {key: {str(Path(f).relative_to(REPO)) for f in files} for key, files in found.items()}


@pytest.mark.parametrize("stage", STAGES)
def test_each_stage_depends_on_exactly_the_code_it_runs(stage):
    """A change to a file a stage does not run re-runs nothing; one to a file it runs re-runs
    it. For train@X: X's own modules (stage_code/X) and the code every strategy runs."""
    name, _, strategy = stage.partition("@")
    entry, extra = STAGE_MODULES[name]
    assert stage_body(stage)["cmd"].startswith(f"python -m {entry}")
    assert stage_deps(stage) == imported_files((entry, *extra), bool(strategy))[strategy]


def test_stage_code_is_what_the_registry_generates():
    """stage_code/ (each strategy's own modules, linked) and the plot's columns in dvc.yaml
    are python -m pipeline.stage_code's output for the registry as it is."""
    assert stage_code.differences() == []


def test_an_edit_to_a_strategys_module_re_runs_the_stages_that_import_it():
    """Which train stages each strategy module is a dependency of: its own, and those of the
    strategies that import it; base.py and the registry every one's."""
    users = {
        f"pipeline/strategies/{module}.py": sorted(
            name
            for name in strategies.KNOWN
            if f"pipeline/strategies/{module}.py" in stage_deps(f"train@{name}")
        )
        for module in ("fsdp", "sync_batchnorm", "dp", "gpu0_autotune", "base", "__init__")
    }
    assert users == {
        "pipeline/strategies/fsdp.py": ["fsdp"],
        # ddp's, fsdp's and horovod's sync_bn; the mesh's BatchNorm over its data ranks
        "pipeline/strategies/sync_batchnorm.py": [
            "channel_parallel",
            "ddp",
            "fsdp",
            "horovod",
            "hybrid",
        ],
        "pipeline/strategies/dp.py": ["balanced_dp", "dp"],  # balanced_dp imports its notes
        "pipeline/strategies/gpu0_autotune.py": ["balanced_dp"],
        "pipeline/strategies/base.py": sorted(strategies.KNOWN),
        "pipeline/strategies/__init__.py": sorted(strategies.KNOWN),
    }


def test_reporting_code_is_no_dependency_of_training():
    """Editing a plot must not retrain anything (the dvc status of such an edit is checked
    for real in tests/e2e/test_dvc_pipeline.py)."""
    for name in strategies.KNOWN:
        assert not any(f.startswith("pipeline/reporting/") for f in stage_deps(f"train@{name}"))
    assert not any(f.startswith("pipeline/reporting/") for f in stage_deps("fetch"))


def test_strategy_names_live_in_the_registry():
    # every per-strategy chart names exactly the strategies, each of a file compare writes
    plotted = {
        f: cols for plot in DVC["plots"] for (f, cols) in next(iter(plot.values()))["y"].items()
    }
    assert plotted == {f"reports/{name}": list(strategies.NAMES) for name in WIDE_PLOTS}
    for name in strategies.KNOWN:
        spec = strategies.get(name)  # a cast there: checked here
        module = importlib.import_module(f"pipeline.strategies.{name}")
        assert isinstance(spec, StrategySpec) and spec is module.SPEC
        assert spec.facts is module.FACTS and spec.facts.name == name
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    assert set(params["strategies"]) <= set(strategies.NAMES)  # no opt-in one by default


def test_each_strategy_declares_its_section_and_its_stage_depends_on_it_alone():
    """facts.options is the type of the Config field named after the strategy; the train
    stage's params name that section through `${item}` and no strategy's section by name, so
    train@X depends on X's section and no other strategy's (dvc status, for real, in
    tests/e2e/test_dvc_pipeline.py)."""
    fields = typing.get_type_hints(Config)
    for name in strategies.NAMES:
        assert fields[name] is strategies.get(name).facts.options, name
    train = stage_body("train")
    assert DVC["stages"]["train"]["foreach"] == "${strategies}"
    params = [p.split("#")[0].strip() for p in train["params"]]
    assert "${item}" in params
    assert not set(params) & set(strategies.NAMES)


def test_what_a_stage_shows_as_it_runs_re_runs_no_stage():
    """Progress lines and MLflow's step metrics change nothing a stage leaves behind: no
    stage's params name them, alone or through their section."""
    for stage in DVC["stages"]:
        params = [p.split("#")[0].strip() for p in stage_body(stage).get("params", [])]
        for key in ("report.log_every_s", "mlflow.log_every_steps"):
            assert not [p for p in params if key == p or key.startswith(f"{p}.")], (stage, key)


def test_config_is_a_leaf():
    """pipeline/config/ imports nothing else of the project, not even for type checking: every
    other module may import it, and it can never close a circle."""
    files = sorted((PACKAGE / "config").glob("*.py"))
    assert PACKAGE / "config" / "schema.py" in files
    outside = {
        f"{path.name} -> {name}"
        for path in files
        for node in ast.walk(ast.parse(path.read_text()))
        for name in imported(node)
        if name != "pipeline.config" and not name.startswith("pipeline.config.")
    }
    assert outside == set()


def test_no_two_modules_share_a_name():
    """One name per concept (CONTRIBUTING.md): a module's name says its one job, so no name is
    used twice anywhere in the package, a command's included."""
    names: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py":
            names.setdefault(path.stem, []).append(str(path.relative_to(REPO)))
    assert {name: paths for name, paths in names.items() if len(paths) > 1} == {}


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command):
    proc = subprocess.run(
        [sys.executable, "-m", command, "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: python -m {command}")
    assert len(proc.stdout.splitlines()) > 5  # what it does, not only the usage line


# CONTRIBUTING.md "What each layer may import", bottom up: a module imports the project only
# from its own layer and those below it. Commands (the other top-level modules) may import
# anything.
LAYERS = [
    {"config"},
    {"errors"},
    {"context", "parallel_dims", "batch_plan", "memory", "core_wait", "files", "locks"}
    | {"results", "timeline"}
    | {"did_not_fit", "interrupts"},
    {"data", "resnet"},
    {"strategies", "run_spec"},
    {"tracking"},
    {"numerics"},
    {"checkpoints"},
    {"recording"},
    {"training"},
    {"scaling"},
    {"launch"},
    {"reporting"},
]


def layer_of(module: str) -> int | None:
    part = module.split(".")[1] if "." in module else module
    return next((i for i, layer in enumerate(LAYERS) if part in layer), None)


def test_each_layer_imports_only_from_below():
    upward = []
    for name, path in modules().items():
        mine = layer_of(name)
        if mine is None:
            continue  # a command
        tree = ast.parse(path.read_text())
        for target in {n for node in ast.walk(tree) for n in imported(node)}:
            theirs = layer_of(target)
            if target != "pipeline" and (theirs is None or theirs > mine):
                upward.append(f"{name} -> {target}")
    assert upward == []


def test_the_pre_commit_hook_is_exactly_make_lint():
    config = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())
    hooks = [hook for repo in config["repos"] for hook in repo["hooks"]]
    assert [(h["entry"], h["language"], h["pass_filenames"]) for h in hooks] == [
        ("make lint", "system", False)
    ]


def test_the_docker_marker_selects_the_container_tests():
    def collected(*args: str) -> set[str]:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        return {line for line in proc.stdout.splitlines() if "::" in line}

    docker = collected("-m", "docker", "tests/e2e/test_compose_e2e.py")
    assert docker and all("test_compose_e2e.py" in t for t in docker)
    rest = collected("-m", "not docker", "tests/e2e/test_compose_e2e.py")
    assert rest == {"tests/e2e/test_compose_e2e.py::test_mlflow_image_pins_match_the_lock"}
