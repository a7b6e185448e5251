"""`[tool.ampfix]` in the nearest pyproject.toml."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_MIN_TORCH = (2, 4)
KNOWN_KEYS = {"select", "ignore", "exclude", "extend-exclude", "per-file-ignores", "min-torch-version"}


class ConfigError(Exception):
    pass


@dataclass
class Config:
    path: Optional[Path] = None  # the pyproject.toml it came from
    select: Optional[List[str]] = None
    ignore: List[str] = field(default_factory=list)
    exclude: List[str] = field(default_factory=list)
    per_file_ignores: Dict[str, List[str]] = field(default_factory=dict)
    min_torch_version: Tuple[int, ...] = DEFAULT_MIN_TORCH

    @property
    def root(self) -> Path:
        return self.path.parent if self.path is not None else Path.cwd()


def parse_version(text: str, where: str) -> Tuple[int, ...]:
    parts = str(text).strip().split(".")
    try:
        nums = tuple(int(p) for p in parts if p != "")
    except ValueError:
        raise ConfigError(f"{where}: min-torch-version must look like \"2.1\", got {text!r}") from None
    if not nums:
        raise ConfigError(f"{where}: min-torch-version must look like \"2.1\", got {text!r}")
    return nums


def _str_list(value, key: str, where: str) -> List[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: `{key}` must be a list of strings")
    return list(value)


def find_pyproject(start: Path) -> Optional[Path]:
    """The nearest pyproject.toml at or above `start` that has a [tool.ampfix] table."""
    start = start.resolve()
    if start.is_file():
        start = start.parent
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            try:
                data = tomllib.loads(candidate.read_text(encoding="utf-8"))
            except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as exc:
                raise ConfigError(f"{candidate}: invalid TOML: {exc}") from None
            if "ampfix" in data.get("tool", {}):
                return candidate
    return None


def load_config(path: Optional[Path]) -> Config:
    if path is None:
        return Config()
    where = str(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as exc:
        raise ConfigError(f"{where}: invalid TOML: {exc}") from None
    table = data.get("tool", {}).get("ampfix", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: [tool.ampfix] must be a table")
    unknown = sorted(set(table) - KNOWN_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) in [tool.ampfix]: {', '.join(unknown)} "
                          f"(known: {', '.join(sorted(KNOWN_KEYS))})")
    cfg = Config(path=path)
    if "select" in table:
        cfg.select = _str_list(table["select"], "select", where)
    cfg.ignore = _str_list(table.get("ignore", []), "ignore", where)
    cfg.exclude = _str_list(table.get("exclude", []), "exclude", where) + _str_list(
        table.get("extend-exclude", []), "extend-exclude", where)
    pfi = table.get("per-file-ignores", {})
    if not isinstance(pfi, dict):
        raise ConfigError(f"{where}: `per-file-ignores` must be a table of glob = [codes]")
    cfg.per_file_ignores = {k: _str_list(v, f"per-file-ignores.{k}", where) for k, v in pfi.items()}
    if "min-torch-version" in table:
        cfg.min_torch_version = parse_version(table["min-torch-version"], where)
    return cfg


def resolve_config(paths: Sequence[str], explicit: Optional[str] = None) -> Config:
    if explicit is not None:
        p = Path(explicit)
        if not p.is_file():
            raise ConfigError(f"{explicit}: config file not found")
        return load_config(p)
    real = [Path(p) for p in paths if p != "-"]
    if real:
        try:
            start = Path(os.path.commonpath([str(p.resolve()) for p in real]))
        except ValueError:
            start = Path.cwd()
    else:
        start = Path.cwd()
    return load_config(find_pyproject(start))
