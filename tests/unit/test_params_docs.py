"""One home for defaults and meanings: every key of the schema (pipeline/config/schema.py) has
a docstring, params.yaml holds the schema's defaults but for the experiment's own choices, and
`--help` / `--params SECTION` print each key's value in use, its default where that differs, and
its meaning from those docstrings; `--print-config` prints what a strategy would run with."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import typing
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from pipeline import config
from pipeline.config import Config, ConfigError, describe, field_docs
from pipeline.strategies import KNOWN
from support import REPO

PARAMS = yaml.safe_load((REPO / "params.yaml").read_text())

# The keys where params.yaml is the experiment's own choice rather than the schema's default.
EXPERIMENT_CHOICES = {
    # the experiment trains every strategy; the schema's default is a single one, so that a
    # params.yaml without the key still names a valid, cheap run
    "strategies",
    # the quickstart's overrides (`make quick`); the schema's default is none
    "quick",
}


def sections(schema: type = Config, prefix: str = "") -> list[tuple[str, type]]:
    """Every dataclass reachable from `schema`, with its dotted prefix: ("", Config),
    ("train.", TrainConfig), ..."""
    found = [(prefix, schema)]
    for name, hint in typing.get_type_hints(schema).items():
        if dataclasses.is_dataclass(hint):
            found += sections(typing.cast(type, hint), f"{prefix}{name}.")
    return found


def all_keys() -> list[str]:
    return [
        f"{prefix}{f.name}"
        for prefix, schema in sections()
        for f in dataclasses.fields(schema)
        if not dataclasses.is_dataclass(typing.get_type_hints(schema)[f.name])
    ]


def get(tree: dict, key: str) -> Any:
    """The value at a dotted key of the schema (data.md5 is one value, a mapping)."""
    for part in key.split("."):
        tree = tree[part]
    return tree


def has(tree: dict, key: str) -> bool:
    try:
        get(tree, key)
    except KeyError:
        return False
    return True


def same(a: Any, b: Any) -> bool:
    """Equal as YAML values: 30 and 30.0 agree, but true and 1 do not."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return bool(a == b)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


# --- the docstrings ---------------------------------------------------------------------------


def test_every_section_of_the_schema_is_reached():
    names = {schema.__name__ for _, schema in sections()}
    assert {"Config", "TrainConfig", "SingleConfig", "DpConfig", "MlflowConfig"} <= names
    assert len(names) == 18  # Config and its 17 sections


@pytest.mark.parametrize("prefix, schema", sections(), ids=lambda x: getattr(x, "__name__", x))
def test_every_field_has_a_docstring(prefix, schema):
    docs = field_docs(schema)
    missing = [f"{prefix}{f.name}" for f in dataclasses.fields(schema) if not docs.get(f.name)]
    assert missing == []
    assert all(doc == doc.strip() and len(doc.split()) >= 2 for doc in docs.values()), docs
    assert (schema.__doc__ or "").strip(), f"{schema.__name__} has no class docstring"


def test_field_docs_reads_the_string_after_each_field():
    assert field_docs(config.TrainConfig)["epochs"] == "Passes over the training set."
    # a docstring over several lines comes back dedented
    assert "\n    " not in field_docs(config.BalancedDpConfig)["gpu0_bsz"]
    assert field_docs(config.SingleConfig) == {}


@dataclass
class _Sample:
    """A class docstring is no field's."""

    documented: int = 1
    """The first one."""
    bare: int = 2
    # a comment is no docstring
    listed: list[int] = field(default_factory=list)
    """Spans
    two lines."""


def test_field_docs_takes_only_strings_right_after_a_field():
    assert field_docs(_Sample) == {"documented": "The first one.", "listed": "Spans\ntwo lines."}
    docs = field_docs(_Sample)
    docs["documented"] = "changed"  # the caller's copy: the next call is unaffected
    assert field_docs(_Sample)["documented"] == "The first one."
    with pytest.raises(TypeError):
        field_docs(int)


def test_no_history_narration_in_the_schema():
    text = "".join(p.read_text() for p in (REPO / "pipeline" / "config").glob("*.py"))
    for phrase in ("original code", "the issue asks", "silently computed"):
        assert phrase not in text


# --- params.yaml against the schema's defaults ------------------------------------------------


def test_params_yaml_holds_the_defaults_but_for_the_experiments_choices():
    # the defaults as OmegaConf writes them (what `to_yaml` would put in a params.yaml)
    defaults = yaml.safe_load(config.to_yaml(Config()))
    config.check_keys(PARAMS, Config, source="params.yaml")  # no key the schema lacks
    section_names = [prefix.removesuffix(".") for prefix, _ in sections()[1:]]
    assert [s for s in section_names if not isinstance(PARAMS.get(s), dict)] == []
    assert [key for key in all_keys() if not has(PARAMS, key)] == []  # every key is there
    differ = {key for key in all_keys() if not same(get(PARAMS, key), get(defaults, key))}
    assert differ == EXPERIMENT_CHOICES, {k: (get(PARAMS, k), get(defaults, k)) for k in differ}


def test_the_experiments_choices_are_valid_and_differ_as_explained():
    assert PARAMS["strategies"] != Config().strategies and len(PARAMS["strategies"]) > 1
    assert PARAMS["quick"] and all("=" in item for item in PARAMS["quick"])
    cfg = config.load_config(REPO / "params.yaml", PARAMS["quick"])
    assert cfg.model.width == 8 and cfg.data.limit_train == 6000


def test_the_strategies_own_sections_are_empty_mappings_where_the_schema_has_no_fields():
    assert PARAMS["single"] == {} and PARAMS["dp"] == {}
    assert dataclasses.fields(config.SingleConfig) == () == dataclasses.fields(config.DpConfig)


# --- describe() -------------------------------------------------------------------------------


def entry(text: str, key: str) -> str:
    """The lines `describe` prints for `key`: its `key: default` line and its meaning."""
    match = re.search(rf"^  {re.escape(key)}:(.*\n(?:    .*\n)*)", text, re.MULTILINE)
    assert match, f"{key} not described in:\n{text}"
    return f"{key}:{match.group(1)}"


def meaning(text: str, key: str) -> str:
    """The meaning `describe` prints for `key`, unwrapped."""
    lines = entry(text, key).splitlines()[1:]
    return " ".join(" ".join(line.split()) for line in lines if line.startswith("      "))


def test_describe_prints_every_key_with_its_default_and_meaning():
    text = describe()
    assert entry(text, "train.epochs").startswith("train.epochs: 10\n")
    assert meaning(text, "train.epochs") == "Passes over the training set."
    for key in all_keys():
        section, _, name = key.rpartition(".")
        schema = dict((p.removesuffix("."), s) for p, s in sections())[section]
        assert meaning(text, key) == " ".join(field_docs(schema)[name].split())


@pytest.mark.parametrize(
    "key, default",
    [
        ("seed", "0"),
        ("devices", "auto"),
        ("strategies", "[single]"),
        ("quick", "[]"),
        ("data.limit_train", "null"),
        ("data.augment", "false"),
        ("ddp.sync_bn", "true"),
        ("train.lr", "0.1"),
        ("train.warmup_epochs", "1.0"),
        ("balanced_dp.gpu0_bsz", "null"),
        ("mlflow.final_sync_wait_s", "30.0"),
        ("data.mirrors", "['http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/']"),
    ],
)
def test_describe_writes_defaults_as_yaml(key, default):
    first = entry(describe(), key).splitlines()[0]
    assert first == f"{key}: {default}"
    assert same(yaml.safe_load(default), get(yaml.safe_load(config.to_yaml(Config())), key))


def test_describe_writes_a_long_mapping_one_entry_a_line():
    lines = entry(describe("data"), "data.md5").splitlines()
    assert lines[0] == "data.md5:"
    body = yaml.safe_load("\n".join(line[4:] for line in lines[1:] if not line.startswith(" " * 6)))
    assert body == config.FASHION_MNIST_MD5


def test_describe_groups_by_section_under_the_class_docstring():
    text = describe()
    assert "\ntrain: the optimisation, identical for every strategy.\n" in text
    assert text.startswith("top-level keys:\n  seed: 0\n")
    headings = [line.split(":")[0] for line in text.splitlines() if line and line[0] != " "]
    assert headings[0] == "top-level keys"
    assert headings[1:] == [
        "data",
        "model",
        "train",
        "single",
        "dp",
        "ddp",
        "fsdp",
        "horovod",
        "balanced_dp",
        "pipeline_parallel",
        "channel_parallel",
        "hybrid",
        "checkpoint",
        "dist",
        "report",
        "predict",
        "mlflow",
    ]


def test_describe_one_section():
    text = describe("train")
    assert text.startswith("train: the optimisation")
    keys = re.findall(r"^  ([\w.]+):", text, re.MULTILINE)
    assert keys == [f"train.{f.name}" for f in dataclasses.fields(config.TrainConfig)]
    assert "ddp.nproc" not in text and "seed" not in text
    assert describe("seed") == (
        "top-level keys:\n  seed: 0\n"
        "      Seeds weights, data order and augmentation, identically for every strategy (0 to "
        "4294967295).\n"
    )
    assert "No options of its own" in describe("single")
    assert describe("train") == text  # pure: same answer every time


def test_describe_refuses_an_unknown_section_naming_the_known_ones():
    with pytest.raises(ConfigError) as err:
        describe("trian")
    message = str(err.value)
    assert "'trian'" in message and "did you mean 'train'" in message
    assert "train, single, dp, ddp" in message and "\n" not in message


def test_describe_fits_a_100_column_terminal():
    assert max(len(line) for line in describe().splitlines()) <= 100


# --- the command line -------------------------------------------------------------------------


def test_train_help_prints_every_keys_value_in_use_and_meaning():
    proc = run_cli("-X", "importtime", "-m", "pipeline.train", "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m pipeline.train")
    # the whole listing, after the command's own help, with params.yaml's values
    assert proc.stdout.endswith(describe(values=config.load_config(REPO / "params.yaml")))
    assert "\n  train.epochs: 10\n      Passes over the training set.\n" in proc.stdout
    assert "--params SECTION" in proc.stdout and "--print-config" in proc.stdout
    # the experiment's own choice is what runs, the schema's default beside it
    # (eight names are past a line: one a line, as describe writes a long value)
    strategies = "".join(f"    - {name}\n" for name in PARAMS["strategies"])
    assert f"\n  strategies:\n{strategies}    (default: [single])\n" in proc.stdout
    assert "fsdp: FSDP2 (torch.distributed.fsdp.fully_shard" in proc.stdout
    # still quick: the schema's docs need no torch
    imported = re.findall(r"\|\s+([\w.]+)$", proc.stderr, re.MULTILINE)
    assert "yaml" in imported and not [m for m in imported if m.split(".")[0] == "torch"]


def test_params_prints_one_section_and_exits():
    proc = run_cli("-m", "pipeline.train", "--params", "train")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == describe("train")  # params.yaml holds train's defaults
    assert "  train.batch_size: 256\n" in proc.stdout and "ddp.nproc" not in proc.stdout


def test_help_and_params_show_the_overrides_given():
    """Overrides beside --help or --params are what would run: shown, the default beside."""
    proc = run_cli("-m", "pipeline.train", "ddp", "train.epochs=3", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "\n  train.epochs: 3  (default: 10)\n" in proc.stdout
    proc = run_cli("-m", "pipeline.train", "--params", "train", "train.lr=0.2")
    assert "\n  train.lr: 0.2  (default: 0.1)\n" in proc.stdout
    assert "\n  train.epochs: 10\n" in proc.stdout
    # an override that does not load: the defaults stand in, saying why
    proc = run_cli("-m", "pipeline.train", "--params", "train", "train.epochs=0")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("(showing the schema's defaults: train.epochs: got 0")


def test_print_config_prints_the_strategys_resolved_params_and_exits():
    proc = run_cli("-m", "pipeline.train", "fsdp", "--print-config", "fsdp.mixed_precision=bf16")
    assert proc.returncode == 0, proc.stderr
    printed = yaml.safe_load(proc.stdout)
    expected = yaml.safe_load(
        config.to_yaml(config.load_config(REPO / "params.yaml", ["fsdp.mixed_precision=bf16"]))
    )
    others = [name for name in KNOWN if name != "fsdp"]
    assert printed == {k: v for k, v in expected.items() if k not in others}
    assert printed["fsdp"]["mixed_precision"] == "bf16" and "ddp" not in printed
    # bad input is refused as when training: one line, exit 2
    proc = run_cli("-m", "pipeline.train", "ddp", "--print-config", "train.epoch=2")
    assert proc.returncode == 2 and "did you mean 'train.epochs'" in proc.stderr


def test_params_with_an_unknown_section_is_one_line_and_exit_2():
    proc = run_cli("-m", "pipeline.train", "--params", "nope")
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "'nope'" in lines[0] and "train" in lines[0] and "Traceback" not in proc.stderr
