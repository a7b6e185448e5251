"""NVIDIA apex outside `apex.amp` to torch (AMP103): the migration of one use of an apex name.

Which uses the file acts on, and their roles, are the model's facts (`ampfix/model/apex_uses.py`);
what each apex name maps to, and how its arguments map, is static knowledge
(`ampfix/knowledge/apex_api.py`). `replace_use` puts the two together: the torch replacement of
one use (`TorchReplacement`: the edits, with `import torch` before the file's first import when
the file has none), or why it is not migrated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import libcst as cst

from ampfix.fixes.edits import with_args
from ampfix.knowledge.apex_api import ONE_TO_ONE, ApexApi, map_args, target_for
from ampfix.model import ApexRole, ApexUse

if TYPE_CHECKING:
    from ampfix.rule import FileContext


def version_text(v: Tuple[int, ...]) -> str:
    """`(2, 0)` -> `2.0`."""
    return ".".join(map(str, v))


@dataclass(eq=False)
class TorchReplacement:
    """What replaces one use of an apex name: the torch target and the edits, or why not."""

    target: str  # the torch replacement, from the torch root (`optim.AdamW`)
    edits: Optional[Dict[cst.CSTNode, object]] = None  # None: not migrated (`reason` says why)
    reason: str = ""
    notes: List[str] = field(default_factory=list)  # what the mapped arguments change (dropped keywords)


def replace_use(ctx: FileContext, use: ApexUse, api: ApexApi) -> TorchReplacement:
    """The torch replacement of one use the file acts on (`use.reported`) of an apex name torch
    replaces (`api`): a build becomes the torch call with its arguments mapped (`map_args`), a
    type check of a class that maps one to one becomes torch's class. Not migrated (the
    `reason`): a name that may also be bound to something else, a replacement newer than the
    oldest supported torch, a file with no module-level import before which `import torch`
    could go, arguments that do not map, a type check of a class whose torch replacement depends
    on its arguments, the base of a wrapper class, a name bound to another that the file calls."""
    model, node, call, torch = ctx.model, use.node, use.call, ctx.model.torch_alias()
    out = TorchReplacement(target_for(model, call, api))
    if use.ambiguous:
        out.reason = f"`{model.code(node)}` may also be bound to something else here (an optional import?)"
    elif tuple(ctx.min_torch_version) < api.min_torch:
        out.reason = (f"torch.{out.target} needs torch >= {version_text(api.min_torch)} and the oldest supported "
                      f"torch is {version_text(ctx.min_torch_version)} ({ctx.min_torch_source or 'min-torch-version'})")
    elif torch is None and model.apex.first_import() is None:
        out.reason = "the file has no module-level import before which `import torch` could go"
    elif use.role is ApexRole.BUILD:
        assert call is not None
        args, target_or_why, notes = map_args(model, call, api)
        if args is None:
            out.reason = target_or_why
        else:
            out.target, out.notes = target_or_why, notes
            func = cst.parse_expression(f"{torch or 'torch'}.{out.target}")
            out.edits = {call: with_args(call.with_changes(func=func), args)}
    elif use.role is ApexRole.TYPE and api.kind in ONE_TO_ONE:
        out.edits = {node: cst.parse_expression(f"{torch or 'torch'}.{out.target}")}
    elif use.role is ApexRole.TYPE:
        out.reason = (f"a type check: `{use.qualified.split('.')[-1]}` becomes a torch class that depends on its "
                      "arguments; change the check with the code that builds them")
    elif use.role is ApexRole.WRAPPED:
        out.reason = "a class of this file wraps it (as its base): give that class torch's base by hand"
    else:
        out.reason = "it is bound to another name here, which this file calls: migrate that name by hand"
    if out.edits is not None and torch is None:  # `import torch` goes before the file's first import, with this use
        first = model.apex.first_import()
        assert first is not None
        out.edits[first] = cst.FlattenSentinel([cst.parse_statement("import torch\n").with_changes(
            leading_lines=first.leading_lines), first.with_changes(leading_lines=())])
    return out
