"""AMP003 clip-scaled-gradients."""

from __future__ import annotations

from typing import Iterator, List, Optional, Tuple

import libcst as cst

from ampfix.model import AmpModel, call_name, dotted
from ampfix.rule import FileContext, Fix, Rule, Violation

# Methods whose result depends on the magnitude of `.grad` (reading scaled values). Scaling by a
# constant (`mul_`, `div_`, as in averaging accumulated gradients) does not care and is left out.
VALUE_METHODS = {"norm", "abs", "max", "min", "mean", "sum", "std", "var", "pow", "square", "item", "tolist",
                 "amax", "amin", "clamp", "clamp_"}
NORM_FUNCS = {"torch.norm", "torch.linalg.norm", "torch.linalg.vector_norm", "torch.abs", "torch.max", "torch.sum",
              "torch.mean", "torch.nn.utils.get_total_norm", "torch._foreach_norm"}


class ClipScaledGradients(Rule):
    code = "AMP003"
    name = "clip-scaled-gradients"
    message = ("gradients are clipped while still scaled by the GradScaler; "
               "call `scaler.unscale_(optimizer)` first")
    triggers = (".scale(",)
    requires = (("clip_grad", ".grad"), ("backward",))
    fixable = "sometimes"
    docs = """
After `scaler.scale(loss).backward()` every `.grad` is multiplied by the current scale
(e.g. 65536). Clipping then compares the norm against a threshold that is effectively 65536x
too small, so nearly every step is clipped hard and training stalls; inspecting `.grad` sees
scaled values. Unscale first: `scaler.step()` knows the gradients were unscaled already.

With several optimizers, an `unscale_` for one of them is taken as enough unless the clipped
parameters are those an optimizer of the same function was built over (`clip(model1.parameters())`
with `opt1 = torch.optim.Adam(model1.parameters())`) and `opt1` is not among those unscaled.

The fix inserts `scaler.unscale_(optimizer)` before the clip when the optimizer that the
scaler steps next (or that owns the clipped parameters) is unambiguous.

Bad:
```python
scaler.scale(loss).backward()
torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
scaler.step(optimizer)
scaler.update()
```

Good:
```python
scaler.scale(loss).backward()
scaler.unscale_(optimizer)
torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
scaler.step(optimizer)
scaler.update()
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        scaled = [b for b in model.backward_calls if b.kind == "scaled"]
        if not scaled:
            return
        shared_fix = {}  # one unscale_ serves every read after the same backward
        for node, what in self._gradient_reads(model):
            scope = model.scope_of(node)
            # the last scaled backward before the read, on a path that can reach it
            before = [b for b in scaled if model.scope_of(b.call) is scope and model.before(b.call, node)
                      and not model.exclusive(b.call, node)]
            if not before:
                continue
            bw = before[-1]
            scaler = bw.scaler
            calls = model.calls_in_scope(scope)
            steps = [c for c in calls if model.scaler_method(c, "step") == scaler and model.before(node, c)
                     and not model.exclusive(node, c)]
            if not steps:
                continue
            unscales = [c for c in calls if model.scaler_method(c, "unscale_") is not None
                        and model.before(bw.call, c) and model.before(c, node)]
            if unscales:
                # fine, unless the clipped parameters are known to belong to an optimizer that
                # none of those unscale_ calls (each naming its optimizer) covers
                owner = self._owner(model, node) if what == "clip" else None
                unscaled = {dotted(c.args[0].value) if c.args else None for c in unscales}
                if owner is None or owner in unscaled or None in unscaled:
                    continue
                later = any(model.scaler_method(c, "unscale_") == scaler and model.before(node, c)
                            and c.args and dotted(c.args[0].value) == owner for c in calls)
                message = (f"gradients of `{owner}`'s parameters are clipped while still scaled: "
                           f"`unscale_` was called for other optimizers only; call `unscale_({owner})` first")
                yield Violation(node, message=message,
                                fix=None if later else self._insert_unscale(model, node, scaler, owner))
                continue
            later_unscale = any(model.scaler_method(c, "unscale_") == scaler and model.before(node, c)
                                for c in calls)
            message = None if what == "clip" else (
                "`.grad` is read while still scaled by the GradScaler; call `scaler.unscale_(optimizer)` first")
            if id(bw.call) not in shared_fix:
                shared_fix[id(bw.call)] = None if later_unscale else self._fix(model, node, scaler, steps)
            fix = shared_fix[id(bw.call)]
            yield Violation(node, message=message, fix=fix)

    def _gradient_reads(self, model: AmpModel) -> List[Tuple[cst.CSTNode, str]]:
        reads: List[Tuple[cst.CSTNode, str]] = []
        for call in model.calls:
            if model.is_api(call, "clip_grad"):
                reads.append((call, "clip"))
                continue
            qn = model.qualname(call.func)
            grad_args = [a for a in call.args if _is_grad(a.value)]
            if qn in NORM_FUNCS and grad_args:
                reads.append((call, "read"))
            elif isinstance(call.func, cst.Attribute) and call.func.attr.value in VALUE_METHODS \
                    and _is_grad(call.func.value):
                reads.append((call, "read"))
        return reads

    def _fix(self, model: AmpModel, node: cst.CSTNode, scaler: Optional[str], steps: List[cst.Call]) -> Optional[Fix]:
        opts = {dotted(s.args[0].value) if s.args else None for s in steps}
        if scaler is None or len(opts) != 1 or None in opts:
            return None
        (opt,) = opts
        return self._insert_unscale(model, node, scaler, opt)

    @staticmethod
    def _owner(model: AmpModel, clip: cst.CSTNode) -> Optional[str]:
        """The optimizer built, in the clip's own function, over exactly the parameters clipped
        (`clip(model0.parameters())` with `opt0 = torch.optim.SGD(model0.parameters(), ...)`)."""
        if not isinstance(clip, cst.Call) or not clip.args or clip.args[0].keyword is not None:
            return None
        clipped = model.module.code_for_node(clip.args[0].value)
        scope = model.scope_of(clip)
        owners = {key for key, entries in model.assignments.items() for stmt, v in entries
                  if model.scope_of(stmt) is scope  # the same names, not a namesake elsewhere
                  and isinstance(v, cst.Call) and model.is_api(v, "optimizer") and v.args
                  and v.args[0].keyword is None and model.module.code_for_node(v.args[0].value) == clipped}
        return owners.pop() if len(owners) == 1 else None

    @staticmethod
    def _insert_unscale(model: AmpModel, node: cst.CSTNode, scaler: Optional[str], opt: str) -> Optional[Fix]:
        stmt = model.statement_of(node)
        if scaler is None or not isinstance(stmt, cst.SimpleStatementLine) or model.block_of(stmt) is None:
            return None
        new = cst.parse_statement(f"{scaler}.unscale_({opt})\n", config=model.module.config_for_parsing)
        assert isinstance(new, cst.SimpleStatementLine)
        new = new.with_changes(leading_lines=stmt.leading_lines)
        return Fix({stmt: cst.FlattenSentinel([new, stmt.with_changes(leading_lines=())])}, safe=True,
                   description="scaler.unscale_(optimizer) inserted before clipping")


def _is_grad(expr: cst.CSTNode) -> bool:
    """`p.grad`, `p.grad.data`, `p.grad.detach()`."""
    while True:
        if isinstance(expr, cst.Attribute) and expr.attr.value == "grad":
            return True
        if isinstance(expr, cst.Attribute) and expr.attr.value == "data":
            expr = expr.value
            continue
        if isinstance(expr, cst.Call) and call_name(expr) == "detach" and isinstance(expr.func, cst.Attribute):
            expr = expr.func.value
            continue
        return False
