"""Finds the rules, checks their definitions, and selects them by code or prefix."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from functools import lru_cache
from typing import Dict, Iterable, List, Optional, Sequence, Type

from ampfix.rule import Rule

CODE_RE = re.compile(r"^AMP[0-9]{3}$")
NAME_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
FIXABLE = ("safe", "unsafe", "sometimes", "none")
EXAMPLE_RE = re.compile(r"^(Bad|Good):\s*\n```python\n(.*?)\n```", re.MULTILINE | re.DOTALL)


class RuleDefinitionError(RuntimeError):
    """A rule class that could not work as written (raised when the rules are loaded)."""


def validate_rule(rule: Type[Rule]) -> None:
    """Reject a rule whose definition would make it silently useless or undocumented."""
    where = f"{rule.__module__}.{rule.__name__}"

    def fail(what: str) -> None:
        raise RuleDefinitionError(f"rule {where}: {what}")

    if not CODE_RE.match(rule.code or ""):
        fail(f"code {rule.code!r} is not of the form AMP123")
    if not NAME_RE.match(rule.name or ""):
        fail(f"name {rule.name!r} must be lowercase words joined by '-'")
    if not (rule.message or "").strip():
        fail("message is empty")
    if rule.fixable not in FIXABLE:
        fail(f"fixable must be one of {', '.join(FIXABLE)}, not {rule.fixable!r}")
    if not (rule.triggers or rule.triggers_lower) and not overrides(rule, "triggered_by"):
        fail("triggers is empty: the rule would never run (name the substrings a file must contain)")
    if any(not isinstance(t, str) or not t for t in (*rule.triggers, *rule.triggers_lower)):
        fail("triggers must be non-empty strings")
    if any(not group for group in rule.requires):
        fail("an empty group in requires would reject every file")
    kinds = [m.group(1) for m in EXAMPLE_RE.finditer(rule.docs or "")]
    if "Bad" not in kinds or "Good" not in kinds:
        fail('docs need a "Bad:" and a "Good:" example, each a ```python block')
    if rule.check is Rule.check:
        fail("check() is not implemented")


def overrides(rule: Type[Rule], name: str) -> bool:
    """`rule` defines its own `name` (a method of `Rule`), in its class or a base below `Rule`."""
    return inspect.getattr_static(rule, name) is not inspect.getattr_static(Rule, name)


def doc_examples(rule: Type[Rule]) -> List[tuple]:
    """[("Bad" | "Good", code), ...] from the rule's docs, in order."""
    return [(m.group(1), m.group(2) + "\n") for m in EXAMPLE_RE.finditer(rule.docs or "")]


@lru_cache(maxsize=1)
def all_rules() -> Dict[str, Type[Rule]]:
    import ampfix.rules as pkg

    found: Dict[str, Type[Rule]] = {}
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{pkg.__name__}.{info.name}")
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, Rule) and obj is not Rule and obj.__module__ == module.__name__:
                validate_rule(obj)
                if obj.code in found:
                    raise RuleDefinitionError(f"rule code {obj.code} is defined twice")
                found[obj.code] = obj
    return dict(sorted(found.items()))


from ampfix.engine import rulemeta  # noqa: E402


def rule_facts() -> Dict[str, rulemeta.RuleInfo]:
    """What the warm path needs to know of every rule (`rulemeta.RuleInfo`), read from the rules."""
    return {code: rulemeta.RuleInfo(code, r.name, bool(r.default_enabled), tuple(r.triggers),
                                    tuple(r.triggers_lower), tuple(tuple(g) for g in r.requires),
                                    None if r.project_requires is None else tuple(tuple(g) for g in r.project_requires),
                                    r.in_preview())
            for code, r in all_rules().items()}
from ampfix.engine.rulemeta import SelectionError  # noqa: E402, F401  (re-exported: the light selection raises it too)


def validate_selectors(selectors: Iterable[str], option: str) -> List[str]:
    return rulemeta.validate_selectors(selectors, option, all_rules())


def select_rules(select: Optional[Sequence[str]], ignore: Sequence[str], preview: bool = False) -> List[Type[Rule]]:
    """Rules chosen by `select` (None: the default set) minus `ignore`. A rule that is off by
    default is chosen only when selected by its own code or by ALL; a preview rule only with `preview`."""
    rules = all_rules()
    return [rules[code] for code in rulemeta.select_codes(select, ignore, rule_facts(), preview=preview)]


def find_rule(code: str) -> Optional[Type[Rule]]:
    code = code.strip().upper()
    rules = all_rules()
    if code in rules:
        return rules[code]
    for r in rules.values():
        if r.name == code.lower():
            return r
    return None
