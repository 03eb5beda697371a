"""The public API: `lvflow/__init__.py` lists every name twice, in `_EXPORTS` (loaded on first use)
and in its `TYPE_CHECKING` block (for editors and type checkers); both lists must agree, and every
name must load and be the object its module defines."""

import ast
import importlib
from pathlib import Path

import lvflow


def _static_imports() -> dict[str, str]:
    tree = ast.parse(Path(lvflow.__file__).read_text())
    block = next(
        node for node in tree.body if isinstance(node, ast.If) and getattr(node.test, "id", "") == "_TYPE_CHECKING"
    )
    found = {}
    for stmt in block.body:
        assert isinstance(stmt, ast.ImportFrom) and stmt.level == 1
        for alias in stmt.names:
            assert alias.asname == alias.name  # re-exported as `name as name`
            found[alias.name] = "." + stmt.module if stmt.module else "." + alias.name
    return found


def test_static_and_lazy_exports_agree():
    assert _static_imports() == lvflow._EXPORTS
    assert lvflow.__all__ == sorted(lvflow._EXPORTS)


def test_every_export_loads_from_its_module():
    for name, module in lvflow._EXPORTS.items():
        mod = importlib.import_module(module, "lvflow")
        expected = mod if module == "." + name else getattr(mod, name)
        assert getattr(lvflow, name) is expected, name
