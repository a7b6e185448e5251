"""Reading and writing the files `ampfix rewrite` edits, without ever losing a byte or a file.

Text layout. LibCST does not round-trip every legal file: it drops the last line break of a
file with CR-only (`\\r`) line endings, renders the statements it builds with the first line
break of the file (so a mixed file gets the wrong one), and deletes a form feed in the
indentation of a statement line. So the engine fixes a *working text* with `\\n` line breaks
(`working_text`), and `restore_layout` maps the fixed text back onto the original: every line
that the fixes did not change is the original line, byte for byte (its line break and form
feeds included); a changed or moved line keeps the line break (and a leading form feed) of
the line it came from; a new line takes the line break of the line before it.

Writing. `Snapshot` records a file as it was read (size, mtime_ns, SHA-256 of the bytes, and
its device and inode: the same file under two names is written once, see
`runner.write_fixes`). `write_fixed` replaces it only when it is still exactly that, under a
per-file lock (`fcntl.flock` on the file itself, so two ampfix runs never interleave their
check and write); through a symlink it writes the target and keeps the link; a file with
several hard links is written through in place, journalled (see "in-place writes" below);
otherwise a temporary file in the same folder (same mode and owner) is renamed over it. A
read-only file is refused. A full disk or a short write leaves the file as it was. Temporary
files are named `.NAME.XXXXXXXX.ampfix.tmp` next to NAME; one left behind by a killed run is
removed by the next run that writes NAME (or that rewrites files in its folder).
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import re
import stat
import time
import tokenize
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from ampfix.engine import signals

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
    dev: int = 0
    ino: int = 0

    @classmethod
    def of(cls, data: bytes, st: os.stat_result) -> "Snapshot":
        return cls(st.st_size, st.st_mtime_ns, hashlib.sha256(data).hexdigest(), st.st_dev, st.st_ino)

    @property
    def identity(self) -> Tuple[int, int]:
        """(device, inode): the same file under two names (hard links, a symlink and its target)."""
        return (self.dev, self.ino)


def read_file(path: str) -> Tuple[bytes, Snapshot]:
    """The bytes of `path` and its snapshot (stat taken on the open file, after reading)."""
    with open(path, "rb") as fh:
        data = fh.read()
        st = os.fstat(fh.fileno())
    return data, Snapshot.of(data, st)


# ----------------------------------------------------------------------------- writing


class WriteRefused(Exception):
    """The file was left as it is; the message says why (one line, no path)."""


class RestorePending(OSError):
    """A write failed half way and so did its rollback: the journal is left for the next run
    (`strerror` is the whole message)."""


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
        if os.path.lexists(journal_of(target)):  # another run was killed writing it since it was read
            note = _recover_locked(target, fd)
            if os.path.lexists(journal_of(target)):
                raise WriteRefused(f"{(note or '').split(': warning: ', 1)[-1]}; nothing was written")
            if note is not None:
                raise WriteRefused(CHANGED)  # restored from the journal: not what was read
        if st.st_nlink > 1:
            _write_in_place(target, data, st)
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


def _write_all(fd: int, data: bytes, offset: int = 0) -> None:
    """`data` written at `offset`, all of it: a short write goes on where it stopped; a write
    that makes no progress is a full disk (OSError ENOSPC)."""
    view = memoryview(data)
    os.lseek(fd, offset, os.SEEK_SET)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[n:]


def _fsync_folder(folder: str) -> None:
    try:
        dfd = os.open(folder or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


# ----------------------------------------------------------------------------- in-place writes
#
# A file with several hard links is written through in place (a rename would give this name a
# new file and leave the other names with the old one): write the new bytes from offset 0, then
# truncate to the new length. Killed between the two, the file would keep the old tail after
# the new end - and might even still parse. So the old and the new bytes are first written to a
# journal next to the file (`.NAME.ampfix.journal`, fsynced, renamed into place); the write
# follows, and the journal is removed when the file is complete. A write that fails (a full
# disk, a short write, a failing truncate) is rolled back from memory at once; a run that was
# killed leaves the journal, and the next run that reads the file restores it (`recover`).

JOURNAL_SUFFIX = ".ampfix.journal"
_JOURNAL_MAGIC = b"ampfix-journal-1\n"


def journal_of(target: str) -> str:
    folder, name = os.path.split(target)
    return os.path.join(folder, f".{name}{JOURNAL_SUFFIX}")


def _journal_bytes(st: os.stat_result, old: bytes, new: bytes) -> bytes:
    head = {"dev": st.st_dev, "ino": st.st_ino, "old_len": len(old), "new_len": len(new),
            "old_sha256": hashlib.sha256(old).hexdigest(), "new_sha256": hashlib.sha256(new).hexdigest()}
    text = json.dumps(head, sort_keys=True)
    head["sum"] = hashlib.sha256(text.encode()).hexdigest()
    return _JOURNAL_MAGIC + json.dumps(head, sort_keys=True).encode() + b"\n" + old + new


def _read_journal(path: str) -> Optional[Tuple[dict, bytes, bytes]]:
    """(header, old bytes, new bytes), or None when the journal is not one ampfix wrote whole."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    if not raw.startswith(_JOURNAL_MAGIC):
        return None
    nl = raw.find(b"\n", len(_JOURNAL_MAGIC))
    try:
        head = json.loads(raw[len(_JOURNAL_MAGIC):nl])
        body = {k: head[k] for k in ("dev", "ino", "old_len", "new_len", "old_sha256", "new_sha256")}
        if hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest() != head["sum"]:
            return None
        old = raw[nl + 1: nl + 1 + head["old_len"]]
        new = raw[nl + 1 + head["old_len"]:]
    except (ValueError, KeyError, TypeError):
        return None
    if (hashlib.sha256(old).hexdigest(), hashlib.sha256(new).hexdigest()) != (head["old_sha256"], head["new_sha256"]):
        return None
    return head, old, new


def _write_journal(target: str, st: os.stat_result, old: bytes, new: bytes) -> str:
    folder, name = os.path.split(target)
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=TEMP_SUFFIX, dir=folder or ".")
    try:
        try:
            _write_all(fd, _journal_bytes(st, old, new))
            os.fsync(fd)
        finally:
            os.close(fd)
        path = journal_of(target)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_folder(folder)
    return path


def _put(fd: int, data: bytes) -> None:
    """The file's content becomes `data` (in place: the write, then the truncate)."""
    _write_all(fd, data)
    if os.fstat(fd).st_size != len(data):
        os.ftruncate(fd, len(data))
    os.fsync(fd)


def _write_in_place(target: str, data: bytes, st: os.stat_result) -> None:
    """Write through the file itself (it has other hard links that must see the change),
    journalled (see above)."""
    with open(target, "rb") as fh:
        old = fh.read()
    try:
        journal = _write_journal(target, st, old, data)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot write the journal next to the file ({exc.strerror or exc})") from None
    with signals.critical():  # Ctrl-C / SIGTERM wait for the write (or its rollback)
        fd = os.open(target, os.O_RDWR)
        try:
            try:
                _put(fd, data)
            except BaseException as exc:
                try:
                    _put(fd, old)
                except OSError:  # the journal stays: the next run restores the file
                    raise RestorePending(getattr(exc, "errno", None) or errno.EIO,
                                         f"cannot write: {getattr(exc, 'strerror', None) or exc}, and the file could "
                                         f"not be put back either: the next ampfix run restores it from {journal}"
                                         ) from None
                os.unlink(journal)
                raise
        finally:
            os.close(fd)
        os.unlink(journal)


def _mixes(current: bytes, old: bytes, new: bytes) -> bool:
    """Whether `current` is what an interrupted in-place write of `new` over `old` can leave:
    a prefix of the new bytes, then the old ones (a killed process); or, after a power cut,
    pieces of either (blocks of 512 bytes, split where either version ends), with the length
    of one of them."""
    k = 0
    limit = min(len(current), len(new))
    step = 4096
    while k < limit and current[k: k + step] == new[k: k + step]:
        k += step
    while k < limit and current[k] == new[k]:
        k += 1
    k = min(k, limit)
    if len(current) == max(len(old), k) and current[k:] == old[k:len(current)]:
        return True
    if len(current) not in (len(old), len(new), max(len(old), len(new))):
        return False
    cuts = sorted({*range(0, len(current), 512), len(old), len(new), len(current)})
    for a, b in zip(cuts, cuts[1:]):
        if b > len(current):
            break
        piece = current[a:b]
        if not ((b <= len(old) and piece == old[a:b]) or (b <= len(new) and piece == new[a:b])):
            return False
    return True


def _recover_locked(target: str, fd: int, shown: Optional[str] = None) -> Optional[str]:
    """Complete or roll back what a journal next to `target` records (the lock is held):
    None when there was nothing to say, else a warning line (about `shown`, the name the file
    was given by)."""
    path = journal_of(target)
    name = shown or target
    found = _read_journal(path)
    if found is None:
        if not os.path.lexists(path):
            return None
        return (f"{name}: warning: {path} is not a journal ampfix can read; nothing was restored (delete it "
                "once the file is right)")
    head, old, new = found
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (head["dev"], head["ino"]):
        return (f"{name}: warning: {path} is the journal of an interrupted rewrite of another file that was "
                "at this path; nothing was restored (delete it once the file is right)")
    with open(target, "rb") as fh:
        current = fh.read()
    if current in (old, new):  # not begun, or complete: nothing to restore
        os.unlink(path)
        return None
    if not _mixes(current, old, new):
        return (f"{name}: warning: {path} is the journal of an interrupted rewrite, but the file was changed "
                "since; nothing was restored (delete the journal once the file is right)")
    with signals.critical():
        wfd = os.open(target, os.O_RDWR)
        try:
            _put(wfd, old)
        finally:
            os.close(wfd)
        os.unlink(path)
    return (f"{name}: warning: restored as it was before an interrupted rewrite (the file was half "
            "written; from its journal)")


def recover(path: str) -> Optional[str]:
    """Restore `path` from the journal a killed in-place write left next to it, under the
    file's lock; None when there was none (or nothing to say), else a warning line."""
    target = os.path.realpath(path)
    if not os.path.lexists(journal_of(target)):
        return None
    try:
        fd = os.open(target, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            _lock(fd)
        except WriteRefused as exc:
            return f"{path}: warning: a journal of an interrupted rewrite is left, and {exc}"
        try:
            return _recover_locked(target, fd, path)
        except OSError as exc:
            return (f"{path}: warning: the file could not be restored from its journal "
                    f"({exc.strerror or exc}); the next run tries again")
    finally:
        os.close(fd)


class Journals:
    """Which files of a run have a journal next to them: one folder listing per folder."""

    def __init__(self) -> None:
        self._names: Dict[str, set] = {}

    def _has(self, target: str) -> bool:
        folder, name = os.path.split(target)
        if folder not in self._names:
            try:
                self._names[folder] = {e for e in os.listdir(folder or ".") if e.endswith(JOURNAL_SUFFIX)}
            except OSError:
                self._names[folder] = set()
        return f".{name}{JOURNAL_SUFFIX}" in self._names[folder]

    def recover(self, path: str) -> Optional[str]:
        if self._has(path) or (os.path.islink(path) and self._has(os.path.realpath(path))):
            return recover(path)
        return None


def _replace(target: str, data: bytes, st: os.stat_result) -> None:
    folder, name = os.path.split(target)
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=TEMP_SUFFIX, dir=folder or ".")
    try:
        try:
            _write_all(fd, data)  # a full disk: OSError, the temporary file goes, the file is as it was
            if hasattr(os, "fchown"):
                try:
                    os.fchown(fd, st.st_uid, st.st_gid)
                except PermissionError:  # not root: keep at least the group when allowed
                    try:
                        os.fchown(fd, -1, st.st_gid)
                    except PermissionError:
                        pass
            os.chmod(tmp, stat.S_IMODE(st.st_mode))  # after chown, which may clear set-id bits
            os.fsync(fd)
        finally:
            os.close(fd)
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


__all__ = ["CHANGED", "Journals", "Snapshot", "WriteRefused", "journal_of", "read_file", "recover",
           "remove_stale_temp_files", "restore_layout", "split_lines", "sweep_folders", "temp_files_of", "working_text",
           "write_atomically", "write_fixed"]
