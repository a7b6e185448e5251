"""Keep one hostile file from costing the others their check.

* `deep_call` runs the per-file work on a thread with a large stack and a raised recursion
  limit: valid code nested a few hundred levels deep is analysed instead of ending in a
  RecursionError, and LibCST's native parser (which recurses on the C stack and segfaults on
  ~2000 nested brackets with the default 8 MiB stack) has room for far deeper input.
* `risky` is a cheap screen (a few C-speed string passes, ~1% of a parse) for the inputs that
  could make the native parser crash or take minutes and gigabytes: deep bracket nesting and
  very long lines. Such a file is first given to CPython's own parser, which rejects what
  Python rejects (> 200 nested brackets) or gives up cleanly (RecursionError, MemoryError) on
  absurd nesting, and it is parsed in a child process even in a sequential run, so that even a
  native crash costs only that file (`runner.isolated`; a process pool recovers the same way).
"""

from __future__ import annotations

import os
import re
import sys
import threading
from typing import Any, Callable, Optional

STACK_SIZE = 512 * 1024 * 1024  # virtual: only the pages a deep file touches are committed
RECURSION_LIMIT = 60_000
# CPython itself rejects more than 200 nested brackets ("too many nested parentheses")
MAX_BRACKET_DEPTH = 100
MAX_LINE_CHARS = 1_000
# tests only: run unguarded (no large stack, no CPython pre-check) so that a real native crash
# in LibCST reaches the process isolation (tests/test_robust_check.py)
UNGUARDED = os.environ.get("AMPFIX_UNGUARDED") == "1"

_NOT_BRACKETS = re.compile(r"[^()\[\]{}]+")
_NOT_BRACKET_BYTES = bytes(b for b in range(128, 256)) + bytes(b for b in range(128) if chr(b) not in "()[]{}")
_lock = threading.Lock()


def bracket_depth_over(text: str, limit: int = MAX_BRACKET_DEPTH) -> bool:
    """Whether brackets nest `limit` or more deep (brackets in strings and comments count too:
    it over-approximates, which only costs a child process). Each pass removes the innermost
    pairs, so it takes (nesting depth) passes over the brackets alone (`brackets`)."""
    b = brackets(text)
    for _ in range(limit):
        shorter = b.replace("()", "").replace("[]", "").replace("{}", "")
        if len(shorter) == len(b):
            return False
        b = shorter
    return True


def brackets(text: str) -> str:
    """The brackets of `text`, in order (`_NOT_BRACKETS` removed; an ASCII text's other bytes
    deleted instead: 4x faster)."""
    if text.isascii():
        return text.encode("ascii").translate(None, _NOT_BRACKET_BYTES).decode("ascii")
    return _NOT_BRACKETS.sub("", text)


def risky(text: str) -> Optional[str]:
    """Why parsing `text` in this process could crash it, or None (the normal case)."""
    if len(text) > MAX_LINE_CHARS and max(map(len, text.splitlines())) > MAX_LINE_CHARS:
        return f"a line longer than {MAX_LINE_CHARS} characters"
    if bracket_depth_over(text):
        return f"brackets nested more than {MAX_BRACKET_DEPTH} deep"
    return None


def deep_call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` on a thread with a large stack and a high recursion limit."""
    if UNGUARDED:
        return fn(*args, **kwargs)
    if _on_deep_thread():
        return fn(*args, **kwargs)  # already on a deep thread
    with _lock:
        return _on_new_thread(fn, args, kwargs, RECURSION_LIMIT)


def fresh_call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`deep_call`, on a new deep thread even when the caller is on one already: for a
    computation whose outcome must not depend on how deep its caller is (a module's summary,
    which the cache keeps by content, asked at the bottom of a deep query)."""
    if UNGUARDED or not _on_deep_thread():
        return deep_call(fn, *args, **kwargs)
    # (the `deep_call` this thread runs under holds the lock and has raised the limit)
    return _on_new_thread(fn, args, kwargs)


def _on_deep_thread() -> bool:
    return threading.current_thread() is not threading.main_thread() and getattr(_local, "deep", False)


def _on_new_thread(fn: Callable[..., Any], args: tuple, kwargs: dict, limit: int = 0) -> Any:
    """`fn(*args, **kwargs)` on a new thread with a `STACK_SIZE` stack, its exception re-raised
    here; the recursion limit raised to `limit` while it runs."""
    box: dict = {}

    def target() -> None:
        _local.deep = True
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # re-raised on the calling thread
            box["error"] = exc

    old_size = threading.stack_size()
    try:
        threading.stack_size(STACK_SIZE)
    except (ValueError, RuntimeError):  # pragma: no cover - platforms without the setting
        return fn(*args, **kwargs)
    try:
        t = threading.Thread(target=target, name="ampfix-deep", daemon=True)
        t.start()
    finally:
        threading.stack_size(old_size)
    old_limit = sys.getrecursionlimit()
    if old_limit < limit:
        sys.setrecursionlimit(limit)
    try:
        t.join()
    finally:
        sys.setrecursionlimit(old_limit)
    if "error" in box:
        raise box["error"]
    return box["value"]


_local = threading.local()
