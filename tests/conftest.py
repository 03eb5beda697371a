import os
import shutil
import tempfile

# The CLI's persistent compilation cache stays off in tests: no writes to the user's cache, and no
# test's timing or compilation depends on what an earlier run left there.
os.environ.setdefault("LVFLOW_CACHE_DIR", "off")

import jax
import pytest

jax.config.update("jax_enable_x64", True)

# One persistent compilation cache per pytest run, in a fresh temporary directory shared by the
# xdist workers (the controller makes it before it starts them; they inherit the variable): a program
# that several test modules compile (after `_fresh_jax_caches_per_module` drops JAX's in-memory
# caches) or both workers compile is compiled once per run. Nothing is read from an earlier run.
# `LVFLOW_TEST_JAX_CACHE=off` runs without it. (Measured: 4 modules, -n 0, 100 → 91 CPU-s.)
_CACHE_OWNER = "LVFLOW_TEST_JAX_CACHE" not in os.environ
if _CACHE_OWNER:
    os.environ["LVFLOW_TEST_JAX_CACHE"] = tempfile.mkdtemp(prefix="lvflow-test-jax-cache-")
if os.environ["LVFLOW_TEST_JAX_CACHE"] != "off":
    jax.config.update("jax_compilation_cache_dir", os.environ["LVFLOW_TEST_JAX_CACHE"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    jax.config.update("jax_compilation_cache_max_size", 2**32)  # a size limit makes JAX lock the directory


# The test files the xdist workers are handed first, costliest first (`--no-loadscope-reorder` in
# pyproject.toml keeps this order; each file runs on one worker): a long file started last would
# leave the other worker idle at the end. Measured CPU time per file of the default suite,
# 2026-12-06; every other file follows in its collected order. Scheduling only: no test depends on it.
_COSTLIEST_FIRST = (
    "test_fit.py",
    "test_solve.py",
    "test_solve_derivatives.py",
    "test_sweep.py",
    "test_predict_cli.py",
    "test_architectures.py",
    "test_rodas5p.py",
    "test_figures_training.py",
    "test_predict.py",
    "test_drops.py",
    "test_readme.py",
    "test_flow.py",
    "test_twin.py",
    "test_nqf_horizon.py",
    "test_appendix_theory.py",
    "test_schedule.py",
    "test_examples.py",
    "test_closed_forms.py",
    "test_lv.py",
    "test_equilibrium_singular.py",
    "test_drop_table_network.py",
    "test_schedule_nqf.py",
)


def pytest_collection_modifyitems(config, items):
    """Files in the order `_COSTLIEST_FIRST`, then the rest as collected (a stable sort: the tests of
    one file keep their order)."""
    rank = {name: i for i, name in enumerate(_COSTLIEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_unconfigure(config):
    """The process that made the run's compilation cache (xdist's controller) removes it."""
    if _CACHE_OWNER:
        shutil.rmtree(os.environ.get("LVFLOW_TEST_JAX_CACHE", ""), ignore_errors=True)


# As diffrax's own test suite: an implicit broadcast between arrays of different rank is an error,
# and so is an implicit promotion between dtypes (an int array meeting a float one, float32 meeting
# float64): lvflow casts explicitly. Python scalars stay weakly typed.
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")

# jaxtyping checks every array annotation in lvflow at run time (with beartype), as diffrax's own
# test suite does: shapes and dtypes that disagree with `Float[Array, "…"]` fail the test. Only the
# array annotations are checked: a plain `bool` or `int` parameter is validated by lvflow itself,
# with the one-line `LvflowError` that tests of bad input expect. Installed for the whole session
# (not as a context manager): lvflow loads its modules lazily.
from jaxtyping import install_import_hook  # noqa: E402

install_import_hook("lvflow", "conftest.check_array_annotations")


def check_array_annotations(fn):
    """beartype on `fn`, restricted to the annotations that mention a jaxtyping array type."""
    import beartype

    def is_array_hint(hint) -> bool:  # a hint, or its source text under `from __future__ import annotations`
        text = hint if isinstance(hint, str) else repr(hint)
        return "jaxtyping" in text or any(f"{dtype}[" in text for dtype in _JAXTYPING_DTYPES)

    hints = getattr(fn, "__annotations__", None)
    if hints:
        fn.__annotations__ = {k: v for k, v in hints.items() if is_array_hint(v)}
    return beartype.beartype(fn)


_JAXTYPING_DTYPES = ("Float", "Int", "Bool", "Shaped", "Real", "Num", "Inexact", "Integer", "Complex")


import lvflow  # noqa: E402,F401  (switches on float64 too)

_pytest_approx = pytest.approx


def _holds_jax_array(value) -> bool:
    if isinstance(value, jax.Array):
        return True
    if isinstance(value, dict):
        return any(_holds_jax_array(v) for v in value.values())
    if isinstance(value, (list, tuple, set)):
        return any(_holds_jax_array(v) for v in value)
    return False


def _approx_of_host_values(expected, *args, **kwargs):
    """`pytest.approx`, refusing a JAX array as the expected value: pytest reads it through numpy's
    protocol (`.flat`), which JAX arrays do not implement (pytest ≥ 9.2 raises on it). Convert with
    `float(...)` or `np.asarray(...)` first, so a test's meaning does not depend on pytest's version."""
    if _holds_jax_array(expected):
        raise TypeError("pytest.approx got a JAX array as the expected value: convert it with float() or np.asarray()")
    return _pytest_approx(expected, *args, **kwargs)


pytest.approx = _approx_of_host_values


@pytest.fixture(autouse=True)
def _lvflow_validation_only(request):
    """A test marked `bad_input` checks lvflow's own one-line errors for input of the wrong type or
    shape; the runtime type checker would reject that input first, so it is off for the test."""
    if request.node.get_closest_marker("bad_input") is None:
        yield
        return
    import jaxtyping

    jaxtyping.config.update("jaxtyping_disable", True)
    try:
        yield
    finally:
        jaxtyping.config.update("jaxtyping_disable", False)


@pytest.fixture(autouse=True, scope="module")
def _fresh_jax_caches_per_module():
    """Drop JAX's compiled programs after each test module: one pytest process compiles a few
    thousand programs, and XLA's compiler crashed (SIGSEGV in `backend_compile_and_load`) near
    the end of a full run while every test passed alone."""
    yield
    jax.clear_caches()
