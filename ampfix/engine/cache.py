"""A persistent cache of `ampfix check` results, so that a re-run over an unchanged tree parses
nothing (ruff-style).

* Where: `$AMPFIX_CACHE_DIR`, else `.ampfix_cache/` next to the pyproject.toml that configures
  ampfix (else in the current folder). The folder holds a `.gitignore` (`*`) and a
  `CACHEDIR.TAG`, so that it is never committed nor backed up.
* Key of an entry: a SHA-256 over the file's content and reported path, ampfix's version and a
  fingerprint of its own code (the size and mtime of every module of ampfix and of its rules: an
  edited rule invalidates the cache), the rule codes that apply to the file and the settings.
* An entry is JSON (never pickle: a cache folder can come with a checkout), written to a
  temporary file in the same folder and renamed into place, so concurrent runs never read half
  an entry; an unreadable or malformed entry is a miss.
* Only checking is cached: `rewrite` and `--add-noqa` always analyse. A report that carries the
  fixes (`json`, `sarif`, `full`) keeps them in its entries (their settings differ, so they are
  entries of their own).
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
from ampfix.engine.results import Diagnostic, FileError, FileResult, FixEdit, Settings, TextEdit, file_digest
from ampfix.engine.rulemeta import fingerprint as _code_fingerprint, write_json

DIR_NAME = ".ampfix_cache"


def cache_dir(project_root: Path) -> Path:
    env = os.environ.get("AMPFIX_CACHE_DIR")
    return Path(env) if env else project_root / DIR_NAME


class Cache:
    def __init__(self, folder: Path):
        self.folder = folder
        self.bucket = folder / ("v" + __version__)
        self._ready = False
        self.hits = self.misses = 0

    def key(self, path: str, data: bytes, codes: Sequence[str], settings: Settings) -> str:
        h = hashlib.sha256()
        h.update(_code_fingerprint().encode())
        h.update(json.dumps([path, list(codes), repr(settings)]).encode())
        h.update(b"\0")
        h.update(data)
        return h.hexdigest()

    def _entry(self, key: str) -> Path:
        return self.bucket / key[:2] / key

    def _fresh(self, path: str, digest: str) -> bool:
        """A module a cached result depends on still has the content it had (hashed once a run)."""
        if not isinstance(path, str) or not isinstance(digest, str):
            return False
        seen = self.__dict__.setdefault("_digests", {})
        if path not in seen:
            seen[path] = file_digest(path) or ""
        return seen[path] == digest

    def get(self, key: str, path: str) -> Optional[FileResult]:
        try:
            raw = json.loads(self._entry(key).read_bytes())
            result = FileResult(path=path)
            for d in raw["diagnostics"]:
                d["noqa_lines"] = tuple(d.get("noqa_lines", ()))
                d["related"] = tuple(dict(r) for r in d.get("related", ()))
                d["source_lines"] = tuple(d.get("source_lines", ()))
                if d.get("cell_region") is not None:
                    d["cell_region"] = tuple(d["cell_region"])
                fix = d.get("fix_edit")
                if fix is not None:
                    edits = fix["edits"]
                    d["fix_edit"] = FixEdit(fix["description"], fix["applicability"],
                                            None if edits is None else [TextEdit(*e) for e in edits], fix["diff"])
                result.diagnostics.append(Diagnostic(**d))
            if raw.get("error") is not None:
                result.error = FileError(**raw["error"])
            result.notes = [FileError(**n) for n in raw.get("notes", ())]
            deps = raw.get("deps") or {}
            if not isinstance(deps, dict) or not all(self._fresh(p, d) for p, d in deps.items()):
                raise ValueError("a module this result depends on changed")
            result.deps = dict(deps)
        except (OSError, ValueError, TypeError, KeyError):
            self.misses += 1
            return None
        self.hits += 1
        return result

    def put(self, key: str, result: FileResult) -> None:
        if result.new_source is not None:
            return
        entry = {
            "diagnostics": [{**d.to_json(), "noqa_lines": list(d.noqa_lines), "source_lines": list(d.source_lines),
                             "fix_edit": _fix_json(d.fix_edit)} for d in result.diagnostics],
            "error": None if result.error is None else result.error.__dict__,
            "notes": [n.__dict__ for n in result.notes],
            "deps": result.deps,
        }
        target = self._entry(key)
        try:
            self._prepare()
        except OSError:
            return  # a cache that cannot be written costs speed, never the check
        write_json(target, entry)

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


def _fix_json(fix: Optional[FixEdit]) -> Optional[dict]:
    if fix is None:
        return None
    edits = None if fix.edits is None else [[e.start_line, e.start_column, e.end_line, e.end_column, e.text]
                                            for e in fix.edits]
    return {"description": fix.description, "applicability": fix.applicability, "edits": edits, "diff": fix.diff}


def cacheable(result: FileResult) -> bool:
    """Results worth keeping: findings, and errors that depend on the content alone."""
    if result.error is None:
        return True
    return result.error.message.startswith(("syntax error", "cannot decode", "file contains a NUL",
                                            "cannot determine the encoding", "not analysed: the code is nested"))


class Summaries:
    """Module summaries (`ampfix/model/summary.py`) kept between runs, keyed by the module's
    path and content hash and by ampfix's own code: the project layer's store."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.bucket = folder / ("v" + __version__) / "summaries"

    def _entry(self, path: str, digest: str) -> Path:
        key = hashlib.sha256(f"{_code_fingerprint()}\0{path}\0{digest}".encode()).hexdigest()
        return self.bucket / key[:2] / key

    def get(self, path: str, digest: str) -> Optional[dict]:
        try:
            raw = json.loads(self._entry(path, digest).read_bytes())
        except (OSError, ValueError):
            return None
        return raw if isinstance(raw, dict) else None

    def put(self, path: str, digest: str, data: dict) -> None:
        write_json(self._entry(path, digest), data)

