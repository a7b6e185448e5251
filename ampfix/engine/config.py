"""`[tool.ampfix]` in the nearest pyproject.toml."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ampfix.engine.budget import DEFAULT_MAX_FILE_MEMORY
from ampfix.knowledge.torch_versions import DEFAULT_MIN_TORCH  # noqa: F401  (re-exported)

# tomllib is imported when a configuration file is read (`_read_toml`): a run without one never needs it

KNOWN_KEYS = {"select", "extend-select", "ignore", "exclude", "extend-exclude", "per-file-ignores",
              "min-torch-version", "max-file-size", "max-file-memory", "preview"}
DEFAULT_MAX_FILE_SIZE = 4 * 1024 * 1024  # bytes; larger files are skipped (reported), not analysed
_UNITS = {"": 1, "b": 1, "kb": 1000, "kib": 1024, "mb": 1000 ** 2, "mib": 1024 ** 2, "gb": 1000 ** 3,
          "gib": 1024 ** 3}


class ConfigError(Exception):
    pass


@dataclass
class Config:
    path: Optional[Path] = None  # the pyproject.toml it came from
    select: Optional[List[str]] = None
    extend_select: List[str] = field(default_factory=list)
    ignore: List[str] = field(default_factory=list)
    exclude: List[str] = field(default_factory=list)
    per_file_ignores: Dict[str, List[str]] = field(default_factory=dict)
    min_torch_version: Tuple[int, ...] = DEFAULT_MIN_TORCH
    min_torch_configured: bool = False  # `min-torch-version` was set (else it may be inferred)
    max_file_size: int = DEFAULT_MAX_FILE_SIZE
    preview: bool = False  # preview rules run too
    max_file_memory: int = DEFAULT_MAX_FILE_MEMORY  # estimated before parsing (ampfix/engine/budget.py)

    @property
    def root(self) -> Path:
        return self.path.parent if self.path is not None else Path.cwd()


def _type_name(value) -> str:
    return {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "an array",
            dict: "a table"}.get(type(value), type(value).__name__)


def parse_version(text, where: str) -> Tuple[int, ...]:
    if not isinstance(text, str):
        hint = (f" ({text}): quote it, e.g. min-torch-version = \"2.10\" (TOML reads an unquoted 2.10 as the "
                "number 2.1)") if isinstance(text, (int, float)) and not isinstance(text, bool) else ""
        raise ConfigError(f"{where}: `min-torch-version` in [tool.ampfix] must be a string like \"2.4\", "
                          f"got {_type_name(text)}{hint}")
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
        got = _type_name(value) if not isinstance(value, list) else "an array with " + ", ".join(
            sorted({_type_name(v) for v in value if not isinstance(v, str)}))
        raise ConfigError(f"{where}: `{key}` in [tool.ampfix] must be a list of strings, got {got}")
    return list(value)


def parse_size(value, where: str, key: str = "max-file-size") -> int:
    """A size in bytes: an integer, or a string such as "10MB" / "512 KiB"."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", value)
        if m and m.group(2).lower() in _UNITS and float(m.group(1)) > 0:
            return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    raise ConfigError(f"{where}: `{key}` must be a positive number of bytes or a string such as \"10MB\", "
                      f"got {value!r}")


def _read_toml(path: Path) -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except RecursionError:
        raise ConfigError(f"{path}: invalid TOML: nested too deeply") from None


def _tool_table(data: dict, where) -> dict:
    tool = data.get("tool", {})
    if not isinstance(tool, dict):
        raise ConfigError(f"{where}: `tool` must be a table ([tool.ampfix] holds ampfix's settings), "
                          f"got {_type_name(tool)}")
    return tool


def find_pyproject(start: Path) -> Optional[Path]:
    """The nearest pyproject.toml at or above `start` that has a [tool.ampfix] table."""
    start = _resolved(start)
    if start.is_file():
        start = start.parent
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        try:
            is_file = candidate.is_file()
        except OSError:
            is_file = False
        if is_file:
            if "ampfix" in _tool_table(_read_toml(candidate), candidate):
                return candidate
    return None


def load_config(path: Optional[Path]) -> Config:
    if path is None:
        return Config()
    where = str(path)
    data = _read_toml(path)
    table = _tool_table(data, where).get("ampfix", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: [tool.ampfix] must be a table of settings, got {_type_name(table)} "
                          "(write `[tool.ampfix]` on a line of its own, the settings below it)")
    unknown = sorted(set(table) - KNOWN_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) in [tool.ampfix]: {', '.join(unknown)} "
                          f"(known: {', '.join(sorted(KNOWN_KEYS))})")
    cfg = Config(path=path)
    if "select" in table:
        cfg.select = _str_list(table["select"], "select", where)
    cfg.extend_select = _str_list(table.get("extend-select", []), "extend-select", where)
    if cfg.select is not None and not any(s.strip() for s in cfg.select + cfg.extend_select):
        raise ConfigError(f"{where}: `select` in [tool.ampfix] names no rule: it would check nothing (remove it "
                          "for the default rules, or name codes or prefixes such as \"AMP0\" or \"ALL\")")
    cfg.ignore = _str_list(table.get("ignore", []), "ignore", where)
    cfg.exclude = _str_list(table.get("exclude", []), "exclude", where) + _str_list(
        table.get("extend-exclude", []), "extend-exclude", where)
    pfi = table.get("per-file-ignores", {})
    if not isinstance(pfi, dict):
        raise ConfigError(f"{where}: `per-file-ignores` in [tool.ampfix] must be a table of glob = [codes], "
                          f"got {_type_name(pfi)}")
    cfg.per_file_ignores = {k: _str_list(v, f"per-file-ignores.{k}", where) for k, v in pfi.items()}
    if "min-torch-version" in table:
        cfg.min_torch_version = parse_version(table["min-torch-version"], where)
        cfg.min_torch_configured = True
    if "max-file-size" in table:
        cfg.max_file_size = parse_size(table["max-file-size"], where)
    if "preview" in table:
        if not isinstance(table["preview"], bool):
            raise ConfigError(f"{where}: `preview` in [tool.ampfix] must be a boolean (true or false), "
                              f"got {_type_name(table['preview'])}")
        cfg.preview = table["preview"]
    if "max-file-memory" in table:
        cfg.max_file_memory = parse_size(table["max-file-memory"], where, "max-file-memory")
    return cfg


def _resolved(p: Path) -> Path:
    try:
        return p.resolve()
    except (OSError, RuntimeError):  # a symlink loop: reported when the files are discovered
        return p.absolute()


def resolve_config(paths: Sequence[str], explicit: Optional[str] = None) -> Config:
    if explicit is not None:
        p = Path(explicit)
        if not p.is_file():
            raise ConfigError(f"{explicit}: config file not found")
        return load_config(p)
    real = [Path(p) for p in paths if p != "-"]
    if real:
        try:
            start = Path(os.path.commonpath([str(_resolved(p)) for p in real]))
        except ValueError:
            start = Path.cwd()
    else:
        start = Path.cwd()
    return load_config(find_pyproject(start))
