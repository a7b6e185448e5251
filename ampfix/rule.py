"""The rule API: a rule is a small class with a code, a name, docs and a `check` method.

A rule never parses, resolves names or walks the tree for facts about flow: it queries the
shared model (`ctx.model`, see `ampfix/model/`) and yields `Violation`s, optionally carrying a
`Fix` built with the edits layer (`ampfix/fixes/edits.py`). The registry checks every rule class
when it is loaded (`ampfix/engine/registry.py`), so a rule that could never run, or has no docs, fails
loudly instead of silently.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, ClassVar, Dict, Iterator, Optional, Tuple

from ampfix.knowledge.torch_versions import DEFAULT_MIN_TORCH
from ampfix.triggers import project_candidate_test, trigger_test  # noqa: F401  (a run tests triggers without this module: ampfix/engine/rulemeta.py)

if TYPE_CHECKING:  # pragma: no cover
    import libcst as cst

    from ampfix.model import AmpModel

    from ampfix.fixes.edits import Replacement


class Applicability(enum.Enum):
    """How a fix may be used. There is no default: every fix says which it is."""

    SAFE = "safe"  #: applied by `ampfix rewrite`
    UNSAFE = "unsafe"  #: may change behaviour: applied only with `--unsafe-fixes`
    DISPLAY_ONLY = "display"  #: shown as a suggestion, never applied


SAFE, UNSAFE, DISPLAY_ONLY = Applicability.SAFE, Applicability.UNSAFE, Applicability.DISPLAY_ONLY


@dataclass
class Fix:
    """Replace nodes of the file's tree (by identity) with new nodes.

    `group`: fixes that share a group (within one rule and file) are applied all together or
    not at all: when one of them cannot be applied (its finding is suppressed with `# noqa`, or
    it collides with another fix), none is, and each finding of the group says why.
    """

    replacements: Dict[cst.CSTNode, Replacement]
    applicability: Applicability
    description: str
    group: Optional[str] = None

    def __post_init__(self) -> None:
        if not isinstance(self.applicability, Applicability):
            raise TypeError(f"Fix.applicability must be an Applicability, not {self.applicability!r}")
        if not self.replacements:
            raise ValueError("a Fix must replace at least one node")

    @property
    def safe(self) -> bool:
        return self.applicability is Applicability.SAFE


@dataclass
class Violation:
    node: cst.CSTNode
    message: Optional[str] = None
    fix: Optional[Fix] = None
    #: code of other modules that is part of the cause, as (path, line, column, note); by
    #: default the engine names the code of other modules that runs at the reported call
    related: Tuple[Tuple[str, int, int, str], ...] = ()


@dataclass
class FileContext:
    path: str
    source: str
    model: "AmpModel"
    min_torch_version: Tuple[int, ...] = DEFAULT_MIN_TORCH
    #: where min_torch_version comes from: "--min-torch-version", "min-torch-version in
    #: pyproject.toml", "`torch>=1.13` in setup.py" (the project's metadata), "" (the default)
    min_torch_source: str = ""
    #: where the project declares it supports a Lightning before 2.0 ("`pytorch-lightning<2.0` in
    #: requirements.txt", read from its metadata); "" when it does not
    lightning_before_2: str = ""
    #: where the project's requirements admit only a torch before 2.4, the first to deprecate
    #: `torch.cuda.amp` ("`torch>=2.1,<2.3` in setup.py"); "" when they do not
    torch_before_2_4: str = ""
    unsafe_fixes: bool = False
    #: set by the engine: (node, code) -> suppressed by `# noqa` on its line
    suppression: Optional[Callable[[cst.CSTNode, str], bool]] = None
    extra: dict = field(default_factory=dict)

    def is_suppressed(self, node: cst.CSTNode, code: str) -> bool:
        """True when a finding of `code` reported at `node` would be silenced by `# noqa`."""
        return self.suppression is not None and self.suppression(node, code)


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
    #: With the project read (every run of `check`/`rewrite` over files on disk), a module that
    #: lacks the triggers is still analysed for this rule when it holds one string of every
    #: group here and a module of the project it imports, or that imports it, holds the
    #: triggers: the scaler built in a base class of another module, the loop that calls this
    #: helper. None: the rule's findings never depend on another module's text.
    project_requires: ClassVar[Optional[Tuple[Tuple[str, ...], ...]]] = None
    #: The rule's triggers may be in comments (AMP901's noqa directives): its trigger tests read the
    #: file as it is. Other rules' read its code with comments and docstrings masked
    #: (`ampfix.lexemes.masked`): a finding is made of code, not of what a comment says of it.
    reads_comments: ClassVar[bool] = False
    #: "safe", "unsafe", "sometimes" or "none": what `ampfix rules` shows.
    fixable: ClassVar[str] = "none"
    #: One line on what the fix does and when (the README's rule table); default: `fixable`.
    fix_note: ClassVar[str] = ""
    #: Markdown with a "Bad:" and a "Good:" example, printed by `ampfix explain CODE`; the
    #: examples are tests: the Bad one must produce this rule's finding, the Good one none.
    docs: ClassVar[str] = ""
    #: Off unless selected explicitly (by its code, not by a prefix or ALL).
    default_enabled: ClassVar[bool] = True
    #: A preview rule runs only with preview on (`--preview`, `preview = true` in [tool.ampfix]),
    #: as ruff's preview rules do. A rule measured below the precision threshold on the
    #: ecosystem check is preview too (`ampfix/knowledge/precision.py`): see `in_preview`.
    preview: ClassVar[bool] = False

    def check(self, ctx: FileContext) -> Iterator[Violation]:  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def in_preview(cls) -> bool:
        """Marked preview, or measured below the precision threshold: runs only with preview on."""
        from ampfix.knowledge.precision import below_threshold

        return bool(cls.preview) or below_threshold(cls.code)

    @classmethod
    def triggered_by(cls, text: str, lowered: str) -> bool:
        # An override may only narrow this test (return False where it returns False): a warm
        # run tests the triggers without importing the rules (ampfix/engine/rulemeta.py) and looks up
        # in the cache only the files this default test lets through.
        return trigger_test(text, lowered, cls.triggers, cls.triggers_lower, cls.requires)

    @classmethod
    def project_candidate(cls, text: str, lowered: Optional[str] = None) -> bool:
        """The text may take part in a step whose rest is in related modules (`project_candidate_test`)."""
        if cls.project_requires is None:
            return False
        return project_candidate_test(text, text.lower() if lowered is None else lowered, cls.triggers,
                                      cls.triggers_lower, cls.requires, cls.project_requires)
