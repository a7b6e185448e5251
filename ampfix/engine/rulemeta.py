"""What a run needs to know about the rules before it analyses anything - their codes, names,
default set and triggers - without importing them (and LibCST): a warm run, every file a cache
hit, then never pays for those imports.

The facts are read from the rules once (`ampfix.engine.registry`) and kept in the cache folder as
JSON, keyed by a fingerprint of ampfix's code (the size and mtime of every module of ampfix and
of its rules, see `fingerprint`): an edited rule brings a fresh read. Without a cache folder
(`--no-cache`) they come straight from the registry.

`maybe_triggered` is the triggers' test as `Rule.triggered_by` does it by default; for a rule
that overrides `triggered_by` it tests the default triggers only (an override may only narrow
them, see `ampfix.rule.Rule.triggered_by`): it may say yes where the rule says no, never the
reverse, so a file it lets through is analysed or looked up in the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from ampfix import __version__
from ampfix.triggers import project_candidate_test, trigger_test

_FINGERPRINT: Optional[str] = None


def fingerprint() -> str:
    """ampfix's version and the size/mtime of its modules and rules (cheap: a few dozen stats)."""
    global _FINGERPRINT
    if _FINGERPRINT is None:
        import ampfix
        import ampfix.rules as rules_pkg

        h = hashlib.sha256(__version__.encode())
        for pkg in (ampfix, rules_pkg):
            for folder in getattr(pkg, "__path__", []):
                for root, _, names in sorted(os.walk(folder)):
                    for name in sorted(names):
                        if name.endswith(".py"):
                            st = os.stat(os.path.join(root, name))
                            h.update(f"{root}/{name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
        _FINGERPRINT = h.hexdigest()
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

    def maybe_triggered(self, text: str, lowered: str, project: bool = False) -> bool:
        if trigger_test(text, lowered, self.triggers, self.triggers_lower, self.requires):
            return True
        return project and project_candidate_test(text, lowered, self.triggers, self.triggers_lower, self.requires,
                                                  self.project_requires)


_INFO: Dict[Optional[str], Dict[str, RuleInfo]] = {}


def rule_info(load: Callable[[], Dict[str, RuleInfo]], folder: Optional[Path] = None) -> Dict[str, RuleInfo]:
    """code -> RuleInfo for every rule, in code order; read from `folder` (a cache folder) when
    it holds them for this fingerprint, else from `load` (the registry's `rule_facts`, which
    imports the rules) and then kept there."""
    key = None if folder is None else str(folder)
    if key in _INFO:
        return _INFO[key]
    info: Optional[Dict[str, RuleInfo]] = None
    entry = None if folder is None else folder / ("v" + __version__) / f"rules-{fingerprint()}.json"
    if entry is not None:
        try:
            raw = json.loads(entry.read_bytes())
            info = {r["code"]: RuleInfo(r["code"], r["name"], bool(r["default_enabled"]), tuple(r["triggers"]),
                                        tuple(r["triggers_lower"]), tuple(tuple(g) for g in r["requires"]),
                                        None if r.get("project_requires") is None
                                        else tuple(tuple(g) for g in r["project_requires"]),
                                        bool(r["preview"]))
                    for r in raw["rules"]}
        except (OSError, ValueError, TypeError, KeyError):
            info = None
    if info is None:
        info = shipped_facts() or load()
        if entry is not None:
            write_json(entry, {"rules": [r.__dict__ for r in info.values()]})
    _INFO[key] = info
    return info


# ----------------------------------------------------------------------------- the shipped table
#
# `ampfix/engine/rule_facts_table.py` holds the same facts, generated from the rules
# (`python -m ampfix.engine.rulemeta`), with a digest of the sources they come from: the rule
# modules, `ampfix/rule.py` and the registry. It is used only while that digest matches the
# sources (reading and hashing them costs about a millisecond), so a run without a cache folder
# (`--no-cache`, or the first run in a folder) still tests the triggers without importing the
# rules and LibCST; a stale table costs that speed, never a wrong answer.

_TABLE = Path(__file__).with_name("rule_facts_table.py")


def source_digest() -> str:
    """sha256 of the sources the rule facts come from (names and contents)."""
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
    return h.hexdigest()


def shipped_facts() -> Optional[Dict[str, RuleInfo]]:
    """The facts of `rule_facts_table.py` when it matches the sources, else None."""
    try:
        from ampfix.engine import rule_facts_table as table

        if table.DIGEST != source_digest():
            return None
        return {r[0]: RuleInfo(r[0], r[1], bool(r[2]), tuple(r[3]), tuple(r[4]), tuple(tuple(g) for g in r[5]),
                               None if r[6] is None else tuple(tuple(g) for g in r[6]), bool(r[7]))
                for r in table.RULES}
    except (ImportError, OSError, AttributeError, IndexError, TypeError):
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
    """Write `data` as JSON to `target` atomically (a temporary file, then a rename); a folder
    that cannot be written is ignored: a cache costs speed, never the check."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        import tempfile

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


def maybe_triggered(codes: Sequence[str], text: str, info: Dict[str, RuleInfo], project: bool = False) -> bool:
    lowered = text.lower()
    return any(info[c].maybe_triggered(text, lowered, project) for c in codes)


if __name__ == "__main__":  # pragma: no cover - regenerates the shipped table
    from ampfix.engine.registry import rule_facts

    _TABLE.write_text(table_text(rule_facts()), encoding="utf-8")
    print(f"wrote {_TABLE}")
