"""What a run needs to know about the rules before it analyses anything - their codes, names,
default set and triggers - without importing them (and LibCST): a warm run, every file a cache
hit, then never pays for those imports.

The facts are keyed by `source_digest`, a hash of the content of the sources they come from
(the rule modules, `ampfix/rule.py`, the registry, the measured precision), so they cannot
disagree with the rules that are installed. They come from the shipped table
(`rule_facts_table.py`, generated, carrying the digest it was made for) while it matches, else
from a cache folder's `rules-<digest>.json` (checksummed and validated by
`ampfix.engine.entries`: one that does not pass is read from the rules again, and facts kept
for other sources, a cache folder restored from another branch, are never read), else from the
registry (which imports the rules).

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
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Container, Dict, Iterable, List, Optional, Sequence, Tuple

from ampfix import __version__
from ampfix.engine import entries as E
from ampfix.triggers import Scan, project_candidate_test, trigger_test

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
    module summaries cached under it cannot disagree with the code that is installed, wherever
    the cache folder came from (a CI cache restored on another branch included).

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
    project_requires: Optional[Tuple[Tuple[str, ...], ...]] = None
    preview: bool = False  # runs only with preview on (`Rule.in_preview`)

    def maybe_triggered(self, text: Container[str], lowered: Container[str], project: bool = False) -> bool:
        """The default trigger test (with `project`, or the default project candidate test) on a
        text, or on the strings a text holds (`Scan`)."""
        if trigger_test(text, lowered, self.triggers, self.triggers_lower, self.requires):
            return True
        return project and project_candidate_test(text, lowered, self.triggers, self.triggers_lower, self.requires,
                                                  self.project_requires)


_INFO: Dict[Optional[str], Dict[str, RuleInfo]] = {}


def _encode_rules(info: Dict[str, RuleInfo]) -> dict:
    return {"rules": [{"code": r.code, "name": r.name, "default_enabled": r.default_enabled,
                       "triggers": list(r.triggers), "triggers_lower": list(r.triggers_lower),
                       "requires": [list(g) for g in r.requires],
                       "project_requires": None if r.project_requires is None else [list(g) for g in r.project_requires],
                       "preview": r.preview} for r in info.values()]}


def _decode_rules(data) -> Dict[str, RuleInfo]:
    """The validator of the rule facts read back (see ampfix/engine/entries.py), from the cache
    folder or from the shipped table: every rule with a code, a name and at least one trigger,
    as `_encode_rules` writes them."""
    def strings(v):
        return tuple(E.array(v, lambda s: E.string(s, nonempty=True)))

    def groups(v, code, what):
        out = tuple(E.array(v, strings))
        if any(not group for group in out):
            raise E.Invalid(f"{code}: an empty group of {what}")
        return out

    rules = E.obj(data, ["rules"])["rules"]
    out: Dict[str, RuleInfo] = {}
    for raw in E.array(rules, lambda r: r):
        r = E.obj(raw, ["code", "name", "default_enabled", "triggers", "triggers_lower", "requires",
                        "project_requires", "preview"])
        code = E.string(r["code"])
        if not re.fullmatch(r"[A-Z]+[0-9]+", code) or code in out:
            raise E.Invalid(f"rule code {code!r}")
        triggers, lower = strings(r["triggers"]), strings(r["triggers_lower"])
        if not triggers and not lower:
            raise E.Invalid(f"{code}: no trigger")
        requires = groups(r["requires"], code, "required strings")
        project = None if r["project_requires"] is None else groups(r["project_requires"], code, "project strings")
        out[code] = RuleInfo(code, E.string(r["name"], nonempty=True), E.boolean(r["default_enabled"]),
                             triggers, lower, requires, project, E.boolean(r["preview"]))
    if not out or list(out) != sorted(out):
        raise E.Invalid("no rules, or not in code order")
    return out


RULES = E.Kind("rules", _encode_rules, _decode_rules)


def rule_info(load: Callable[[], Dict[str, RuleInfo]], folder: Optional[Path] = None) -> Dict[str, RuleInfo]:
    """code -> RuleInfo for every rule, in code order. The facts are keyed by `source_digest`, a
    hash of the content of the sources they come from, so they cannot disagree with the rules
    that are installed: the shipped table (`rule_facts_table.py`) when its digest is theirs (the
    fast path: no cache folder needed); else the entry `rules-<digest>.json` of `folder` (a
    cache folder) when it passes the checks of ampfix/engine/entries.py (its kind, the digest
    as its key, a checksum, `_decode_rules`); else `load` (the registry's `rule_facts`, which
    imports the rules), then kept in `folder`."""
    key = None if folder is None else str(folder)
    if key in _INFO:
        return _INFO[key]
    info = shipped_facts()
    if info is None and folder is not None:
        digest = source_digest()
        entry = folder / ("v" + __version__) / f"rules-{digest}.json"
        try:
            info = RULES.decode(E.unseal(entry.read_bytes(), RULES.name, digest))
        except (OSError, E.Invalid):
            info = load()
            write_json(entry, E.seal(RULES.name, digest, RULES.encode(info)))
    if info is None:
        info = load()
    _INFO[key] = info
    return info


# ----------------------------------------------------------------------------- the shipped table
#
# `ampfix/engine/rule_facts_table.py` holds the same facts, generated from the rules
# (`python -m ampfix.engine.rulemeta`), with the digest of the sources they come from
# (`source_digest`: the rule modules, `ampfix/rule.py`, the registry and the measured precision,
# by content). It is used only while that digest matches the sources (reading and hashing them
# costs about a millisecond) and its rows pass the facts' validator, so a run without a cache
# folder (`--no-cache`, or the first run in a folder) still tests the triggers without importing
# the rules and LibCST; a stale table costs that speed, never a wrong answer. The same digest
# keys the facts kept in a cache folder (`rule_info`): one key, two places.

_TABLE = Path(__file__).with_name("rule_facts_table.py")
_SOURCE_DIGEST: Optional[str] = None


def source_digest() -> str:
    """sha256 of the sources the rule facts come from (names and contents), once a process."""
    global _SOURCE_DIGEST
    if _SOURCE_DIGEST is not None:
        return _SOURCE_DIGEST
    import ampfix.rules as rules_pkg

    files = [Path(__file__).with_name("registry.py"), Path(__file__).parent.parent / "rule.py",
             Path(__file__).parent.parent / "knowledge" / "precision.py"]  # preview follows the measured precision
    for folder in getattr(rules_pkg, "__path__", []):
        files.extend(sorted(Path(folder).glob("*.py")))
    h = hashlib.sha256()
    for f in files:
        data = f.read_bytes()
        h.update(f"{f.name}:{len(data)}\n".encode())
        h.update(data)
    _SOURCE_DIGEST = h.hexdigest()
    return _SOURCE_DIGEST


def _row(r) -> dict:
    """A row of the shipped table as `_encode_rules` writes a rule (lists for tuples)."""
    def lists(v):
        return [lists(x) for x in v] if isinstance(v, (list, tuple)) else v

    code, name, default_enabled, triggers, lower, requires, project, preview = r
    return {"code": code, "name": name, "default_enabled": default_enabled, "triggers": lists(triggers),
            "triggers_lower": lists(lower), "requires": lists(requires),
            "project_requires": None if project is None else lists(project), "preview": preview}


def shipped_facts() -> Optional[Dict[str, RuleInfo]]:
    """The facts of `rule_facts_table.py` when it matches the sources and passes the facts'
    validator (`_decode_rules`), else None."""
    try:
        from ampfix.engine import rule_facts_table as table

        if table.DIGEST != source_digest():
            return None
        return _decode_rules({"rules": [_row(r) for r in table.RULES]})
    except (ImportError, OSError, AttributeError, ValueError, TypeError):  # E.Invalid is a ValueError
        return None


def table_text(facts: Dict[str, RuleInfo]) -> str:
    """The text of `rule_facts_table.py` for `facts` (read from the rules)."""
    lines = ['"""Generated by `python -m ampfix.engine.rulemeta` from the rules: what a run needs to know of',
             "them before it analyses anything (see ampfix/engine/rulemeta.py). Do not edit; regenerate.",
             '"""', "", f"DIGEST = {source_digest()!r}", "", "RULES = ["]
    for r in facts.values():
        lines.append(f"    ({r.code!r}, {r.name!r}, {r.default_enabled!r}, {r.triggers!r}, {r.triggers_lower!r},")
        lines.append(f"     {r.requires!r}, {r.project_requires!r}, {r.preview!r}),")
    lines.append("]")
    return "\n".join(lines) + "\n"


def write_json(target: Path, data: dict) -> None:
    """Write `data` as JSON to `target` atomically (`write_atomically`)."""
    # (encoded whole, then one write: `json.dump` writes each chunk of the encoder, 5x slower)
    write_atomically(target, json.dumps(data).encode("utf-8"))


def write_atomically(target: Path, data: bytes) -> None:
    """Write `data` to `target` whole or not at all (a temporary file, then a rename: a reader,
    another process included, sees the old file or the new one); a folder that cannot be
    written is ignored: a cache costs speed, never the check."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        import tempfile

        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=str(target.parent))
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
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


def _selects(code: str, default_enabled: bool, selectors: Sequence[str]) -> bool:
    """Whether `selectors` choose a rule: a rule on by default by its code, a prefix or ALL; a
    rule off by default (AMP901) only by its own code or by ALL (as ruff's ALL is every rule)."""
    if default_enabled:
        return any(_matches(code, s) for s in selectors)
    return code in selectors or "ALL" in selectors


def select_codes(select: Optional[Sequence[str]], ignore: Sequence[str], info: Dict[str, RuleInfo],
                 extend: Sequence[str] = (), preview: bool = False) -> List[str]:
    """`ampfix.engine.registry.select_rules`, as codes: `select` (None: the default set) plus
    `extend` (`extend-select`), minus `ignore`. A preview rule is chosen only with `preview` on
    (then as any other rule), whatever selects it: a prefix, ALL or its own code
    (`preview_warnings` tells the user about the last)."""
    chosen = []
    for code, r in info.items():
        if r.preview and not preview:
            continue
        if select is None:
            wanted = r.default_enabled
        else:
            wanted = _selects(code, r.default_enabled, select)
        wanted = wanted or _selects(code, r.default_enabled, extend)
        if wanted and not any(_matches(code, s) for s in ignore):
            chosen.append(code)
    return chosen


def preview_warnings(select: Optional[Sequence[str]], info: Dict[str, RuleInfo], preview: bool) -> List[str]:
    """As ruff: selecting a preview rule by its exact code without preview on does nothing, and
    says so."""
    if preview or not select:
        return []
    return [f"warning: selection `{code}` has no effect because preview is not enabled ({code} is a preview "
            "rule: add --preview, or `preview = true` in [tool.ampfix])"
            for code in dict.fromkeys(select) if code in info and info[code].preview]


def first_triggered(codes: Sequence[str], text: str, info: Dict[str, RuleInfo], project: bool = False
                    ) -> Optional[str]:
    """The first of `codes` whose triggers' default test passes on `text` (`RuleInfo.maybe_triggered`), or
    None: the runner need not test again a file whose first such rule keeps the default tests.
    The rules share most of their strings: each is looked for in the text once (`Scan`), and the
    text is lower-cased only for a rule with lower-case triggers."""
    held, held_lower = Scan(text), Scan(text, lower=True)
    return next((c for c in codes if info[c].maybe_triggered(held, held_lower, project)), None)


if __name__ == "__main__":  # pragma: no cover - regenerates the shipped table
    from ampfix.engine.registry import rule_facts

    _TABLE.write_text(table_text(rule_facts()), encoding="utf-8")
    print(f"wrote {_TABLE}")
