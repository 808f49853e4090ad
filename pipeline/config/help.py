"""`describe`: every params.yaml key with its value, its default and its meaning, for
`python -m pipeline.<command> --help` and `--params SECTION`. The meanings are the schema's
attribute docstrings, which Python keeps only in the source: `field_docs` reads them from the
AST of the module that defines each dataclass (schema.py).
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import textwrap
import typing
from typing import Any, Optional, cast

import yaml

from pipeline.config.schema import Config, ConfigError

HELP_WIDTH = 100  # columns `describe` keeps to


def field_docs(schema: type) -> dict[str, str]:
    """A dataclass's attribute docstrings (the string statement right after a field), read
    from its source: field name -> docstring. Fields without one are left out."""
    if not (isinstance(schema, type) and dataclasses.is_dataclass(schema)):
        raise TypeError(f"{schema!r} is not a dataclass")
    return dict(_field_docs(schema))


@functools.cache
def _field_docs(schema: type) -> tuple[tuple[str, str], ...]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(schema)))
    body = next(node for node in tree.body if isinstance(node, ast.ClassDef)).body
    names = {f.name for f in dataclasses.fields(schema)}
    docs = []
    for stmt, after in zip(body, body[1:]):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and stmt.target.id in names
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs.append((stmt.target.id, inspect.cleandoc(after.value.value)))
    return tuple(docs)


def describe(section: Optional[str] = None, values: Optional[Config] = None) -> str:
    """Every params.yaml key, dotted, with its value (as YAML writes it) and its meaning,
    grouped by section; with `section` (a top-level key of params.yaml) only that one.
    The value is `values`' (the config a command would run with), followed by the schema's
    default where the two differ; without `values`, the default. An unknown section is a
    `ConfigError` listing the known ones."""
    fields = dataclasses.fields(Config)
    known = [f.name for f in fields]
    if section is not None and section not in known:
        hint = difflib.get_close_matches(section, known, n=1)
        also = f"; did you mean '{hint[0]}'?" if hint else ""
        raise ConfigError(
            f"unknown params section {section!r} (expected one of: {', '.join(known)}){also}"
        )
    types = typing.get_type_hints(Config)
    defaults = Config()
    used = defaults if values is None else values
    docs = field_docs(Config)
    chosen = [f.name for f in fields if section is None or f.name == section]
    top = [name for name in chosen if not dataclasses.is_dataclass(types[name])]
    blocks = []
    if top:
        lines = ["top-level keys:"]
        for name in top:
            default = getattr(defaults, name)
            lines += _describe_key(name, getattr(used, name), docs.get(name, ""), default)
        blocks.append("\n".join(lines))
    for name in chosen:
        if not dataclasses.is_dataclass(types[name]):
            continue
        schema = cast(type, types[name])
        title = inspect.cleandoc(schema.__doc__ or "").removeprefix(f"`{name}`: ")
        lines = _wrap(f"{name}: {title}", indent=0, hang=4)
        section_docs = field_docs(schema)
        for f in dataclasses.fields(schema):
            value = getattr(getattr(used, name), f.name)
            default = getattr(getattr(defaults, name), f.name)
            doc = section_docs.get(f.name, "")
            lines += _describe_key(f"{name}.{f.name}", value, doc, default)
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def _describe_key(key: str, value: Any, doc: str, default: Any) -> list[str]:
    differs = f"(default: {_yaml_flow(default)})" if value != default else ""
    line = f"  {key}: {_yaml_flow(value)}" + (f"  {differs}" if differs else "")
    if len(line) <= HELP_WIDTH:
        lines = [line]
    else:  # a long mapping or list: YAML's block style, one entry a line
        block = yaml.safe_dump(value, default_flow_style=False, sort_keys=False, width=10**9)
        lines = [f"  {key}:", *(f"    {row}" for row in block.splitlines())]
        lines += _wrap(differs, indent=4, hang=6)
    return lines + _wrap(doc, indent=6, hang=6)


def _yaml_flow(value: Any) -> str:
    """A value as YAML writes it on one line: null, true, 0.1, [a, b], {k: v}, '0'."""
    text: str = yaml.safe_dump([value], default_flow_style=True, sort_keys=False, width=10**9)
    return text.strip()[1:-1]


def _wrap(text: str, indent: int, hang: int) -> list[str]:
    return textwrap.wrap(
        " ".join(text.split()),
        width=HELP_WIDTH,
        initial_indent=" " * indent,
        subsequent_indent=" " * hang,
        break_long_words=False,
        break_on_hyphens=False,
    )
