"""AMP014 custom-fwd-without-custom-bwd."""

from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from ampfix.fixes.edits import clean_commas
from ampfix.model import AmpModel, dotted
from ampfix.rule import SAFE, FileContext, Fix, Rule, Violation


class CustomFwdWithoutCustomBwd(Rule):
    code = "AMP014"
    name = "custom-fwd-without-custom-bwd"
    message = ("this autograd Function's `forward` has `custom_fwd` but its `backward` lacks `custom_bwd`: the "
               "backward runs under whatever autocast state the caller has, not the forward's")
    triggers = ("custom_fwd",)
    requires = (("Function",),)
    fixable = "sometimes"
    fix_note = "safe (`custom_bwd` in the spelling of the forward's decorator)"
    docs = """
`@torch.amp.custom_fwd` on a custom `torch.autograd.Function`'s `forward` records the autocast
state (and, with `cast_inputs=`, runs the forward in that dtype with autocast off). Its
`backward` must carry `@torch.amp.custom_bwd` to run under the same state: without it the
backward runs under the caller's autocast state (typically off, or a different dtype), so its
ops run in other dtypes than the forward's saved tensors, and with `cast_inputs` the gradient
dtypes no longer match. `custom_fwd` put on `backward` by mistake is the same bug with a
misleading decorator (it may even cast the incoming gradients).

The fix adds `custom_bwd` (or puts it in place of the misplaced `custom_fwd`), spelled like the
forward's decorator (`torch.amp.custom_bwd(device_type=...)`, `torch.cuda.amp.custom_bwd`,
`amp.custom_bwd`, or a bare `custom_bwd` added to the import of `custom_fwd`). `custom_fwd` on
an `nn.Module.forward` has no backward to pair and is left alone.

Bad:
```python
import torch


class MyMM(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a.mm(b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        return grad.mm(b.t()), a.t().mm(grad)
```

Good:
```python
import torch


class MyMM(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a.mm(b)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        return grad.mm(b.t()), a.t().mm(grad)
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        for cls in model.autograd.functions():
            fwd, bwd = model.method(cls, "forward"), model.method(cls, "backward")
            if fwd is None or bwd is None:
                continue
            fwd_dec = model.autograd.decorator_of(fwd, "custom_fwd")
            if fwd_dec is None or "custom_bwd" in model.autograd.decorator_kinds(bwd):
                continue
            wrong = model.autograd.decorator_of(bwd, "custom_fwd")
            message = None if wrong is None else (
                "`backward` carries `custom_fwd` instead of `custom_bwd`: it does not replay the forward's "
                "autocast state (and `cast_inputs` would cast the incoming gradients)")
            yield Violation(bwd.name, message=message, fix=self._fix(model, fwd_dec, bwd, wrong))

    def _fix(self, model: AmpModel, fwd_dec: cst.Decorator, bwd: cst.FunctionDef,
             wrong: Optional[cst.Decorator]) -> Optional[Fix]:
        expr = fwd_dec.decorator
        func = expr.func if isinstance(expr, cst.Call) else expr
        name = dotted(func)
        if name is None or not name.endswith("custom_fwd"):
            return None  # imported under another name: no spelling to copy
        new_func = cst.parse_expression(name[: -len("custom_fwd")] + "custom_bwd")
        device = [a for a in expr.args if a.keyword is not None and a.keyword.value == "device_type"] \
            if isinstance(expr, cst.Call) else []
        # custom_bwd takes only device_type (torch.cuda.amp.custom_bwd takes nothing: bare)
        new_expr = cst.Call(func=new_func, args=clean_commas(device)) if device else new_func
        replacements = {}
        if isinstance(func, cst.Name) and not model.module_binds("custom_bwd"):
            imports = self._import_with_bwd(model, func)
            if imports is None:
                return None
            replacements.update(imports)
        if wrong is not None:  # in its place, keeping its comments
            decorators = [d.with_changes(decorator=new_expr) if d is wrong else d for d in bwd.decorators]
        else:  # innermost: below @staticmethod
            decorators = [*bwd.decorators, cst.Decorator(new_expr)]
        replacements[bwd] = bwd.with_changes(decorators=decorators)
        return Fix(replacements, applicability=SAFE, description="custom_bwd on backward, like forward's custom_fwd")

    @staticmethod
    def _import_with_bwd(model: AmpModel, name: cst.Name) -> Optional[dict]:
        """`from torch.amp import custom_fwd` -> `from torch.amp import custom_fwd, custom_bwd`."""
        for b in model.import_bindings:
            if b.name == name.value and isinstance(b.stmt, cst.ImportFrom) and b.alias.asname is None \
                    and b.scope is model.module and not isinstance(b.stmt.names, cst.ImportStar):
                names = clean_commas([*b.stmt.names, cst.ImportAlias(name=cst.Name("custom_bwd"))])
                return {b.stmt: b.stmt.with_changes(names=names)}
        return None
