"""The envelope of every JSON file ampfix keeps in its cache folder, and the checks that make
a file read back from there trustworthy or a miss.

A cache folder can come from anywhere (a CI cache restored on another branch, a hand edit, a
disk that lost a block): nothing read from it is believed unless it passes three checks.

* The envelope: `{"kind": ..., "key": ..., "sum": ..., "data": ...}`. `kind` names what the
  entry holds, `key` is the key it was written under (an entry copied or renamed to another
  key is a miss), `sum` a SHA-256 over kind, key and the canonical JSON of `data` (a changed
  byte is a miss).
* The shape: each kind has one validator (`Kind.decode`) that rebuilds the object from `data`
  and raises `Invalid` on anything it did not write: a wrong type, a missing or unknown field,
  a number out of range. Adding a kind of entry is writing its encoder and its validator.
* Any other error reading it (not JSON, nested too deeply, not readable) is a miss too.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence


class Invalid(ValueError):
    """An entry that is not exactly what ampfix writes: a miss."""


def _canonical(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def _sum(kind: str, key: str, data: Any) -> str:
    h = hashlib.sha256()
    h.update(f"{kind}\0{key}\0".encode())
    h.update(_canonical(data))
    return h.hexdigest()


def seal(kind: str, key: str, data: Any) -> dict:
    """The envelope to write for `data` (JSON values only) under `key`."""
    return {"kind": kind, "key": key, "sum": _sum(kind, key, data), "data": data}


def unseal(raw: bytes, kind: str, key: str) -> Any:
    """The `data` of an envelope read back, checked against `kind` and `key`; raises Invalid."""
    try:
        env = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise Invalid(f"not JSON: {exc}") from None
    if not isinstance(env, dict) or set(env) != {"kind", "key", "sum", "data"}:
        raise Invalid("not an ampfix cache entry")
    if env["kind"] != kind or env["key"] != key:
        raise Invalid("an entry of another kind or key")
    try:
        expected = _sum(kind, key, env["data"])
    except (ValueError, TypeError, RecursionError):
        raise Invalid("data that cannot be written back") from None
    if env["sum"] != expected:
        raise Invalid("checksum mismatch")
    return env["data"]


def _no_constant(name: str) -> Any:
    raise Invalid(f"{name} is not JSON")


# ----------------------------------------------------------------------------- shape checks


def obj(value: Any, required: Iterable[str], optional: Iterable[str] = ()) -> Dict[str, Any]:
    """`value` as a dict with exactly these keys (the optional ones may be absent)."""
    if not isinstance(value, dict):
        raise Invalid(f"expected an object, got {type(value).__name__}")
    required = set(required)
    missing = required - set(value)
    extra = set(value) - required - set(optional)
    if missing or extra:
        raise Invalid(f"fields: missing {sorted(missing)}, unknown {sorted(extra)}")
    return value


def integer(value: Any, minimum: Optional[int] = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise Invalid(f"expected an integer, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise Invalid(f"{value} is below {minimum}")
    return value


def optional_integer(value: Any, minimum: Optional[int] = None) -> Optional[int]:
    return None if value is None else integer(value, minimum)


def string(value: Any, nonempty: bool = False, choices: Optional[Sequence[str]] = None) -> str:
    if not isinstance(value, str):
        raise Invalid(f"expected a string, got {type(value).__name__}")
    if nonempty and not value:
        raise Invalid("expected a non-empty string")
    if choices is not None and value not in choices:
        raise Invalid(f"{value!r} is not one of {list(choices)}")
    return value


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise Invalid(f"expected true or false, got {type(value).__name__}")
    return value


def array(value: Any, item: Callable[[Any], Any]) -> List[Any]:
    if not isinstance(value, list):
        raise Invalid(f"expected an array, got {type(value).__name__}")
    return [item(v) for v in value]


@dataclass(frozen=True)
class Kind:
    """One kind of cache entry: how its object becomes JSON and how JSON read back becomes
    the object again (the validator: raises Invalid on anything else)."""

    name: str
    encode: Callable[..., Any]
    decode: Callable[..., Any]
