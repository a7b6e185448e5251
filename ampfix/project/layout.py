"""Where a project's modules are: its root, and what a local import refers to.

Resolution follows Python's own import system on the project's files, by probing the file
system (as mypy and pyright do with their search paths), so it needs no listing of the tree
(a search folder's own entries are listed once, as Python's finder lists them, to rule out the
names it does not hold):

* the project root is the nearest folder above a file that holds `pyproject.toml`,
  `setup.cfg`, `setup.py` or `.git` (else the folder that was checked);
* an absolute import (`import pkg.mod`, `from pkg.mod import f`) is looked for, in order, in
  the importing script's own folder when it is not inside a package (Python puts a script's
  folder first on `sys.path`, which is how `train.py` imports its sibling `utils.py`), in the
  folder above the importing file's top package, in `src/` under the root, and in the root;
* a relative import (`from . import x`, `from ..utils import y`) is resolved against the
  importing file's package;
* `pkg` is `pkg/__init__.py`, `pkg.py`, or a namespace folder `pkg/` (PEP 420);
* `from pkg import name` is the submodule `pkg/name.py` when there is one, else the name as
  `pkg/__init__.py` binds it (re-exports are followed by the project, see `project.py`).

Anything not found among the project's files (third-party packages, the standard library, a
name built at run time) is unresolved: the project layer reports it as unknown.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Dict, FrozenSet, Iterable, List, Optional, Tuple

ROOT_MARKERS = ("pyproject.toml", "setup.cfg", "setup.py", ".git")


def find_root(start: Path, fallback: Optional[Path] = None) -> Path:
    """The nearest folder at or above `start` (a file or folder) holding a root marker; else
    `fallback` (the folder that was checked), else `start`'s folder."""
    here = start if start.is_dir() else start.parent
    here = Path(os.path.abspath(here))
    for folder in (here, *here.parents):
        if any((folder / m).exists() for m in ROOT_MARKERS):
            return folder
    if fallback is not None:
        return Path(os.path.abspath(fallback if fallback.is_dir() else fallback.parent))
    return here


@dataclass(frozen=True)
class Target:
    """What an import names: a module file (`attr` None), or a name bound in a module."""

    path: str  # absolute path of the module's file (`.../pkg/__init__.py` for a package), "" for a namespace folder
    attr: Optional[str] = None
    folder: str = ""  # the folder of a namespace package (no file)


@lru_cache(maxsize=65536)
def _is_file(path: str) -> bool:
    return os.path.isfile(path)


@lru_cache(maxsize=65536)
def _is_dir(path: str) -> bool:
    return os.path.isdir(path)


@lru_cache(maxsize=4096)
def _names_in(folder: str) -> Optional[FrozenSet[str]]:
    """The names of the entries of `folder` (None when it cannot be listed)."""
    try:
        return frozenset(os.listdir(folder))
    except OSError:
        return None


def _module_file(folder: str, parts: Tuple[str, ...]) -> Optional[Target]:
    """`folder/a/b.py` or `folder/a/b/__init__.py` (or the namespace folder `folder/a/b`).
    Each lies in `folder/a` or is `folder/a.py`: a folder without an entry `a` or `a.py` (the
    third-party and standard modules most imports name) holds none of them, and is ruled out
    by its listing, as Python's own finder does, before any probe."""
    if not parts:
        return None
    names = _names_in(folder)
    if names is not None and parts[0] not in names and parts[0] + ".py" not in names:
        return None
    base = os.path.join(folder, *parts)
    if _is_file(base + ".py"):
        return Target(base + ".py")
    init = os.path.join(base, "__init__.py")
    if _is_file(init):
        return Target(init)
    if _is_dir(base) and all(_is_dir(os.path.join(folder, *parts[:i])) for i in range(1, len(parts))):
        return Target("", folder=base)
    return None


def package_folder(path: str) -> str:
    """The folder a relative import with one dot starts from: the file's own folder."""
    return os.path.dirname(path)


def in_package(path: str) -> bool:
    return _is_file(os.path.join(os.path.dirname(path), "__init__.py"))


def top_package_parent(path: str) -> str:
    """The folder above the outermost package holding `path` (its own folder when none)."""
    folder = os.path.dirname(path)
    while _is_file(os.path.join(folder, "__init__.py")):
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return folder


class Layout:
    """Module resolution for one project root (see the module docstring)."""

    def __init__(self, root: Path):
        self.root = str(Path(os.path.abspath(root)))
        src = os.path.join(self.root, "src")
        self._roots = [src, self.root] if _is_dir(src) else [self.root]
        self._memo: dict = {}
        self._search: Dict[str, List[str]] = {}  # a file's folder -> `search_path`

    def search_path(self, importer: str) -> List[str]:
        """Where an absolute import written in `importer` is looked for, in order. (It depends
        on the importer's folder only: memoised per folder, as `resolve` is.)"""
        folder = os.path.dirname(importer)
        found = self._search.get(folder)
        if found is None:
            found = self._search[folder] = self._search_path(importer)
        return found

    def _search_path(self, importer: str) -> List[str]:
        out: List[str] = []
        if not in_package(importer):
            out.append(os.path.dirname(importer))
        out.append(top_package_parent(importer))
        out.extend(self._roots)
        seen: List[str] = []
        for folder in out:
            if folder not in seen and self.contains(folder):
                seen.append(folder)
        return seen

    def contains(self, path: str) -> bool:
        return path == self.root or path.startswith(self.root + os.sep)

    def resolve(self, importer: str, qualified: str) -> Optional[Target]:
        """What the import binding `qualified` (as the model records it: `pkg.mod`,
        `pkg.mod.name`, `..utils.helper`) written in the file `importer` refers to; None when
        it is not one of the project's files. (It depends on the importer's folder only:
        memoised per folder.)"""
        key = (os.path.dirname(importer), qualified)
        if key in self._memo:
            return self._memo[key]
        found = self._memo[key] = self._resolve(importer, qualified)
        return found

    def _resolve(self, importer: str, qualified: str) -> Optional[Target]:
        level = len(qualified) - len(qualified.lstrip("."))
        parts = tuple(p for p in qualified[level:].split(".") if p)
        if level:
            folder = os.path.dirname(importer)
            for _ in range(level - 1):
                folder = os.path.dirname(folder)
            if not self.contains(folder):
                return None
            return self._resolve_in(folder, parts, relative=True)
        namespace = None  # a folder without `__init__.py`: a module or package found later wins, as in Python
        for folder in self.search_path(importer):
            found = self._resolve_in(folder, parts, relative=False)
            if found is not None and found.path:
                return found
            namespace = namespace or found
        return namespace

    def _resolve_in(self, folder: str, parts: Tuple[str, ...], relative: bool) -> Optional[Target]:
        if not parts:
            init = os.path.join(folder, "__init__.py")
            return Target(init) if _is_file(init) else Target("", folder=folder) if relative else None
        whole = _module_file(folder, parts)
        if whole is not None:
            return whole
        # `pkg.mod.name`: a name bound in module `pkg.mod`
        owner = _module_file(folder, parts[:-1]) if len(parts) > 1 else (
            Target(os.path.join(folder, "__init__.py")) if relative and _is_file(os.path.join(folder, "__init__.py"))
            else None)
        if owner is not None and owner.path:
            return Target(owner.path, attr=parts[-1])
        return None

    def submodule(self, package: Target, name: str) -> Optional[Target]:
        """`package.name` as a module (a file of the package's folder)."""
        folder = package.folder or (os.path.dirname(package.path) if package.path.endswith("__init__.py") else "")
        if not folder:
            return None
        return _module_file(folder, (name,))

    def module_name(self, path: str) -> str:
        """A dotted name for messages (`pkg.mod`), relative to the project root."""
        rel = os.path.relpath(path, self.root)
        for root in self._roots:
            if path.startswith(root + os.sep):
                rel = os.path.relpath(path, root)
                break
        rel = rel[:-3] if rel.endswith(".py") else rel
        parts = [p for p in rel.split(os.sep) if p and p != "__init__"]
        return ".".join(parts)


def clear_caches() -> None:
    """Forget the file-system probes (tests that build trees in one process)."""
    _is_file.cache_clear()
    _is_dir.cache_clear()
    _names_in.cache_clear()


def common_folder(paths: Iterable[Path]) -> Optional[Path]:
    items = [os.path.abspath(p) for p in paths]
    if not items:
        return None
    return Path(os.path.commonpath(items))
