"""A persistent cache of `ampfix check` results, so that a re-run over an unchanged tree parses
nothing (ruff-style).

* Where: `$AMPFIX_CACHE_DIR`, else `.ampfix_cache/` next to the pyproject.toml that configures
  ampfix (else in the current folder). The folder holds a `.gitignore` (`*`) and a
  `CACHEDIR.TAG`, so that it is never committed nor backed up.
* Key of an entry: a SHA-256 over the file's content and reported path, ampfix's version and a
  fingerprint of its own code (a hash of the content of every module of ampfix and of its
  rules: an edited rule invalidates the cache), the rule codes that apply to the file and the
  settings.
* An entry is JSON (never pickle: a cache folder can come with a checkout), written to a
  temporary file in the same folder and renamed into place, so concurrent runs never read half
  an entry. It is believed only when it passes the checks of `ampfix.engine.entries` (its
  kind, its key, a checksum, and the kind's validator: a finding of this file, by a rule that
  applies to it, at a real position); anything else (unreadable, malformed, edited, copied
  from another key) is a miss, and the file is analysed.
* Only checking is cached: `rewrite`, `--add-noqa` and the detailed formats (fix edits) always
  analyse.
* Every verdict on a file is kept, "no selected rule's trigger" and "cannot decode" included, and
  the cache is looked up before anything else (`runner.run`): a warm run hashes and reads, and
  imports neither LibCST nor the rules. What it needs to know of the rules (codes, default set,
  triggers) is kept here too, as `v<version>/rules-<fingerprint>.json` (`ampfix.engine.rulemeta`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Optional, Sequence

from ampfix import __version__
from ampfix.engine import entries as E
from ampfix.engine.results import Diagnostic, FileError, FileResult, Settings
from ampfix.engine.rulemeta import fingerprint as _code_fingerprint, write_json

DIR_NAME = ".ampfix_cache"


def cache_dir(project_root: Path) -> Path:
    env = os.environ.get("AMPFIX_CACHE_DIR")
    return Path(env) if env else project_root / DIR_NAME


# ----------------------------------------------------------------------------- kinds of entry
# One encoder and one validator per kind (see ampfix/engine/entries.py); a new kind of entry
# (a project summary, say) is one more `E.Kind` and its two functions.

FIXES = (None, "safe", "unsafe", "display")


def _encode_result(result: FileResult) -> dict:
    return {
        "diagnostics": [{**d.to_json(), "noqa_lines": list(d.noqa_lines)} for d in result.diagnostics],
        "error": None if result.error is None else dict(result.error.__dict__),
    }


def _decode_diagnostic(raw, path: str, codes: Optional[Sequence[str]]) -> Diagnostic:
    d = E.obj(raw, ["path", "line", "column", "end_line", "end_column", "code", "name", "message", "fix", "cell",
                    "noqa_lines"])
    if d["path"] != path:
        raise E.Invalid("a finding of another file")
    line, end_line = E.integer(d["line"], 1), E.integer(d["end_line"], 1)
    column, end_column = E.integer(d["column"], 1), E.integer(d["end_column"], 1)
    if (end_line, end_column) < (line, column):
        raise E.Invalid("a range that ends before it starts")
    code = E.string(d["code"], nonempty=True)
    if codes is not None and code not in codes:
        raise E.Invalid(f"{code} is not a rule that applies to the file")
    if d["fix"] not in FIXES:
        raise E.Invalid(f"fix {d['fix']!r}")
    return Diagnostic(path=path, line=line, column=column, end_line=end_line, end_column=end_column, code=code,
                      name=E.string(d["name"], nonempty=True), message=E.string(d["message"], nonempty=True),
                      fix=d["fix"], cell=E.optional_integer(d["cell"], 1),
                      noqa_lines=tuple(E.array(d["noqa_lines"], lambda n: E.integer(n, 1))))


def _decode_result(data, path: str, codes: Optional[Sequence[str]] = None) -> FileResult:
    """The validator of a file's result: findings of this file, by rules that apply to it,
    with positions that are positions; an error only of the kinds that are kept."""
    raw = E.obj(data, ["diagnostics", "error"])
    result = FileResult(path=path)
    result.diagnostics = E.array(raw["diagnostics"], lambda d: _decode_diagnostic(d, path, codes))
    if raw["error"] is not None:
        err = E.obj(raw["error"], ["path", "line", "column", "message"])
        message = E.string(err["message"], nonempty=True)
        if not isinstance(err["path"], str) or not err["path"].startswith(path):
            raise E.Invalid("an error of another file")
        result.error = FileError(err["path"], E.optional_integer(err["line"], 1), E.optional_integer(err["column"], 1),
                                 message)
        if not cacheable(result):
            raise E.Invalid("an error that is never kept")
    return result


RESULT = E.Kind("result", _encode_result, _decode_result)


class Cache:
    def __init__(self, folder: Path):
        self.folder = folder
        self.bucket = folder / ("v" + __version__)
        self._ready = False
        self.hits = self.misses = 0

    def key(self, path: str, data: bytes, codes: Sequence[str], settings: Settings) -> str:
        h = hashlib.sha256()
        h.update(_code_fingerprint(self.folder).encode())
        h.update(json.dumps([path, list(codes), repr(settings)]).encode())
        h.update(b"\0")
        h.update(data)
        return h.hexdigest()

    def _entry(self, key: str) -> Path:
        return self.bucket / key[:2] / key

    def load(self, kind: E.Kind, key: str, **context):
        """The object kept under `key`, or None: missing, unreadable, or failing the entry's
        checks (ampfix/engine/entries.py and the kind's validator) is a miss."""
        try:
            value = kind.decode(E.unseal(self._entry(key).read_bytes(), kind.name, key), **context)
        except (OSError, E.Invalid):
            self.misses += 1
            return None
        self.hits += 1
        return value

    def store(self, kind: E.Kind, key: str, value) -> None:
        try:
            self._prepare()
        except OSError:
            return  # a cache that cannot be written costs speed, never the check
        try:
            entry = E.seal(kind.name, key, kind.encode(value))
        except (ValueError, TypeError):
            return  # not JSON (a NaN, say): not kept
        write_json(self._entry(key), entry)

    def get(self, key: str, path: str, codes: Optional[Sequence[str]] = None) -> Optional[FileResult]:
        """The result kept for `path` under `key` (None: a miss); with `codes`, a finding of
        any other rule makes the entry a miss."""
        return self.load(RESULT, key, path=path, codes=codes)

    def put(self, key: str, result: FileResult) -> None:
        if result.new_source is not None:
            return
        self.store(RESULT, key, result)

    def _prepare(self) -> None:
        if self._ready:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        for name, text in ((".gitignore", "# created by ampfix\n*\n"),
                           ("CACHEDIR.TAG", "Signature: 8a477f597d28d172789f06886806bc55\n"
                                            "# This file is a cache directory tag created by ampfix.\n")):
            f = self.folder / name
            if not f.exists():
                try:
                    f.write_text(text, encoding="utf-8")
                except OSError:
                    pass
        self._ready = True


def cacheable(result: FileResult) -> bool:
    """Results worth keeping: findings, and errors that depend on the content alone."""
    if result.error is None:
        return True
    return result.error.message.startswith(("syntax error", "cannot decode", "file contains a NUL",
                                            "cannot determine the encoding", "not analysed: the code is nested"))
