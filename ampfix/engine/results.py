"""The results of a check (findings, errors, per-file results), the settings, and decoding a
file: everything a warm run (all cache hits) needs, without importing LibCST or the rules.
`ampfix.engine.analyze` re-exports these names."""

from __future__ import annotations

import codecs
import os
from dataclasses import dataclass, field, fields
from typing import Dict, List, Optional, Sequence, Tuple

from ampfix.engine import fileio
from ampfix.knowledge.torch_versions import DEFAULT_MIN_TORCH


# ----------------------------------------------------------------------------- results


@dataclass
class Diagnostic:
    path: str
    line: int
    column: int  # 1-based
    end_line: int
    end_column: int
    code: str
    name: str
    message: str
    fix: Optional[str] = None  # "safe", "unsafe", "display" or None
    cell: Optional[int] = None  # notebooks: the 1-based cell; line and columns are within the cell
    # code of other modules that is part of the cause: ({"path", "line", "column", "message"}, ...)
    related: Tuple[Dict[str, object], ...] = ()
    #: notebooks: (line, column, end line, end column) in the notebook's JSON text of the
    #: source lines reported (SARIF regions, GitHub annotations); None when unknown
    cell_region: Optional[Tuple[int, int, int, int]] = None
    # not part of the JSON report: the lines where a `# noqa` silences the finding, and (when
    # asked for with Settings.details) the fix as edits and the source lines reported
    noqa_lines: Tuple[int, ...] = field(default=(), repr=False, compare=False)
    fix_edit: Optional["FixEdit"] = field(default=None, repr=False, compare=False)
    source_lines: Tuple[str, ...] = field(default=(), repr=False, compare=False)

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _NOT_JSON}


_NOT_JSON = ("noqa_lines", "fix_edit", "source_lines")


def error_objects(missing: Sequence[str], problems: Sequence[str], results: Sequence["FileResult"],
                  more: Sequence[str] = ()) -> List["FileError"]:
    """Every input error of a run as a FileError (for the formats that carry them), then the
    notes (files or cells skipped) as warnings."""
    out = [FileError(m, None, None, "no such file or directory") for m in missing]
    out.extend(FileError.parse(p) for p in problems)
    out.extend(r.error for r in results if r.error is not None)
    out.extend(FileError.parse(p) for p in more)
    out.extend(n for r in results for n in r.notes)
    return out


@dataclass
class TextEdit:
    """Replace the text from (start_line, start_column) up to (end_line, end_column) (1-based,
    end exclusive, columns in code points) with `text`."""

    start_line: int
    start_column: int
    end_line: int
    end_column: int
    text: str


@dataclass
class FixEdit:
    """One finding's fix, on its own: what `ampfix rewrite` would change for it."""

    description: str
    applicability: str  # "safe", "unsafe" or "display"
    edits: Optional[List[TextEdit]]  # None when they cannot be given in the finding's coordinates
    diff: str  # unified diff of the change


@dataclass
class FileError:
    path: str
    line: Optional[int]
    column: Optional[int]
    message: str
    cell: Optional[int] = None  # notebooks: the 1-based cell the line is in
    level: str = "error"  # or "warning": a file skipped (the exit status is not changed by it)

    def __str__(self) -> str:
        where = self.path
        if self.cell is not None:
            where += f":cell {self.cell}"
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        return f"{where}: {self.level}: {self.message}"

    @classmethod
    def parse(cls, line: str, level: str = "error") -> "FileError":
        """A `PATH: error: MESSAGE` line (as discovery and writing report them) as a FileError."""
        path, sep, message = line.partition(f": {level}: ")
        return cls(path, None, None, message, level=level) if sep else cls("", None, None, line, level=level)

    @property
    def kind(self) -> str:
        """What went wrong, as a code for the machine formats (ruff's `invalid-syntax` and
        `io-error`; `invalid-input` for a file ampfix cannot read as Python or as a notebook;
        `internal-error` for ampfix's own failure; `skipped` for a warning)."""
        m = self.message
        if self.level != "error":
            return "skipped"
        if m.startswith("syntax error"):
            return "invalid-syntax"
        if m.startswith(("cannot read", "no such file", "cannot write", "the file changed on disk")):
            return "io-error"
        if m.startswith(("internal error", "not analysed: the parser crashed")):
            return "internal-error"
        return "invalid-input"


@dataclass
class FileResult:
    path: str
    diagnostics: List[Diagnostic] = field(default_factory=list)
    error: Optional[FileError] = None
    new_source: Optional[bytes] = None  # set by fixing when the file changed
    old_source: Optional[bytes] = None
    fixed: Dict[str, int] = field(default_factory=dict)  # "CODE" or "CODE: what" -> fixes applied
    found: Dict[str, int] = field(default_factory=dict)  # fixing: "CODE" -> findings before any fix
    notes: List[FileError] = field(default_factory=list)  # parts skipped (a notebook cell that is not Python)
    skipped: bool = False  # not analysed at all (over max-file-size, stdin's name excluded): not counted as checked
    # the other modules of the project the result depends on: path -> SHA-256 of its bytes, and
    # the answers of the project's import graph it used (ampfix/project/graph.py: "importers:" + path,
    # "imports:" + path, "callers:" + path + ":" + name -> SHA-256 of the answer);
    # a cached result is used only while each of them is unchanged
    deps: Dict[str, str] = field(default_factory=dict)


def file_digest(path: str) -> Optional[str]:
    """SHA-256 of a file's bytes (None: unreadable)."""
    import hashlib

    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except OSError:
        return None


_DIGESTS: Dict[str, Tuple[Tuple[int, int, int, int], str]] = {}


def dep_digest(path: str) -> Optional[str]:
    """`file_digest` of a module a result depends on, kept per process while the file's
    `os.stat` (modification and change times, size, inode) is the same: the files of a run
    depend on the same modules, which were read and hashed once per file otherwise."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)
    hit = _DIGESTS.get(path)
    if hit is not None and hit[0] == key:
        return hit[1]
    digest = file_digest(path)
    if digest is not None:
        _DIGESTS[path] = (key, digest)  # (changed between the stat and the read: the next stat differs)
    return digest


class InputError(Exception):
    def __init__(self, error: FileError):
        super().__init__(str(error))
        self.error = error


# ----------------------------------------------------------------------------- decoding


@dataclass
class SourceText:
    text: str
    encoding: str
    bom: bool

    def encode(self, text: str) -> bytes:
        data = text.encode(self.encoding)
        return codecs.BOM_UTF8 + data if self.bom else data


def decode_source(data: bytes, path: str) -> SourceText:
    """Decode like the interpreter does: BOM, then a PEP 263 cookie, else UTF-8."""
    bom = data.startswith(codecs.BOM_UTF8)
    try:
        encoding = fileio.detect_encoding(data)
    except SyntaxError as exc:
        raise InputError(FileError(path, None, None, f"cannot determine the encoding: {exc}")) from None
    if encoding == "utf-8-sig":
        encoding = "utf-8"
    body = data[len(codecs.BOM_UTF8):] if bom else data
    try:
        text = body.decode(encoding)
    except (UnicodeDecodeError, LookupError) as exc:
        line = None
        if isinstance(exc, UnicodeDecodeError):
            line = body[: exc.start].count(b"\n") + 1
            reason = f"cannot decode as {encoding}: byte 0x{body[exc.start]:02x} is not valid here"
        else:
            reason = f"unknown encoding {encoding!r}"
        raise InputError(FileError(path, line, None, reason)) from None
    if "\x00" in text:
        raise InputError(FileError(path, text[: text.index("\x00")].count("\n") + 1, None, "file contains a NUL byte"))
    return SourceText(text, encoding, bom)


@dataclass
class Settings:
    min_torch_version: Tuple[int, ...] = DEFAULT_MIN_TORCH
    #: where min_torch_version comes from, for messages ("" = the default)
    min_torch_source: str = ""
    #: where the project declares it supports a Lightning before 2.0 (`requirements.py`; "": it does not)
    lightning_before_2: str = ""
    #: where the project's requirements admit only a torch before 2.4 (`requirements.py`; "": they do not)
    torch_before_2_4: str = ""
    unsafe_fixes: bool = False
    details: bool = False  # checking: attach each finding's fix as edits and a diff (FixEdit)
    add_noqa: bool = False  # "fixing" adds `# noqa: CODE` for each finding instead
    # read the other modules of the file's project (its imports, base classes, helpers, callers);
    # off for a text with no place on disk (`api.check_source`, tests of one snippet)
    project: bool = False
    cache_folder: Optional[str] = None  # where module summaries are kept between runs (None: nowhere)
    # where a pool's workers hand each other summaries within a run without a cache folder
    # (`runner._sharing`, `engine/share.py`): the run's own private folder
    share_folder: Optional[str] = None
    # the bound on one module's analysis (`max-file-memory`), for the modules the project reads
    # too: one whose estimate is over it is not parsed for its summary (unknown); 0: none
    max_file_memory: int = 0


def unified_diff(old: str, new: str, fromfile: str, tofile: str, context: int = 3) -> str:
    import difflib  # only reports with diffs need it

    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                 fromfile=fromfile, tofile=tofile, n=context)
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def diff_names(path: str) -> Tuple[str, str]:
    rel = not path.startswith("/") and path not in ("-",)
    return (f"a/{path}", f"b/{path}") if rel else (path, path)
