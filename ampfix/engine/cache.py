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
  applies to it, at a real position, with related locations, fix edits and dependencies of
  the shapes ampfix writes); anything else (unreadable, malformed, edited, copied from
  another key) is a miss, and the file is analysed.
* Only checking is cached: `rewrite` and `--add-noqa` always analyse. A report that carries the
  fixes (`json`, `sarif`, `full`) keeps them in its entries (their settings differ, so they are
  entries of their own).
* A result that depends on other modules of the project (`FileResult.deps`: path -> SHA-256)
  is a miss as soon as one of them changed; one that depends on an answer of the project's
  import graph (`ampfix/project/graph.py`: import lines and text scans only, no LibCST) as soon
  as that answer, asked again of the project's current files, changed: the files importing a
  module (`importers:` + path: a new file, or a file that starts importing it), what a file's
  import lines resolve to (`imports:` + path: a new module makes an import resolve, or shadows
  what it resolved to), the files that may call a function (`callers:` + path + `:` + name: a
  new file, or a file that starts calling it). Module summaries (the project layer's store,
  `Summaries`) are entries of their own kind, sealed and validated the same way.
* Every verdict on a file is kept, "no selected rule's trigger" and "cannot decode" included, and
  the cache is looked up before anything else (`runner.run`): a warm run hashes and reads, and
  imports neither LibCST nor the rules. What it needs to know of the rules (codes, default set,
  triggers) comes from the shipped table, or, when the rules' sources are not the ones it was
  made for, is kept here too, as `v<version>/rules-<digest>.json` (`ampfix.engine.rulemeta`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence

from ampfix import __version__
from ampfix.engine import entries as E
from ampfix.engine.results import Diagnostic, FileError, FileResult, FixEdit, Settings, TextEdit, file_digest
from ampfix.engine.rulemeta import fingerprint as _code_fingerprint, write_json
from ampfix.project.graph import CACHE_TAG, CALLERS, GRAPH_DEPS, IMPORTERS, SUBCLASSES, split_dep

DIR_NAME = ".ampfix_cache"


def cache_dir(project_root: Path) -> Path:
    env = os.environ.get("AMPFIX_CACHE_DIR")
    return Path(env) if env else project_root / DIR_NAME


# ----------------------------------------------------------------------------- kinds of entry
# One encoder and one validator per kind (see ampfix/engine/entries.py); a new kind of entry
# (a project summary, say) is one more `E.Kind` and its two functions.

FIXES = (None, "safe", "unsafe", "display")
LEVELS = ("error", "warning", "note")


def _encode_error(e: FileError) -> dict:
    return dict(e.__dict__)


def _encode_result(result: FileResult) -> dict:
    return {
        "diagnostics": [{**d.to_json(), "noqa_lines": list(d.noqa_lines), "source_lines": list(d.source_lines),
                         "fix_edit": _fix_json(d.fix_edit)} for d in result.diagnostics],
        "error": None if result.error is None else _encode_error(result.error),
        "notes": [_encode_error(n) for n in result.notes],
        "deps": dict(result.deps),
    }


def _range(line: int, column: int, end_line: int, end_column: int) -> None:
    if (end_line, end_column) < (line, column):
        raise E.Invalid("a range that ends before it starts")


def _decode_related(raw) -> dict:
    r = E.obj(raw, ["path", "line", "column", "message"])
    return {"path": E.string(r["path"], nonempty=True), "line": E.integer(r["line"], 1),
            "column": E.integer(r["column"], 0), "message": E.string(r["message"])}


def _decode_cell_region(raw) -> Optional[tuple]:
    if raw is None:
        return None
    region = tuple(E.array(raw, lambda n: E.integer(n, 1)))
    if len(region) != 4:
        raise E.Invalid("a cell region is four numbers")
    _range(*region)
    return region


def _decode_text_edit(raw) -> TextEdit:
    e = E.array(raw, lambda v: v)
    if len(e) != 5:
        raise E.Invalid("an edit is five values")
    start_line, start_column, end_line, end_column = (E.integer(v, 1) for v in e[:4])
    _range(start_line, start_column, end_line, end_column)
    return TextEdit(start_line, start_column, end_line, end_column, E.string(e[4]))


def _decode_fix_edit(raw) -> Optional[FixEdit]:
    if raw is None:
        return None
    f = E.obj(raw, ["description", "applicability", "edits", "diff"])
    edits = None if f["edits"] is None else E.array(f["edits"], _decode_text_edit)
    return FixEdit(E.string(f["description"], nonempty=True), E.string(f["applicability"], choices=FIXES[1:]),
                   edits, E.string(f["diff"]))


def _decode_diagnostic(raw, path: str, codes: Optional[Sequence[str]]) -> Diagnostic:
    d = E.obj(raw, ["path", "line", "column", "end_line", "end_column", "code", "name", "message", "fix", "cell",
                    "related", "cell_region", "noqa_lines", "source_lines", "fix_edit"])
    if d["path"] != path:
        raise E.Invalid("a finding of another file")
    line, end_line = E.integer(d["line"], 1), E.integer(d["end_line"], 1)
    column, end_column = E.integer(d["column"], 1), E.integer(d["end_column"], 1)
    _range(line, column, end_line, end_column)
    code = E.string(d["code"], nonempty=True)
    if codes is not None and code not in codes:
        raise E.Invalid(f"{code} is not a rule that applies to the file")
    if d["fix"] not in FIXES:
        raise E.Invalid(f"fix {d['fix']!r}")
    return Diagnostic(path=path, line=line, column=column, end_line=end_line, end_column=end_column, code=code,
                      name=E.string(d["name"], nonempty=True), message=E.string(d["message"], nonempty=True),
                      fix=d["fix"], cell=E.optional_integer(d["cell"], 1),
                      related=tuple(E.array(d["related"], _decode_related)),
                      cell_region=_decode_cell_region(d["cell_region"]),
                      noqa_lines=tuple(E.array(d["noqa_lines"], lambda n: E.integer(n, 1))),
                      source_lines=tuple(E.array(d["source_lines"], E.string)),
                      fix_edit=_decode_fix_edit(d["fix_edit"]))


def _decode_error(raw, path: str) -> FileError:
    err = E.obj(raw, ["path", "line", "column", "message", "cell", "level"])
    if not isinstance(err["path"], str) or not err["path"].startswith(path):
        raise E.Invalid("an error of another file")
    return FileError(err["path"], E.optional_integer(err["line"], 1), E.optional_integer(err["column"], 1),
                     E.string(err["message"], nonempty=True), cell=E.optional_integer(err["cell"], 1),
                     level=E.string(err["level"], choices=LEVELS))


def _decode_deps(raw) -> Dict[str, str]:
    if not isinstance(raw, dict):
        raise E.Invalid(f"deps: expected an object, got {type(raw).__name__}")
    for p, digest in raw.items():
        E.string(p, nonempty=True)
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise E.Invalid(f"deps: {p!r} has no SHA-256")
    return dict(raw)


_SHA256 = re.compile(r"[0-9a-f]{64}")


def _decode_result(data, path: str, codes: Optional[Sequence[str]] = None,
                   fresh: Optional[Callable[[str, str], bool]] = None) -> FileResult:
    """The validator of a file's result: findings of this file, by rules that apply to it,
    with positions that are positions (related locations, cell regions and fix edits
    included); an error only of the kinds that are kept; notes of this file; dependencies as
    path -> SHA-256, each still of that content (`fresh`), else a miss."""
    raw = E.obj(data, ["diagnostics", "error", "notes", "deps"])
    result = FileResult(path=path)
    result.diagnostics = E.array(raw["diagnostics"], lambda d: _decode_diagnostic(d, path, codes))
    if raw["error"] is not None:
        result.error = _decode_error(raw["error"], path)
        if result.error.level != "error" or not cacheable(result):
            raise E.Invalid("an error that is never kept")
    result.notes = E.array(raw["notes"], lambda n: _decode_error(n, path))
    deps = _decode_deps(raw["deps"])
    if fresh is not None and not all(fresh(p, d) for p, d in deps.items()):
        raise E.Invalid("a module this result depends on changed")
    result.deps = deps
    return result


RESULT = E.Kind("result", _encode_result, _decode_result)


def _decode_graph(data) -> Dict[str, str]:
    """The validator of a project's graph answers kept under its graph's stamp: dependency
    key -> SHA-256, as `deps` are."""
    return _decode_deps(data)


GRAPH = E.Kind("graph", dict, _decode_graph)


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

    def _fresh(self, path: str, digest: str) -> bool:
        """A module a cached result depends on still has the content it had, or an answer of
        the project's import graph is still the one it was (each hashed once a run)."""
        seen = self.__dict__.setdefault("_digests", {})
        if path not in seen:
            seen[path] = self._graph_digest(path) if path.startswith(GRAPH_DEPS) else file_digest(path) or ""
        return seen[path] == digest

    def _graph_digest(self, key: str) -> str:
        """The digest of a dependency on the import graph (`graph.split_dep`) as the project's
        files are now (the root found as the analysis finds it, once per folder and run)."""
        from ampfix.project.graph import digest_of_paths
        from ampfix.project.layout import find_root

        kind, path, qual = split_dep(key) or ("", key, None)
        roots = self.__dict__.setdefault("_roots", {})
        folder = os.path.dirname(path)
        if folder not in roots:
            roots[folder] = str(find_root(Path(folder)))
        root = roots[folder]
        if kind in (CALLERS, SUBCLASSES):
            return self._callers_digest(root, key, path, qual or "", kind)
        found = self._graph_digests(root).get(key)
        if found is not None:
            return found
        if kind == IMPORTERS:
            return digest_of_paths([])  # a module no file imports
        graph = self.__dict__["_graph_objects"][root]
        return digest_of_paths([]) if path in graph.files() else graph.imports_digest(path)  # no import lines, or a file the walk skips

    def _graph_key(self, root: str, *more: str) -> str:
        """The key of what the cache keeps of the graph of `root` as its files are now (its
        `stamp`, taken once per root and run), and of `more`."""
        stamps = self.__dict__.setdefault("_stamps", {})
        if root not in stamps:
            from ampfix.project.graph import ImportGraph

            graph = self.__dict__.setdefault("_graph_objects", {})[root] = ImportGraph(Path(root))
            stamps[root] = f"{_code_fingerprint(self.folder)}\0{root}\0{graph.stamp()}"
        return hashlib.sha256("\0".join((stamps[root], *more)).encode("utf-8", "surrogatepass")).hexdigest()

    def _graph_digests(self, root: str) -> Dict[str, str]:
        """`ImportGraph.digests` of the project at `root` (importers and imports), once per root
        and run: kept in the cache under the graph's `stamp`, so that a warm run over an
        unchanged tree stats its files instead of reading and resolving their imports."""
        graphs = self.__dict__.setdefault("_graphs", {})
        if root in graphs:
            return graphs[root]
        key = self._graph_key(root)
        graphs[root] = self._kept_graph(key, lambda: self.__dict__["_graph_objects"][root].digests())
        return graphs[root]

    def _callers_digest(self, root: str, key: str, path: str, qual: str, kind: str = CALLERS) -> str:
        """The digest of a `callers:` (or `subclasses:`) dependency (`ImportGraph.callers_digest`,
        `subclasses_digest`: a scan of the texts of the project), kept in an entry of its own
        under the graph's `stamp`."""
        def scan() -> Dict[str, str]:
            graph = self.__dict__["_graph_objects"][root]
            return {key: graph.callers_digest(path, qual) if kind == CALLERS else graph.subclasses_digest(path, qual)}
        return self._kept_graph(self._graph_key(root, key), scan).get(key, "")

    def _kept_graph(self, key: str, compute: Callable[[], Dict[str, str]]) -> Dict[str, str]:
        entry = self.bucket / "graphs" / key[:2] / key
        try:
            return GRAPH.decode(E.unseal(entry.read_bytes(), GRAPH.name, key))
        except (OSError, E.Invalid):
            digests = compute()
            try:
                self._prepare()
                write_json(entry, E.seal(GRAPH.name, key, GRAPH.encode(digests)))
            except OSError:
                pass  # a cache that cannot be written costs speed, never the check
            return digests

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
        return self.load(RESULT, key, path=path, codes=codes, fresh=self._fresh)

    def put(self, key: str, result: FileResult) -> None:
        if result.new_source is not None:
            return
        self.store(RESULT, key, result)
        for dep in result.deps:
            if dep.startswith(GRAPH_DEPS):  # the graph's answers kept now: the next run only stats
                self._graph_digest(dep)

    def _prepare(self) -> None:
        if self._ready:
            return
        prepare_folder(self.folder)
        self._ready = True


def prepare_folder(folder: Path) -> None:
    """Create the cache folder with its `.gitignore` and `CACHEDIR.TAG` (the import graph
    does not walk a tagged folder: `graph.CACHE_TAG`)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in ((".gitignore", "# created by ampfix\n*\n"),
                       (CACHE_TAG, "Signature: 8a477f597d28d172789f06886806bc55\n"
                                   "# This file is a cache directory tag created by ampfix.\n")):
        f = folder / name
        if not f.exists():
            try:
                f.write_text(text, encoding="utf-8")
            except OSError:
                pass


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
                                            "cannot determine the encoding", "not analysed: the code is nested",
                                            "not analysed: Python accepts this file"))


def _encode_summary(summary) -> dict:
    """A module summary as JSON; None (the module could not be summarised) as `{"unreadable": true}`."""
    return {"unreadable": True} if summary is None else summary.to_json()


def _decode_summary(data, path: str, digest: str):
    """The validator of a module summary read back: `{"unreadable": true}` (`UNREADABLE`: the
    module could not be summarised), or the summary `ModuleSummary.from_json` reads, of this
    module and content."""
    from ampfix.model.summary import UNREADABLE, ModuleSummary  # only a run that reads other modules gets here

    if data == {"unreadable": True}:
        return UNREADABLE
    try:
        summary = ModuleSummary.from_json(data)
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        raise E.Invalid(f"not a module summary: {exc}") from None
    if summary.path != path or summary.digest != digest:
        raise E.Invalid("a summary of another module or content")
    return summary


SUMMARY = E.Kind("summary", _encode_summary, _decode_summary)


class Summaries:
    """Module summaries (`ampfix/model/summary.py`) kept between runs, keyed by the module's
    path and content hash and by ampfix's own code: the project layer's store. Entries are
    sealed and validated as every entry of the cache (`SUMMARY`): a summary of the wrong shape,
    of another module or of other content is a miss, and the module is summarised again."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.bucket = folder / ("v" + __version__) / "summaries"
        self._ready = False

    def _key(self, path: str, digest: str) -> str:
        return hashlib.sha256(f"{_code_fingerprint(self.folder)}\0{path}\0{digest}".encode()).hexdigest()

    def _entry(self, key: str) -> Path:
        return self.bucket / key[:2] / key

    def get(self, path: str, digest: str):
        """The summary kept (a `ModuleSummary`, or `UNREADABLE`), None on a miss."""
        key = self._key(path, digest)
        try:
            return SUMMARY.decode(E.unseal(self._entry(key).read_bytes(), SUMMARY.name, key), path=path, digest=digest)
        except (OSError, E.Invalid):
            return None

    def put(self, path: str, digest: str, summary) -> None:
        """Keep `summary` (None: the module could not be summarised)."""
        key = self._key(path, digest)
        try:
            entry = E.seal(SUMMARY.name, key, SUMMARY.encode(summary))
        except (ValueError, TypeError, RecursionError):
            return  # not JSON: not kept
        if not self._ready:  # (the language server keeps summaries only)
            try:
                prepare_folder(self.folder)
            except OSError:
                return  # a cache that cannot be written costs speed, never the check
            self._ready = True
        write_json(self._entry(key), entry)
