"""Reading and writing the files `ampfix rewrite` edits, without ever losing a byte or a file.

Text layout. LibCST does not round-trip every legal file: it drops the last line break of a
file with CR-only (`\\r`) line endings, renders the statements it builds with the first line
break of the file (so a mixed file gets the wrong one), and deletes a form feed in the
indentation of a statement line. So the engine fixes a *working text* with `\\n` line breaks
(`working_text`), and `restore_layout` maps the fixed text back onto the original: every line
that the fixes did not change is the original line, byte for byte (its line break and form
feeds included); a changed or moved line keeps the line break (and a leading form feed) of
the line it came from; a new line takes the line break of the line before it.

Writing. `Snapshot` records a file as it was read (size, mtime_ns, SHA-256 of the bytes).
`write_fixed` replaces it only when it is still exactly that, under a per-file lock
(`fcntl.flock` on the file itself, so two ampfix runs never interleave their check and write);
through a symlink it writes the target and keeps the link; a file with several hard links is
written through in place; otherwise a temporary file in the same folder (same mode and owner)
is renamed over it. A read-only file is refused. Temporary files are named
`.NAME.XXXXXXXX.ampfix.tmp` next to NAME; one left behind by a killed run is removed by the
next run that writes NAME (or that rewrites files in its folder).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import stat
import time
import tokenize
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

try:  # POSIX; elsewhere the re-check before the write still applies, without the lock
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

_LINE_RE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")
_INDENT_FF_RE = re.compile(r"^[ \t\f]*\f")  # leading whitespace up to its last form feed
TEMP_SUFFIX = ".ampfix.tmp"
_TEMP_RE = re.compile(r"^\.(?P<target>.+)\.[A-Za-z0-9_]{6,}" + re.escape(TEMP_SUFFIX) + "$")


# ----------------------------------------------------------------------------- text layout


def split_lines(text: str) -> List[str]:
    """The lines of `text` with their line breaks (`\\r\\n`, `\\r` or `\\n` only: unlike
    `str.splitlines`, a form feed or a vertical tab is not a line break for Python)."""
    return _LINE_RE.findall(text)


def _ending(line: str) -> str:
    if line.endswith("\r\n"):
        return "\r\n"
    if line.endswith(("\r", "\n")):
        return line[-1]
    return ""


def _body(line: str) -> str:
    return line[: len(line) - len(_ending(line))]


def working_text(text: str) -> str:
    """`text` with every line break a `\\n` (the same lines, the same columns)."""
    if "\r" not in text:
        return text
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _key(line: str) -> str:
    """A line as LibCST renders it: `\\n` line break, no form feed in the indentation (a
    form feed resets the indentation count, so what follows the last one is what counts)."""
    body = _body(line)
    if "\f" in body:
        body = _INDENT_FF_RE.sub("", body)
    return body + ("\n" if _ending(line) else "")


def _ff_prefix(line: str) -> str:
    """`\\f` when the line starts with a form feed in its indentation (put back at its start)."""
    return "\f" if _INDENT_FF_RE.match(line) else ""


def restore_layout(original: str, fixed: str) -> str:
    """The fixed working text (`fixed`, from `working_text(original)`) with the layout of
    `original`: unchanged lines exactly as they were, line breaks and form feeds kept."""
    old = split_lines(original)
    new = split_lines(fixed)
    old_keys = [_key(line) for line in old]
    endings = {_ending(line) for line in old if _ending(line)}
    if "\f" not in original and endings <= {"\n"} and "\r" not in fixed and not _libcst_losses(original, old_keys):
        return fixed
    new_keys = [_key(line) for line in new]
    # common head and tail first: the diff then only looks at the region the fixes touched
    head = 0
    while head < min(len(old), len(new)) and old_keys[head] == new_keys[head]:
        head += 1
    tail = 0
    while (tail < min(len(old), len(new)) - head
           and old_keys[len(old) - 1 - tail] == new_keys[len(new) - 1 - tail]):
        tail += 1
    out: List[str] = list(old[:head])
    a_keys, b_keys = old_keys[head: len(old) - tail], new_keys[head: len(new) - tail]
    import difflib  # here: reading and checking files never needs it

    opcodes = difflib.SequenceMatcher(None, a_keys, b_keys, autojunk=False).get_opcodes()
    lost = _libcst_losses(original, old_keys) if any(t in ("replace", "delete") for t, *_ in opcodes) else {}
    # lines a fix removed, by content: a moved line finds its own line break and form feed
    removed: Dict[str, List[str]] = {}
    for tag, i1, i2, _, _ in opcodes:
        if tag in ("replace", "delete"):
            for line in old[head + i1: head + i2]:
                removed.setdefault(_body(_key(line)).strip(), []).append(line)
    dominant = _dominant(old)
    for tag, i1, i2, j1, j2 in opcodes:
        if tag == "equal":
            out.extend(old[head + i1: head + i2])
            continue
        # lines LibCST drops by itself (blank lines before a whitespace-only last line; no fix
        # asked for it) are put back, after what the fix put there (it follows the statement before)
        gone = []
        for i in range(head + i1, head + i2):
            if lost.get(old_keys[i], 0) > 0:  # by content: identical blank lines align either way
                lost[old_keys[i]] -= 1
                gone.append(i)
        if tag == "replace" and len(gone) == i2 - i1:
            tag = "insert"
        for k in range(j2 - j1):
            line = new[head + j1 + k]
            source: Optional[str] = None
            same = removed.get(_body(line).strip())
            if same:
                source = same.pop(0)
            elif tag == "replace" and k < i2 - i1:
                source = old[head + i1 + k]
            if not _ending(line):
                ending = ""
            elif source is not None and _ending(source):
                ending = _ending(source)
            else:
                before = head + i1 - 1
                ending = _ending(old[before]) if before >= 0 and _ending(old[before]) else dominant
            prefix = _ff_prefix(source) if source is not None and "\f" not in line else ""
            out.append(prefix + _body(line) + ending)
        out.extend(old[i] for i in gone)
    out.extend(old[len(old) - tail:])
    result = "".join(out)
    # the layout never changes the program: else keep LibCST's text with the usual line break
    if result != fixed and not _same_program(result, fixed):
        return fixed.replace("\n", dominant) if dominant != "\n" else fixed
    return result


def _libcst_losses(original: str, old_keys: Sequence[str]) -> Dict[str, int]:
    """The lines of `original` (by content) that LibCST's own round trip (parse, render) does
    not give back (blank lines before a whitespace-only last line): no fix removed those."""
    import libcst as cst

    try:
        rendered = cst.parse_module(working_text(original)).code
    except Exception:
        return {}
    keys = [_key(line) for line in split_lines(rendered)]
    if keys == list(old_keys):
        return {}
    out: Dict[str, int] = {}
    import difflib

    for tag, i1, i2, _, _ in difflib.SequenceMatcher(None, list(old_keys), keys, autojunk=False).get_opcodes():
        if tag in ("replace", "delete"):
            for key in old_keys[i1:i2]:
                out[key] = out.get(key, 0) + 1
    return out


def _dominant(lines: Sequence[str]) -> str:
    counts: Dict[str, int] = {}
    for line in lines:
        e = _ending(line)
        if e:
            counts[e] = counts.get(e, 0) + 1
    return max(counts, key=lambda e: counts[e]) if counts else "\n"


def _same_program(a: str, b: str) -> bool:
    try:
        import ast

        return ast.dump(ast.parse(a)) == ast.dump(ast.parse(b))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        # cannot tell with CPython's parser (e.g. newer syntax): trust the line-for-line mapping
        # only when it changed nothing but line breaks and indentation form feeds
        return [_key(x) for x in split_lines(a)] == [_key(x) for x in split_lines(b)]


# ----------------------------------------------------------------------------- reading

_BYTE_LINES_RE = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")


def detect_encoding(data: bytes) -> str:
    """The source encoding as the interpreter finds it (BOM, PEP 263 cookie in the first two
    lines, else UTF-8), with any line break: `tokenize.detect_encoding` alone reads a file with
    CR-only line breaks as one line and misses its cookie. Raises SyntaxError."""
    if b"\r" not in data[:4096]:
        return tokenize.detect_encoding(io.BytesIO(data).readline)[0]
    lines = iter(_BYTE_LINES_RE.findall(data[:4096]))
    return tokenize.detect_encoding(lambda: next(lines, b""))[0]


@dataclass(frozen=True)
class Snapshot:
    """A file as it was read: what must still be true just before it is replaced."""

    size: int
    mtime_ns: int
    sha256: str

    @classmethod
    def of(cls, data: bytes, st: os.stat_result) -> "Snapshot":
        return cls(st.st_size, st.st_mtime_ns, hashlib.sha256(data).hexdigest())


def read_file(path: str) -> Tuple[bytes, Snapshot]:
    """The bytes of `path` and its snapshot (stat taken on the open file, after reading)."""
    with open(path, "rb") as fh:
        data = fh.read()
        st = os.fstat(fh.fileno())
    return data, Snapshot.of(data, st)


# ----------------------------------------------------------------------------- writing


class WriteRefused(Exception):
    """The file was left as it is; the message says why (one line, no path)."""


CHANGED = "the file changed on disk during the rewrite; nothing was written (run ampfix again)"


LOCK_TIMEOUT_S = 60.0


def _lock(fd: int) -> None:
    """Take the file's lock; give up (the file is not written) when another process keeps it."""
    if fcntl is None:
        return
    deadline = time.monotonic() + LOCK_TIMEOUT_S
    delay = 0.005
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise WriteRefused(f"another process has held the file's lock for {LOCK_TIMEOUT_S:.0f} s; "
                                   "nothing was written (run ampfix again)") from None
            time.sleep(delay)
            delay = min(delay * 2, 0.1)


def _writable(target: str, st: os.stat_result) -> bool:
    """The write permission the mode bits give (root included: as root `os.access` says yes
    to everything, but a file with no write bit is read-only by intent)."""
    if not st.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        return False
    return os.access(target, os.W_OK)


def temp_files_of(folder: str, name: Optional[str] = None) -> List[str]:
    """ampfix's temporary files in `folder` (those of `name` only, when given)."""
    try:
        entries = os.listdir(folder)
    except OSError:
        return []
    out = []
    for entry in entries:
        m = _TEMP_RE.match(entry)
        if m and (name is None or m.group("target") == name):
            out.append(os.path.join(folder, entry))
    return out


def remove_stale_temp_files(folder: str, name: Optional[str] = None) -> List[str]:
    """Remove the temporary files a killed run left in `folder` (for `name`, or for every
    file that still exists there). A live run holds its target's lock while its temporary
    file exists, so a temp file whose target can be locked here is stale. Returns the removed."""
    removed = []
    for tmp in temp_files_of(folder, name):
        m = _TEMP_RE.match(os.path.basename(tmp))
        target = os.path.join(folder, m.group("target")) if m else None
        if target is None or not os.path.isfile(target):
            continue  # not tied to a file here: not ours to judge
        try:
            fd = os.open(target, os.O_RDONLY)
        except OSError:
            continue
        try:
            if fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    continue  # a run is writing the target right now
            try:
                os.unlink(tmp)
                removed.append(tmp)
            except OSError:
                pass
        finally:
            os.close(fd)
    return removed


# a test hook: called with the path just before the re-check (tests change the file here)
_before_recheck = None


def write_fixed(path: str, data: bytes, snapshot: Optional[Snapshot]) -> None:
    """Replace the file at `path` with `data`, if it is still what `snapshot` recorded.

    Raises WriteRefused (the file is left as it is) or OSError."""
    target = os.path.realpath(path)  # a symlink: write its target, keep the link
    try:
        fd = os.open(target, os.O_RDONLY)
    except FileNotFoundError:  # deleted (or renamed) since it was read
        raise WriteRefused(CHANGED) from None
    try:
        _lock(fd)
        if _before_recheck is not None:
            _before_recheck(path)
        try:
            st = os.stat(target)
        except FileNotFoundError:
            raise WriteRefused(CHANGED) from None
        if not stat.S_ISREG(st.st_mode):
            raise WriteRefused("not a regular file; nothing was written")
        if snapshot is not None:
            if (st.st_size, st.st_mtime_ns) != (snapshot.size, snapshot.mtime_ns) or st.st_ino != os.fstat(fd).st_ino:
                raise WriteRefused(CHANGED)
            with open(target, "rb") as fh:
                if hashlib.sha256(fh.read()).hexdigest() != snapshot.sha256:
                    raise WriteRefused(CHANGED)
        if not _writable(target, st):
            raise WriteRefused("the file is read-only (no write permission); nothing was written "
                               "(make it writable to rewrite it)")
        folder, name = os.path.split(target)
        _remove_own_temps(folder or ".", name)
        if st.st_nlink > 1:
            _write_in_place(target, data)
        else:
            _replace(target, data, st)
    finally:
        os.close(fd)


def _remove_own_temps(folder: str, name: str) -> None:
    """Under the target's lock every temporary file of it is a leftover."""
    for tmp in temp_files_of(folder, name):
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _write_in_place(target: str, data: bytes) -> None:
    """Write through the file itself (it has other hard links that must see the change)."""
    with open(target, "r+b") as fh:
        fh.write(data)
        fh.truncate()
        fh.flush()
        os.fsync(fh.fileno())


def _replace(target: str, data: bytes, st: os.stat_result) -> None:
    folder, name = os.path.split(target)
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=TEMP_SUFFIX, dir=folder or ".")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if hasattr(os, "fchown"):
                try:
                    os.fchown(fh.fileno(), st.st_uid, st.st_gid)
                except PermissionError:  # not root: keep at least the group when allowed
                    try:
                        os.fchown(fh.fileno(), -1, st.st_gid)
                    except PermissionError:
                        pass
            os.chmod(tmp, stat.S_IMODE(st.st_mode))  # after chown, which may clear set-id bits
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def sweep_folders(paths: Iterable[str]) -> List[str]:
    """Remove stale ampfix temporary files in the folders of `paths`; returns the removed."""
    removed: List[str] = []
    for folder in sorted({os.path.dirname(os.path.realpath(p)) for p in paths}):
        removed.extend(remove_stale_temp_files(folder))
    return removed


def write_atomically(path: str, data: bytes) -> None:
    """Replace `path` with `data` (no re-check): kept for callers of the old runner function."""
    write_fixed(path, data, None)


__all__ = ["CHANGED", "Snapshot", "WriteRefused", "read_file", "remove_stale_temp_files", "restore_layout",
           "split_lines", "sweep_folders", "temp_files_of", "working_text", "write_atomically", "write_fixed"]
