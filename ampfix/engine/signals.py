"""Signals: a run that is stopped (Ctrl-C, SIGTERM, SIGHUP) cleans up what it started - worker
processes, child processes, temporary folders - and exits with 128 + the signal's number (130
for Ctrl-C, 143 for SIGTERM), as shells report a process killed by a signal.

* `terminable()` (the command line wraps every command in it) turns SIGTERM and SIGHUP into a
  `Terminated` exception in the main thread, as Python turns SIGINT into KeyboardInterrupt, so
  that every `finally` and `except BaseException` on the way out runs.
* `critical()` holds those signals back while a file is being written (the in-place write of
  ampfix/engine/fileio.py, between its two steps): the signal takes effect when the write is
  complete or rolled back. SIGKILL cannot be held back; the write's journal covers it.
* `child_setup()` is run first in every process ampfix starts for itself (pool workers, the
  child that parses a risky file): it dies with its parent (Linux: PR_SET_PDEATHSIG), even
  when the parent is killed with SIGKILL, and leaves Ctrl-C to the parent, which ends it.
* Temporary folders are named `PREFIX<pid>-...`: `sweep_temp_folders` removes those of
  processes that no longer exist (a run killed with SIGKILL cannot remove its own).
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import sys
import tempfile
import threading
from contextlib import contextmanager
from typing import Iterator, List, Optional

STOP_SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s is not None)


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived (a BaseException, like KeyboardInterrupt: `except Exception`
    does not swallow it)."""

    def __init__(self, signum: int):
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum


def exit_status(exc: BaseException) -> int:
    """128 + the signal's number, as a shell reports a process a signal ended."""
    if isinstance(exc, Terminated):
        return 128 + exc.signum
    return 128 + signal.SIGINT


def leave(status: int) -> None:
    """End the process with `status` once a stopped run has cleaned up. When a thread is still
    at work (the analysis runs on a thread of its own, maybe inside LibCST's native parser),
    the interpreter's finalization would abort the process (SIGABRT) under it: then the
    streams are flushed and the process ends at once."""
    if threading.active_count() > 1:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(status)
    sys.exit(status)


_state = threading.local()
_pending: List[int] = []


def _in_critical() -> bool:
    return getattr(_state, "critical", 0) > 0


def _handler(signum, frame) -> None:
    if _in_critical():
        _pending.append(signum)
        return
    raise Terminated(signum)


@contextmanager
def terminable() -> Iterator[None]:
    """SIGTERM and SIGHUP raise `Terminated` in the main thread while this is active (the
    previous handlers come back after). Elsewhere than in the main thread: nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for sig in STOP_SIGNALS:
        try:
            if signal.getsignal(sig) is signal.SIG_IGN:
                continue  # e.g. SIGHUP under nohup: the user asked for it to be ignored
            previous[sig] = signal.signal(sig, _handler)
        except (ValueError, OSError):  # pragma: no cover - not the main interpreter
            pass
    try:
        yield
    finally:
        for sig, old in previous.items():
            try:
                signal.signal(sig, old)
            except (ValueError, OSError, TypeError):  # pragma: no cover
                pass


@contextmanager
def critical() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP back until the block is done (main thread; elsewhere
    Python delivers no signal anyway). A signal that came meanwhile takes effect at the end."""
    main = threading.current_thread() is threading.main_thread()
    old_int = None
    if main and not _in_critical():
        try:
            old_int = signal.getsignal(signal.SIGINT)
            if old_int is signal.default_int_handler:
                signal.signal(signal.SIGINT, _handler)
            else:
                old_int = None
        except (ValueError, OSError):  # pragma: no cover
            old_int = None
    _state.critical = getattr(_state, "critical", 0) + 1
    try:
        yield
    finally:
        _state.critical -= 1
        if not _in_critical():
            if old_int is not None:
                signal.signal(signal.SIGINT, old_int)
            if main and _pending:
                signum = _pending[0]
                del _pending[:]
                if signum == signal.SIGINT:
                    raise KeyboardInterrupt
                raise Terminated(signum)


# ----------------------------------------------------------------------------- children


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send `sig` to this process when its parent dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError, ValueError):  # pragma: no cover - no libc prctl
        pass


def child_setup(parent: Optional[int] = None) -> None:
    """First thing in a process ampfix forks for its own work: die with the parent (SIGKILL
    included), leave Ctrl-C to the parent (it ends its children), default SIGTERM."""
    die_with_parent()
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
    except (ValueError, OSError):  # pragma: no cover - not the main thread
        pass
    if parent is not None and os.getppid() != parent:
        os._exit(1)  # the parent died before the request above took effect


# ----------------------------------------------------------------------------- temporary folders


def make_temp_folder(prefix: str) -> str:
    """A new temporary folder named PREFIX<pid>-XXXXXXXX (see `sweep_temp_folders`)."""
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_temp_folders(prefix: str, folder: Optional[str] = None) -> List[str]:
    """Remove the temporary folders PREFIX<pid>-* of processes that are gone (killed with
    SIGKILL, or by a power cut), owned by this user; returns the removed."""
    folder = folder or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    uid = os.getuid() if hasattr(os, "getuid") else None
    for name in names:
        if not name.startswith(prefix):
            continue
        pid_text = name[len(prefix):].split("-", 1)[0]
        if not pid_text.isdigit() or int(pid_text) == os.getpid() or _alive(int(pid_text)):
            continue
        path = os.path.join(folder, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if uid is not None and st.st_uid != uid:
            continue
        if not stat.S_ISDIR(st.st_mode):
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            removed.append(path)
    return removed
