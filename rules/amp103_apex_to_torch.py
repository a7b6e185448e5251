"""AMP103 apex-to-torch: the rest of NVIDIA apex (outside apex.amp, which is AMP102's) to torch.

Each use of an apex name (whatever the import: `from apex.parallel import
DistributedDataParallel as DDP`, `import apex`, `from apex import parallel`) is rewritten to the
fully qualified torch replacement (`torch.nn.parallel.DistributedDataParallel(...)`) with its
arguments mapped (`ampfix/knowledge/apex_api.py`); once nothing uses an apex import any more, the import
goes in the next pass (a `try:` that only imported apex goes whole when its `except` branch binds
nothing the file uses). Every fix is unsafe: another library's kernels; each title says what differs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Set, Tuple

import libcst as cst

from ampfix.knowledge.apex_api import APIS, actionable, adam_mode_unknown, canonical, category, fallback_targets, \
    first_import, flagged_try, is_legacy_mixed_precision, lookup, map_args, target_for, try_of
from ampfix.fixes.edits import keep_comments, remove_import_alias, remove_statement, with_args
from ampfix.model import AmpModel, ImportBinding, names_bound
from ampfix.rule import UNSAFE, FileContext, Fix, Rule, Violation

ONE_TO_ONE = ("ddp", "syncbn", "layernorm", "rmsnorm")  # classes whose isinstance/annotation uses map too
USED_KEY = "AMP103: apex imports in use"  # in the rewrite's memo: set by the first pass


def _ver(v: Tuple[int, ...]) -> str:
    return ".".join(map(str, v))


def _mine(b: ImportBinding) -> bool:
    q = b.qualified
    return (q == "apex" or q.startswith("apex.")) and not (q == "apex.amp" or q.startswith("apex.amp."))


@dataclass
class _Use:
    """One use of an apex name that AMP103 reports."""

    node: cst.CSTNode
    message: str
    fix: Optional[Fix]
    qualified: str
    call: Optional[cst.Call]


def _star_actionable(module: str) -> bool:
    """`from <module> import *` brings apex names with a torch replacement."""
    key = canonical(module) or ""
    return is_legacy_mixed_precision(module) or any(k.split(".")[0] == key for k in APIS)


def _alternatives(model: AmpModel, a: Optional[cst.CSTNode], b: Optional[cst.CSTNode]) -> bool:
    """`a` and `b` never both run in one call of their function: they are in exclusive branches,
    or one is in an `if` branch that ends in `return`/`raise` and the other after that `if`."""
    if a is None or b is None:
        return False
    if model.exclusive(a, b):
        return True
    first, second = (a, b) if model.before(a, b) else (b, a)
    for anc in model.ancestors(first):
        if isinstance(anc, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            return False
        if isinstance(anc, cst.If) and model.is_ancestor(anc.body, first) and not model.is_ancestor(anc, second) \
                and _ends_in_exit(anc.body):
            return True
    return False


def _thin_wrapper(model: AmpModel, cls: cst.ClassDef) -> bool:
    """Every method `cls` defines calls the same method of `super()` (and it defines one)."""
    methods = [f for f in model.nodes_of(cst.FunctionDef) if model.class_of(f) is cls]
    if not methods:
        return False
    for f in methods:
        name = f.name.value
        if not any(isinstance(c.func, cst.Attribute) and c.func.attr.value == name
                   and isinstance(c.func.value, cst.Call) and isinstance(c.func.value.func, cst.Name)
                   and c.func.value.func.value == "super" and model.function_of(c) is f for c in model.calls):
            return False
    return True


def _ends_in_exit(block: cst.BaseSuite) -> bool:
    body = getattr(block, "body", None)
    if not isinstance(body, (list, tuple)) or not body:
        return False
    last = body[-1]
    return isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[-1], (cst.Return, cst.Raise))


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
        torch = model.torch_alias()
        binds = [b for b in model.import_bindings if _mine(b) and not model.in_fallback(b.stmt)]
        if not ctx.extra.get("rewrite_pass"):  # the imports in use before a rewrite changed anything
            ctx.extra.setdefault("rewrite_memo", {})[USED_KEY] = {(b.qualified, b.name) for b in binds if b.refs}
        optional: Set[int] = set()  # bindings of an optional import with a torch fallback: handled whole
        for tr, bs in self._optional_tries(model, binds).items():
            optional.update(id(b) for b in bs)
            yield from self._optional(ctx, tr, bs)
        binds = [b for b in binds if id(b) not in optional]
        flagged: Dict[int, Tuple[cst.Try, List[ImportBinding]]] = {}  # `try:` imports next to a flag
        for b in [b for b in binds if flagged_try(model, b.stmt)]:
            optional.add(id(b))
            tr = try_of(model, b.stmt)
            assert tr is not None
            flagged.setdefault(id(tr), (tr, []))[1].append(b)
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
                found.append((node, apex[0], len(names) > 1, b))
        for imp in model.nodes_of(cst.ImportFrom):
            mod = model.code(imp.module).strip() if imp.module is not None and not imp.relative else ""
            if isinstance(imp.names, cst.ImportStar) and mod.split(".")[0] == "apex" and _star_actionable(mod):
                yield Violation(imp, message=f"`from {mod} import *` brings NVIDIA apex names that cannot be followed "
                                             "(each has a torch replacement): import them by name, or migrate them "
                                             "by hand")
        # classes this file constructs: their isinstance checks and annotations migrate with them
        built = {canonical(q) for node, q, _, _ in found if model.reference_role(node)[0] == "call"}
        flags = {id(b): tr for tr, bs in flagged.values() for b in bs}
        uses = []
        for node, q, ambiguous, b in found:
            u = self._use(ctx, node, q, torch, ambiguous, canonical(q) in built)
            if u is None:
                continue
            if id(b) in flags:  # said once, with the use: after the migration the import is left as it is
                u.message += (f" (its import on line {model.line(b.stmt)} sits in a `try:` that also sets an "
                              "availability flag: remove it by hand once nothing uses it)")
            uses.append(u)
        yield from self._grouped(model, uses)
        yield from self._imports(ctx, [b for b in binds if not b.refs and id(b) not in optional])

    # ------------------------------------------------------------------ uses
    def _use(self, ctx: FileContext, node: cst.CSTNode, qualified: str, torch: Optional[str],
             ambiguous: bool, built_here: bool) -> Optional["_Use"]:
        """The finding for one use of an apex name, or None when there is nothing to act on: a
        feature torch has no replacement for, a name ampfix does not know (`apex.__file__`), an
        apex class only named for compatibility (a type check or a type tuple for objects built
        elsewhere, a class handed to a tracer)."""
        model = ctx.model
        if not actionable(qualified):
            return None
        api, why = lookup(qualified)
        role, call = model.reference_role(node)
        shown = call if role == "call" else node
        short = qualified.split(".")[-1]
        if role == "value" and not self._constructed_elsewhere(model, node):
            return None  # passed as a value (a type tuple, a tracer's leaf classes): the file builds none
        if role == "type" and not built_here:
            return None  # a type check for objects built elsewhere (apex's or torch's): compatibility code
        if api is None:
            return _Use(shown, f"NVIDIA apex `{short}`: {why}", None, qualified, call)
        target = target_for(model, call if role == "call" else None, api)
        unknown_mode = adam_mode_unknown(model, call if role == "call" else None, api)
        if unknown_mode is not None:
            use_what = f"`torch.optim.AdamW`, or `torch.optim.Adam` where `adam_w_mode={unknown_mode}` is False"
        else:
            use_what = f"`torch.{target}`"
        msg = f"NVIDIA apex `{short}`: use {use_what} (torch >= {_ver(api.min_torch)})"
        reason, notes, new = None, [], None
        if ambiguous:
            reason = f"`{model.code(node)}` may also be bound to something else here (an optional import?)"
        elif tuple(ctx.min_torch_version) < api.min_torch:
            reason = (f"torch.{target} needs torch >= {_ver(api.min_torch)} and the oldest supported torch is "
                      f"{_ver(ctx.min_torch_version)} ({ctx.min_torch_source or 'min-torch-version'})")
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
        elif role == "type" and api.kind in ONE_TO_ONE:
            new = {node: cst.parse_expression(f"{torch or 'torch'}.{target}")}
        elif role == "type":
            reason = (f"a type check: `{short}` becomes a torch class that depends on its arguments; change the "
                      "check with the code that builds them")
        elif isinstance(model.parent(node), cst.Arg):
            reason = "a class of this file wraps it (as its base): give that class torch's base by hand"
        else:
            reason = "it is bound to another name here, which this file calls: migrate that name by hand"
        if new is None:
            return _Use(shown, f"{msg}; not migrated: {reason}", None, qualified, call)
        if torch is None:  # `import torch` goes before the file's first import, with this use
            first = first_import(model)
            new[first] = cst.FlattenSentinel([cst.parse_statement("import torch\n").with_changes(
                leading_lines=first.leading_lines), first.with_changes(leading_lines=())])
        title = f"apex {short} -> torch.{target}: " + "; ".join([api.why, *notes])
        return _Use(shown, msg, Fix(new, applicability=UNSAFE, description=title), qualified, call)

    @staticmethod
    def _constructed_elsewhere(model: AmpModel, node: cst.CSTNode) -> bool:
        """An apex class used as a value that this file still builds: bound to a name the file
        calls (`LayerNorm = FusedLayerNorm if has_apex else nn.LayerNorm`, then `LayerNorm(...)`),
        or the base of a thin wrapper the file builds (every method of the subclass calls the
        same method of `super()`: fairseq's FusedLayerNorm). A subclass that does more extends
        apex's internals (fairseq's FusedAdamV2): replacing its base is no migration, and it is
        not reported."""
        parent = model.parent(node)
        if isinstance(parent, cst.Arg) and isinstance(model.parent(parent), cst.ClassDef):
            cls = model.parent(parent)
            assert isinstance(cls, cst.ClassDef)
            built = any(isinstance(c.func, cst.Name) and c.func.value == cls.name.value for c in model.calls)
            return built and _thin_wrapper(model, cls)
        value: cst.CSTNode = node
        while isinstance(model.parent(value), (cst.IfExp, cst.BooleanOperation)):
            value = model.parent(value)
        assign = model.parent(value)
        if not isinstance(assign, cst.Assign) or assign.value is not value:
            return False
        names = {t.target.value for t in assign.targets if isinstance(t.target, cst.Name)}
        return any(isinstance(c.func, cst.Name) and c.func.value in names for c in model.calls)

    def _grouped(self, model: AmpModel, uses: List["_Use"]) -> Iterator[Violation]:
        """One finding per optimizer factory: apex optimizers built in the branches of one
        function (`if name == "fusedadam": ... elif name == "fusedsgd": ...`) are one mistake,
        reported once at the first, the message naming each branch; its fix migrates every
        branch that can be."""
        factories: Dict[int, List[_Use]] = {}
        for u in uses:
            if u.call is not None and category(u.qualified) == "optimizers":
                scope = model.function_of(u.call)
                if scope is not None:
                    factories.setdefault(id(scope), []).append(u)
        grouped: Set[int] = set()
        for members in factories.values():
            if len(members) < 2 or not all(_alternatives(model, a.call, b.call)
                                           for i, a in enumerate(members) for b in members[i + 1:]):
                continue
            grouped.update(id(u) for u in members)
            members.sort(key=lambda u: model.start(u.node))
            first = members[0]
            parts = []
            for u in members:
                what = u.message.split(": ", 1)[1]
                parts.append(f"line {model.line(u.node)}: `{u.qualified.split('.')[-1]}`, {what}")
            replacements: Dict[cst.CSTNode, object] = {}
            moves, notes = [], []
            for u in members:
                if u.fix is not None:
                    replacements.update(u.fix.replacements)
                    move, _, why = u.fix.description.partition(": ")
                    moves.append(move.replace("apex ", "", 1))
                    notes.extend(n for n in why.split("; ") if n and n not in notes)
            message = (f"this optimizer factory builds NVIDIA apex optimizers in {len(members)} branches: "
                       + "; ".join(parts))
            title = "apex optimizers of the factory to torch: " + ", ".join(moves) + ": " + "; ".join(notes)
            fix = Fix(replacements, applicability=UNSAFE, description=title) if replacements else None
            yield Violation(first.node, message=message, fix=fix)  # type: ignore[arg-type]
        for u in uses:
            if id(u) not in grouped:
                yield Violation(u.node, message=u.message, fix=u.fix)

    # ------------------------------------------------------------------ optional imports
    @staticmethod
    def _optional_tries(model: AmpModel, binds: List[ImportBinding]) -> Dict[cst.Try, List[ImportBinding]]:
        """`try: <apex imports>` / `except ImportError: <the same names bound again>`."""
        out: Dict[cst.Try, List[ImportBinding]] = {}
        for b in binds:
            if lookup(b.qualified)[0] is None:
                continue  # `nccl_allocator = None` as the fallback of an apex module torch has nothing for
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
        """Imports the migration of their uses left unused, removed in the rewrite's next pass.
        An apex import that was unused before the rewrite (an install check, a probe, an
        availability test) is not reported: there was nothing of apex to migrate."""
        model = ctx.model
        if not ctx.extra.get("rewrite_pass"):
            return
        used_before = ctx.extra.get("rewrite_memo", {}).get(USED_KEY, set())
        by_try: Dict[int, Tuple[cst.Try, List[ImportBinding]]] = {}
        for b in unused:
            if (b.qualified, b.name) not in used_before:
                continue
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
        return Violation(b.stmt, message=f"apex import `{b.name}` is no longer used (its uses were migrated): remove it",
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
            names = ", ".join(f"`{b.name}`" for b in bs)
            yield Violation(bs[0].stmt, message=f"apex import{'s' if len(bs) > 1 else ''} {names} no longer used, "
                                                f"but {why}: remove the optional import by hand")
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
        names = ", ".join(f"`{b.name}`" for b in bs)
        yield Violation(bs[0].stmt, message=f"apex import{'s' if len(bs) > 1 else ''} {names} no longer used: remove "
                                            "the `try:` that imports "
                                            + ("them" if len(bs) > 1 else "it"), fix=fix)


__all__ = ["ApexToTorch"]
