"""The oldest torch a project supports, read from its own metadata, as ruff infers its target
Python version from `requires-python`.

Looked up from the folder being checked upwards, in the nearest project folder (one that holds
a `pyproject.toml`, `setup.py`, `setup.cfg`, `PKG-INFO`, `*.dist-info/METADATA` or
`requirements*.txt`; the search stops at the repository root, a folder with `.git`). There, every
requirement on `torch` is read from:

* `pyproject.toml`: `[project] dependencies` and `[project.optional-dependencies]`, Poetry's
  `[tool.poetry.dependencies]` (and its groups' dependencies);
* `setup.cfg`: `[options] install_requires` and `[options.extras_require]`;
* `setup.py`: the string literals that are requirements on torch (`"torch>=1.13"`), wherever
  they are (an `install_requires=[...]` list, a `REQUIRED = [...]` constant);
* `requirements*.txt` and `requirements/*.txt`;
* packaging metadata, where an sdist (allennlp 2.10.1's) declares what its `setup.py` computes,
  or a wheel unpacked as a tree (joeynmt 2.3.0's) holds no declared file at all: `PKG-INFO`'s and
  a wheel's `*.dist-info/METADATA`'s `Requires-Dist:` headers (the same format; the header only,
  never the long description after the first blank line; `torch (>=1.10,<1.13) ; extra == "x"`
  and `torch>=1.10; python_version>"3"`), the latter in the project folder or its `src/`,
  and `*.egg-info/requires.txt` (in the project folder or its `src/`), every line, those under a
  section (`[dev]`, `[:python_version < "3.8"]`) as well, as extras are read above; only for a
  package (torch, Lightning) that the files above give no version of: a build writes this
  metadata from them, and an egg-info left in a developer's checkout may be older than its
  `setup.py`.

The oldest supported torch is the lowest lower bound among them (`>=1.13`, `==2.1.*`, `~=2.0`,
`>2.0`, Poetry's `^1.13`); requirements without a lower bound (`torch`, `torch<3`) say nothing.
`min-torch-version` in the configuration, and `--min-torch-version`, win over it; without any,
the default applies (`ampfix.knowledge.torch_versions.DEFAULT_MIN_TORCH`).

The requirements on Lightning (`lightning`, `pytorch-lightning`) are read the same way, for
whether the project declares a Lightning before 2.0 (`declares_lightning_before`: AMP204's
explicit precision names do not exist there).

Only the standard library is used: `check` needs nothing more.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Iterable, List, Optional, Tuple

PROJECT_FILES = ("pyproject.toml", "setup.py", "setup.cfg", "PKG-INFO")
MAX_BYTES = 1024 * 1024  # metadata larger than this is not read
TORCH = ("torch",)
LIGHTNING = ("lightning", "pytorch-lightning")  # Lightning 2.x's package, and the 1.x one (still published)


def _requirement_re(names: Tuple[str, ...]) -> "re.Pattern[str]":
    """A requirement on one of `names`: the name (PEP 503 normalised: case-insensitive, `-`,
    `_` and `.` alike), extras, then specifiers."""
    spelled = "|".join("[-_.]".join(map(re.escape, re.split(r"[-_.]", n))) for n in names)
    return re.compile(r"^\s*(?:%s)\s*(?:\[[^\]]*\])?\s*(?P<spec>(?:[<>=!~^][^;#]*)?)\s*(?:[;#].*)?$" % spelled,
                      re.IGNORECASE)


_REQ = _requirement_re(TORCH)
_LIGHTNING_REQ = _requirement_re(LIGHTNING)
_CLAUSE = re.compile(r"^\s*(?P<op>===|==|~=|>=|<=|!=|>|<|\^|~)?\s*(?P<ver>[0-9][0-9a-zA-Z.*+!_-]*)\s*$")


class Found:
    """A lower bound and where it was read (`pyproject.toml: torch>=1.13`)."""

    def __init__(self, version: Tuple[int, ...], where: str):
        self.version, self.where = version, where

    def __repr__(self) -> str:  # pragma: no cover - debugging
        return f"Found({self.version}, {self.where!r})"


def lower_bound(spec: str) -> Optional[Tuple[int, ...]]:
    """The lowest torch version a specifier set (`>=1.13,<3`, `==2.1.*`, `^1.13`) allows, as
    (major, minor); None when it has no lower bound."""
    best: Optional[Tuple[int, ...]] = None
    for clause in spec.split(","):
        if not clause.strip():
            continue
        m = _CLAUSE.match(clause)
        if m is None:
            return None  # something this reader does not understand: no claim
        op = m.group("op") or "=="
        if op in ("<", "<=", "!="):
            continue
        nums = []
        for part in re.split(r"[.+!]", m.group("ver")):
            if not part.isdigit():
                break
            nums.append(int(part))
        if not nums:
            continue
        version = tuple(nums[:2]) if len(nums) >= 2 else (nums[0], 0)
        best = version if best is None or version > best else best  # clauses all hold: the highest bound
    return best


def below(spec: str, version: Tuple[int, ...]) -> bool:
    """A specifier set with no lower bound (`lower_bound`) declares a version before `version`
    all the same: one of its clauses (`<2.0`, `<=1.9.5`) admits nothing from `version` on."""
    for clause in spec.split(","):
        m = _CLAUSE.match(clause)
        if m is None or m.group("op") not in ("<", "<="):
            continue
        nums = tuple(int(p) for p in re.findall(r"\d+", m.group("ver"))[:2])
        if nums and (nums <= version if m.group("op") == "<" else nums < version):
            return True
    return False


def only_before(spec: str, version: Tuple[int, ...]) -> bool:
    """A specifier set admits no version from `version` on: an upper clause below it (`<2.3`,
    `<=2.2.1`; `below`), or an exact version before it (`==1.9.1`, `==2.1.*`)."""
    if below(spec, version):
        return True
    exact = False
    for clause in spec.split(","):
        m = _CLAUSE.match(clause)
        if m is None:
            return False
        if m.group("op") in ("==", "==="):
            nums = tuple(int(p) for p in re.findall(r"\d+", m.group("ver"))[:2])
            if not nums or nums >= version:
                return False
            exact = True
    return exact


def requirement_bound(text: str) -> Optional[Tuple[Tuple[int, ...], str]]:
    """For a requirement string on torch: (its lower bound or (), the requirement as written);
    None when it is not a requirement on torch."""
    m = _REQ.match(text)
    if m is None:
        return None
    bound = lower_bound(m.group("spec")) if m.group("spec").strip() else None
    return (bound or (), text.strip())


def _spec_of(text: str, pattern: "re.Pattern[str]") -> Optional[str]:
    m = pattern.match(text)
    return m.group("spec") if m is not None else None


def _read(path: Path) -> Optional[str]:
    try:
        if path.stat().st_size > MAX_BYTES:
            return None
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _from_pyproject(path: Path, names: Tuple[str, ...] = TORCH) -> Iterable[str]:
    text = _read(path)
    if text is None:
        return []
    if sys.version_info >= (3, 11):  # imported here: a run over files with no AMP code never needs it
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError):
        return []  # a broken pyproject.toml is the configuration's error to report, not ours
    out: List[str] = []
    project = data.get("project") if isinstance(data.get("project"), dict) else {}
    deps = project.get("dependencies", [])
    if isinstance(deps, list):
        out.extend(d for d in deps if isinstance(d, str))
    extras = project.get("optional-dependencies", {})
    if isinstance(extras, dict):
        for group in extras.values():
            if isinstance(group, list):
                out.extend(d for d in group if isinstance(d, str))
    poetry = data.get("tool", {}).get("poetry", {}) if isinstance(data.get("tool"), dict) else {}
    tables = [poetry.get("dependencies"), poetry.get("dev-dependencies")]
    groups = poetry.get("group", {})
    if isinstance(groups, dict):
        tables.extend(g.get("dependencies") for g in groups.values() if isinstance(g, dict))
    for table in tables:
        if not isinstance(table, dict):
            continue
        for name, value in table.items():
            if re.sub(r"[-_.]+", "-", name.lower()) not in names:
                continue
            for v in (value if isinstance(value, list) else [value]):
                version = v.get("version") if isinstance(v, dict) else v
                if isinstance(version, str):
                    out.append(f"{name}{version}" if version[:1] in "<>=!~^" else f"{name}=={version}")
    return out


def _from_setup_cfg(path: Path) -> Iterable[str]:
    import configparser  # here: most runs never read a setup.cfg

    text = _read(path)
    if text is None:
        return []
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(text)
    except configparser.Error:
        return []
    out: List[str] = []
    if parser.has_option("options", "install_requires"):
        out.extend(parser.get("options", "install_requires").splitlines())
    if parser.has_section("options.extras_require"):
        for _, value in parser.items("options.extras_require"):
            out.extend(value.splitlines())
    return out


def _from_setup_py(path: Path, names: Tuple[str, ...] = TORCH) -> Iterable[str]:
    import ast  # here: most runs never read a setup.py

    text = _read(path)
    if text is None:
        return []
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    pattern = _REQ if names == TORCH else _requirement_re(names)
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and pattern.match(n.value)]


def _from_requirements(path: Path) -> Iterable[str]:
    text = _read(path)
    return text.splitlines() if text is not None else []


_REQUIRES_DIST = re.compile(r"^Requires-Dist:\s*(?P<req>.*)$", re.IGNORECASE)
_PARENTHESISED = re.compile(r"^(?P<name>[^;(]*?)\s*\((?P<spec>[^)]*)\)\s*(?P<rest>.*)$")


def _from_pkg_info(path: Path) -> Iterable[str]:
    """The `Requires-Dist:` requirements of a `PKG-INFO`'s header (up to the first blank line:
    the body is the long description, whose examples are not requirements), the older
    parenthesised spelling (`torch (<1.13,>=1.10)`) written as the others are (`torch<1.13,>=1.10`)."""
    text = _read(path)
    if text is None:
        return []
    out: List[str] = []
    for line in text.splitlines():
        if not line.strip():
            break
        m = _REQUIRES_DIST.match(line)
        if m is None:
            continue
        req = m.group("req").strip()
        p = _PARENTHESISED.match(req)
        if p is not None:
            req = p.group("name") + p.group("spec").strip() + (" " + p.group("rest") if p.group("rest") else "")
        out.append(req)
    return out


def _from_egg_requires(path: Path) -> Iterable[str]:
    """The requirement lines of an egg-info's `requires.txt`; its section headers (`[dev]`,
    `[:sys_platform != "win32"]`) are skipped and the requirements under them kept, as extras."""
    text = _read(path)
    if text is None:
        return []
    return [line for line in text.splitlines() if not line.lstrip().startswith("[")]


def _egg_requires_files(folder: Path) -> List[Path]:
    """`*.egg-info/requires.txt` in `folder` and in its `src/` (where setuptools writes it for a
    src layout)."""
    files = sorted(folder.glob("*.egg-info/requires.txt")) + sorted(folder.glob("src/*.egg-info/requires.txt"))
    return [f for f in files if f.is_file()]


def _dist_info_files(folder: Path, src: bool = True) -> List[Path]:
    """`*.dist-info/METADATA` in `folder` (a wheel unpacked as a tree) and, with `src`, in its
    `src/`: one wheel's. A folder holding several (`site-packages`, where the installed
    distributions' metadata lie side by side) is an environment, not a project: none."""
    out: List[Path] = []
    for where in (folder, folder / "src") if src else (folder,):
        files = [f for f in where.glob("*.dist-info/METADATA") if f.is_file()]
        if len(files) == 1:
            out.extend(files)
    return out


def _requirement_files(folder: Path) -> List[Path]:
    files = sorted(folder.glob("requirements*.txt"))
    sub = folder / "requirements"
    if sub.is_dir():
        files.extend(sorted(sub.glob("*.txt")))
    return [f for f in files if f.is_file()]


def _project_folder(start: Path) -> Optional[Path]:
    """The nearest folder at or above `start` that holds project metadata (see the module
    docstring); the search ends at a repository root."""
    for folder in (start, *start.parents):
        try:
            if (any((folder / name).is_file() for name in PROJECT_FILES) or _requirement_files(folder)
                    or _dist_info_files(folder, src=False)):
                return folder
            if (folder / ".git").exists():
                return None
        except OSError:
            return None
    return None


def _requirements(start: Path, names: Tuple[str, ...]) -> Iterable[Tuple[str, str]]:
    """(requirement line, file name) of every line of the metadata of the project around
    `start` that its readers give for `names` (the others' lines are filtered by the caller)."""
    try:
        start = start.resolve()
    except (OSError, RuntimeError):
        start = start.absolute()
    if start.is_file():
        start = start.parent
    folder = _project_folder(start)
    if folder is None:
        return
    declared = [(folder / "pyproject.toml", lambda p: _from_pyproject(p, names)), (folder / "setup.cfg", _from_setup_cfg),
                (folder / "setup.py", lambda p: _from_setup_py(p, names))]
    declared += [(f, _from_requirements) for f in _requirement_files(folder)]
    generated = [(folder / "PKG-INFO", _from_pkg_info)] + [(f, _from_pkg_info) for f in _dist_info_files(folder)]
    generated += [(f, _from_egg_requires) for f in _egg_requires_files(folder)]
    lines = list(_read_sources(declared))
    yield from lines
    # the packaging metadata only for a package the declared files give no version of: it is
    # what a build wrote from them (an sdist's, where setup.py computes its list or its versions:
    # a bare "torch" there; a wheel's, unpacked without them), and in a developer's checkout an
    # egg-info may be left from an older setup.py
    named = [r for r in (_REQ, _LIGHTNING_REQ) if any((_spec_of(line, r) or "").strip() for line, _ in lines)]
    for line, name in _read_sources(generated):
        if not any(r.match(line) for r in named):
            yield line, name


def _read_sources(sources) -> Iterable[Tuple[str, str]]:
    """(requirement line, file name) of the files of `sources` ((path, reader) pairs) that exist."""
    for path, reader in sources:
        if path.is_file():
            # an egg-info's or dist-info's file is named with its folder: `requires.txt` alone says nothing
            name = (f"{path.parent.name}/{path.name}" if path.parent.name.endswith((".egg-info", ".dist-info"))
                    else path.name)
            for line in reader(path):
                yield line, name


class ProjectRequirements:
    """The requirement lines of the project around `start` on torch and on Lightning, read once
    (on the first question) for both of the questions below."""

    def __init__(self, start: Path):
        self.start = start
        self._lines: Optional[List[Tuple[str, str]]] = None

    def _read(self) -> List[Tuple[str, str]]:
        if self._lines is None:
            self._lines = list(_requirements(self.start, TORCH + LIGHTNING))
        return self._lines

    def min_torch(self) -> Optional[Found]:
        """The oldest torch the project declares it supports, or None."""
        best: Optional[Found] = None
        for line, where in self._read():
            hit = requirement_bound(line)
            if hit is None or not hit[0]:
                continue
            version, written = hit
            if best is None or version < best.version:
                best = Found(version, f"`{written}` in {where}")
        return best

    def torch_only_before(self, version: Tuple[int, ...]) -> Optional[str]:
        """Where the project's requirements on torch admit only versions before `version`
        (every one of them has a bound, `only_before`: `torch>=2.1,<2.3` in setup.py): that
        requirement as written ("`torch>=2.1,<2.3` in setup.py"); None when one does not (a plain
        `torch`, `torch>=1.13`), or when none is declared."""
        found = None
        for line, where in self._read():
            spec = _spec_of(line, _REQ)
            if spec is None:
                continue
            if not spec.strip() or not only_before(spec, version):
                return None
            found = found or f"`{line.strip()}` in {where}"
        return found

    def lightning_before(self, version: Tuple[int, ...]) -> Optional[str]:
        """Where the project declares it supports a Lightning (`lightning` or
        `pytorch-lightning`) before `version` (a lower bound below it, `>1.7`, or only an upper
        bound up to it, `<2.0`): "`pytorch-lightning<2.0` in requirements.txt"; None when it
        does not (no requirement on Lightning, or none with such a bound)."""
        for line, where in self._read():
            spec = _spec_of(line, _LIGHTNING_REQ)
            if not spec or not spec.strip():
                continue
            bound = lower_bound(spec)
            if (bound is not None and bound < version) or (bound is None and below(spec, version)):
                return f"`{line.strip()}` in {where}"
        return None


def infer_min_torch(start: Path) -> Optional[Found]:
    """The oldest torch the project around `start` declares it supports, or None."""
    return ProjectRequirements(start).min_torch()


def declares_lightning_before(start: Path, version: Tuple[int, ...]) -> Optional[str]:
    """`ProjectRequirements.lightning_before` of the project around `start`."""
    return ProjectRequirements(start).lightning_before(version)
