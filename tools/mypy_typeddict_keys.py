"""A mypy plugin for `make lint`: `row.get("key")` on a TypedDict that declares no such key
is an error, as `row["key"]` already is. mypy lets any key through `.get` (typed `object`),
after the typing spec, so a misspelled key read with `.get` (`if row.get("speed_notee"):`)
would pass unseen; the report's rows (pipeline/reporting/row.py) read most of their
optional figures that way. The return type stays mypy's own (its default plugin's
callback, which this hook runs after the check). Uses mypy's internals: mypy is pinned
(pyproject.toml's dev extra); tests/unit/test_row_types.py checks it still works."""

from __future__ import annotations

from collections.abc import Callable

from mypy.plugin import MethodContext, Plugin
from mypy.plugins.default import typed_dict_get_callback
from mypy.typeops import try_getting_str_literals
from mypy.types import Type, TypedDictType, get_proper_type

# what mypy calls a TypedDict's .get (the class that defines it)
GET = "typing.Mapping.get"


def checked_get(ctx: MethodContext) -> Type:
    """Each literal key of the call that the TypedDict does not declare: mypy's own error
    for a missing key, as for `row["key"]`."""
    typed = get_proper_type(ctx.type)
    if isinstance(typed, TypedDictType) and ctx.args and len(ctx.args[0]) == 1:
        keys = try_getting_str_literals(ctx.args[0][0], ctx.arg_types[0][0]) or []
        for key in keys:
            if key not in typed.items:
                ctx.api.msg.typeddict_key_not_found(typed, key, ctx.context)
    return typed_dict_get_callback(ctx)


class TypedDictKeys(Plugin):
    def get_method_hook(self, fullname: str) -> Callable[[MethodContext], Type] | None:
        return checked_get if fullname == GET else None


def plugin(version: str) -> type[Plugin]:
    return TypedDictKeys
