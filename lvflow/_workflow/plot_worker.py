"""The CLI's plot process: `lvflow predict --plot` draws its figure in a child process forked
before JAX is imported, which imports matplotlib and draws a first figure (fonts, tick
machinery) while the parent imports JAX and computes; the parent then sends the plot's numpy
data (`prediction_plot.plot_data`) and waits for the file to be written. The drawing is the
same function either way (`prediction_plot.draw`); without a worker, or where `os.fork` is
missing, it runs in the calling process.

The child never prints and leaves through `os._exit`; a parent that exits or dies closes the
pipe, and the child then exits too.
"""

from __future__ import annotations

import enum
import os
import pickle
import signal
import struct
import sys
from pathlib import Path
from typing import Any

from .._core.errors import LvflowError

_worker: _Worker | None = None


class _Reply(enum.Enum):
    """What the plot process reports: the figure drawn (its path), an `LvflowError` (its message)
    or another failure (its type and message)."""

    DRAWN = enum.auto()
    REFUSED = enum.auto()
    FAILED = enum.auto()


class _Worker:
    """A forked child that draws one figure: `draw(data, path)` sends it, waits, and returns the path."""

    def __init__(self):
        to_child, self._to_child = os.pipe()
        self._from_child, from_parent = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child
            os.close(self._to_child)
            os.close(self._from_child)
            _serve(to_child, from_parent)  # does not return
        os.close(to_child)
        os.close(from_parent)

    def draw(self, data: dict[str, Any], path) -> Path:
        try:
            _send(self._to_child, (data, os.fspath(path)))
            kind, message = _receive(self._from_child)
        except (OSError, EOFError, pickle.UnpicklingError) as e:
            raise RuntimeError(f"the plot process failed ({type(e).__name__}: {e})") from None
        finally:
            self.close()
        if kind is _Reply.DRAWN:
            return Path(message)
        if kind is _Reply.REFUSED:
            raise LvflowError(message)
        raise RuntimeError(f"the plot process failed: {message}")

    def close(self, *, kill: bool = False) -> None:
        """Close the pipes and reap the child; `kill`: end it first (it has nothing to write)."""
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            if kill:
                os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ChildProcessError, ProcessLookupError):
            pass


def _plotting():
    """`prediction_plot`, imported where a figure is drawn: it imports numpy and this module (the
    plot process is forked before either is needed), and it imports matplotlib when it draws."""
    from . import prediction_plot

    return prediction_plot


def start() -> None:
    """Fork the plot process, if it can be done safely: `os.fork` exists and JAX (multithreaded)
    is not imported yet (POSIX only). Otherwise plots are drawn in this process."""
    global _worker
    if _worker is None and os.name == "posix" and "jax" not in sys.modules:
        _worker = _Worker()


def stop() -> None:
    """End the plot process if it was started and not used (an error before the plot)."""
    global _worker
    if _worker is not None:
        _worker.close(kill=True)  # still warming up, or waiting for data that will not come
        _worker = None


def render(data: dict[str, Any], path) -> Path:
    """Draw `data` (`prediction_plot.plot_data`) into `path`: in the plot process where one was
    started, else here.

    **Raises:** `LvflowError` for a bad file type or a failed write, as `prediction_plot.draw`.
    """
    global _worker
    worker, _worker = _worker, None
    if worker is None:
        return _plotting().draw(data, path)
    return worker.draw(data, path)


def _serve(rfd: int, wfd: int) -> None:
    """The child: warm matplotlib up, draw what arrives, report, exit."""
    try:
        plotting = _plotting()
        try:
            plotting.warm_up()
        except Exception:  # only a head start: the real drawing reports its own errors
            pass
        try:
            data, path = _receive(rfd)
        except (EOFError, OSError):  # the parent ended without a plot
            os._exit(0)
        try:
            reply = (_Reply.DRAWN, os.fspath(plotting.draw(data, path)))
        except LvflowError as e:
            reply = (_Reply.REFUSED, str(e))
        except Exception as e:  # reported by the parent as an internal error
            reply = (_Reply.FAILED, f"{type(e).__name__}: {e}")
        _send(wfd, reply)
    except BaseException:
        pass
    finally:
        os._exit(0)


def _send(fd: int, obj) -> None:
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(struct.pack("<Q", len(payload)) + payload)
    while view:
        view = view[os.write(fd, view) :]


def _receive(fd: int):
    (n,) = struct.unpack("<Q", _read_exactly(fd, 8))
    return pickle.loads(_read_exactly(fd, n))


def _read_exactly(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError("pipe closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
