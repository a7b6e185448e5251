"""AMP103 apex-to-torch: the rest of NVIDIA apex (outside apex.amp, which is AMP102's) to torch.

Each use of an apex name (whatever the import: `from apex.parallel import
DistributedDataParallel as DDP`, `import apex`, `from apex import parallel`) is rewritten to the
fully qualified torch replacement (`torch.nn.parallel.DistributedDataParallel(...)`) with its
arguments mapped (`ampfix/knowledge/apex_api.py`); once nothing uses an apex import any more, the import
goes in the next pass (a `try:` that only imported apex goes whole when its `except` branch binds
nothing the file uses). Every fix is unsafe: another library's kernels; each title says what differs.
Which uses the file acts on, its optional imports, optimizer factories and leftover imports are
the model's facts (`ampfix/model/apex_uses.py`), the torch replacement of one use the
migration's (`ampfix/migrations/apex/rest.py`); this rule words them and builds the fixes.
"""

from __future__ import annotations

from typing import Dict, Iterator, List, Optional, Tuple

import libcst as cst

from ampfix.knowledge.apex_api import adam_mode_unknown, lookup
from ampfix.fixes.edits import keep_comments, remove_import_alias_tidily, remove_statement_tidily, with_args
from ampfix.migrations.apex.rest import replace_use, version_text
from ampfix.model import AmpModel, ApexOptionalImport, ApexUse
from ampfix.rule import UNSAFE, FileContext, Fix, Rule, Violation

USED_KEY = "AMP103: apex imports in use"  # in the rewrite's memo: set by the first pass
Finding = Tuple[ApexUse, str, Optional[Fix]]


class ApexToTorch(Rule):
    code = "AMP103"
    name = "apex-to-torch"
    message = "NVIDIA apex is not maintained for current torch: use the torch equivalent"
    triggers = ("apex",)
    fixable = "unsafe"
    fix_note = "unsafe (apex DDP, SyncBatchNorm, FusedAdam/SGD, FusedLayerNorm/RMSNorm to torch; the title says what differs)"
    docs = """
NVIDIA apex is not maintained for current torch. What it offers outside `apex.amp` (AMP102
migrates that) and torch can replace is reported, and migrated where the arguments map:

| apex | torch | torch >= | what differs |
|---|---|---|---|
| `apex.parallel.DistributedDataParallel(m, ...)` | `torch.nn.parallel.DistributedDataParallel(m)` | 1.0 | no `device_ids` (apex has none; torch uses the module's device); `message_size`, `delay_allreduce`, `gradient_predivide_factor`, `num_allreduce_streams`, `prof` dropped; torch broadcasts rank 0's buffers at each forward; unused parameters need `find_unused_parameters=True` |
| `apex.parallel.convert_syncbn_model(m)` | `torch.nn.SyncBatchNorm.convert_sync_batchnorm(m)` | 1.2 | `channel_last=True` reported |
| `apex.parallel.SyncBatchNorm(n, ...)` | `torch.nn.SyncBatchNorm(n, ...)` | 1.1 | `channel_last`, `fuse_relu` reported |
| `apex.optimizers.FusedAdam(p, ...)` | `torch.optim.AdamW(p, ..., weight_decay=0.0, fused=True)` | 2.0 | apex's default is `adam_w_mode=True` (AdamW) and `weight_decay=0`; `adam_w_mode=False`: `torch.optim.Adam`; `bias_correction=False`, `master_weights=True` reported; apex's optimizer state does not load |
| `apex.optimizers.FusedSGD(p, lr, ...)` | `torch.optim.SGD(p, lr, ..., fused=True)` | 2.3 | `wd_after_momentum=True` reported |
| `apex.normalization.FusedLayerNorm(shape, ...)` | `torch.nn.LayerNorm(shape, ...)` | 1.0 | `memory_efficient` dropped |
| `apex.normalization.FusedRMSNorm(shape, ...)` | `torch.nn.RMSNorm(shape, eps=1e-5, ...)` | 2.4 | torch's default eps is the dtype's, apex's 1e-5 |
| `FusedAdagrad` | `torch.optim.Adagrad` | | reported: no fused kernel, migrate by hand |
| `apex.fp16_utils`, `FP16_Optimizer` | `torch.amp.autocast` and `torch.amp.GradScaler` | | reported: apex's manual fp16 training, migrate by hand |
| `FusedLAMB`, `FusedNovoGrad`, `LARC`, `MixedFusedLayerNorm`, `FastLayerNorm`, fused layer-norm functions, `create_syncbn_process_group`, `apex.contrib` kernels | none | | not reported: nothing to migrate to |

The apex signatures assumed (apex master, 2023-2024) are listed in `ampfix/knowledge/apex_api.py`;
the tests compare the kept arguments with torch's own signatures.
Not reported either: code that only names apex classes for compatibility with objects built
elsewhere (an `isinstance` check or a type tuple for models that may hold apex's SyncBatchNorm,
an export helper converting apex modules, classes handed to a tracer, `apex.__file__` in an
environment report), and an apex import the file does not use (an install check). An optimizer
factory that offers several apex optimizers in its branches is one finding, at the first branch.

Only the positional arguments whose meaning is the same in both are kept (FusedAdam: `params, lr`);
a keyword without an equivalent, `*args`, or a replacement newer than `--min-torch-version`
is reported. `isinstance`/annotation uses of the classes this file builds map to the torch class;
an apex class bound to a name the file calls, or wrapped by a thin subclass the file builds (its
methods only add to `super()`'s), is reported; a subclass that extends apex's internals is not. Once the rewrite has
migrated every use of an apex import it is removed
(a `try:` that only imports apex goes whole when its `except ImportError:` branch raises or
binds nothing the file uses; next to an availability flag it is left, and the finding of its
use says so). apex imported as the fallback of a torch import (`except ImportError: from
apex...`) is left alone.

Bad:
```python
import torch
from apex.parallel import DistributedDataParallel as DDP

model = DDP(model, delay_allreduce=True)
```

Good:
```python
import torch

model = torch.nn.parallel.DistributedDataParallel(model)
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        if not ctx.extra.get("rewrite_pass"):  # the imports in use before a rewrite changed anything
            ctx.extra.setdefault("rewrite_memo", {})[USED_KEY] = model.apex.imports_in_use()
        for optional in model.apex.optional_imports():  # with a torch fallback: handled whole
            yield self._optional(model, optional)
        for imp, mod in model.apex.star_imports():
            yield Violation(imp, message=f"`from {mod} import *` brings NVIDIA apex names that cannot be followed "
                                         "(each has a torch replacement): import them by name, or migrate them by hand")
        found = {id(u): (u, *self._use(ctx, u)) for u in model.apex.uses() if u.reported}
        for members in model.apex.factories():
            yield self._factory(model, [found.pop(id(u)) for u in members])
        for u, message, fix in found.values():
            yield Violation(u.shown, message=message, fix=fix)
        yield from self._imports(ctx)

    def _use(self, ctx: FileContext, u: ApexUse) -> Tuple[str, Optional[Fix]]:
        """The message and fix for one use of an apex name the file acts on."""
        model = ctx.model
        api, why = lookup(u.qualified)
        short = u.qualified.split(".")[-1]
        flag = (f" (its import on line {model.line(u.binding.stmt)} sits in a `try:` that also sets an availability "
                "flag: remove it by hand once nothing uses it)") if u.flagged else ""  # after the migration it stays
        if api is None:
            return f"NVIDIA apex `{short}`: {why}{flag}", None
        replacement = replace_use(ctx, u, api)
        unknown_mode = adam_mode_unknown(model, u.call, api)
        if unknown_mode is not None and replacement.edits is None:
            use_what = f"`torch.optim.AdamW`, or `torch.optim.Adam` where `adam_w_mode={unknown_mode}` is False"
        else:
            use_what = f"`torch.{replacement.target}`"
        msg = f"NVIDIA apex `{short}`: use {use_what} (torch >= {version_text(api.min_torch)})"
        if replacement.edits is None:
            return f"{msg}; not migrated: {replacement.reason}{flag}", None
        title = f"apex {short} -> torch.{replacement.target}: " + "; ".join([api.why, *replacement.notes])
        return msg + flag, Fix(replacement.edits, applicability=UNSAFE, description=title)

    def _factory(self, model: AmpModel, members: List[Finding]) -> Violation:
        """One finding per optimizer factory (`model.apex.factories()`), at its first apex optimizer,
        the message naming each branch; its fix migrates every branch that can be."""
        parts = [f"line {model.line(u.shown)}: `{u.qualified.split('.')[-1]}`, {message.split(': ', 1)[1]}"
                 for u, message, _ in members]
        replacements: Dict[cst.CSTNode, object] = {}
        moves, notes = [], []
        for _, _, fix in members:
            if fix is not None:
                replacements.update(fix.replacements)
                move, _, why = fix.description.partition(": ")
                moves.append(move.replace("apex ", "", 1))
                notes.extend(n for n in why.split("; ") if n and n not in notes)
        message = (f"this optimizer factory builds NVIDIA apex optimizers in {len(members)} branches: "
                   + "; ".join(parts))
        title = "apex optimizers of the factory to torch: " + ", ".join(moves) + ": " + "; ".join(notes)
        fix = Fix(replacements, applicability=UNSAFE, description=title) if replacements else None
        return Violation(members[0][0].shown, message=message, fix=fix)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ imports
    def _optional(self, model: AmpModel, optional: ApexOptionalImport) -> Violation:
        """Keep the torch fallback, drop the apex branch (`model.apex.optional_imports()` says when not)."""
        tr, first = optional.node, optional.bindings[0]
        msg = (f"optional NVIDIA apex import `{first.name}` with a torch fallback: keep the fallback "
               f"and drop apex")
        if optional.blocker is not None:
            return Violation(first.stmt, message=f"{msg}; not migrated: {optional.blocker}")
        kept = [st for st in tr.handlers[0].body.body if not (isinstance(st, cst.SimpleStatementLine) and all(
            isinstance(x, cst.Expr) for x in st.body))]  # log lines about installing apex go
        kept = [st.with_changes(leading_lines=()) for st in kept]
        kept[0] = kept[0].with_changes(leading_lines=tr.leading_lines)
        kept = keep_comments(tr, kept)  # the comments of the apex branch stay, before the fallback
        edit: Dict[cst.CSTNode, object] = {tr: cst.FlattenSentinel(kept),
                                           **{c: with_args(c, args) for c, args in optional.calls.items()}}
        return Violation(first.stmt, message=msg, fix=Fix(edit, applicability=UNSAFE,  # type: ignore[arg-type]
                         description="optional apex import -> its torch fallback: installs with apex now run torch's "
                                     "class too (apex-only arguments dropped from its calls)"))

    def _imports(self, ctx: FileContext) -> Iterator[Violation]:
        """Imports the migration of their uses left unused, removed in the rewrite's next pass."""
        if not ctx.extra.get("rewrite_pass"):
            return
        for left in ctx.model.apex.leftover_imports(ctx.extra.get("rewrite_memo", {}).get(USED_KEY, set())):
            first = left.bindings[0]
            names = ", ".join(f"`{b.name}`" for b in left.bindings)
            imports = f"apex import{'s' if len(left.bindings) > 1 else ''} {names} no longer used"
            if left.node is None:
                yield Violation(first.stmt, message=f"apex import `{first.name}` is no longer used (its uses were "
                                                    "migrated): remove it",
                                fix=Fix(remove_import_alias_tidily(ctx.model, first.stmt, first.alias),
                                        applicability=UNSAFE, description="unused apex import removed"))
            elif not left.removable:
                why = (f"its `except` branch binds `{left.kept_by.value}`, used on line {ctx.model.line(left.kept_by)}"
                       if left.kept_by is not None else "the `try` has an `else`/`finally`")
                yield Violation(first.stmt, message=f"{imports}, but {why}: remove the optional import by hand")
            else:
                fix = Fix(remove_statement_tidily(ctx.model, left.node), applicability=UNSAFE,
                          description="optional apex import removed with its `except ImportError` branch")
                yield Violation(first.stmt, message=f"{imports}: remove the `try:` that imports "
                                                    + ("them" if len(left.bindings) > 1 else "it"), fix=fix)

__all__ = ["ApexToTorch"]
