"""AMP103 apex-to-torch: the rest of NVIDIA apex (outside apex.amp, which is AMP102's) to torch.

Each use of an apex name (whatever the import: `from apex.parallel import
DistributedDataParallel as DDP`, `import apex`, `from apex import parallel`) is rewritten to the
fully qualified torch replacement (`torch.nn.parallel.DistributedDataParallel(...)`) with its
arguments mapped (`ampfix/knowledge/apex_api.py`); once nothing uses an apex import any more, the import
goes in the next pass (a `try:` that only imported apex goes whole when its `except` branch binds
nothing the file uses). Every fix is unsafe: another library's kernels; each title says what differs.
"""

from __future__ import annotations

from typing import Dict, Iterator, List, Optional, Set, Tuple

import libcst as cst

from ampfix.knowledge.apex_api import canonical, fallback_targets, first_import, flagged_try, lookup, map_args, try_of
from ampfix.fixes.edits import keep_comments, remove_import_alias, remove_statement, with_args
from ampfix.model import AmpModel, ImportBinding, names_bound
from ampfix.rule import UNSAFE, FileContext, Fix, Rule, Violation

ONE_TO_ONE = ("ddp", "syncbn", "layernorm", "rmsnorm")  # classes whose isinstance/annotation uses map too


def _ver(v: Tuple[int, ...]) -> str:
    return ".".join(map(str, v))


def _mine(b: ImportBinding) -> bool:
    q = b.qualified
    return (q == "apex" or q.startswith("apex.")) and not (q == "apex.amp" or q.startswith("apex.amp."))


def _outer(model: AmpModel, ref: cst.CSTNode) -> cst.CSTNode:
    node = ref
    while isinstance(model.parent(node), cst.Attribute) and model.parent(node).value is node:
        node = model.parent(node)
    return node


class ApexToTorch(Rule):
    code = "AMP103"
    name = "apex-to-torch"
    message = "NVIDIA apex is not maintained for current torch: use the torch equivalent"
    triggers = ("apex",)
    fixable = "unsafe"
    fix_note = "unsafe (apex DDP, SyncBatchNorm, FusedAdam/SGD, FusedLayerNorm/RMSNorm to torch; the title says what differs)"
    docs = """
Everything from NVIDIA apex that is not `apex.amp` (AMP102 migrates that) has a torch
replacement or is reported:

| apex | torch | torch >= | what differs |
|---|---|---|---|
| `apex.parallel.DistributedDataParallel(m, ...)` | `torch.nn.parallel.DistributedDataParallel(m)` | 1.0 | no `device_ids` (apex has none; torch uses the module's device); `message_size`, `delay_allreduce`, `gradient_predivide_factor`, `num_allreduce_streams`, `prof` dropped; torch broadcasts rank 0's buffers at each forward; unused parameters need `find_unused_parameters=True` |
| `apex.parallel.convert_syncbn_model(m)` | `torch.nn.SyncBatchNorm.convert_sync_batchnorm(m)` | 1.2 | `channel_last=True` reported |
| `apex.parallel.SyncBatchNorm(n, ...)` | `torch.nn.SyncBatchNorm(n, ...)` | 1.1 | `channel_last`, `fuse_relu` reported |
| `apex.optimizers.FusedAdam(p, ...)` | `torch.optim.AdamW(p, ..., weight_decay=0.0, fused=True)` | 2.0 | apex's default is `adam_w_mode=True` (AdamW) and `weight_decay=0`; `adam_w_mode=False`: `torch.optim.Adam`; `bias_correction=False`, `master_weights=True` reported; apex's optimizer state does not load |
| `apex.optimizers.FusedSGD(p, lr, ...)` | `torch.optim.SGD(p, lr, ..., fused=True)` | 2.3 | `wd_after_momentum=True` reported |
| `apex.normalization.FusedLayerNorm(shape, ...)` | `torch.nn.LayerNorm(shape, ...)` | 1.0 | `memory_efficient` dropped |
| `apex.normalization.FusedRMSNorm(shape, ...)` | `torch.nn.RMSNorm(shape, eps=1e-5, ...)` | 2.4 | torch's default eps is the dtype's, apex's 1e-5 |
| `FusedLAMB`, `FusedNovoGrad`, `MixedFusedLayerNorm`, `LARC`, `apex.fp16_utils`, `apex.contrib`, ... | none | | reported |

The apex signatures assumed (apex master, 2023-2024) are listed in `ampfix/knowledge/apex_api.py`;
the tests compare the kept arguments with torch's own signatures.
Only the positional arguments whose meaning is the same in both are kept (FusedAdam: `params, lr`);
a keyword without an equivalent, `*args`, or a replacement newer than `--min-torch-version`
is reported. `isinstance`/annotation uses of the classes map to the torch class; an apex class
passed as a value or subclassed is reported. Once nothing uses an apex import it is removed
(a `try:` that only imports apex goes whole when its `except ImportError:` branch raises or
binds nothing the file uses; with an availability flag it is reported). apex imported as the
fallback of a torch import (`except ImportError: from apex...`) is left alone.

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
        torch = model.torch_alias()
        binds = [b for b in model.import_bindings if _mine(b) and not model.in_fallback(b.stmt)]
        optional: Set[int] = set()  # bindings of an optional import with a torch fallback: handled whole
        for tr, bs in self._optional_tries(model, binds).items():
            optional.update(id(b) for b in bs)
            yield from self._optional(ctx, tr, bs)
        binds = [b for b in binds if id(b) not in optional]
        for b in [b for b in binds if flagged_try(model, b.stmt)]:
            optional.add(id(b))
            yield Violation(b.stmt, message=f"optional apex import `{b.name}` next to other statements in its `try:` "
                                            "(an availability flag?): once its uses are migrated, remove it by hand")
        seen: Set[int] = set()
        found = []
        for b in binds:
            for ref in b.refs:
                node = _outer(model, ref)
                if id(node) in seen:
                    continue
                seen.add(id(node))
                names = {qn.name for qn in model.qualified_names(node)}
                apex = sorted(n for n in names if n.startswith("apex"))
                if not apex or any(n.startswith("apex.amp") or n == "apex" for n in apex):
                    continue  # apex.amp: AMP102's
                found.append((node, apex[0], len(names) > 1))
        for imp in model.nodes_of(cst.ImportFrom):
            mod = model.code(imp.module).strip() if imp.module is not None and not imp.relative else ""
            if isinstance(imp.names, cst.ImportStar) and mod.split(".")[0] == "apex" and not mod.startswith("apex.amp"):
                yield Violation(imp, message=f"`from {mod} import *`: the apex names it brings cannot be followed; "
                                             "import them by name (or migrate them) by hand")
        # classes this file constructs: their isinstance checks and annotations migrate with them
        built = {canonical(q) for node, q, _ in found if model.reference_role(node)[0] == "call"}
        for node, q, ambiguous in found:
            yield from self._use(ctx, node, q, torch, ambiguous, canonical(q) in built)
        yield from self._imports(ctx, [b for b in binds if not b.refs and id(b) not in optional])

    # ------------------------------------------------------------------ uses
    def _use(self, ctx: FileContext, node: cst.CSTNode, qualified: str, torch: Optional[str],
             ambiguous: bool, built_here: bool) -> Iterator[Violation]:
        model = ctx.model
        api, why = lookup(qualified)
        role, call = model.reference_role(node)
        shown = call if role == "call" else node
        short = qualified.split(".")[-1]
        if api is None:
            yield Violation(shown, message=f"NVIDIA apex `{short}`: {why}; migrate by hand")
            return
        target = api.target
        msg = f"NVIDIA apex `{short}`: use `torch.{target}` (torch >= {_ver(api.min_torch)})"
        reason, notes, new = None, [], None
        if ambiguous:
            reason = f"`{model.code(node)}` may also be bound to something else here (an optional import?)"
        elif tuple(ctx.min_torch_version) < api.min_torch:
            reason = (f"torch.{target} needs torch >= {_ver(api.min_torch)} and the oldest supported torch is "
                      f"{_ver(ctx.min_torch_version)} (--min-torch-version)")
        elif torch is None and first_import(model) is None:
            reason = "the file has no module-level import before which `import torch` could go"
        elif role == "call":
            assert isinstance(call, cst.Call)
            args, target_or_why, notes = map_args(model, call, api)
            if args is None:
                reason = target_or_why
            else:
                target = target_or_why
                msg = f"NVIDIA apex `{short}`: use `torch.{target}` (torch >= {_ver(api.min_torch)})"
                new = {call: with_args(call.with_changes(func=cst.parse_expression(f"{torch or 'torch'}.{target}")), args)}
        elif role == "type" and api.kind in ONE_TO_ONE and built_here:
            new = {node: cst.parse_expression(f"{torch or 'torch'}.{target}")}
        elif role == "type" and api.kind in ONE_TO_ONE:
            reason = (f"a type check, and this file builds no `{short}`: objects built elsewhere may still be apex's; "
                      "migrate it with the code that builds them")
        else:
            reason = "it is used as a value (passed, aliased or subclassed): its call sites cannot be followed"
        if new is None:
            yield Violation(shown, message=f"{msg}; not migrated: {reason}")
            return
        if torch is None:  # `import torch` goes before the file's first import, with this use
            first = first_import(model)
            new[first] = cst.FlattenSentinel([cst.parse_statement("import torch\n").with_changes(
                leading_lines=first.leading_lines), first.with_changes(leading_lines=())])
        title = f"apex {short} -> torch.{target}: " + "; ".join([api.why, *notes])
        yield Violation(shown, message=msg, fix=Fix(new, applicability=UNSAFE, description=title))

    # ------------------------------------------------------------------ optional imports
    @staticmethod
    def _optional_tries(model: AmpModel, binds: List[ImportBinding]) -> Dict[cst.Try, List[ImportBinding]]:
        """`try: <apex imports>` / `except ImportError: <the same names bound again>`."""
        out: Dict[cst.Try, List[ImportBinding]] = {}
        for b in binds:
            tr = try_of(model, b.stmt)
            if tr is not None and b.name in names_bound([s for h in tr.handlers for s in h.body.body]):
                out.setdefault(tr, []).append(b)
        return out

    def _optional(self, ctx: FileContext, tr: cst.Try, bs: List[ImportBinding]) -> Iterator[Violation]:
        """Keep the torch fallback, drop the apex branch: only when the `try` imports nothing but these
        apex names and the `except ImportError` branch binds each to the torch class AMP103 maps it to."""
        model = ctx.model
        fallback = fallback_targets(model, tr)
        reason = None
        wanted = {id(b.alias) for b in bs}
        if tr.orelse is not None or tr.finalbody is not None or len(tr.handlers) != 1:
            reason = "the `try` has an `else`/`finally` or several `except` branches"
        elif not all(isinstance(st, cst.SimpleStatementLine) and all(
                isinstance(x, (cst.Import, cst.ImportFrom)) and not isinstance(x.names, cst.ImportStar)
                and all(id(a) in wanted for a in x.names) for x in st.body) for st in tr.body.body):
            reason = "the `try` does more than import these apex names (an availability flag?)"
        uses: Dict[cst.CSTNode, cst.CSTNode] = {}
        for b in bs:
            api, _ = lookup(b.qualified)
            got = fallback.get(b.name)
            if reason is None and (api is None or got != f"torch.{api.target}"):
                reason = (f"the `except ImportError` branch binds `{b.name}` to "
                          f"{'`' + got.replace('builtins.', '') + '`' if got and got != '?' else 'code of its own'}, not to "
                          f"`torch.{api.target if api else '...'}`: keep one of the two by hand")
            for ref in (r for ib in model.import_bindings if ib.name == b.name and ib.scope is b.scope for r in ib.refs):
                role, call = model.reference_role(ref)
                if reason is None and role == "call" and api is not None:
                    args, target, _ = map_args(model, call, api)
                    if args is None or target != api.target:
                        reason = f"the call on line {model.line(call)} cannot be mapped: {target}"
                    elif [id(a) for a in args] != [id(a) for a in call.args]:
                        uses[call] = with_args(call, args)
        first = bs[0]
        msg = (f"optional NVIDIA apex import `{first.name}` with a torch fallback: keep the fallback "
               f"and drop apex")
        if reason is not None:
            yield Violation(first.stmt, message=f"{msg}; not migrated: {reason}")
            return
        handler = tr.handlers[0]
        kept = [st for st in handler.body.body if not (isinstance(st, cst.SimpleStatementLine) and all(
            isinstance(x, cst.Expr) for x in st.body))]  # log lines about installing apex go
        kept = [st.with_changes(leading_lines=()) for st in kept]
        kept[0] = kept[0].with_changes(leading_lines=tr.leading_lines)
        kept = keep_comments(tr, kept)  # the comments of the apex branch stay, before the fallback
        edit: Dict[cst.CSTNode, object] = {tr: cst.FlattenSentinel(kept), **uses}
        yield Violation(first.stmt, message=msg, fix=Fix(edit, applicability=UNSAFE,  # type: ignore[arg-type]
                        description="optional apex import -> its torch fallback: installs with apex now run torch's "
                                    "class too (apex-only arguments dropped from its calls)"))

    # ------------------------------------------------------------------ imports
    def _imports(self, ctx: FileContext, unused: List[ImportBinding]) -> Iterator[Violation]:
        model = ctx.model
        by_try: Dict[int, Tuple[cst.Try, List[ImportBinding]]] = {}
        for b in unused:
            line = model.parent(b.stmt)
            block = model.block_of(line) if line is not None else None
            owner = model.parent(block) if block is not None else None
            if isinstance(owner, cst.Try):
                by_try.setdefault(id(owner), (owner, []))[1].append(b)
                continue
            yield self._remove_alias(model, b)
        for tr, bs in by_try.values():
            yield from self._try_imports(ctx, tr, bs)

    def _remove_alias(self, model: AmpModel, b: ImportBinding) -> Violation:
        edit = remove_import_alias(model, b.stmt, b.alias)
        line = model.parent(b.stmt)
        block = model.block_of(line)
        if block is not None and len(block.body) == 1 and edit.get(line) is not None \
                and isinstance(edit[line], cst.RemovalSentinel):
            edit = {line: cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=line.leading_lines,
                                                  trailing_whitespace=line.trailing_whitespace)}
        elif block is not None and block is not model.module and block.body[0] is line and len(block.body) > 1 \
                and isinstance(edit.get(line), cst.RemovalSentinel) and len(edit) == 1:
            nxt = block.body[1]  # first in its block: the blank line that followed the import goes too
            edit[nxt] = nxt.with_changes(leading_lines=[ln for ln in nxt.leading_lines if ln.comment is not None])
        return Violation(b.stmt, message=f"apex import `{b.name}` is no longer used: remove it",
                         fix=Fix(edit, applicability=UNSAFE, description="unused apex import removed"))

    def _try_imports(self, ctx: FileContext, tr: cst.Try, bs: List[ImportBinding]) -> Iterator[Violation]:
        model = ctx.model
        body = list(tr.body.body)
        removable = {id(b.alias) for b in bs}
        only_these = all(
            isinstance(s, cst.SimpleStatementLine) and all(
                isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(small.names, cst.ImportStar)
                and all(id(a) in removable for a in small.names) for small in s.body)
            for s in body)
        if not only_these:  # the try keeps other statements (which bind nothing: see flagged_try)
            for b in bs:
                yield self._remove_alias(model, b)
            return
        bound = names_bound([s for h in tr.handlers for s in h.body.body])
        used = [n for n in model.nodes_of(cst.Name) if n.value in bound and not model.is_ancestor(tr, n)]
        if tr.orelse is not None or tr.finalbody is not None or used:
            why = f"its `except` branch binds `{used[0].value}`, used on line {model.line(used[0])}" if used \
                else "the `try` has an `else`/`finally`"
            for b in bs:
                yield Violation(b.stmt, message=f"apex import `{b.name}` is no longer used, but {why}: "
                                                "remove the optional import by hand")
            return
        block = model.block_of(tr)
        edit = remove_statement(model, tr) if block is None or len(block.body) > 1 else \
            {tr: cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=tr.leading_lines)}
        if block is not None and block is not model.module and len(block.body) > 1 and block.body[0] is tr \
                and len(edit) == 1:
            nxt = block.body[1]  # first in its block: the blank line that followed the `try` goes too
            edit[nxt] = nxt.with_changes(leading_lines=[ln for ln in nxt.leading_lines if ln.comment is not None])
        fix = Fix(edit, applicability=UNSAFE,
                  description="optional apex import removed with its `except ImportError` branch")
        yield Violation(bs[0].stmt, message=f"apex import `{bs[0].name}` is no longer used: remove the `try:` "
                                            "that imports it", fix=fix)


__all__ = ["ApexToTorch"]
