"""Safe file input and atomic file output for the `lvflow` workflow.

Reading never unpickles: `.npy`/`.npz` go through `numpy.load(..., allow_pickle=False)`, so an
object array (which would run arbitrary code when unpickled) is refused with an `LvflowError`.
Writing is atomic: the data go to a temporary file in the destination's directory, are flushed
to disk, and only then `os.replace`d onto the target, so a crash or a full disk never leaves a
half-written result behind (and a reader never sees one).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import signal
import sys
import tempfile
import threading
import zipfile
from pathlib import Path
from typing import Any, BinaryIO, Callable, Mapping

import numpy as np

from .._core.errors import LvflowError

#: The array files `load_arrays` reads, by suffix: the bytes a binary one starts with (`None`: CSV
#: text) and what it is, in words.
_FORMATS = {".npz": (b"PK", "an .npz archive"), ".npy": (b"\x93NUMPY", "an .npy file"), ".csv": (None, "CSV")}
#: File suffixes `load_arrays` understands.
SUFFIXES = tuple(_FORMATS)
#: The figure files lvflow writes (matplotlib's formats).
PLOT_SUFFIXES = (".png", ".pdf", ".svg")
#: The first byte of a pickle stream (protocol ≥ 2)
_PICKLE = b"\x80"


def check_suffix(name: str, path, suffixes: tuple[str, ...]) -> str:
    """The file type of an output `path`: its suffix (lower case, with the dot) when it is one of
    `suffixes` (e.g. `PLOT_SUFFIXES`).

    **Raises:** `LvflowError` `"{name}: unsupported file type for {path}; use .png or .pdf or .svg"`.
    """
    suffix = Path(os.fspath(path)).suffix.lower()
    if suffix not in suffixes:
        raise LvflowError(f"{name}: unsupported file type for {path}; use {' or '.join(suffixes)}")
    return suffix


def _check_file(path, name: str) -> Path:
    p = Path(os.fspath(path))
    if not p.exists():
        raise LvflowError(f"{name}: file not found: {p}")
    if p.is_dir():
        raise LvflowError(f"{name}: is a directory, expected a file: {p}")
    if not os.access(p, os.R_OK):
        raise LvflowError(f"{name}: file is not readable (permission denied): {p}")
    if p.suffix.lower() not in SUFFIXES:
        raise LvflowError(
            f"{name}: unsupported file type {p.suffix or '(none)'!r} for {p}; use one of {', '.join(SUFFIXES)}"
        )
    return p


def _numeric(name: str, key: str, a: np.ndarray) -> np.ndarray:
    label = f"{name}[{key}]" if key else name
    if a.dtype.hasobject or a.dtype.names is not None:
        raise LvflowError(f"{label}: holds a structured or object array; only plain numeric arrays are accepted")
    if not (np.issubdtype(a.dtype, np.number) or a.dtype == bool):
        raise LvflowError(f"{label}: not numeric (dtype {a.dtype})")
    if np.iscomplexobj(a):
        raise LvflowError(f"{label}: complex values are not accepted")
    return np.asarray(a, dtype=np.float64)


def _pickle_refused(name: str, p: Path) -> LvflowError:
    return LvflowError(
        f"{name}: {p} contains pickled (object) data, which lvflow refuses to load for safety; "
        "save plain numeric arrays with numpy.save / numpy.savez"
    )


_READ_ERRORS = (ValueError, OSError, EOFError, zipfile.BadZipFile)


def _unreadable(name: str, p: Path, e: Exception, what: str = "") -> LvflowError:
    """One line for a failed `numpy.load` (numpy says "pickle" when it meets object data)."""
    if isinstance(e, ValueError):
        if "pickle" in str(e).lower():
            return _pickle_refused(name, p)
        return LvflowError(f"{name}: cannot read {p}{what}: {e}")
    return LvflowError(f"{name}: cannot read {p}{what}: {e.__class__.__name__}: {e}")


def csv_lines(p: Path, name: str) -> list[str]:
    """The non-blank, non-comment (`#`) lines of a UTF-8 text file (a leading byte-order mark dropped).

    **Raises:** `LvflowError` (naming `name` and `p`) if it cannot be read or has no such line.
    """
    try:
        text = p.read_text(encoding="utf-8-sig")  # a byte-order mark (Excel's UTF-8 CSV) is not data
    except (OSError, UnicodeDecodeError) as e:
        raise LvflowError(f"{name}: cannot read {p}: {e.__class__.__name__}: {e}") from None
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise LvflowError(f"{name}: {p} is empty")
    return lines


def _cells(line: str) -> list[str]:
    """The comma-separated cells of one line, stripped, quotes removed (`"r","C0"` as spreadsheets write)."""
    return [c.strip() for c in next(csv.reader([line], skipinitialspace=True))]


def _load_csv(p: Path, name: str) -> dict[str, np.ndarray]:
    lines = csv_lines(p, name)
    header: list[str] | None = None
    first = _cells(lines[0])
    try:
        [float(c) for c in first]
    except ValueError:
        header, lines = first, lines[1:]
        if not lines:
            raise LvflowError(f"{name}: {p} has a header but no data rows")
    rows = []
    for i, ln in enumerate(lines):
        cells = _cells(ln)
        try:
            rows.append([float(c) for c in cells])
        except ValueError:
            raise LvflowError(f"{name}: {p} data row {i + 1} is not numeric: {ln.strip()[:60]!r}") from None
    widths = {len(r) for r in rows}
    if len(widths) != 1:
        raise LvflowError(f"{name}: {p} has rows of different lengths {sorted(widths)}")
    a = np.asarray(rows, dtype=np.float64)
    if header is None:
        return {"": a}
    if len(header) != a.shape[1]:
        raise LvflowError(f"{name}: {p} header has {len(header)} names but rows have {a.shape[1]} values")
    # Columns sharing a name prefix ("C0, C1, …" or repeated "x") are stacked into one 2-D array.
    out: dict[str, list[np.ndarray]] = {}
    for j, h in enumerate(header):
        key = h.rstrip("0123456789_[]") or h
        out.setdefault(key, []).append(a[:, j])
    return {k: (v[0] if len(v) == 1 else np.stack(v, axis=1)) for k, v in out.items()}


def read_document(p: Path, head: str, loads: Callable[[str], Any] = json.loads, kind: str = "JSON") -> Any:
    """The value in the text file `p` (UTF-8, a leading byte-order mark dropped) as `loads` parses
    it (default JSON; `tomllib.loads` for TOML): the one reader of lvflow's JSON and TOML inputs
    (logs, sweep specs, manifests).

    **Arguments:**

    - `p`: the file.
    - `head`: the start of every error message, naming the input and the file (e.g.
      `"spec: sweep.json: "`).
    - `loads`, `kind`: the parser and the format's name.

    **Raises:** `LvflowError` `head` + the problem: unreadable, not UTF-8, not valid `kind`, or
    nested deeper than Python's recursion limit allows to parse.
    """
    import tomllib

    try:
        return loads(p.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError) as e:
        raise LvflowError(f"{head}cannot read the file: {e.__class__.__name__}: {e}") from None
    except json.JSONDecodeError as e:
        raise LvflowError(f"{head}not valid {kind}: {e.msg} at line {e.lineno}") from None
    except tomllib.TOMLDecodeError as e:
        raise LvflowError(f"{head}not valid {kind}: {e}") from None
    except (RecursionError, MemoryError):
        raise LvflowError(
            f"{head}{kind} nested too deeply to read (Python's recursion limit is {sys.getrecursionlimit()})"
        ) from None


def read_json(p: Path, head: str) -> Any:
    """`read_document` of a JSON file."""
    return read_document(p, head)


def load_arrays(path, *, name: str = "file") -> dict[str, np.ndarray]:
    """Load numeric arrays from `.npz`, `.npy` or `.csv`, never unpickling.

    **Returns:** a dict of float64 arrays. An `.npz` gives its keys; an `.npy` or a header-less
    `.csv` gives the single key `""`; a `.csv` with a header row gives one key per column name,
    columns whose names differ only by a trailing index (`C0,C1,C2`) stacked into a 2-D array.

    **Raises:** `LvflowError` naming `name` and the problem: missing, unreadable or unsupported
    file, pickled/object data, non-numeric or complex values. (NaN/inf are left to the caller's
    `as_array`, which names the array.)
    """
    p = _check_file(path, name)
    suffix = p.suffix.lower()
    if _FORMATS[suffix][0] is None:
        return _load_csv(p, name)
    try:
        with open(p, "rb") as f:
            magic = f.read(6)
    except OSError as e:
        raise LvflowError(f"{name}: cannot read {p}: {e.__class__.__name__}: {e}") from None
    if magic.startswith(_PICKLE):  # a bare pickle stream in disguise
        raise _pickle_refused(name, p)
    # what the file is, read from its first bytes (as `np.load` decides), against its suffix
    found = next((s for s, (m, _) in _FORMATS.items() if m is not None and magic.startswith(m)), None)
    if found is None:
        raise LvflowError(f"{name}: {p} is not a valid {suffix} file (bad header)")
    if found != suffix:
        raise LvflowError(f"{name}: {p} is {_FORMATS[found][1]} with a {suffix} suffix")
    try:
        loaded = np.load(p, allow_pickle=False)
    except _READ_ERRORS as e:
        raise _unreadable(name, p, e, f" as {suffix}") from None
    if isinstance(loaded, np.ndarray):
        return {"": _numeric(name, "", loaded)}
    out = {}
    try:
        with loaded as z:
            for k in z.files:
                out[k] = _numeric(name, k, z[k])
    except LvflowError:
        raise
    except _READ_ERRORS as e:
        raise _unreadable(name, p, e) from None
    if not out:
        raise LvflowError(f"{name}: {p} holds no arrays")
    return out


def load_array(path, *, name: str = "file") -> np.ndarray:
    """The single array in an `.npy`, a header-less `.csv`, or a one-key `.npz` (see `load_arrays`)."""
    arrs = load_arrays(path, name=name)
    if len(arrs) != 1:
        raise LvflowError(f"{name}: expected a single array in {path}, found keys {sorted(arrs)}")
    return next(iter(arrs.values()))


def atomic_write_bytes(path, data: bytes, *, name: str = "output") -> Path:
    """Write `data` to `path` atomically (`atomic_write`)."""
    return atomic_write(path, lambda f: f.write(data), name=name)


def check_writable(path, name: str = "output") -> Path:
    """Refuse an output path before a long computation: its directory must exist and be writable,
    the path must not be a directory, and its file name and whole path must be no longer than
    the file system allows (`NAME_MAX` and `PATH_MAX` of the directory, in bytes).

    **Raises:** `LvflowError` naming `name` and the user's path.
    """
    p = Path(os.fspath(path))
    parent = p.parent if str(p.parent) else Path(".")
    check_path_length(p, name)
    if not parent.is_dir():
        raise LvflowError(f"{name}: directory does not exist: {parent}")
    if p.is_dir():
        raise LvflowError(f"{name}: is a directory, expected a file name: {p}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise LvflowError(f"{name}: directory is not writable (permission denied): {parent}")
    if p.exists() and not os.access(p, os.W_OK):
        raise LvflowError(f"{name}: file is not writable (permission denied): {p}")
    return p


def _limit(directory: Path, which: str, default: int) -> int:
    """`os.pathconf(directory, which)` of the nearest existing directory, else `default`."""
    d = directory
    while not d.is_dir() and d != d.parent:
        d = d.parent
    try:
        value = os.pathconf(d if d.is_dir() else ".", which)
    except (OSError, ValueError, AttributeError):  # no such limit here (or not POSIX)
        return default
    return value if value is not None and value > 0 else default


def check_path_length(path, name: str = "output") -> Path:
    """Refuse a path with a component longer than `NAME_MAX` bytes, or longer in all than
    `PATH_MAX` bytes, of the file system it is (to be) on: the write would fail with `OSError`
    after the computation (and `Path.exists` raises on it).

    **Returns:** the path. **Raises:** `LvflowError` naming `name` and the component.
    """
    p = Path(os.fspath(path))
    parent = p.parent if str(p.parent) else Path(".")
    name_max = _limit(parent, "PC_NAME_MAX", 255)
    for part in p.parts:
        size = len(os.fsencode(part))
        if size > name_max:
            raise LvflowError(
                f"{name}: the name {part[:40] + '…'!r} is {size} bytes long; the file system allows at most {name_max}"
            )
    full = len(os.fsencode(os.path.abspath(p)))
    path_max = _limit(parent, "PC_PATH_MAX", 4096)
    if full >= path_max:
        raise LvflowError(f"{name}: the path is {full} bytes long; the file system allows less than {path_max}")
    return p


#: Signals that end a process politely; during a write they remove the temporary file first.
_CLEANUP_SIGNALS = tuple(signal.Signals[n] for n in ("SIGTERM", "SIGHUP") if n in signal.Signals.__members__)


@contextlib.contextmanager
def _signals_raise():
    """While writing: SIGTERM/SIGHUP (left at their default, which kills without cleanup) raise
    `SystemExit(128 + signum)` instead, so the temporary file is removed before the process ends.
    Only in the main thread (the only one that may set handlers); other handlers are left alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}

    def handler(signum, frame):
        raise SystemExit(128 + signum)

    for sig in _CLEANUP_SIGNALS:
        if signal.getsignal(sig) is signal.SIG_DFL:
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)


#: The temporary files of writes in progress (`atomic_write`), for `remove_pending_temporaries`.
_PENDING: set[str] = set()


def remove_pending_temporaries() -> None:
    """Delete the temporary files of the writes in progress: what the `lvflow` command does
    before it ends the process on Ctrl-C while the write's own thread cannot run its cleanup."""
    for tmp in list(_PENDING):
        try:
            os.unlink(tmp)
        except OSError:
            pass


def atomic_write(path, write: Callable[[BinaryIO], object], *, name: str = "output") -> Path:
    """Write `path` atomically: `write(f)` fills a temporary file in the same directory, which is
    flushed, fsync'ed and `os.replace`d onto `path` (removed instead if anything fails, including
    SIGTERM or SIGHUP during the write).

    **Raises:** `LvflowError` naming `name` and `path` (not the temporary file) when the
    directory is missing or unwritable, `path` is a directory, or the write fails (a full disk).
    """
    p = check_writable(path, name)
    parent = p.parent if str(p.parent) else Path(".")
    # mkstemp creates the file 0600; give the result the mode a plain open() would (or keep
    # the mode of the file it replaces).
    try:
        mode = p.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    with _signals_raise():
        try:
            # the name's first 64 characters: a name near NAME_MAX leaves room for the suffixes
            fd, tmp = tempfile.mkstemp(prefix=f".{p.name[:64]}.", suffix=".tmp", dir=parent)
        except OSError as e:
            raise LvflowError(f"{name}: cannot write {p}: {e.strerror or e}") from None
        _PENDING.add(tmp)
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, mode)
            os.replace(tmp, p)
        except BaseException as e:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            if isinstance(e, OSError):
                raise LvflowError(f"{name}: cannot write {p}: {e.strerror or e}") from None
            raise
        finally:
            _PENDING.discard(tmp)
    return p


def atomic_write_text(path, text: str) -> Path:
    """`atomic_write_bytes` of UTF-8 text."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def _jsonable(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float):  # numpy's float64 included
        # JSON has no inf/NaN; `null` marks "does not apply / never happens".
        return float(x) if math.isfinite(x) else None
    if isinstance(x, (str, bytes, bool, int, type(None))):
        return x
    # numpy and JAX arrays and scalars (this module does not import JAX): through numpy
    a = np.asarray(x)
    if a.dtype == object:
        return x
    if a.ndim == 0:
        return _jsonable(a.item())
    if a.dtype.kind in "biu" or (a.dtype.kind == "f" and bool(np.isfinite(a).all())):
        return a.tolist()  # Python numbers already: what the element-wise path gives, at once
    return [_jsonable(v) for v in a.tolist()]


def to_json(obj: Mapping[str, Any]) -> str:
    """Strict JSON (non-finite floats become `null`) of a dict of scalars, strings and arrays."""
    return json.dumps(_jsonable(obj), indent=2, allow_nan=False) + "\n"


def save_json(path, obj: Mapping[str, Any]) -> Path:
    """Atomically write `to_json(obj)` to `path`."""
    return atomic_write_text(path, to_json(obj))


def save_npz(path, arrays: Mapping[str, Any]) -> Path:
    """Atomically write a compressed `.npz` of numeric arrays (strings stored as unicode arrays,
    `None` skipped), readable back with `allow_pickle=False`."""
    buf = io.BytesIO()
    clean = {}
    for k, v in arrays.items():
        if v is None:
            continue
        a = np.asarray(v)
        if a.dtype.hasobject:
            raise LvflowError(f"output: {k!r} is not a numeric or string array; cannot save without pickling")
        clean[k] = a
    np.savez_compressed(buf, **clean)
    return atomic_write_bytes(path, buf.getvalue())
