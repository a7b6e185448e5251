"""The import graph of a project, read from the import lines of its files (regular
expressions, no parse): which of the project's modules a file imports, and which files import a
module.

It imports neither LibCST nor the model, so that the cache can check a result's dependency on
the importers of a module (`importers_dep`) on a warm run as cheaply as it checks a module's
content: the project layer (`Project`) asks it its questions during an analysis, and the cache
asks it again, of the project's current files, before it believes a result.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from ampfix.project.layout import Layout

SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", ".venv", "venv", "env", ".env", "build", "dist", "site-packages",
             "node_modules", ".tox", ".nox", ".mypy_cache", ".pytest_cache", ".ampfix_cache", ".eggs"}
#: the key of a result's dependency on the importers of a module (`FileResult.deps`): this, then its path
IMPORTERS = "importers:"

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


def import_statements(text: str) -> Tuple[List["re.Match[str]"], List["re.Match[str]"]]:
    """The `from ... import` statements of `text` (`_FROM_RE`: group 1 the module, group 2 the
    names) and the `import ...` statements (`_IMPORT_RE`: group 1 the modules), in order: the
    matches `finditer` finds, but tried only at the start of the lines that hold the word
    `import` (a scan of every line start costs ten times as much on a large tree)."""
    froms: List["re.Match[str]"] = []
    imports: List["re.Match[str]"] = []
    done = last = -1  # the end of the last `from` statement (its names may span lines); the last line tried
    for word in _WORD.finditer(text):
        start = text.rfind("\n", 0, word.start()) + 1
        if start == last:
            continue
        last = start
        m = _FROM_RE.match(text, start) if start >= done else None
        if m is not None:
            froms.append(m)
            done = m.end()
            continue
        m = _IMPORT_RE.match(text, start)
        if m is not None:
            imports.append(m)
    return froms, imports


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


def digest_of_paths(paths: List[str]) -> str:
    """SHA-256 of a set of paths (sorted, one a line): the digest of an `importers_dep`."""
    return hashlib.sha256("\n".join(sorted(paths)).encode("utf-8", "surrogatepass")).hexdigest()


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
        self._imports: Dict[str, List[str]] = {}
        self._direct: Dict[str, List[str]] = {}
        self._importers: Optional[Dict[str, List[str]]] = None

    def files(self) -> List[str]:
        """Every Python file of the project (sorted; the folders of `SKIP_DIRS` and hidden
        folders left out)."""
        if self._files is None:
            out: List[str] = []
            for folder, dirs, names in os.walk(self.root):
                dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
                out.extend(os.path.join(folder, n) for n in sorted(names) if n.endswith(".py"))
            self._files = out
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
            for qualified in import_lines(self._text_of(path) or ""):
                target = self.layout.resolve(path, qualified)
                if target is not None and target.path and target.path not in cached:
                    cached.append(target.path)
            self._direct[path] = cached
        return cached

    def importers_of(self, path: str) -> List[str]:
        """The project's files that import the module at `path` (directly, or through a
        package `__init__.py` that re-exports it). The first question reads the import lines
        of every file of the project."""
        path = os.path.abspath(path)
        if self._importers is None:
            importers: Dict[str, List[str]] = {}
            for f in self.files():
                for dep in self.imports_of(f):
                    importers.setdefault(dep, []).append(f)
            self._importers = importers
        return self._importers.get(path, [])

    def importers_digest(self, path: str) -> str:
        """The digest of the `importers_dep` of `path`, as the files are now."""
        return digest_of_paths(self.importers_of(path))

    def importers_digests(self) -> Dict[str, str]:
        """The digest of the `importers_dep` of every module some file imports (any other
        module's is `digest_of_paths([])`): what the cache keeps of the graph (`stamp`)."""
        self.importers_of(self.root)
        return {p: digest_of_paths(found) for p, found in (self._importers or {}).items()}

    def stamp(self) -> str:
        """SHA-256 of the project's Python files as the file system describes them (path, size,
        modification and change times, no read): while it is the same, so are the import lines
        the graph reads (the cache keeps `importers_digests` under it, so that a warm run
        neither reads nor resolves the imports of a tree again)."""
        h = hashlib.sha256(self.root.encode("utf-8", "surrogatepass"))
        for f in self.files():
            try:
                st = os.stat(f)
            except OSError:
                h.update(f"\0{f}\0-".encode("utf-8", "surrogatepass"))
                continue
            h.update(f"\0{f}\0{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}".encode("utf-8", "surrogatepass"))
        return h.hexdigest()
