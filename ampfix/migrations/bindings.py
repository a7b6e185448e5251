"""Migrating a name together with its import: the bookkeeping migration rules share.

A name bound by an import (`from torch.cuda.amp import autocast as ac`) is migrated in two
steps: every use first (the arguments change, the name stays), then the import, in a later
pass, once no use is left to change. The name is never half migrated: when one use cannot be
migrated, or a use or the import is silenced with `# noqa`, none of them is, and each use says
why. `settle` works that out; the rule then reports the uses (their fixes share a fix group)
and, for a binding with nothing `pending`, the import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import libcst as cst


@dataclass
class Binding:
    """A name bound by an import that is to be migrated."""

    stmt: cst.CSTNode  # the Import / ImportFrom small statement
    alias: cst.ImportAlias
    name: str  # the bound name
    device: str
    kind: Optional[str]  # the API for `from torch.cuda.amp import autocast`; None for a module binding
    refs: List[cst.Name] = field(default_factory=list)
    blocked: Optional[str] = None
    pending: int = 0  # uses with a fix this pass


@dataclass
class Use:
    """One use of an API to migrate, and its replacement (or why it cannot be migrated)."""

    node: cst.CSTNode  # where the finding is reported
    kind: str
    device: str
    replacements: Optional[Dict[cst.CSTNode, cst.CSTNode]] = None
    blocked: Optional[str] = None
    done: bool = False  # already migrated (its import follows)
    binding: Optional[Binding] = None
    fallback: bool = False  # the old torch's path of a shim: not reported (it blocks its name's migration)


def settle(ctx, code: str, bindings: Sequence[Binding], uses: Sequence[Use]) -> None:
    """Block every binding that has a use which cannot be migrated or that is silenced (or
    whose import is), and count the uses each binding still has to migrate."""
    model = ctx.model
    for b in bindings:
        b_uses = [u for u in uses if u.binding is b]
        hit = next((n for n in [b.stmt, *(u.node for u in b_uses if not u.done)] if ctx.is_suppressed(n, code)), None)
        if b.blocked is None and hit is not None:
            b.blocked = f"`{b.name}` has a use or import marked `# noqa` (line {model.line(hit)})"
        bad = next((u for u in b_uses if u.blocked), None)
        if b.blocked is None and bad is not None:
            b.blocked = f"`{b.name}` is also used on line {model.line(bad.node)}, where {bad.blocked}"
        b.pending = sum(1 for u in b_uses if not u.done and u.blocked is None)
