"""A run's identity: what a checkpoint (and the MLflow run it feeds) must agree on to be
resumed. Everything that shapes the trajectory, and nothing else:

    params      the params that change what is computed: SHAPING, and of the strategy's own
                section the keys its FACTS name (not where the data came from, which GPUs,
                MLflow, reporting, checkpointing, launch settings or other strategies' sections)
    strategy    and its world size, where the strategy's trajectory depends on it
    hardware    the devices, their kind, count and precision, torch and CUDA (hardware.py)
    code        the source of every module of the project this run imported but those that
                only hand on its numbers (NOT_IDENTITY), as a syntax tree: comments,
                docstrings and formatting do not count
    data        the SHA-256 of the training tensors the fetch stage wrote

A checkpoint whose identity differs is not resumed; `difference` says in one line why.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import json
import os
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pipeline.run_spec import RunSpec
from pipeline.strategies.base import StrategyFacts

# Keys (or, ending in ".", sections) that shape every strategy's trajectory. The rest of
# params.yaml is the strategies' own sections (each strategy's FACTS say which of its keys
# count) and what never changes what is computed (tests/unit/test_identity.py lists it).
SHAPING = (
    "seed",
    "data.limit_train",
    "data.limit_test",
    "data.loader",
    "data.augment",
    "data.workers",
    "model.",
    "train.",
)
# Modules' digests by their source (code_digests), kept between runs beside torch.compile's
# caches (launcher.py), outside DVC's outputs; it starts over past this many entries.
DIGEST_CACHE = Path(".cache/code-digests.json")
DIGEST_CACHE_SIZE = 2000
# The project's modules a train stage runs that are not part of the identity (a name ending
# in "." is a package); every other one a run imports is. A change to one of these re-runs
# the stage (dvc.yaml), which resumes the finished run and hands on the numbers it has: so
# none of these may measure or compute a number a run reports. pipeline.results is in: it
# computes the summary's figures, and MLflow keeps the metrics.json it was given first.
# tests/unit/test_identity.py checks that every train-stage dependency is one or the other.
NOT_IDENTITY = (
    # they hand on what a run measured as it is kept on disk: to MLflow (whose system-metrics
    # sampler runs only while a run trains) and into files
    "pipeline.tracking.",
    "pipeline.files",
    # the command: reads the command line, starts the launcher or a worker, reports failures
    "pipeline.train",
    "pipeline.cli",
    "pipeline.errors",
    # when each phase was reached, for benchmarks/startup.py
    "pipeline.timeline",
    # the launcher's alone (a forked worker inherits them, but never runs them): they choose
    # the devices, the number of processes and the agent's settings, and the identity holds
    # what they chose (hardware, world size)
    "pipeline.launch.launcher",
    "pipeline.launch.devices",
    "pipeline.launch.topology",
    "pipeline.launch.one_node_rendezvous",
    # srun's task variables read as torchrun's: the identity holds what they set (world size)
    "pipeline.launch.slurm",
    # the launcher's too: it reads CUDA's libraries into the page cache, which changes when
    # a run's first epoch pays for them, never what it computes
    "pipeline.launch.machine_warmup",
)


# the hardware fields a strategy that computes the same at any world size leaves out
PER_WORLD_SIZE = ("devices", "count")


@dataclass(frozen=True)
class RunIdentity:
    params: dict[str, Any]
    strategy: str
    world_size: int | None  # None: the strategy computes the same at any world size
    code: dict[str, str]  # module file (relative to the package's parent) -> digest
    data: str
    hardware: dict[str, Any]  # pipeline/checkpoints/hardware.py

    @property
    def key(self) -> str:
        text = json.dumps(asdict(self), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_record(self) -> dict[str, Any]:
        record: dict[str, Any] = json.loads(json.dumps(asdict(self), default=str))
        return record

    def difference(self, record: dict[str, Any] | None) -> str:
        """Why a checkpoint with this recorded identity is not this run's, in a few words."""
        if not record:
            return "it was written before runs recorded their identity"
        mine = self.to_record()
        if record.get("strategy") != mine["strategy"]:
            return f"it belongs to strategy {record.get('strategy')!r}"
        if (
            None not in (record.get("world_size"), mine["world_size"])
            and record.get("world_size") != mine["world_size"]
        ):
            return (
                f"it was written by {record.get('world_size')} process(es), this run has "
                f"{mine['world_size']}"
            )
        changed = _changed(record.get("params", {}), mine["params"])
        if changed:
            return (
                "its params differ ("
                + ", ".join(
                    f"{k}: {record.get('params', {}).get(k)!r} -> {mine['params'].get(k)!r}"
                    for k in changed[:3]
                )
                + ")"
            )
        changed = _changed(record.get("code", {}), mine["code"])
        if changed:
            return f"its code differs ({', '.join(changed[:3])})"
        if record.get("data") != mine["data"]:
            return "its training data differs"
        changed = _changed(record.get("hardware", {}), mine["hardware"])
        if changed:
            old, new = record.get("hardware", {}), mine["hardware"]
            return (
                "it ran on other hardware ("
                + ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in changed[:2])
                + ")"
            )
        return "its identity differs"


def _changed(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    return sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))


def shaping_keys(facts: StrategyFacts[Any]) -> tuple[str, ...]:
    """The params that shape a run of this strategy (SHAPING's sections as prefixes)."""
    return (*SHAPING, *(f"{facts.name}.{key}" for key in facts.shaping_keys))


def shapes(key: str, keys: tuple[str, ...]) -> bool:
    """Whether `key` is one of `keys`, or inside one of its sections (those ending in ".")."""
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in keys)


def run_identity(
    spec: RunSpec[Any], world_size: int, data_file: Path, hardware: dict[str, Any]
) -> RunIdentity:
    facts = spec.facts
    keys = shaping_keys(facts)
    params = {k: v for k, v in spec.params.items() if shapes(k, keys)}
    world: int | None = world_size
    if facts.same_at_any_world_size(spec.options):
        # how many processes (and devices) split the work does not change what is computed:
        # a checkpoint resumes at another world size, resharded (a node lost under
        # dist.min_nnodes, or more GPUs)
        world = None
        hardware = {k: v for k, v in hardware.items() if k not in PER_WORLD_SIZE}
    return RunIdentity(
        json.loads(json.dumps(params, default=str)),
        facts.name,
        world,
        code_digests(),
        file_digest(data_file),
        hardware,
    )


def in_identity(module: str) -> bool:
    """Whether a module's code is part of a run's identity: every module of the project but
    NOT_IDENTITY's."""
    project = module == "pipeline" or module.startswith("pipeline.")
    return project and not any(
        (module + ".").startswith(name) if name.endswith(".") else module == name
        for name in NOT_IDENTITY
    )


def code_digests(cache: Path = DIGEST_CACHE) -> dict[str, str]:
    """Digests of the modules in the identity this process has imported. Imports of the
    project's own modules all happen at module level (tests/unit/test_layout.py), so by the
    time a run has built its strategy, every module it will run is here. Digests already
    worked out for the same source are read from `cache` (parsing every module takes a
    fifth of a second on a 2-core machine, before the first step); new ones are added to it."""
    known = read_digest_cache(cache)
    out, new = {}, {}
    for name, module in sorted(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if path and in_identity(name):
            depth = len(name.split(".")) - (Path(path).name != "__init__.py")
            root = Path(path).parents[depth]  # the directory that holds the package
            source = Path(path).read_text()
            key = source_key(source)
            if key not in known:
                known[key] = new[key] = tree_digest(source)
            out[str(Path(path).relative_to(root))] = known[key]
    if new:
        write_digest_cache(cache, known if len(known) <= DIGEST_CACHE_SIZE else new)
    return out


@functools.cache  # by the source itself: a forked worker finds its launcher's digests
def tree_digest(source: str) -> str:
    """SHA-256 of a module's syntax tree without its string statements (docstrings of
    modules, classes, functions and dataclass fields): a change to a comment, a docstring or
    the layout of the code leaves it unchanged, a change to the code does not."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            kept = [statement for statement in body if not _is_string_statement(statement)]
            node.body = kept or [ast.Pass()]  # type: ignore[attr-defined]
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()[:16]


def source_key(source: str) -> str:
    """The cache's key for a module's source: its text, and the Python whose `ast.dump` the
    digest is made from (another version may dump the same tree differently)."""
    text = f"{sys.version_info[0]}.{sys.version_info[1]}\0{source}"
    return hashlib.sha256(text.encode()).hexdigest()


def read_digest_cache(cache: Path) -> dict[str, str]:
    """The cached digests; none where the file is missing or not what `write_digest_cache`
    writes (a cache never stops a run: its digests are worked out again)."""
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):
        return {}
    valid = isinstance(known, dict) and all(isinstance(v, str) for v in known.values())
    return known if valid else {}


def write_digest_cache(cache: Path, digests: dict[str, str]) -> None:
    """Replace the cache with `digests` at once (a file of this process's own first, so two
    stages writing together leave one whole file); where it cannot be written, the next
    run works them out again."""
    with contextlib.suppress(OSError):
        cache.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache.parent, prefix=f".{cache.name}.")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(digests, f)
            os.replace(tmp, cache)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def _is_string_statement(statement: ast.stmt) -> bool:
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )


def file_digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()[:16]
