"""The public API: `lvflow/__init__.py` lists every name twice, in `_EXPORTS` (loaded on first use)
and in its `TYPE_CHECKING` block (for editors and type checkers); both lists must agree, and every
name must load and be the object its module defines."""

import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import lvflow


def _static_imports(module=lvflow) -> dict[str, str]:
    tree = ast.parse(Path(module.__file__).read_text())
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


@pytest.mark.smoke
def test_static_and_lazy_exports_agree():
    assert _static_imports() == lvflow._EXPORTS
    assert lvflow.__all__ == sorted(lvflow._EXPORTS)


def test_every_export_loads_from_its_module():
    for name, module in lvflow._EXPORTS.items():
        mod = importlib.import_module(module, "lvflow")
        expected = mod if module == "." + name else getattr(mod, name)
        assert getattr(lvflow, name) is expected, name


def test_the_architectures_load_on_first_use(tmp_path):
    # `lvflow.architectures` lists its built-in architectures twice too (loaded on first use: a
    # command that builds an MLP does not import the attention or CNN modules)
    arch = lvflow.architectures
    assert _static_imports(arch) == arch._EXPORTS
    assert set(arch.__all__) == {*arch._EXPORTS, *(n for n in dir(arch) if n.startswith("Abstract"))}
    for name, module in arch._EXPORTS.items():
        assert getattr(arch, name) is getattr(importlib.import_module(module, arch.__name__), name), name
    code = (
        "import sys, lvflow.architectures as a\na.MLP\nprint(sorted(m for m in sys.modules if '.architectures.' in m))"
    )
    out = _run(tmp_path, code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["['lvflow.architectures._base',", "'lvflow.architectures._mlp']"]


def _run(tmp_path, code: str, *flags: str, pythonpath: str = "") -> subprocess.CompletedProcess:
    root = str(Path(lvflow.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (pythonpath, root) if p)}
    return subprocess.run(
        [sys.executable, *flags, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )


def test_a_missing_or_broken_dependency_is_named_in_one_line(tmp_path):
    # Without site-packages (`-S`) none of lvflow's dependencies can be imported; `import lvflow`
    # itself needs none of them, and the first public name that does says which one is missing.
    code = "import lvflow\ntry:\n    lvflow.solve_lv\nexcept ImportError as e:\n    print(e.name, '|', e)"
    out = _run(tmp_path, code, "-S")
    assert out.returncode == 0, out.stderr
    name, message = out.stdout.strip().split(" | ")
    assert name in ("numpy", "jax", "equinox", "diffrax") and f"the package {name!r}" in message
    # the command: one line on stderr naming the package, exit 2
    demo = "import runpy, sys; sys.argv = ['lvflow', 'demo']; runpy.run_module('lvflow', run_name='__main__')"
    out = _run(tmp_path, demo, "-S")
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.splitlines()) == 1 and "lvflow demo: error: lvflow needs the package" in out.stderr
    # a jax that fails to import (a broken install): the error names jax, not lvflow's import hook
    (tmp_path / "fake" / "jax").mkdir(parents=True)
    (tmp_path / "fake" / "jax" / "__init__.py").write_text("raise RuntimeError('this jaxlib is broken')\n")
    out = _run(tmp_path, code, pythonpath=str(tmp_path / "fake"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("jax | ") and "this jaxlib is broken" in out.stdout
