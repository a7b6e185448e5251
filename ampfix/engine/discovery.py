"""Which files to check: recursive walk that skips VCS folders, virtualenvs, build
output, site-packages and what .gitignore files ignore; config `exclude` globs."""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple

SKIP_DIRS = {
    ".git", ".hg", ".svn", ".bzr", "__pycache__", ".venv", "venv", ".tox", ".nox", ".eggs",
    "build", "site-packages", "node_modules", ".mypy_cache", ".pytest_cache", ".ruff_cache",
    "__pypackages__", ".ipynb_checkpoints",
}
PY_SUFFIXES = (".py", ".pyi", ".ipynb")


@dataclass
class _Pattern:
    regex: re.Pattern
    negate: bool
    dir_only: bool
    anchored: bool


def _glob_to_regex(pat: str) -> str:
    i, out = 0, []
    while i < len(pat):
        c = pat[i]
        if c == "*":
            if pat[i:i + 3] == "**/":
                out.append("(?:.*/)?")
                i += 3
                continue
            if pat[i:i + 2] == "**":
                out.append(".*")
                i += 2
                continue
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = pat.find("]", i + 1)
            if j == -1:
                out.append(re.escape(c))
            else:
                body = pat[i + 1:j].replace("\\", "\\\\")
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append(f"[{body}]")
                i = j
        elif c == "\\" and i + 1 < len(pat):
            i += 1
            out.append(re.escape(pat[i]))
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


class GitIgnore:
    """The patterns of one .gitignore file, relative to its folder."""

    def __init__(self, base: Path, lines: Sequence[str]):
        self.base = base
        self.patterns: List[_Pattern] = []
        for raw in lines:
            line = raw.rstrip("\n").rstrip("\r")
            if not line.strip() or line.startswith("#"):
                continue
            line = line.rstrip(" ") if not line.endswith("\\ ") else line
            negate = line.startswith("!")
            if negate:
                line = line[1:]
            if line.startswith("\\"):
                line = line[1:]
            dir_only = line.endswith("/")
            line = line.rstrip("/")
            anchored = "/" in line
            line = line.lstrip("/")
            if not line:
                continue
            regex = re.compile(_glob_to_regex(line) + r"\Z")
            self.patterns.append(_Pattern(regex, negate, dir_only, anchored))

    @classmethod
    def load(cls, folder: Path) -> Optional["GitIgnore"]:
        f = folder / ".gitignore"
        if not f.is_file():
            return None
        try:
            return cls(folder, f.read_text(encoding="utf-8", errors="replace").splitlines())
        except OSError:
            return None

    def match(self, path: Path, is_dir: bool) -> Optional[bool]:
        """True ignored, False re-included, None no opinion."""
        try:
            rel = path.relative_to(self.base).as_posix()
        except ValueError:
            return None
        verdict = None
        for p in self.patterns:
            if p.dir_only and not is_dir:
                continue
            target = rel if p.anchored else rel.rsplit("/", 1)[-1]
            if p.regex.match(target):
                verdict = not p.negate
        return verdict


def is_virtualenv(folder: Path) -> bool:
    """Raises OSError (PermissionError) when the folder cannot be looked into."""
    return (folder / "pyvenv.cfg").is_file() or (folder / "conda-meta").is_dir()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc)


def matches_any(path: Path, root: Path, globs: Sequence[str]) -> bool:
    if not globs:  # (no exclusion configured: nothing to resolve the path for)
        return False
    try:
        rel = path.resolve().relative_to(root.resolve()).as_posix()
    except (ValueError, OSError, RuntimeError):  # elsewhere, or a symlink loop
        rel = path.as_posix()
    for g in globs:
        g = g.rstrip("/")
        if fnmatch.fnmatch(rel, g) or fnmatch.fnmatch(path.name, g) or fnmatch.fnmatch(rel, g + "/*") \
                or any(fnmatch.fnmatch(part, g) for part in Path(rel).parts):
            return True
    return False


def _ignored(path: Path, is_dir: bool, stack: List[GitIgnore]) -> bool:
    verdict = False
    for gi in stack:
        v = gi.match(path, is_dir)
        if v is not None:
            verdict = v
    return verdict


def _gitignores_above(folder: Path) -> List[GitIgnore]:
    """.gitignore files in the folders above `folder`, up to the repository root."""
    found: List[GitIgnore] = []
    for parent in folder.resolve().parents:
        gi = GitIgnore.load(parent)
        if gi is not None:
            found.append(gi)
        if (parent / ".git").exists():
            break
    return list(reversed(found))


def walk(root: Path, exclude: Sequence[str], config_root: Path, problems: Optional[List[str]] = None
         ) -> Iterator[Path]:
    """The files to check under `root`; a folder or file that cannot be read (permissions, a
    symlink loop) adds "PATH: error: REASON" to `problems` and the walk goes on."""
    if problems is None:
        problems = []
    try:
        stack0 = _gitignores_above(root)
    except (OSError, RuntimeError):
        stack0 = []

    def rec(folder: Path, stack: List[GitIgnore]) -> Iterator[Path]:
        gi = GitIgnore.load(folder)
        if gi is not None:
            stack = stack + [gi]
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            problems.append(f"{folder}: error: cannot read the folder: {_reason(exc)}")
            return
        for e in entries:
            p = Path(e.path)
            if e.is_dir(follow_symlinks=False):
                if e.name in SKIP_DIRS or e.name.endswith(".egg-info"):
                    continue
                try:
                    if is_virtualenv(p):
                        continue
                except OSError as exc:
                    problems.append(f"{p}: error: cannot read the folder: {_reason(exc)}")
                    continue
                if _ignored(p, True, stack) or matches_any(p, config_root, exclude):
                    continue
                yield from rec(p, stack)
                continue
            if not e.name.endswith(PY_SUFFIXES):
                continue
            try:
                is_file = e.is_file()
            except OSError as exc:  # a symlink loop
                problems.append(f"{p}: error: cannot read: {_reason(exc)}")
                continue
            if is_file:
                if _ignored(p, False, stack) or matches_any(p, config_root, exclude):
                    continue
                yield p

    yield from rec(root, stack0)


def discover(paths: Sequence[str], exclude: Sequence[str], config_root: Path, force_exclude: bool = False,
             problems: Optional[List[str]] = None) -> Tuple[List[str], List[str]]:
    """(files to check, paths that do not exist). "-" stays as is (stdin). Paths that exist
    but cannot be read (permissions, symlink loops) add a line to `problems`."""
    if problems is None:
        problems = []
    files: List[str] = []
    missing: List[str] = []
    seen = set()
    for raw in paths:
        if raw == "-":
            files.append(raw)
            continue
        p = Path(raw)
        try:
            os.stat(raw)
        except FileNotFoundError:
            if os.path.islink(raw):
                problems.append(f"{raw}: error: cannot read: the symbolic link points to nothing")
            else:
                missing.append(raw)
            continue
        except OSError as exc:
            problems.append(f"{raw}: error: cannot read: {_reason(exc)}")
            continue
        if p.is_dir():
            for f in walk(p, exclude, config_root, problems):
                s = str(f)
                if s not in seen:
                    seen.add(s)
                    files.append(s)
        elif p.is_file():
            if force_exclude and matches_any(p, config_root, exclude):
                continue
            if raw not in seen:
                seen.add(raw)
                files.append(raw)
        else:
            missing.append(raw)
    return files, missing
