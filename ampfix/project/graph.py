"""The import graph of a project, read from the import lines of its files (regular
expressions, no parse): which of the project's modules a file imports, which files import a
module, and which files may call a function (a text scan).

It imports neither LibCST nor the model, so that the cache can check a result's dependencies on
the project's files as cheaply as it checks a module's content: the project layer (`Project`)
asks it its questions during an analysis, and the cache asks them again, of the project's
current files, before it believes a result. Three kinds of dependency (`FileResult.deps`, key
-> SHA-256):

* `importers:PATH` (`importers_dep`): the files that import the module at PATH;
* `imports:PATH` (`imports_dep`): what the import lines of PATH resolve to (a new file can make
  an unresolved import resolve, or shadow what it resolved to);
* `callers:PATH:QUAL` (`callers_dep`): the files whose text may call function QUAL of PATH
  (`caller_candidates`, the scan before any parse);
* `subclasses:PATH:NAME` (`subclasses_dep`): the files whose text may define a subclass of
  class NAME of PATH (`subclass_candidates`).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Tuple

from ampfix.project.layout import Layout, Target

SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", ".venv", "venv", "env", ".env", "build", "dist", "site-packages",
             "node_modules", ".tox", ".nox", ".mypy_cache", ".pytest_cache", ".ampfix_cache", ".eggs"}
#: a folder holding this file is a cache (https://bford.info/cachedir/: ampfix's own among them), not walked
CACHE_TAG = "CACHEDIR.TAG"
#: the key of a result's dependency on the importers of a module (`FileResult.deps`): this, then its path
IMPORTERS = "importers:"
#: ... on what the import lines of a file resolve to: this, then its path
IMPORTS = "imports:"
#: ... on the files that may call a function: this, its module's path, ":" and its (qualified) name
CALLERS = "callers:"
#: ... on the files that may subclass a class: this, its module's path, ":" and its name
SUBCLASSES = "subclasses:"
GRAPH_DEPS = (IMPORTERS, IMPORTS, CALLERS, SUBCLASSES)

_FROM_RE = re.compile(r"^[ \t]*from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#;]+)", re.MULTILINE)
_IMPORT_RE = re.compile(r"^[ \t]*import[ \t]+([^\n#;]+)", re.MULTILINE)


def read_text(path: str) -> Optional[str]:
    """The text of a module as the project reads it (UTF-8, a BOM dropped); None when it cannot
    be read or decoded."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None


_WORD = re.compile("import")


def _line_starts_holding(text: str, word: "re.Pattern[str]") -> Iterator[int]:
    """The offset where each line that holds what `word` finds starts, once per line, in order."""
    last = -1
    for found in word.finditer(text):
        start = text.rfind("\n", 0, found.start()) + 1
        if start != last:
            last = start
            yield start


def import_statements(text: str) -> Tuple[List["re.Match[str]"], List["re.Match[str]"]]:
    """The `from ... import` statements of `text` (`_FROM_RE`: group 1 the module, group 2 the
    names) and the `import ...` statements (`_IMPORT_RE`: group 1 the modules), in order: the
    matches `finditer` finds, but tried only at the start of the lines that hold the word
    `import` (a scan of every line start costs ten times as much on a large tree)."""
    froms: List["re.Match[str]"] = []
    imports: List["re.Match[str]"] = []
    done = -1  # the end of the last `from` statement (its names may span lines)
    for start in _line_starts_holding(text, _WORD):
        m = _FROM_RE.match(text, start) if start >= done else None
        if m is not None:
            froms.append(m)
            done = m.end()
            continue
        m = _IMPORT_RE.match(text, start)
        if m is not None:
            imports.append(m)
    return froms, imports


def at_lines_holding(text: str, pattern: "re.Pattern[str]", word: "re.Pattern[str]" = _WORD
                     ) -> List["re.Match[str]"]:
    """`list(pattern.finditer(text))` for a `pattern` that can match only at the start of a line
    (`^` with `re.MULTILINE`) whose line holds what `word` finds (each match's first line): it
    is tried only at the start of those lines, and not inside the match before (what
    `finditer` skips). `re` would try `^` at every offset of the text (`module_imports`: 3.7
    times slower on the 17017 modules of the cached trees, bench/SPEED.md)."""
    out: List["re.Match[str]"] = []
    done = -1  # the end of the last match
    for start in _line_starts_holding(text, word):
        if start < done:
            continue
        m = pattern.match(text, start)
        if m is not None:
            out.append(m)
            done = m.end()
    return out


def import_lines(text: str) -> List[str]:
    """The qualified names the import statements of `text` bind (`pkg.mod`, `.utils.helper`),
    read with regular expressions: cheap, and good enough to find related modules."""
    out: List[str] = []
    if "import" not in text:
        return out
    froms, imports = import_statements(text)
    for m in froms:
        base = m.group(1)
        names = m.group(2).strip("()")
        for part in names.replace("\\\n", " ").split(","):
            name = part.strip().split(" as ")[0].strip()
            if name and name != "*" and name.isidentifier():
                out.append(f"{base}.{name}" if base and not base.endswith(".") else f"{base}{name}")
        if base.strip(".") or base:
            out.append(base)
    for m in imports:
        for part in m.group(1).split(","):
            name = part.strip().split(" as ")[0].strip()
            if name and all(p.isidentifier() for p in name.split(".")):
                out.append(name)
    return out


def importers_dep(path: str) -> str:
    """The key, in a result's dependencies, of "the files that import the module at `path`"."""
    return IMPORTERS + path


def imports_dep(path: str) -> str:
    """The key of "what the import lines of the file at `path` resolve to"."""
    return IMPORTS + path


def callers_dep(path: str, qual: str) -> str:
    """The key of "the files that may call function `qual` of the module at `path`" (`qual`
    is a name, never a ':': the key splits at its last one, whatever the path holds)."""
    return f"{CALLERS}{path}:{qual}"


def subclasses_dep(path: str, name: str) -> str:
    """The key of "the files that may define a subclass of class `name` of the module at
    `path`" (split at its last ':', as `callers_dep`)."""
    return f"{SUBCLASSES}{path}:{name}"


def split_dep(key: str) -> Optional[Tuple[str, str, Optional[str]]]:
    """(kind, path, function name or None) of a graph dependency's key; None for any other key
    (a module's content, its key its path)."""
    for kind in GRAPH_DEPS:
        if key.startswith(kind):
            rest = key[len(kind):]
            if kind in (CALLERS, SUBCLASSES):
                path, _, qual = rest.rpartition(":")
                return kind, path, qual
            return kind, rest, None
    return None


def digest_of_paths(paths: List[str]) -> str:
    """SHA-256 of a set of paths (sorted, one a line): the digest of a graph dependency."""
    return hashlib.sha256("\n".join(sorted(paths)).encode("utf-8", "surrogatepass")).hexdigest()


def module_stem(path: str) -> str:
    """The name a module is imported by, last part (`steps` for `pkg/steps.py`, `pkg` for
    `pkg/__init__.py`): a file calling one of its functions names it somewhere."""
    stem = os.path.splitext(os.path.basename(path))[0]
    return os.path.basename(os.path.dirname(path)) if stem == "__init__" else stem


class ImportGraph:
    """The imports between the files of one project root, each file's import lines read once
    (through `text_of`) and resolved by `layout` (a `Layout` of the root, shared with the
    project when it has one). Memoised: one graph per project and run."""

    def __init__(self, root: Path, text_of: Callable[[str], Optional[str]] = read_text,
                 layout: Optional[Layout] = None):
        self.layout = layout or Layout(root)
        self.root = self.layout.root
        self._text_of = text_of
        self._files: Optional[List[str]] = None
        self._folders: List[str] = []  # the folders `files` walked (a namespace package is one)
        self._imports: Dict[str, List[str]] = {}
        self._direct: Dict[str, List[str]] = {}
        self._resolved: Dict[str, List[Tuple[str, Optional[Target]]]] = {}
        self._importers: Optional[Dict[str, List[str]]] = None
        self._texts: Dict[str, Optional[str]] = {}
        self._candidates: Dict[Tuple[str, str], List[str]] = {}
        self._imports_digests: Dict[str, str] = {}

    def files(self) -> List[str]:
        """Every Python file of the project (sorted; the folders of `SKIP_DIRS`, hidden
        folders and cache folders (`CACHE_TAG`) left out)."""
        if self._files is None:
            out: List[str] = []
            folders: List[str] = []
            for folder, dirs, names in os.walk(self.root):
                if CACHE_TAG in names and folder != self.root:
                    dirs[:] = []
                    continue
                dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
                folders.append(folder)
                out.extend(os.path.join(folder, n) for n in sorted(names) if n.endswith(".py"))
            self._files, self._folders = out, folders
        return self._files

    def imports_of(self, path: str) -> List[str]:
        """The project modules the file at `path` imports (read from its import lines: no
        parse), with the modules a package it imports re-exports from (one level)."""
        path = os.path.abspath(path)
        cached = self._imports.get(path)
        if cached is not None:
            return cached
        self._imports[path] = []
        out: List[str] = []
        for target in self.direct_imports(path):
            if target == path:
                continue
            if target not in out:
                out.append(target)
            if target.endswith("__init__.py"):
                for inner in self.direct_imports(target):
                    if inner not in out and inner != path:
                        out.append(inner)
        self._imports[path] = out
        return out

    def direct_imports(self, path: str) -> List[str]:
        """The files of the project the import lines of `path` name (memoised: a package's
        `__init__.py` is read once, however many modules import it)."""
        cached = self._direct.get(path)
        if cached is None:
            cached = []
            for _, target in self._resolutions(path):
                if target is not None and target.path and target.path not in cached:
                    cached.append(target.path)
            self._direct[path] = cached
        return cached

    def resolutions(self, path: str) -> List[Tuple[str, Optional[Target]]]:
        """`_resolutions` of the file at `path`."""
        return self._resolutions(os.path.abspath(path))

    def _resolutions(self, path: str) -> List[Tuple[str, Optional[Target]]]:
        """Each name the import lines of `path` bind (`import_lines`) and what `layout`
        resolves it to (None: not one of the project's files). Memoised."""
        cached = self._resolved.get(path)
        if cached is None:
            cached = self._resolved[path] = [(q, self.layout.resolve(path, q))
                                             for q in import_lines(self._text(path) or "")]
        return cached

    def resolved_imports(self, path: str) -> List[str]:
        """What the import lines of `path` resolve to, one line each (sorted, no repeats):
        the name, a tab, then the file (the folder of a namespace package) and the name bound
        in it, or `?` when unresolved. What `imports_dep` digests: the answers of
        `direct_imports` and of the project's resolution of the names the file imports."""
        out = set()
        for qualified, target in self._resolutions(os.path.abspath(path)):
            if target is None:
                out.add(f"{qualified}\t?")
            else:
                where = target.path or "namespace:" + target.folder
                out.add(f"{qualified}\t{where}" + (f"\t{target.attr}" if target.attr is not None else ""))
        return sorted(out)

    def imports_digest(self, path: str) -> str:
        """The digest of the `imports_dep` of `path`, as the files are now (memoised, as the
        resolutions it digests are)."""
        path = os.path.abspath(path)
        found = self._imports_digests.get(path)
        if found is None:
            found = self._imports_digests[path] = digest_of_paths(self.resolved_imports(path))
        return found

    def _text(self, path: str) -> Optional[str]:
        """The text of a file, read once (through `text_of`) whichever question reads it."""
        if path not in self._texts:
            self._texts[path] = self._text_of(path)
        return self._texts[path]

    def caller_candidates(self, path: str, qual: str) -> List[str]:
        """The project's files (other than `path`) whose text may call function `qual` of the
        module at `path`: it holds `qual(` and the module's name (`module_stem`). A text scan,
        no parse (the project reads the calls of these only: `Project.callers`); each file is
        read once a run. Memoised."""
        path = os.path.abspath(path)
        key = (path, qual)
        cached = self._candidates.get(key)
        if cached is None:
            needle, stem = f"{qual}(", module_stem(path)
            cached = []
            for f in self.files():
                if f == path:
                    continue
                text = self._text(f)
                if text is not None and needle in text and stem in text:
                    cached.append(f)
            self._candidates[key] = cached
        return cached

    def callers_digest(self, path: str, qual: str) -> str:
        """The digest of the `callers_dep` of (`path`, `qual`), as the files are now."""
        return digest_of_paths(self.caller_candidates(path, qual))

    def subclass_candidates(self, path: str, name: str) -> List[str]:
        """The project's files whose text may define a subclass of class `name` of the module
        at `path`: those that hold `name` (a subclass names its base, or the import of it,
        whatever the alias), the module itself included. A text scan; memoised."""
        path = os.path.abspath(path)
        key = (path, "class " + name)  # (beside `caller_candidates`' keys in one memo: never a function's name)
        cached = self._candidates.get(key)
        if cached is None:
            cached = [f for f in self.files() if name in (self._text(f) or "")]
            self._candidates[key] = cached
        return cached

    def subclasses_digest(self, path: str, name: str) -> str:
        """The digest of the `subclasses_dep` of (`path`, `name`), as the files are now."""
        return digest_of_paths(self.subclass_candidates(path, name))

    def importers_of(self, path: str) -> List[str]:
        """The project's files that import the module at `path` (directly, or through a
        package `__init__.py` that re-exports it). The first question reads the import lines
        of every file of the project."""
        return self._importers_map().get(os.path.abspath(path), [])

    def _importers_map(self) -> Dict[str, List[str]]:
        """Module path -> the files importing it, for every module some file imports."""
        if self._importers is None:
            importers: Dict[str, List[str]] = {}
            for f in self.files():
                for dep in self.imports_of(f):
                    importers.setdefault(dep, []).append(f)
            self._importers = importers
        return self._importers

    def importers_digest(self, path: str) -> str:
        """The digest of the `importers_dep` of `path`, as the files are now."""
        return digest_of_paths(self.importers_of(path))

    def digests(self) -> Dict[str, str]:
        """What the cache keeps of the graph under its `stamp`, by dependency key: the
        `importers_dep` of every module some file imports (any other module's is
        `digest_of_paths([])`) and the `imports_dep` of every file of `files` (the same
        reading of the import lines: no other text is read)."""
        out = {importers_dep(p): self.importers_digest(p) for p in self._importers_map()}
        for f in self.files():
            out[imports_dep(f)] = self.imports_digest(f)
        return out

    def stamp(self) -> str:
        """SHA-256 of the project's Python files as the file system describes them (path, size,
        modification and change times, no read) and of its folders (their paths: a new folder,
        even an empty one, is a namespace package an import may now resolve to): while it is
        the same, so are the import lines the graph reads and what they resolve to (the cache
        keeps `digests` under it, so that a warm run neither reads nor resolves the imports of
        a tree again)."""
        folders, stats = self.snapshot()
        h = hashlib.sha256(self.root.encode("utf-8", "surrogatepass"))
        for d in folders:
            h.update(f"\0{d}{os.sep}".encode("utf-8", "surrogatepass"))
        for f, st in stats.items():
            if st is None:
                h.update(f"\0{f}\0-".encode("utf-8", "surrogatepass"))
            else:
                h.update(f"\0{f}\0{st[0]}:{st[1]}:{st[2]}".encode("utf-8", "surrogatepass"))
        return h.hexdigest()

    def snapshot(self) -> Tuple[Tuple[str, ...], Dict[str, Optional[Tuple[int, int, int]]]]:
        """What `stamp` hashes: the folders, and each Python file's (size, modification time,
        change time) (None: gone since the walk). The shape of the tree (which files and
        folders there are) tells whether an import may resolve elsewhere now; a file whose
        times changed may have new contents (`Project.refresh`)."""
        files = self.files()
        stats: Dict[str, Optional[Tuple[int, int, int]]] = {}
        for f in files:
            try:
                st = os.stat(f)
            except OSError:
                stats[f] = None
                continue
            stats[f] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        return tuple(self._folders), stats
