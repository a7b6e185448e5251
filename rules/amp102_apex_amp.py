"""AMP102 apex-amp: migrate NVIDIA apex.amp training code to native torch.amp.

The migration is one unit: `amp.initialize` becomes a GradScaler, every `amp.scale_loss` block a
scaled backward (its forward pass wrapped in autocast, the following `optimizer.step()` a
`scaler.step` + `scaler.update`), `amp.master_params` the optimizer's parameters after
`scaler.unscale_`, `amp.state_dict/load_state_dict` the scaler's. Each apex call is one finding
with its own fix, so the summary counts them, but the fixes are offered only when every apex use
in the file can be migrated: otherwise each finding says what is left to do by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Set, Tuple

import libcst as cst

from ampfix.model import AmpModel, dotted, get_arg, literal_string, reads_writes
from ampfix.rule import UNSAFE, FileContext, Fix, Rule, Violation

APEX_CALLS = ("initialize", "scale_loss", "master_params", "state_dict", "load_state_dict")
# amp.initialize keywords that native AMP makes moot (O1/O2 casting is autocast's job)
IGNORED_INIT_KW = {"opt_level", "loss_scale", "keep_batchnorm_fp32", "master_weights", "verbosity", "enabled"}

DESCRIPTIONS = {
    "initialize": 'apex amp.initialize -> torch.amp.GradScaler("cuda"), created once',
    "scale_loss": 'apex amp.scale_loss -> scaler.scale(loss).backward(), forward in torch.autocast("cuda"), '
                  "optimizer.step() -> scaler.step + scaler.update",
    "master_params": "apex amp.master_params -> the optimizer's params after scaler.unscale_",
    "state_dict": "apex amp.state_dict -> scaler.state_dict",
    "load_state_dict": "apex amp.load_state_dict -> scaler.load_state_dict",
}
MESSAGES = {
    "initialize": 'apex amp.initialize: NVIDIA apex is superseded by native AMP: create a torch.amp.GradScaler("cuda") '
                  "once and run the forward pass in torch.autocast(\"cuda\")",
    "scale_loss": "apex amp.scale_loss: use scaler.scale(loss).backward(), the forward pass in "
                  'torch.autocast("cuda"), and scaler.step(optimizer) + scaler.update()',
    "master_params": "apex amp.master_params: clip the optimizer's parameters after scaler.unscale_(optimizer)",
    "state_dict": "apex amp.state_dict: save scaler.state_dict()",
    "load_state_dict": "apex amp.load_state_dict: load into scaler.load_state_dict()",
    "other": "apex.amp has no native equivalent for this call",
}


@dataclass
class ApexUse:
    call: cst.Call
    kind: str  # one of APEX_CALLS, or "other"
    replacements: Dict[cst.CSTNode, object] = field(default_factory=dict)
    reason: Optional[str] = None  # what blocks this use


def _semicolonless(node: cst.BaseStatement) -> bool:
    return isinstance(node, cst.SimpleStatementLine) and len(node.body) == 1


class ApexAmp(Rule):
    code = "AMP102"
    name = "apex-amp"
    message = "NVIDIA apex.amp is superseded by native AMP (torch.amp.GradScaler + torch.autocast)"
    triggers = ("apex",)
    fixable = "unsafe"
    fix_note = "unsafe (NVIDIA apex amp to native AMP)"
    docs = """
NVIDIA apex's `amp` (`amp.initialize`, `amp.scale_loss`, `amp.master_params`) is deprecated in
favour of native AMP, which ships with torch and needs no extension build.

The fix (unsafe: it restructures the training loop) migrates the whole file at once:

* `model, optimizer = amp.initialize(model, optimizer, opt_level="O1")` disappears; a
  `torch.amp.GradScaler("cuda")` is created in its place, once (O1 and O2; `loss_scale=128.0`
  becomes `init_scale=128.0`; native AMP always scales dynamically, so a fixed apex scale becomes
  the starting scale; `"dynamic"` is the default);
* `with amp.scale_loss(loss, optimizer) as scaled: scaled.backward()` becomes
  `scaler.scale(loss).backward()`, the statements of the iteration that the loss depends on are
  wrapped in `torch.autocast("cuda")` (the others stay outside), and the following
  `optimizer.step()` becomes `scaler.step(optimizer)` + `scaler.update()`;
* `amp.master_params(optimizer)` becomes the optimizer's parameters, after
  `scaler.unscale_(optimizer)` when it is used between backward and step (gradient clipping);
* `amp.state_dict()` / `amp.load_state_dict(sd)` become the scaler's.

No fix, and a message saying what to do by hand, for: opt_level O0/O3, several
`amp.initialize` calls, a loss computed in another function, `delay_unscale`/`loss_id`/several
optimizers, a scaler that the code using it cannot see, other `apex.amp` functions.

Bad:
```python
from apex import amp

model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for x, y in loader:
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
```

Good:
```python
scaler = torch.amp.GradScaler("cuda")
for x, y in loader:
    optimizer.zero_grad()
    with torch.autocast("cuda"):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        uses = self._uses(model)
        if not uses:
            return
        plan = _Plan(model, ctx, uses)
        plan.build()
        for use in uses:
            msg = MESSAGES[use.kind]
            reason = use.reason or plan.group_reason
            if reason:
                if use.reason is None and plan.group_reason_line is not None:
                    reason = f"{reason} (line {plan.group_reason_line})"
                yield Violation(use.call, message=f"{msg}; migrate by hand: {reason}")
            else:
                yield Violation(use.call, message=msg,
                                fix=Fix(dict(use.replacements), applicability=UNSAFE,  # type: ignore[arg-type]
                                        description=DESCRIPTIONS[use.kind]))

    @staticmethod
    def _uses(model: AmpModel) -> List[ApexUse]:
        out = []
        for call in model.calls:
            for qn in model.qualified_names(call.func):
                if qn.name.startswith("apex.amp."):
                    rest = qn.name[len("apex.amp."):]
                    out.append(ApexUse(call, rest if rest in APEX_CALLS else "other"))
                    break
        return out


class _Plan:
    """Builds every replacement of the migration, or the reason it cannot be done."""

    def __init__(self, model: AmpModel, ctx: FileContext, uses: List[ApexUse]):
        self.model = model
        self.ctx = ctx
        self.uses = uses
        self.group_reason: Optional[str] = None
        self.group_reason_line: Optional[int] = None
        self.q = model.quote()
        self.torch = "torch"
        self.need_torch_import = False
        self.scaler = "scaler"
        self.init_scope: Optional[cst.CSTNode] = None
        self.init_stmt: Optional[cst.CSTNode] = None

    def line(self, node: cst.CSTNode) -> int:
        return self.model.start(node)[0]

    def block(self, reason: str, node: Optional[cst.CSTNode] = None) -> None:
        if self.group_reason is None:
            self.group_reason = reason
            self.group_reason_line = self.line(node) if node is not None else None

    def expr(self, code: str) -> cst.BaseExpression:
        return cst.parse_expression(code)

    def stmt(self, code: str) -> cst.BaseStatement:
        return cst.parse_statement(code, config=self.model.module.config_for_parsing)

    def build(self) -> None:
        inits = [u for u in self.uses if u.kind == "initialize"]
        if len(inits) != 1:
            if not inits:
                self.block("apex is initialised in another file (no amp.initialize here): replace these calls "
                           "with the GradScaler created where amp.initialize was, by hand")
            else:
                lines = ", ".join(str(self.line(u.call)) for u in inits)
                self.block(f"several amp.initialize calls (lines {lines}): create one "
                           "torch.amp.GradScaler per model/optimizer set and scale each loss with it")
            return
        self._names()
        imports = self._import_plan()
        self._initialize(inits[0], imports)
        for use in self.uses:
            if use.reason is not None or use.kind == "initialize":
                continue
            if use.kind == "other":
                name = dotted(use.call.func) or "this call"
                use.reason = f"`{name}` has no native AMP equivalent"
            elif not self._visible(use.call):
                use.reason = ("the scaler created in place of amp.initialize (line "
                              f"{self.line(inits[0].call)}) is not visible here: pass it in by hand")
            elif use.kind == "scale_loss":
                self._scale_loss(use)
            elif use.kind == "master_params":
                pass  # after scale_loss: it needs to know where backward and step are
            else:
                self._state_dict(use)
        for use in self.uses:
            if use.kind == "master_params" and use.reason is None:
                self._master_params(use)
        self._shared_steps()
        first_bad = next((u for u in self.uses if u.reason is not None), None)
        if first_bad is not None:
            self.block(f"the apex code on line {self.line(first_bad.call)} cannot be migrated: {first_bad.reason}")
            self.group_reason_line = None
        self._noqa()

    # ------------------------------------------------------------------ names and imports
    def _names(self) -> None:
        scaler = self.model.free_name(("scaler", "grad_scaler", "amp_scaler", "native_scaler"))
        if scaler is None:
            self.block("no free name for the scaler")
        else:
            self.scaler = scaler
        torch_name = self.model.torch_alias()
        if torch_name is None:
            self.need_torch_import = True
        else:
            self.torch = torch_name

    def _import_plan(self) -> Dict[cst.CSTNode, object]:
        """Replacements that drop `from apex import amp` (and add `import torch` if needed)."""
        model = self.model
        found: List[Tuple[cst.SimpleStatementLine, cst.ImportFrom, cst.ImportAlias]] = []
        other_apex_import = None

        class V(cst.CSTVisitor):
            def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
                nonlocal other_apex_import
                mod = dotted(node.module) if node.module is not None else None
                if mod == "apex" and not isinstance(node.names, cst.ImportStar):
                    for a in node.names:
                        if dotted(a.name) == "amp":
                            line = model.parent(node)
                            if isinstance(line, cst.SimpleStatementLine) and model.block_of(line) is model.module:
                                found.append((line, node, a))
                            else:
                                other_apex_import = node
                elif mod is not None and mod.startswith("apex.amp"):
                    other_apex_import = node

            def visit_Import(self, node: cst.Import) -> None:
                nonlocal other_apex_import
                if any((dotted(a.name) or "").split(".")[0] == "apex" for a in node.names):
                    # `import apex` for apex.amp: ampfix does not rewrite it
                    other_apex_import = node

        model.module.visit(V())
        if other_apex_import is not None or len(found) != 1:
            node = other_apex_import if other_apex_import is not None else None
            self.block("apex.amp is imported in a way ampfix does not rewrite (only a module-level "
                       "`from apex import amp` is): migrate the import by hand", node)
            return {}
        line, imp, alias = found[0]
        assert not isinstance(imp.names, cst.ImportStar)
        kept = [a for a in imp.names if a is not alias]
        if kept:
            kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            new_line = line.with_changes(body=[imp.with_changes(names=kept) if s is imp else s for s in line.body])
            if self.need_torch_import:
                return {line: cst.FlattenSentinel([new_line, self.stmt("import torch\n")])}
            return {line: new_line}
        body = [s for s in line.body if s is not imp]
        if body:
            body[-1] = body[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
            new = line.with_changes(body=body)
            if self.need_torch_import:
                return {line: cst.FlattenSentinel([new, self.stmt("import torch\n")])}
            return {line: new}
        if self.need_torch_import:
            return {line: line.with_changes(body=[cst.Import(names=[cst.ImportAlias(name=cst.Name("torch"))])])}
        return {line: cst.RemoveFromParent()}

    # ------------------------------------------------------------------ initialize
    def _initialize(self, use: ApexUse, imports: Dict[cst.CSTNode, object]) -> None:
        model = self.model
        call = use.call
        stmt = model.statement_of(call)
        self.init_stmt = stmt
        self.init_scope = model.scope_of(call)
        if not (isinstance(stmt, cst.SimpleStatementLine) and _semicolonless(stmt)
                and isinstance(stmt.body[0], cst.Assign) and stmt.body[0].value is call
                and len(stmt.body[0].targets) == 1):
            use.reason = "amp.initialize is not a plain `model, optimizer = amp.initialize(...)` statement"
            return
        level_arg = get_arg(call, None, "opt_level")
        level = literal_string(level_arg.value) if level_arg is not None else "O1"
        if level in ("O0", "O3") or level not in ("O1", "O2"):
            use.reason = {
                "O0": "opt_level O0 is pure fp32 training: drop apex (and the scaler) by hand",
                "O3": "opt_level O3 is pure fp16 training (model.half(), no master weights); native AMP keeps "
                      "an fp32 model: remove the .half() casts, then use torch.autocast + GradScaler by hand",
            }.get(level or "", "opt_level is not a literal O1/O2")
            return
        positional = [a for a in call.args if a.keyword is None]
        if len(positional) != 2 or any(a.star for a in call.args):
            use.reason = ("amp.initialize is not called as amp.initialize(model, optimizer, ...) "
                          "(several models/optimizers, or model only)")
            return
        if isinstance(positional[1].value, (cst.List, cst.Tuple)):
            use.reason = "amp.initialize with several optimizers"
            return
        extra = [a.keyword.value for a in call.args if a.keyword is not None and a.keyword.value not in IGNORED_INIT_KW]
        if extra:
            use.reason = f"amp.initialize option {extra[0]}= has no native equivalent"
            return
        enabled = get_arg(call, None, "enabled")
        if enabled is not None:
            use.reason = "amp.initialize(enabled=...): pass it to GradScaler and torch.autocast by hand"
            return
        scale_arg = get_arg(call, None, "loss_scale")
        scaler_args = [f"{self.q}cuda{self.q}"]
        if scale_arg is not None:
            value = scale_arg.value
            if literal_string(value) == "dynamic":
                pass
            elif isinstance(value, (cst.Integer, cst.Float)):
                scaler_args.append(f"init_scale={model.module.code_for_node(value)}")
            else:
                use.reason = "loss_scale is neither \"dynamic\" nor a number"
                return
        assign = stmt.body[0]
        code = model.module.code_for_node
        new_stmts: List[cst.BaseStatement] = []
        targets = code(assign.targets[0].target).strip()
        sources = ", ".join(code(a.value).strip() for a in positional)
        if targets.replace(" ", "") != sources.replace(" ", ""):
            new_stmts.append(self.stmt(f"{targets} = {sources}\n"))
        new_stmts.append(self.stmt(f"{self.scaler} = {self.torch}.amp.GradScaler({', '.join(scaler_args)})\n"))
        new_stmts[0] = new_stmts[0].with_changes(leading_lines=stmt.leading_lines)
        use.replacements[stmt] = cst.FlattenSentinel(new_stmts) if len(new_stmts) > 1 else new_stmts[0]
        use.replacements.update(imports)  # type: ignore[arg-type]

    def _visible(self, node: cst.CSTNode) -> bool:
        """Is the scaler (assigned where amp.initialize was) visible at `node`, after it?"""
        scope = self.model.scope_of(node)
        if self.init_scope is None:
            return False
        if scope is self.init_scope:
            return self.init_stmt is not None and self.model.before(self.init_stmt, node)
        return isinstance(self.init_scope, cst.Module) and isinstance(scope, cst.FunctionDef)

    # ------------------------------------------------------------------ scale_loss
    def _scale_loss(self, use: ApexUse) -> None:
        model = self.model
        call = use.call
        item = model.parent(call)
        with_node = model.parent(item) if isinstance(item, cst.WithItem) else None
        if not isinstance(with_node, cst.With) or len(with_node.items) != 1 or with_node.asynchronous:
            use.reason = "amp.scale_loss is not the only item of a `with` statement"
            return
        as_name = item.asname.name if item.asname is not None else None
        body = with_node.body
        if not isinstance(as_name, cst.Name) or not isinstance(body, cst.IndentedBlock) or len(body.body) != 1:
            use.reason = "the scale_loss block does more than `scaled_loss.backward()`"
            return
        inner = body.body[0]
        bw = inner.body[0].value if isinstance(inner, cst.SimpleStatementLine) and _semicolonless(inner) \
            and isinstance(inner.body[0], cst.Expr) else None
        if not (isinstance(bw, cst.Call) and isinstance(bw.func, cst.Attribute) and bw.func.attr.value == "backward"
                and isinstance(bw.func.value, cst.Name) and bw.func.value.value == as_name.value):
            use.reason = "the scale_loss block does more than `scaled_loss.backward()`"
            return
        positional = [a for a in call.args if a.keyword is None and not a.star]
        if len(positional) != 2 or len(call.args) != 2:
            use.reason = ("amp.scale_loss with delay_unscale=/loss_id= or other options (gradient accumulation, "
                          "several losses): scale each loss with scaler.scale(loss) and step/update once per "
                          "optimizer step by hand")
            return
        loss, opt = positional[0].value, positional[1].value
        opt_name = dotted(opt)
        if opt_name is None:
            use.reason = "amp.scale_loss with several optimizers: call scaler.step for each, then one scaler.update()"
            return
        code = model.module.code_for_node
        loss_code = code(loss).strip()
        bw_args = code(bw).strip()[len(code(bw.func).strip()):]
        scaled = self.stmt(f"{self.scaler}.scale({loss_code}).backward{bw_args}\n")
        use.replacements[with_node] = scaled.with_changes(leading_lines=with_node.leading_lines)
        # the forward pass
        reads, _ = reads_writes(loss)
        if not self._forward(use, with_node, reads):
            return
        # the optimizer step(s) that follow
        self._steps(use, with_node, opt_name)

    def _forward(self, use: ApexUse, with_node: cst.With, needed: Set[str]) -> bool:
        model = self.model
        block = model.block_of(with_node)
        if block is None:
            use.reason = "the scale_loss block is not a statement of a block"
            return False
        stmts = list(block.body)
        idx = next(i for i, s in enumerate(stmts) if s is with_node)
        deps: List[int] = []
        needed = set(needed)
        for i in range(idx - 1, -1, -1):
            reads, writes = reads_writes(stmts[i])
            if isinstance(stmts[i], (cst.FunctionDef, cst.ClassDef)):
                continue
            if writes & needed:
                deps.append(i)
                needed |= reads
        if not deps:
            use.reason = ("the loss is not computed in the block of the scale_loss `with` (it comes from another "
                          "function or an outer block): run that forward pass in torch.autocast(\"cuda\") by hand")
            return False
        deps.sort()
        first, last = deps[0], deps[-1]
        dep_set = set(deps)
        before: List[cst.BaseStatement] = []
        after: List[cst.BaseStatement] = []
        names = {i: reads_writes(stmts[i]) for i in range(first, last + 1)}
        for i in range(first, last + 1):
            if i in dep_set:
                continue
            r, w = names[i]
            earlier = [names[j] for j in deps if j < i]
            later = [names[j] for j in deps if j > i]
            if not any(r & ew or w & (er | ew) for er, ew in earlier):
                before.append(stmts[i])
            elif not any(w & (lr | lw) or r & lw for lr, lw in later):
                after.append(stmts[i])
            else:
                use.reason = (f"line {self.line(stmts[i])} is interleaved with the forward pass: wrap the forward "
                              "in torch.autocast(\"cuda\") by hand")
                return False
        body = [stmts[i] for i in deps]
        lead = stmts[first].leading_lines
        body[0] = body[0].with_changes(leading_lines=())
        region = cst.With(
            items=[cst.WithItem(item=self.expr(f"{self.torch}.autocast({self.q}cuda{self.q})"))],
            body=cst.IndentedBlock(body=body),
        )
        seq: List[cst.BaseStatement] = [*before, region, *after]
        seq = [s.with_changes(leading_lines=()) if s is not seq[0] else s for s in seq]
        seq[0] = seq[0].with_changes(leading_lines=lead)
        use.replacements[stmts[first]] = cst.FlattenSentinel(seq)
        for i in range(first + 1, last + 1):
            use.replacements[stmts[i]] = cst.RemoveFromParent()
        self._forward_range = (stmts[first], stmts[last])
        return True

    def _steps(self, use: ApexUse, with_node: cst.With, opt_name: str) -> None:
        model = self.model
        loop = model.loop_of(with_node)
        scope = model.scope_of(with_node)
        steps = []
        for c in model.calls_in_scope(scope):
            if not (isinstance(c.func, cst.Attribute) and c.func.attr.value == "step"
                    and dotted(c.func.value) == opt_name and model.before(with_node, c)):
                continue
            if loop is not None and not model.is_ancestor(loop, c):
                continue
            steps.append(c)
        if not steps:
            use.reason = f"no `{opt_name}.step()` follows the scaled backward: call scaler.step/update by hand"
            return
        for c in steps:
            stmt = model.statement_of(c)
            if not (isinstance(stmt, cst.SimpleStatementLine) and _semicolonless(stmt)
                    and isinstance(stmt.body[0], cst.Expr) and stmt.body[0].value is c) or c.args:
                use.reason = f"`{opt_name}.step(...)` on line {self.line(c)} is not a plain statement"
                return
            new = self.stmt(f"{self.scaler}.step({opt_name})\n").with_changes(leading_lines=stmt.leading_lines)
            upd = self.stmt(f"{self.scaler}.update()\n")
            use.replacements[stmt] = cst.FlattenSentinel([new, upd])
        self._step_stmts = getattr(self, "_step_stmts", []) + [(use, model.statement_of(c)) for c in steps]
        self._backwards = getattr(self, "_backwards", []) + [(with_node, steps, opt_name)]

    def _shared_steps(self) -> None:
        seen: Dict[int, ApexUse] = {}
        for use, stmt in getattr(self, "_step_stmts", []):
            if id(stmt) in seen and seen[id(stmt)] is not use:
                use.reason = (f"several amp.scale_loss blocks share the step on line {self.line(stmt)}: scale each "
                              "loss, then one scaler.step per optimizer and one scaler.update() by hand")
            seen[id(stmt)] = use

    # ------------------------------------------------------------------ master_params, state_dict
    def _master_params(self, use: ApexUse) -> None:
        model = self.model
        call = use.call
        if len(call.args) != 1 or call.args[0].keyword is not None or call.args[0].star:
            use.reason = "amp.master_params is not called with one optimizer"
            return
        opt = model.module.code_for_node(call.args[0].value).strip()
        q = self.q
        params = self.expr(f"[p for group in {opt}.param_groups for p in group[{q}params{q}]]")
        stmt = model.statement_of(call)
        if stmt is None or model.block_of(stmt) is None:
            use.reason = "amp.master_params is not in a statement of a block"
            return
        # between a scaled backward and its step: the gradients must be unscaled first
        needs_unscale = False
        for with_node, steps, opt_name in getattr(self, "_backwards", []):
            if opt_name == opt and model.before(with_node, call) and any(model.before(call, s) for s in steps):
                needs_unscale = True
        for other in self.uses:
            if other is not use and other.kind == "master_params" and model.statement_of(other.call) is stmt:
                use.reason = "amp.master_params twice in one statement"
                return

        class Replace(cst.CSTTransformer):
            def on_leave(self, original, updated):  # type: ignore[override]
                return params if original is call else updated

        new_stmt = stmt.visit(Replace())
        if needs_unscale and not self._unscaled_before(opt, stmt):
            unscale = self.stmt(f"{self.scaler}.unscale_({opt})\n").with_changes(leading_lines=stmt.leading_lines)
            new_stmt = new_stmt.with_changes(leading_lines=())
            use.replacements[stmt] = cst.FlattenSentinel([unscale, new_stmt])
        else:
            use.replacements[stmt] = new_stmt

    def _unscaled_before(self, opt: str, stmt: cst.CSTNode) -> bool:
        """Another master_params statement of this iteration already got the unscale_."""
        done = getattr(self, "_unscaled", set())
        block = self.model.block_of(stmt)
        key = (opt, id(block))
        if key in done:
            return True
        done.add(key)
        self._unscaled = done
        return False

    def _state_dict(self, use: ApexUse) -> None:
        call = use.call
        func = self.expr(f"{self.scaler}.{use.kind}")
        use.replacements[call] = call.with_changes(func=func)

    # ------------------------------------------------------------------ noqa
    def _noqa(self) -> None:
        """A suppressed apex use would stay while its import goes: then nothing is migrated."""
        if self.group_reason is not None:
            return
        for use in self.uses:
            if self.ctx.is_suppressed(use.call, ApexAmp.code):
                self.block("an apex use is marked `# noqa`, so the file cannot be migrated as a whole", use.call)
                return


__all__ = ["ApexAmp"]
