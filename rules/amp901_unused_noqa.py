"""AMP901 unused-noqa: a `# noqa: AMPxxx` that silences nothing.

The AMP9xx family is for rules about ampfix's own directives rather than about AMP code (as
ruff's RUF100 sits apart from the lint rules); 0xx are AMP correctness rules and 1xx API
migrations, leaving 2xx-8xx for future kinds of AMP rules.
"""

from __future__ import annotations

from typing import Dict, Iterator, List, Optional, Set, Tuple

import libcst as cst

from ampfix.engine.noqa import NoqaDirective, covers, directives, without_codes
from ampfix.rule import SAFE, FileContext, Fix, Rule, Violation


class UnusedNoqa(Rule):
    code = "AMP901"
    name = "unused-noqa"
    message = "`# noqa` names an ampfix code that silences nothing on this line"
    triggers_lower = ("noqa",)
    reads_comments = True
    fixable = "safe"
    fix_note = "safe (removes the stale code)"
    default_enabled = False
    #: the engine runs this rule after the others and tells it, in ctx.extra, which `# noqa`
    #: directives silenced a finding ("noqa_used") and which codes ran on the file ("selected_codes")
    after_noqa = True
    docs = """
A `# noqa: AMP003` stays in the code after the mistake it silenced is fixed, or was put on a
line where ampfix never reports AMP003. It then silences nothing today and would hide a real
finding added to that line later. This rule reports each ampfix code in a `# noqa` list that
did not silence a finding on its line, and each `AMP` code that names no ampfix rule; its
safe fix removes those codes (the whole comment when nothing else is left in it). A
file-level `# ampfix: noqa: AMP003` is judged the same way over the whole file.

Off by default (select it by its code: `--select AMP0,AMP1,AMP901`, or in the config). It
judges a code only when every rule the code covers ran on the file: a `# noqa: AMP003` is left
alone when AMP003 is not selected or is ignored for the file, since it may be needed by a run
that selects it. A bare `# noqa` and other tools' codes (`# noqa: E501`) are never touched.

Bad:
```python
import torch

scaler = torch.amp.GradScaler("cuda")
scaler.step(optimizer)  # noqa: AMP099
```

Good:
```python
import torch

scaler = torch.amp.GradScaler("cuda")
scaler.step(optimizer)
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        from ampfix.engine.registry import all_rules

        found = directives(ctx.source)
        if not found:
            return
        used: Set[Tuple[int, Optional[str]]] = ctx.extra.get("noqa_used", set())
        selected = set(ctx.extra.get("selected_codes", ()))
        known = list(all_rules())
        comments: Optional[Dict[Tuple[int, int], cst.Comment]] = None
        for d in found:
            stale: List[str] = []
            unknown: List[str] = []
            for c in d.codes:
                if not c.startswith("AMP") or (d.line, c) in used:
                    continue
                covered = [k for k in known if covers(c, k)]
                if not covered:
                    unknown.append(c)
                elif self.code not in covered and all(k in selected for k in covered):
                    stale.append(c)
            if not (stale or unknown):
                continue
            if comments is None:
                comments = self._comments(ctx)
            node = comments.get((d.line, d.column))
            if node is None:
                continue
            yield Violation(node, message=self._message(stale, unknown, d.file_level),
                            fix=self._fix(ctx, d, node, set(stale) | set(unknown)))

    @staticmethod
    def _comments(ctx: FileContext) -> Dict[Tuple[int, int], cst.Comment]:
        """The comments that may hold a directive (the word `noqa`), by position: only those
        need one (a position costs the code generation of its top-level statement)."""
        out = {}
        for node in ctx.model.nodes_of(cst.Comment):
            if "noqa" not in node.value.lower():
                continue
            pos = ctx.model.position(node).start
            out[(pos.line, pos.column)] = node
        return out

    @staticmethod
    def _message(stale: List[str], unknown: List[str], file_level: bool = False) -> str:
        parts = []
        if stale:
            names = ", ".join(f"`{c}`" for c in stale)
            if file_level:
                parts.append(f"unused `# ampfix: noqa` code{'s' if len(stale) > 1 else ''} {names}: nothing in this "
                             "file is reported as such")
            else:
                parts.append(f"unused `# noqa` code{'s' if len(stale) > 1 else ''} {names}: nothing on this line "
                             "is reported as such")
        if unknown:
            names = ", ".join(f"`{c}`" for c in unknown)
            parts.append(f"{names} name{'s' if len(unknown) == 1 else ''} no ampfix rule")
        return "; ".join(parts) + "; remove the stale code"

    def _fix(self, ctx: FileContext, d: NoqaDirective, node: cst.Comment, stale: Set[str]) -> Optional[Fix]:
        new = without_codes(d, stale)
        if new is not None:
            return Fix({node: cst.Comment(new)}, applicability=SAFE, description="stale noqa code removed")
        parent = ctx.model.parent(node)
        if isinstance(parent, cst.TrailingWhitespace):
            replacement: object = parent.with_changes(whitespace=cst.SimpleWhitespace(""), comment=None)
        elif isinstance(parent, cst.EmptyLine):
            replacement = parent.with_changes(whitespace=cst.SimpleWhitespace(""), comment=None)
        else:
            return None
        return Fix({parent: replacement}, applicability=SAFE, description="stale noqa comment removed")  # type: ignore[dict-item]
