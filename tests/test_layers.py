"""The layers below the backends import no backend: the runtime, the core, the frontend, the
instantiation and the code generator know nothing of ``einopt.backends``, at module level or inside a
function (the runtime finds the TVM backend's session hook by its entry point, installed code)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import einopt

EINOPT = Path(einopt.__file__).resolve().parent
BELOW_THE_BACKENDS = ("runtime", "core", "frontend", "instantiate", "codegen")


def imported_modules(tree: ast.Module) -> list[tuple[int, str]]:
    """Every module ``tree`` imports, anywhere in it, with its line (relative imports left out)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, node.module)]
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def names_a_backend(module: str) -> bool:
    return module == "einopt.backends" or module.startswith("einopt.backends.")


@pytest.mark.parametrize("folder", BELOW_THE_BACKENDS)
def test_no_layer_below_the_backends_imports_them(folder):
    paths = sorted((EINOPT / folder).rglob("*.py"))
    assert paths, folder
    found = [
        f"{path.relative_to(EINOPT.parent)}:{line}: {module}"
        for path in paths
        for line, module in imported_modules(ast.parse(path.read_text(), str(path)))
        if names_a_backend(module)
    ]
    assert not found, "\n".join(found)


def test_the_check_sees_a_function_local_import():
    tree = ast.parse("def f():\n    from einopt.backends.tvm import kernels\n\n\nimport einopt.backends\n")
    found = {m for _, m in imported_modules(tree) if names_a_backend(m)}
    assert found == {"einopt.backends", "einopt.backends.tvm", "einopt.backends.tvm.kernels"}
