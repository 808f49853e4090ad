"""No function in pipeline/ takes more than six parameters (self and cls aside; positional,
keyword-only, *args and **kwargs all count): run state travels in objects (the run's spec,
the trainer, the session), not in long argument lists, and this keeps it so."""

import ast

from support import REPO

LIMIT = 6


def parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = node.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    count = len(names) + (args.vararg is not None) + (args.kwarg is not None)
    return count - (names[:1] in (["self"], ["cls"]))


def test_no_function_in_the_package_takes_more_than_six_parameters():
    over = [
        f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({parameters(node)})"
        for path in sorted((REPO / "pipeline").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and parameters(node) > LIMIT
    ]
    assert not over, f"more than {LIMIT} parameters: {over}"


def test_the_count_takes_every_kind_of_parameter():
    (node,) = ast.parse("def f(self, a, /, b, *c, d, **e): pass").body
    assert isinstance(node, ast.FunctionDef) and parameters(node) == 5
