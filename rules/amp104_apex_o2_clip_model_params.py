"""AMP104 apex-o2-clip-model-params: with apex amp O2 (fp16 model, fp32 master weights in the
optimizer), clipping `model.parameters()` clips the fp16 model gradients, which the optimizer
never steps with, instead of the fp32 master gradients (`amp.master_params(optimizer)`)."""

from __future__ import annotations

from typing import Iterator, List, Optional, Set

import libcst as cst

from ampfix.model import AmpModel, dotted, get_arg, method_call
from ampfix.model.events import BACKWARD, GRAD_READ
from ampfix.rule import SAFE, FileContext, Fix, Rule, Violation


def _names(node: Optional[cst.CSTNode]) -> List[str]:
    if node is None:
        return []
    if isinstance(node, (cst.List, cst.Tuple)):
        return [n for el in node.elements for n in _names(el.value)]
    name = dotted(node)
    return [name] if name else []


class ApexO2ClipModelParams(Rule):
    code = "AMP104"
    name = "apex-o2-clip-model-params"
    message = ("apex amp O2 keeps fp32 master weights in the optimizer: clipping `model.parameters()` clips the fp16 "
               "model gradients, not the master gradients the optimizer steps; clip `amp.master_params(optimizer)`")
    triggers = ("apex",)
    requires = (("clip_grad",), ("O2", "O3"))
    fixable = "sometimes"
    fix_note = "safe (the optimizer's parameters, what `amp.master_params(optimizer)` yields) when the optimizer is unambiguous"
    docs = """
With `amp.initialize(model, optimizer, opt_level="O2")` apex casts the model to fp16 and
gives the optimizer fp32 copies of the weights (the master weights). Backward fills the fp16
model gradients with *scaled* values; leaving `amp.scale_loss`, apex writes the unscaled
gradients into the fp32 master copies, and `optimizer.step()` uses those. Clipping
`model.parameters()` therefore measures the scaled fp16 gradients, shrinks them (and the
gradients of the parameters apex kept in fp32, such as BatchNorm with
`keep_batchnorm_fp32`, which are shared) by a factor computed from the scaled norm, and leaves
the master gradients of the fp16 weights unclipped. apex's documentation says to clip
`amp.master_params(optimizer)`. O1 and O0 keep the model in fp32 (no master copy) and are
not reported, nor O3 unless `master_weights=True`, nor an `opt_level` that is not a literal, nor
the clip of code that supports apex and native AMP where it runs only without apex (the branch
that is not the apex one, a decision it shares with `amp.initialize`, gradients from a native
backward only).

The fix (safe, when amp.initialize names one optimizer that is visible where the clip is) clips
the optimizer's parameters, `[p for group in optimizer.param_groups for p in group["params"]]`:
exactly what `amp.master_params(optimizer)` yields under apex, and still right after the
migration to native AMP (AMP102), where the optimizer holds the model's parameters, so the
fix does not depend on the `amp` import.

Bad:
```python
import torch
from apex import amp

model, optimizer = amp.initialize(model, optimizer, opt_level="O2")
with amp.scale_loss(loss, optimizer) as scaled_loss:
    scaled_loss.backward()
torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
optimizer.step()
```

Good:
```python
import torch
from apex import amp

model, optimizer = amp.initialize(model, optimizer, opt_level="O2")
with amp.scale_loss(loss, optimizer) as scaled_loss:
    scaled_loss.backward()
torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)
optimizer.step()
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        inits = [c for c in model.calls if "apex.amp.initialize" in model.qualnames(c.func)]
        o2 = [c for c in inits if model.apex.keeps_master_weights(c)]
        if not o2:
            return
        models: Set[str] = set()
        optimizers: List[str] = []
        for c in o2:
            pos = [a for a in c.args if a.keyword is None and not a.star]
            models.update(_names(pos[0].value if pos else None))
            opt = pos[1].value if len(pos) > 1 else (get_arg(c, None, "optimizers").value
                                                     if get_arg(c, None, "optimizers") else None)
            optimizers += [] if isinstance(opt, (cst.List, cst.Tuple)) else _names(opt)
            optimizers += ["<several>"] if isinstance(opt, (cst.List, cst.Tuple)) else []
            stmt = model.small_statement_of(c)
            if isinstance(stmt, cst.Assign) and isinstance(stmt.targets[0].target, cst.Tuple) and stmt.value is c:
                els = stmt.targets[0].target.elements
                models.update(_names(els[0].value))
        for call in model.calls:
            if not model.is_api(call, "clip_grad") or not call.args or call.args[0].keyword is not None:
                continue
            recv = method_call(call.args[0].value, "parameters")
            name = dotted(recv) if recv is not None else None
            if name is None or call.args[0].value.args:
                continue
            if name not in models and not (name.endswith(".module") and name[: -len(".module")] in models):
                continue
            if self._native_path(model, call, o2):
                continue
            yield self._finding(model, call, o2, optimizers)

    @staticmethod
    def _native_path(model: AmpModel, clip: cst.Call, inits: List[cst.Call]) -> bool:
        """The clip runs only where apex amp is off (code that supports apex and native AMP): it
        never runs with an O2 `amp.initialize` (one decision picks either), or it is in the
        branch of an `if` whose other branch is the apex one, or every backward whose gradients
        it may clip is a native one (not under `amp.scale_loss`)."""
        if all(model.exclusive(init, clip) for init in inits):
            return True
        child: cst.CSTNode = clip
        for anc in model.ancestors(clip):
            if isinstance(anc, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                break
            if isinstance(anc, (cst.If, cst.IfExp)) and child is not anc.test and anc.orelse is not None:
                other = anc.orelse if child is anc.body else anc.body
                if model.apex.amp_call_in(other) and not model.apex.amp_call_in(child):
                    return True
            child = anc
        seen = False
        for trace in model.traces():
            for read in trace.of(GRAD_READ):
                if read.node is not clip:
                    continue
                backwards = [b for b in trace.before(read, BACKWARD) if model.may_precede(trace, b, read)]
                if not backwards or any(model.apex.in_scale_loss(b.node) for b in backwards):
                    return False
                seen = True
        return seen

    def _finding(self, model: AmpModel, call: cst.Call, inits: List[cst.Call], optimizers: List[str]) -> Violation:
        arg = call.args[0]
        # the optimizer the loss is scaled for in this function (scale_loss takes amp.initialize's optimizer) ...
        scope = model.scope_of(call)
        local = {dotted(c.args[1].value) for c in model.calls if model.scope_of(c) is scope
                 and "apex.amp.scale_loss" in model.qualnames(c.func) and len(c.args) > 1 and c.args[1].keyword is None}
        opts = sorted(set(optimizers))
        if len(local) == 1 and None not in local:
            opt = local.pop()
        # ... or the one amp.initialize returned, where that name means the same object
        elif len(opts) == 1 and opts[0] != "<several>" and self._visible(model, opts[0], inits[0], call):
            opt = opts[0]
        else:
            why = "several optimizers" if len(opts) != 1 or opts[0] == "<several>" else \
                "the optimizer amp.initialize returned is not visible here"
            return Violation(arg.value, message=f"{self.message} (not fixed: {why})")
        # code that supports apex and native AMP: a clip that runs only where apex does not (the
        # other branch of `if args.apex:`) is not apex's to change
        apex = [c for c in model.calls if any(n.startswith("apex.amp.") for n in model.qualnames(c.func))]
        if apex and all(model.exclusive(call, c) for c in apex):
            return Violation(arg.value, message=(
                f"{self.message} (not fixed: this clip runs only where apex amp does not (line "
                f"{model.line(apex[0])} runs in another branch of the same test): a fix there would edit the other "
                "backend's branch)"))
        q = model.quote()
        new = cst.parse_expression(f"[p for group in {opt}.param_groups for p in group[{q}params{q}]]")
        return Violation(arg.value, fix=Fix({arg.value: new}, applicability=SAFE,
                                            description="clip the optimizer's fp32 master parameters "
                                                        "(amp.master_params(optimizer)), not the fp16 model's"))

    @staticmethod
    def _visible(model: AmpModel, opt: str, init: cst.Call, clip: cst.Call) -> bool:
        """`opt`, bound where amp.initialize is, means the same object where the clip is."""
        init_scope, clip_scope = model.scope_of(init), model.scope_of(clip)
        if init_scope is clip_scope:
            return True
        if opt.startswith("self."):
            return model.class_of(model.function_of(init)) is model.class_of(model.function_of(clip)) is not None
        return isinstance(init_scope, cst.Module) and opt not in (model.code(p.name) for p in _params(clip_scope))


def _params(scope: cst.CSTNode) -> List[cst.Param]:
    if isinstance(scope, cst.FunctionDef):
        ps = scope.params
        return [*ps.posonly_params, *ps.params, *ps.kwonly_params]
    return []


__all__ = ["ApexO2ClipModelParams"]
