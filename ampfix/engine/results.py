"""The results of a check (findings, errors, per-file results), the settings, and decoding a
file: everything a warm run (all cache hits) needs, without importing LibCST or the rules.
`ampfix.engine.analyze` re-exports these names."""

from __future__ import annotations

import codecs
import difflib
from dataclasses import dataclass, field, fields
from typing import Dict, List, Optional, Tuple

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
    # not part of the JSON report: the lines where a `# noqa` silences the finding, and (when
    # asked for with Settings.details) the fix as edits and the source lines reported
    noqa_lines: Tuple[int, ...] = field(default=(), repr=False, compare=False)
    fix_edit: Optional["FixEdit"] = field(default=None, repr=False, compare=False)
    source_lines: Tuple[str, ...] = field(default=(), repr=False, compare=False)

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _NOT_JSON}


_NOT_JSON = ("noqa_lines", "fix_edit", "source_lines")


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

    def __str__(self) -> str:
        where = self.path
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        return f"{where}: error: {self.message}"


@dataclass
class FileResult:
    path: str
    diagnostics: List[Diagnostic] = field(default_factory=list)
    error: Optional[FileError] = None
    new_source: Optional[bytes] = None  # set by fixing when the file changed
    old_source: Optional[bytes] = None
    fixed: Dict[str, int] = field(default_factory=dict)  # "CODE" or "CODE: what" -> fixes applied
    found: Dict[str, int] = field(default_factory=dict)  # fixing: "CODE" -> findings before any fix
    notes: List[str] = field(default_factory=list)  # warnings about this file (exit status unchanged)


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
    unsafe_fixes: bool = False
    details: bool = False  # checking: attach each finding's fix as edits and a diff (FixEdit)
    add_noqa: bool = False  # "fixing" adds `# noqa: CODE` for each finding instead


def unified_diff(old: str, new: str, fromfile: str, tofile: str, context: int = 3) -> str:
    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                 fromfile=fromfile, tofile=tofile, n=context)
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def diff_names(path: str) -> Tuple[str, str]:
    rel = not path.startswith("/") and path not in ("-",)
    return (f"a/{path}", f"b/{path}") if rel else (path, path)
