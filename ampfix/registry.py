"""Finds the rules and selects them by code or prefix."""

from __future__ import annotations

import importlib
import pkgutil
import re
from functools import lru_cache
from typing import Dict, Iterable, List, Optional, Sequence, Type

from ampfix.rule import Rule

CODE_RE = re.compile(r"^AMP[0-9]{3}$")


@lru_cache(maxsize=1)
def all_rules() -> Dict[str, Type[Rule]]:
    import ampfix.rules as pkg

    found: Dict[str, Type[Rule]] = {}
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{pkg.__name__}.{info.name}")
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, Rule) and obj is not Rule and obj.__module__ == module.__name__:
                if not CODE_RE.match(obj.code):
                    raise RuntimeError(f"rule {obj.__name__} has an invalid code {obj.code!r}")
                if obj.code in found:
                    raise RuntimeError(f"rule code {obj.code} is defined twice")
                found[obj.code] = obj
    return dict(sorted(found.items()))


class SelectionError(ValueError):
    pass


def _matches(code: str, selector: str) -> bool:
    return selector == "ALL" or code.startswith(selector)


def validate_selectors(selectors: Iterable[str], option: str) -> List[str]:
    out = []
    codes = all_rules().keys()
    for raw in selectors:
        sel = raw.strip().upper()
        if not sel:
            continue
        if sel != "ALL" and not any(_matches(c, sel) for c in codes):
            known = ", ".join(codes)
            raise SelectionError(f"{option}: unknown rule code or prefix {raw.strip()!r} (known codes: {known})")
        out.append(sel)
    return out


def select_rules(select: Optional[Sequence[str]], ignore: Sequence[str]) -> List[Type[Rule]]:
    rules = all_rules()
    chosen = [r for c, r in rules.items() if select is None or any(_matches(c, s) for s in select)]
    return [r for r in chosen if not any(_matches(r.code, s) for s in ignore)]


def find_rule(code: str) -> Optional[Type[Rule]]:
    code = code.strip().upper()
    rules = all_rules()
    if code in rules:
        return rules[code]
    for r in rules.values():
        if r.name == code.lower():
            return r
    return None
