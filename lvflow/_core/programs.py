"""Compiled programs kept across processes: `persistent_jit`, an `equinox.filter_jit` whose compiled
executable the `lvflow` command saves in its cache directory and loads in the next process, which
then neither traces nor lowers the function (JAX's persistent cache skips only XLA's compilation).

A program is kept under a key made of everything its compiled code depends on: the function's
module and name, the SHA-256 of lvflow's source files, the versions of Python, JAX, jaxlib,
equinox and numpy, JAX's options that change a traced program, `XLA_FLAGS` and `EQX_ON_ERROR`,
the device, the host's processor (its model and instruction-set flags), the pytree structure of
the arguments with their static values, and each array argument's shape, dtype and weak type.
A call whose static values cannot be named stably across processes (a function or object defined
outside lvflow, JAX, equinox and numpy, a lambda, a closure), a call under a JAX transformation
(traced arguments), with more than one device, outside the main thread, or with no directory set
runs the plain `filter_jit`. A file that is unreadable or corrupt (its checksum does not match)
is removed, and the program compiled and written again.

A program kept for the first time (after lvflow or JAX changed, or in a new directory) is compiled
by XLA even where JAX's persistent cache holds it (`_compile_anew`): that first run pays XLA's
compilation, the next ones neither it nor the tracing.

The files are pickles of JAX's serialized executables (`jax.experimental.serialize_executable`)
and of the structure of their outputs (tuples, lists, dicts and None around arrays), as trusted as
JAX's own persistent cache in the same directory: the directory must be the user's.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import hashlib
import os
import pickle
import platform
import struct
import sys
import threading
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import equinox as eqx
import jax
import jaxlib
import numpy as np
from jax.core import Tracer

from .._workflow.io import atomic_write_bytes

_F = TypeVar("_F", bound=Callable[..., Any])

#: The first bytes of a program file; the SHA-256 of the rest follows them.
MAGIC = b"lvflow-program-2\n"
#: The subdirectory of the command's cache directory that holds the programs.
SUBDIRECTORY = "programs"
#: At most this many program files are kept; the least recently used go first.
MAX_FILES = 256
#: Modules whose functions and objects are named by module and name in a key: their code is pinned
#: by lvflow's source hash or by the packages' versions.
_PINNED = ("lvflow", "jax", "jaxlib", "equinox", "numpy", "builtins")
#: JAX's options that change what a function traces or lowers to.
_OPTIONS = (
    "jax_enable_x64",
    "jax_default_matmul_precision",
    "jax_default_prng_impl",
    "jax_threefry_partitionable",
    "jax_numpy_dtype_promotion",
    "jax_numpy_rank_promotion",
    "jax_enable_checks",
    "jax_debug_nans",
    "jax_debug_infs",
    "jax_platforms",
)

#: The directory programs are kept in (`keep_programs_in`); None: none are kept.
_DIRECTORY: Path | None = None
#: Programs loaded or compiled in this process, by key.
_LOADED: dict[str, Any] = {}
#: Keys whose programs cannot be kept (`_compile_and_keep` failed): the plain `filter_jit` runs them.
_UNKEPT: set[str] = set()


class _NotKept(Exception):
    """A call whose program is not kept (the plain `filter_jit` runs)."""


def persistent_jit(fun: _F) -> _F:
    """`equinox.filter_jit(fun)`, whose compiled program is kept across processes while a directory
    is set (`keep_programs_in`; the `lvflow` command sets its cache directory). `fun` must return
    arrays in tuples, lists, dicts or None (no other node, no other leaf) for its program to be
    kept; array arguments are traced, everything else is static, as with `filter_jit`.

    **Arguments:** `fun`, a function defined at the top level of an lvflow module.

    **Returns:** the function, compiled on first use as `filter_jit` compiles it.
    """
    jitted = eqx.filter_jit(fun)

    @functools.wraps(fun)
    def call(*args):
        if _DIRECTORY is None:
            return jitted(*args)
        try:
            key, dynamic, static = _key(fun, args)
        except Exception:  # noqa: BLE001 — `_NotKept`, or arguments `_key` cannot describe: not kept
            return jitted(*args)
        if key in _UNKEPT:
            return jitted(*args)
        compiled = _LOADED.get(key)
        if compiled is None:
            compiled = _load(key, dynamic)
            if compiled is None:
                return _compile_and_keep(fun, key, dynamic, static, jitted, args)
            try:
                out = jax.block_until_ready(compiled(dynamic))
            except Exception:  # noqa: BLE001 — a program that loads but does not run: not kept
                _remove(_path(key))
                return jitted(*args)
            _LOADED[key] = compiled
            return out
        return compiled(dynamic)

    call.__wrapped_jit__ = jitted  # type: ignore[attr-defined]
    return call  # type: ignore[return-value]


@contextlib.contextmanager
def keep_programs_in(directory: str | os.PathLike | None) -> Iterator[None]:
    """Within the block, `persistent_jit` keeps its programs in `directory/programs` (created when
    first written); `None` keeps none.

    **Arguments:** `directory`, the command's cache directory, or None.
    """
    global _DIRECTORY
    before = _DIRECTORY
    _DIRECTORY = None if directory is None else Path(directory) / SUBDIRECTORY
    try:
        yield
    finally:
        _DIRECTORY = before


def _key(fun: Callable, args: tuple) -> tuple[str, Any, Any]:
    """The key of `fun(*args)`'s program, its array arguments and the rest (`eqx.partition`).

    **Raises:** `_NotKept` where the program cannot be kept (see the module's docstring)."""
    if jax.config.jax_disable_jit or jax.device_count() != 1:  # pyright: ignore[reportAttributeAccessIssue]
        raise _NotKept
    if threading.current_thread() is not threading.main_thread():  # `_compile_anew` sets JAX's options
        raise _NotKept
    dynamic, static = eqx.partition(args, eqx.is_array)
    leaves, dynamic_tree = jax.tree_util.tree_flatten(dynamic)
    static_leaves, static_tree = jax.tree_util.tree_flatten(static)
    parts = [_context(), f"{fun.__module__}.{fun.__qualname__}", _describe_tree(static_tree)]
    parts += [_describe(v) for v in static_leaves]
    parts.append(_describe_tree(dynamic_tree))
    for a in leaves:
        if isinstance(a, Tracer):
            raise _NotKept
        if isinstance(a, jax.Array):
            parts.append(f"{a.shape}{a.dtype}{'w' if a.weak_type else ''}")
        else:
            a = np.asarray(a)
            parts.append(f"{a.shape}{a.dtype}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest(), dynamic, static


def _describe_tree(tree) -> str:
    """A pytree structure in words that are the same in every process: its node types and their
    static data by module and name (`_describe`)."""
    if tree.num_nodes == 1 and tree.num_leaves == 1:
        return "*"
    data = tree.node_data()
    if data is None:
        return "None"
    kind, aux = data
    children = ",".join(_describe_tree(c) for c in tree.children())
    return f"{_name(kind)}[{_describe(aux)}]({children})"


def _describe(v: Any) -> str:
    """A static value in words that are the same in every process.

    **Raises:** `_NotKept` for a value that cannot be so named (its code is not pinned)."""
    if v is None or isinstance(v, (bool, int, float, complex, str, bytes, np.dtype, np.generic)):
        return f"{type(v).__name__}:{v!r}"
    if isinstance(v, (tuple, list, frozenset)):
        items = sorted(map(_describe, v)) if isinstance(v, frozenset) else map(_describe, v)
        return f"{type(v).__name__}({','.join(items)})"
    if isinstance(v, dict):
        return "dict(" + ",".join(f"{_describe(k)}:{_describe(x)}" for k, x in v.items()) + ")"
    if isinstance(v, type):
        return _name(v)
    if isinstance(v, enum.Enum):
        return f"{_name(type(v))}.{v.name}"
    if isinstance(v, np.ufunc):
        return f"numpy.{v.__name__}"
    if isinstance(v, (types.FunctionType, types.BuiltinFunctionType)) or hasattr(v, "__wrapped__"):
        inner = getattr(v, "__wrapped__", v)
        if getattr(inner, "__closure__", None) or not isinstance(getattr(inner, "__qualname__", None), str):
            raise _NotKept
        return _name(inner)
    if type(v).__name__ == "_Missing" and type(v).__module__.startswith("equinox"):  # a field without a value
        return "Missing"
    raise _NotKept


def _name(obj: Any) -> str:
    """`module.qualname` of a class or function whose code is pinned (`_PINNED`).

    **Raises:** `_NotKept` otherwise (user code, a lambda, a local function)."""
    module, qualname = getattr(obj, "__module__", None) or "", getattr(obj, "__qualname__", "")
    if module.split(".")[0] not in _PINNED or "<" in qualname:
        raise _NotKept
    return f"{module}.{qualname}"


@functools.cache
def _source_hash() -> str:
    """The SHA-256 of lvflow's source files (their paths and contents)."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _context() -> str:
    """What every program's code depends on beyond its arguments (see the module's docstring)."""
    device = jax.devices()[0]
    versions = (sys.version, jax.__version__, getattr(jaxlib, "__version__", ""), eqx.__version__, np.__version__)
    options = [repr(getattr(jax.config, name, None)) for name in _OPTIONS]
    env = [os.environ.get(name, "") for name in ("XLA_FLAGS", "EQX_ON_ERROR", "LIBTPU_INIT_ARGS")]
    backend = (device.platform, device.device_kind, device.client.platform_version)
    return repr((_source_hash(), versions, options, env, backend, _host()))


@functools.cache
def _host() -> str:
    """The host's processor: its architecture and, on Linux, the model and instruction-set flags
    of its first processor (`/proc/cpuinfo`). XLA compiles CPU programs for the host's
    instruction set, so a cache directory shared between machines (a network home on a cluster)
    must not hand one machine's program to another."""
    lines = []
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("model name", "flags", "Features", "CPU part")):
                    lines.append(line.strip())
                elif not line.strip() and lines:  # the first processor's block ends
                    break
    return repr((platform.machine(), lines))


@functools.cache
def _lapack_ready() -> bool:
    """Set up JAX's CPU LAPACK kernels (it imports scipy), as `jax.export` does before it runs a
    program: JAX sets them up only when it first lowers a call to them, and a loaded program that
    calls them before then (a least-squares solver's QR) crashes the process. False where JAX's
    private function for it is missing (then no such program is loaded)."""
    try:
        from jax._src.lax import linalg

        linalg.initialize_lapack()
    except Exception:  # noqa: BLE001 — another JAX: compile the program rather than risk a crash
        return False
    return True


def _path(key: str) -> Path:
    assert _DIRECTORY is not None
    return _DIRECTORY / f"{key}.bin"


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def _load(key: str, dynamic) -> Any:
    """The program of `key` from its file, loaded; None where there is none or it is corrupt (then
    the file is removed)."""
    from jax.experimental import serialize_executable

    path = _path(key)
    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        head, digest, body = data[: len(MAGIC)], data[len(MAGIC) : len(MAGIC) + 32], data[len(MAGIC) + 32 :]
        if head != MAGIC or hashlib.sha256(body).digest() != digest:
            raise ValueError("corrupt")
        (n_key,) = struct.unpack_from("<I", body)
        stored_key, (n_tree,) = body[4 : 4 + n_key].decode(), struct.unpack_from("<I", body, 4 + n_key)
        if stored_key != key:
            raise ValueError("another program")
        in_tree = jax.tree_util.tree_structure(((dynamic,), {}))
        out_tree = pickle.loads(body[8 + n_key : 8 + n_key + n_tree])
        (lapack,) = struct.unpack_from("<B", body, 8 + n_key + n_tree)
        if not _plain_tree(out_tree) or lapack > 1:
            raise ValueError("another output")
        if lapack and not _lapack_ready():
            raise ValueError("LAPACK not set up")
        compiled = serialize_executable.deserialize_and_load(body[9 + n_key + n_tree :], in_tree, out_tree)
        with contextlib.suppress(OSError):  # (a read-only directory)
            os.utime(path)  # recently used
        return compiled
    except Exception:  # noqa: BLE001 — a file that cannot be read back is compiled again
        _remove(path)
        return None


def _compile_and_keep(fun, key, dynamic, static, jitted, args):
    """Compile `fun` for these arguments, keep the program in its file (when it can be kept) and
    run it; where it cannot be compiled this way, `jitted(*args)`."""
    from jax.experimental import serialize_executable

    def program(dynamic):
        out = fun(*eqx.combine(dynamic, static))
        leaves, tree = jax.tree_util.tree_flatten(out)
        if not (_plain_tree(tree) and all(isinstance(a, jax.Array) for a in leaves)):
            raise _NotKept
        return out

    program.__name__ = program.__qualname__ = fun.__name__
    try:
        compiled = _compile_anew(jax.jit(program).lower(dynamic))
        body, _, out_tree = serialize_executable.serialize(compiled)
    except Exception:  # noqa: BLE001 — outputs not kept (`_NotKept`), a host callback (not serializable), …
        _UNKEPT.add(key)
        return jitted(*args)
    _LOADED[key] = compiled
    encoded, tree = key.encode(), pickle.dumps(out_tree)
    try:  # whether the program calls JAX's LAPACK kernels (`_lapack_ready`)
        lapack = "lapack_" in (compiled.as_text() or "lapack_")
    except Exception:  # noqa: BLE001 — its text unknown: set them up on loading, to be safe
        lapack = True
    payload = struct.pack("<I", len(encoded)) + encoded + struct.pack("<I", len(tree)) + tree
    payload += struct.pack("<B", lapack) + body
    try:
        assert _DIRECTORY is not None
        _DIRECTORY.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(_path(key), MAGIC + hashlib.sha256(payload).digest() + payload, name="program cache")
        _evict(_DIRECTORY)
    except Exception:  # noqa: BLE001 — an unwritable cache costs speed, not correctness
        pass
    return compiled(dynamic)


def _plain_tree(tree) -> bool:
    """Whether a pytree structure has only tuples, lists, dicts and None for nodes (its pickle
    loads back as the same structure; an equinox module's may not: its static data)."""
    if tree.num_nodes == 1 and tree.num_leaves == 1:
        return True
    data = tree.node_data()
    if data is None or data[0] not in (tuple, list, dict, type(None)):
        return False
    return all(_plain_tree(c) for c in tree.children())


def _compile_anew(lowered):
    """`lowered.compile()` by XLA, not read from JAX's persistent cache: an executable JAX read from
    its cache serializes without its compiled functions (on the CPU, jax 0.10: loaded again it fails
    with `NOT_FOUND: Function … not found`). JAX's cache is off during the compilation and set up
    again afterwards as it was."""
    from jax.experimental.compilation_cache import compilation_cache

    enabled = jax.config.jax_enable_compilation_cache  # pyright: ignore[reportAttributeAccessIssue]
    compilation_cache.reset_cache()
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        return lowered.compile()
    finally:
        jax.config.update("jax_enable_compilation_cache", enabled)
        compilation_cache.reset_cache()


def _evict(directory: Path) -> None:
    """Remove the least recently used program files beyond `MAX_FILES`."""
    files = []
    for p in directory.glob("*.bin"):
        with contextlib.suppress(OSError):
            files.append((p.stat().st_mtime, p))
    files.sort()
    for _, p in files[: max(0, len(files) - MAX_FILES)]:
        _remove(p)
