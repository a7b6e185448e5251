"""What a run needs to know about the rules before it analyses anything - their codes, names,
default set and triggers - without importing them (and LibCST): a warm run, every file a cache
hit, then never pays for those imports.

The facts are read from the rules once (`ampfix.engine.registry`) and kept in the cache folder as
JSON, keyed by a fingerprint of ampfix's code (a hash of the content of every module of ampfix
and of its rules, see `fingerprint`): an edited rule brings a fresh read, and facts kept for other
code (a cache folder restored from another branch) are never read. The entry is checksummed and
validated (`ampfix.engine.entries`): one that does not pass is read from the rules again.
Without a cache folder (`--no-cache`) they come straight from the registry.

`maybe_triggered` is the triggers' test as `Rule.triggered_by` does it by default; for a rule
that overrides `triggered_by` it tests the default triggers only (an override may only narrow
them, see `ampfix.rule.Rule.triggered_by`): it may say yes where the rule says no, never the
reverse, so a file it lets through is analysed or looked up in the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from ampfix import __version__
from ampfix.engine import entries as E
from ampfix.rule import trigger_test

_FINGERPRINT: Optional[str] = None


def _code_files() -> List[Tuple[str, str]]:
    """(name within its package, path) of every module of ampfix and of its rules."""
    import ampfix
    import ampfix.rules as rules_pkg

    out = []
    for pkg in (ampfix, rules_pkg):
        for folder in getattr(pkg, "__path__", []):
            for root, _, names in sorted(os.walk(folder)):
                for name in sorted(names):
                    if name.endswith(".py"):
                        path = os.path.join(root, name)
                        out.append((f"{pkg.__name__}:{os.path.relpath(path, folder)}", path))
    return out


def fingerprint(memo: Optional[Path] = None) -> str:
    """A SHA-256 of ampfix's version and of the content of its modules and rules: results and
    rule facts cached under it cannot disagree with the code that is installed, wherever the
    cache folder came from (a CI cache restored on another branch included).

    Hashing the content reads ~0.8 MB; a warm run takes it from a memo in the cache folder
    (`memo`), keyed by each file's path, size, mtime, ctime, device and inode: any write to a
    file changes its ctime, which no tool can set back, and a copied folder has other inodes."""
    global _FINGERPRINT
    if _FINGERPRINT is not None:
        return _FINGERPRINT
    files = _code_files()
    sig = hashlib.sha256(__version__.encode())
    for _, path in files:
        try:
            st = os.stat(path)
        except OSError:
            continue
        sig.update(f"{path}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_dev}:{st.st_ino}\n".encode())
    memo_file = None if memo is None else memo / ("v" + __version__) / f"code-{sig.hexdigest()}.json"
    if memo_file is not None:
        try:
            raw = json.loads(memo_file.read_bytes())
            if (isinstance(raw, dict) and raw.get("sig") == sig.hexdigest() and isinstance(raw.get("content"), str)
                    and len(raw["content"]) == 64):
                _FINGERPRINT = raw["content"]
                return _FINGERPRINT
        except (OSError, ValueError):
            pass
    h = hashlib.sha256(__version__.encode())
    for name, path in files:
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        h.update(f"{name}:{len(data)}\n".encode())
        h.update(data)
    _FINGERPRINT = h.hexdigest()
    if memo_file is not None:
        write_json(memo_file, {"sig": sig.hexdigest(), "content": _FINGERPRINT})
    return _FINGERPRINT


@dataclass(frozen=True)
class RuleInfo:
    code: str
    name: str
    default_enabled: bool
    triggers: Tuple[str, ...]
    triggers_lower: Tuple[str, ...]
    requires: Tuple[Tuple[str, ...], ...]

    def maybe_triggered(self, text: str, lowered: str) -> bool:
        return trigger_test(text, lowered, self.triggers, self.triggers_lower, self.requires)


_INFO: Dict[Optional[str], Dict[str, RuleInfo]] = {}


def _encode_rules(info: Dict[str, RuleInfo]) -> dict:
    return {"rules": [{"code": r.code, "name": r.name, "default_enabled": r.default_enabled,
                       "triggers": list(r.triggers), "triggers_lower": list(r.triggers_lower),
                       "requires": [list(g) for g in r.requires]} for r in info.values()]}


def _decode_rules(data) -> Dict[str, RuleInfo]:
    """The validator of the rule facts read back (see ampfix/engine/entries.py): every rule
    with a code, a name and at least one trigger, as `_encode_rules` writes them."""
    def strings(v):
        return tuple(E.array(v, lambda s: E.string(s, nonempty=True)))

    rules = E.obj(data, ["rules"])["rules"]
    out: Dict[str, RuleInfo] = {}
    for raw in E.array(rules, lambda r: r):
        r = E.obj(raw, ["code", "name", "default_enabled", "triggers", "triggers_lower", "requires"])
        code = E.string(r["code"])
        if not re.fullmatch(r"[A-Z]+[0-9]+", code) or code in out:
            raise E.Invalid(f"rule code {code!r}")
        triggers, lower = strings(r["triggers"]), strings(r["triggers_lower"])
        if not triggers and not lower:
            raise E.Invalid(f"{code}: no trigger")
        requires = tuple(E.array(r["requires"], strings))
        if any(not group for group in requires):
            raise E.Invalid(f"{code}: an empty group of required strings")
        out[code] = RuleInfo(code, E.string(r["name"], nonempty=True), E.boolean(r["default_enabled"]),
                             triggers, lower, requires)
    if not out or list(out) != sorted(out):
        raise E.Invalid("no rules, or not in code order")
    return out


RULES = E.Kind("rules", _encode_rules, _decode_rules)


def rule_info(load: Callable[[], Dict[str, RuleInfo]], folder: Optional[Path] = None) -> Dict[str, RuleInfo]:
    """code -> RuleInfo for every rule, in code order; read from `folder` (a cache folder) when
    it holds them for this code (`fingerprint`: the file name and the entry's key) and they
    pass the checks of ampfix/engine/entries.py, else from `load` (the registry's `rule_facts`,
    which imports the rules) and then kept there."""
    key = None if folder is None else str(folder)
    if key in _INFO:
        return _INFO[key]
    info: Optional[Dict[str, RuleInfo]] = None
    code_key = None if folder is None else fingerprint(folder)
    entry = None if folder is None else folder / ("v" + __version__) / f"rules-{code_key}.json"
    if entry is not None:
        try:
            info = RULES.decode(E.unseal(entry.read_bytes(), RULES.name, code_key))
        except (OSError, E.Invalid):
            info = None
    if info is None:
        info = load()
        if entry is not None:
            write_json(entry, E.seal(RULES.name, code_key, RULES.encode(info)))
    _INFO[key] = info
    return info


def write_json(target: Path, data: dict) -> None:
    """Write `data` as JSON to `target` atomically (a temporary file, then a rename); a folder
    that cannot be written is ignored: a cache costs speed, never the check."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=str(target.parent))
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(data, fh)
            os.replace(tmp, target)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError:
        pass  # a cache that cannot be written costs speed, never the check


# ----------------------------------------------------------------------------- selection (as ampfix.engine.registry)


class SelectionError(ValueError):
    pass


def _matches(code: str, selector: str) -> bool:
    return selector == "ALL" or code.startswith(selector)


def validate_selectors(selectors: Iterable[str], option: str, info: Dict[str, RuleInfo]) -> List[str]:
    out = []
    codes = info.keys()
    for raw in selectors:
        sel = raw.strip().upper()
        if not sel:
            continue
        if sel != "ALL" and not any(_matches(c, sel) for c in codes):
            known = ", ".join(codes)
            raise SelectionError(f"{option}: unknown rule code or prefix {raw.strip()!r} (known codes: {known})")
        out.append(sel)
    return out


def select_codes(select: Optional[Sequence[str]], ignore: Sequence[str], info: Dict[str, RuleInfo]) -> List[str]:
    """`ampfix.engine.registry.select_rules`, as codes."""
    chosen = []
    for code, r in info.items():
        if select is None:
            wanted = r.default_enabled
        elif r.default_enabled:
            wanted = any(_matches(code, s) for s in select)
        else:
            wanted = code in select
        if wanted and not any(_matches(code, s) for s in ignore):
            chosen.append(code)
    return chosen


def maybe_triggered(codes: Sequence[str], text: str, info: Dict[str, RuleInfo]) -> bool:
    lowered = text.lower()
    return any(info[c].maybe_triggered(text, lowered) for c in codes)
