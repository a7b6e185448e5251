"""The rule API: a rule is a small class with a code, a name, docs and a `check` method.

A rule never parses or resolves names itself; it queries the shared `AmpModel`
(`ctx.model`) and yields `Violation`s, optionally carrying a `Fix`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Dict, Iterator, Optional, Tuple, Union

import libcst as cst

if TYPE_CHECKING:  # pragma: no cover
    from ampfix.model import AmpModel

Replacement = Union[cst.CSTNode, cst.RemovalSentinel, cst.FlattenSentinel]


@dataclass
class Fix:
    """Replace nodes of the file's tree (by identity) with new nodes.

    `safe` fixes are applied by `ampfix rewrite`; unsafe ones only with `--unsafe-fixes`.
    """

    replacements: Dict[cst.CSTNode, Replacement]
    safe: bool = True
    description: str = ""


@dataclass
class Violation:
    node: cst.CSTNode
    message: Optional[str] = None
    fix: Optional[Fix] = None


@dataclass
class FileContext:
    path: str
    source: str
    model: "AmpModel"
    min_torch_version: Tuple[int, ...] = (2, 4)
    unsafe_fixes: bool = False
    extra: dict = field(default_factory=dict)


class Rule:
    """Base class. Subclasses set the class attributes and implement `check`."""

    code: ClassVar[str] = ""
    name: ClassVar[str] = ""
    message: ClassVar[str] = ""
    #: The file must contain at least one of these substrings for the rule to run at all;
    #: a file that contains none of any selected rule's triggers is never parsed.
    triggers: ClassVar[Tuple[str, ...]] = ()
    #: Lowercase triggers, matched against the lowercased text (for misspellings).
    triggers_lower: ClassVar[Tuple[str, ...]] = ()
    #: Further groups of substrings: the file must also contain one of each group.
    requires: ClassVar[Tuple[Tuple[str, ...], ...]] = ()
    #: "safe", "unsafe", "sometimes" or "none": what `ampfix rules` shows.
    fixable: ClassVar[str] = "none"
    #: Markdown with a "Bad" and a "Good" example, printed by `ampfix explain CODE`.
    docs: ClassVar[str] = ""

    def check(self, ctx: FileContext) -> Iterator[Violation]:  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def triggered_by(cls, text: str, lowered: str) -> bool:
        if not (any(t in text for t in cls.triggers) or any(t in lowered for t in cls.triggers_lower)):
            return False
        return all(any(t in text for t in group) for group in cls.requires)
