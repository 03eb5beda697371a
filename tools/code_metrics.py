"""Counters of issue 30 ("one source of truth"), measured on the working tree.

Run: `python tools/code_metrics.py` (pyright is counted separately:
`pyright --pythonpath .venv/bin/python`, settings in pyproject.toml).

- string comparisons: `==`, `!=` or `in (` beside a quoted string, in `lvflow/`;
- `_is_concrete`: occurrences in `lvflow/`;
- scipy at run time: `import scipy…` / `from scipy…` in `lvflow/` outside `if TYPE_CHECKING:`;
- `jax.config.update` calls in `lvflow/`;
- function-local imports of lvflow modules, and import cycles among module-level imports;
- imports of private lvflow modules (`lvflow._…`, or `from lvflow import _…`) in `tests/`;
- lines of `lvflow/`.
"""

from __future__ import annotations

import ast
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PKG = ROOT / "lvflow"


def _module(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _resolve(mod: str, is_pkg: bool, level: int, name: str | None) -> str:
    if level == 0:
        return name or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _imports(tree: ast.AST, mod: str, is_pkg: bool):
    """(target module, inside a function?, inside TYPE_CHECKING?) for every import."""
    out = []

    def visit(node, in_func, in_tc):
        for child in ast.iter_child_nodes(node):
            f = in_func or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            tc = in_tc or (
                isinstance(child, ast.If)
                and isinstance(child.test, (ast.Name, ast.Attribute))
                and "TYPE_CHECKING" in ast.unparse(child.test)
            )
            if isinstance(child, ast.Import):
                out.extend((a.name, f, tc) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                target = _resolve(mod, is_pkg, child.level, child.module)
                for a in child.names:
                    sub = f"{target}.{a.name}"
                    out.append((sub if sub in MODULES else target, f, tc))
            visit(child, f, tc)

    visit(tree, False, False)
    return out


FILES = sorted(PKG.rglob("*.py"))
MODULES = {_module(p) for p in FILES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index, low, stack, on, comps = {}, {}, [], set(), []
    sys.setrecursionlimit(10000)

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in graph:
        if v not in index:
            strong(v)
    return comps


def main() -> int:
    strcmp = re.compile(r"""(==|!=)\s*[rbf]?["']|["']\s*(==|!=)|\bin \(\s*["']""")
    n_str = n_conc = n_cfg = n_lines = 0
    scipy, local, graph = [], [], {}
    for p in FILES:
        text = p.read_text()
        n_lines += text.count("\n")
        n_str += sum(1 for line in text.splitlines() if strcmp.search(line))
        n_conc += text.count("_is_concrete")
        n_cfg += len(re.findall(r"jax\.config\.update\(", text))
        mod = _module(p)
        tree = ast.parse(text)
        for target, in_func, in_tc in _imports(tree, mod, p.name == "__init__.py"):
            if target.split(".")[0] == "scipy" and not in_tc:
                scipy.append(f"{p.relative_to(ROOT)}: {target}")
            if target.startswith("lvflow") and target != mod:
                if in_func:
                    local.append(f"{p.relative_to(ROOT)}: {target}")
                elif not in_tc:
                    # importing a.b.c runs a/__init__ and a/b/__init__ too
                    parts = target.split(".")
                    for i in range(1, len(parts) + 1):
                        t = ".".join(parts[:i])
                        if t in MODULES and t != mod and not mod.startswith(t + "."):
                            graph.setdefault(mod, set()).add(t)
    private = []
    for p in sorted((ROOT / "tests").rglob("*.py")):
        for line in p.read_text().splitlines():
            if re.search(r"\b(from|import)\s+lvflow\.\_|from\s+lvflow\s+import\s+_", line):
                private.append(f"{p.relative_to(ROOT)}: {line.strip()}")
    cycles = _cycles(graph)
    verbose = "-v" in sys.argv
    print(f"string-literal comparisons in lvflow/: {n_str}")
    print(f"_is_concrete in lvflow/: {n_conc}")
    print(f"scipy imported at run time by lvflow/: {len(scipy)}")
    if verbose:
        print("  " + "\n  ".join(scipy))
    print(f"jax.config.update in lvflow/: {n_cfg}")
    print(f"function-local imports of lvflow modules: {len(local)}")
    if verbose:
        print("  " + "\n  ".join(local))
    print(f"import cycles among module-level imports: {len(cycles)}")
    for c in cycles:
        print("  " + " <-> ".join(c))
    print(f"private lvflow imports in tests/: {len(private)}")
    if verbose:
        print("  " + "\n  ".join(private))
    print(f"lines in lvflow/: {n_lines}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
