"""python -m pipeline.stage_code [--check]: the code each DVC stage depends on, and the
parts of dvc.yaml the strategy registry decides, generated from the imports so they cannot
drift (tests/unit/test_layout.py runs --check and checks the links against what each stage
really imports).

    stage_code/<stage>/      fetch, train, predict, compare: links to every module of the
                             project the stage's command imports, directly or not (for train,
                             what every strategy runs), laid out as under pipeline/
    stage_code/<strategy>/   links to the strategy's own modules: those its module imports,
                             directly or not, that stage_code/train does not have.
                             train@<strategy> depends on both directories, so an edit to
                             fsdp.py re-runs train@fsdp alone, one to sync_batchnorm.py
                             train@ddp and train@fsdp, one to training/trainer.py every train stage
    the plots' columns       one per name in pipeline.strategies.NAMES (dvc.yaml `plots`)

A directory of links is one DVC dependency, so `dvc exp show` has a column per directory
rather than one per file. DVC cannot give each item of a `foreach` its own list of deps (no
nested interpolation: `${deps.${item}}`, treeverse/dvc#5167), but it can a path built from
the item; DVC hashes the files a directory's links point to. Run it after adding a module, a
strategy, or an import.
"""

from __future__ import annotations

import argparse
import ast
import functools
import os
import re
import sys
from pathlib import Path

from pipeline.strategies import KNOWN, NAMES

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "pipeline"
PACKAGE = "pipeline.strategies"
# each stage's command module (dvc.yaml `cmd: python -m ...`); the train stage's strategy
# modules are imported by name (strategies.get), so they are each strategy's own directory
COMMANDS = {
    "fetch": "pipeline.fetch",
    "train": "pipeline.train",
    "predict": "pipeline.predict",
    "compare": "pipeline.compare",
}
LINKS = ROOT / "stage_code"
DVC_YAML = ROOT / "dvc.yaml"
# the per-strategy charts' columns: `reports/<file>.csv: [single, dp, ...]`
PLOT_LINE = re.compile(r"^(\s+reports/\w+\.csv: )\[.*\]$", re.MULTILINE)


def module_file(module: str) -> Path:
    path = ROOT.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


@functools.cache  # each stage's closure walks the shared modules again
def runtime_imports(module: str) -> frozenset[str]:
    """The modules of the project that importing `module` runs, its commands' imports inside
    functions included (not those under `if TYPE_CHECKING:`, which never run), their parent
    packages too."""
    tree = ast.parse(module_file(module).read_text())
    typing_only = {
        id(node)
        for block in tree.body
        if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
        for node in ast.walk(block)
    }
    named: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            named |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pipeline.strategies import dp` imports the submodule dp
            named |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    found = set()
    for name in named:
        parts = name.split(".")
        found |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return frozenset(m for m in found if m.split(".")[0] == PROJECT and module_file(m).exists())


def closure(roots: set[str]) -> set[str]:
    seen: set[str] = set()
    todo = set(roots)
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo |= runtime_imports(module)
    return seen


def stage_modules() -> dict[str, tuple[str, set[str]]]:
    """directory of stage_code/ -> (the package its links mirror, the modules it links)."""
    stages = {stage: closure({command}) for stage, command in COMMANDS.items()}
    clash = set(stages) & set(KNOWN)
    if clash:
        raise SystemExit(f"a strategy may not be named after a stage: {sorted(clash)}")
    own = {name: (PACKAGE, closure({f"{PACKAGE}.{name}"}) - stages["train"]) for name in KNOWN}
    return {**{stage: (PROJECT, mods) for stage, mods in stages.items()}, **own}


def expected_links() -> dict[Path, str]:
    """stage_code/<directory>/<file> -> its relative link target."""
    links = {}
    for directory, (package, modules) in stage_modules().items():
        for module in modules:
            file = module_file(module).relative_to(ROOT)
            link = LINKS / directory / file.relative_to(*package.split("."))
            links[link] = os.path.relpath(ROOT / file, link.parent)
    return links


def current_links() -> dict[Path, str]:
    if not LINKS.exists():
        return {}
    return {p: os.readlink(p) if p.is_symlink() else "" for p in LINKS.rglob("*") if not p.is_dir()}


def expected_dvc_yaml() -> str:
    text = DVC_YAML.read_text()
    return PLOT_LINE.sub(lambda m: f"{m.group(1)}[{', '.join(NAMES)}]", text)


def differences() -> list[str]:
    expected, current = expected_links(), current_links()
    lines = [
        f"{p.relative_to(ROOT)}: {'-> ' + current[p] if p in current else 'missing'}, "
        f"expected -> {target}"
        for p, target in sorted(expected.items())
        if current.get(p) != target
    ]
    lines += [
        f"{p.relative_to(ROOT)}: not a module of its strategy" for p in current if p not in expected
    ]
    if expected_dvc_yaml() != DVC_YAML.read_text():
        lines.append(f"dvc.yaml: the plots' columns are not {', '.join(NAMES)}")
    return lines


def write() -> None:
    expected = expected_links()
    for path, target in current_links().items():
        if expected.get(path) != target:
            path.unlink()
    for path, target in expected.items():
        if not path.is_symlink():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.symlink_to(target)
    for directory in sorted(LINKS.rglob("*"), reverse=True):  # a strategy's former links
        if directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()
    DVC_YAML.write_text(expected_dvc_yaml())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.stage_code",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 listing what differs"
    )
    args = parser.parse_args(argv)
    if args.check:
        lines = differences()
        for line in lines:
            print(line, file=sys.stderr)
        if lines:
            print("run: python -m pipeline.stage_code", file=sys.stderr)
        return 1 if lines else 0
    write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
