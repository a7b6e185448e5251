"""AMP015 scaler-with-bfloat16."""

from __future__ import annotations

from typing import Iterator, List, Optional

import libcst as cst

from ampfix.fixes.edits import set_keyword
from ampfix.model import AmpModel, Region, dotted, literal_bool
from ampfix.rule import UNSAFE, FileContext, Fix, Rule, Violation


class ScalerWithBfloat16(Rule):
    code = "AMP015"
    name = "scaler-with-bfloat16"
    message = ("this GradScaler is enabled although every autocast region of the file runs in bfloat16: bfloat16 "
               "has float32's range, its gradients do not underflow, and the scaler only adds work (an inf/NaN "
               "check per step); enable it only for float16")
    triggers = ("GradScaler",)
    requires = (("bfloat16", "autocast"),)
    project_requires = (("GradScaler",),)
    fixable = "unsafe"
    fix_note = "unsafe (`enabled=` tied to the autocast dtype, or `enabled=False`)"
    docs = """
Loss scaling exists for float16, whose smallest normal number (6e-5) makes small gradients
underflow to zero. bfloat16 has the exponent range of float32: its gradients do not underflow,
and the PyTorch AMP recipe uses a GradScaler only with float16. A scaler enabled for code whose
autocast regions all run in bfloat16 multiplies the loss by 65536, checks every gradient for
inf/NaN (a device synchronisation per step) and divides again, for nothing; and it tells the
reader that this code runs float16.

Reported when every enabled (or possibly enabled) autocast region of the file provably runs in
bfloat16 (`dtype=torch.bfloat16`, a variable or table whose values are all bfloat16, or CPU
autocast's default) and the scaler's `enabled=` is not tied to float16 (`enabled=use_fp16`,
`enabled=(dtype == torch.float16)` are correct). A region whose dtype is a variable that may be
float16, or any float16 region, keeps the file silent.

The fix (unsafe: a disabled scaler saves an empty state and takes a plain `optimizer.step()`)
sets `enabled=<dtype> == torch.float16` when every region takes its dtype from one variable that
the scaler's code can read, else `enabled=False`.

The results do not change: multiplying by a power of two is exact and bfloat16 gradients have
float32's range, so they overflow no more than float32 ones and the scale stays where it is.
The scaler costs time only: a multiply, an inf/NaN check and an unscale of every gradient, each
step.

Bad:
```python
import torch

scaler = torch.amp.GradScaler("cuda")
with torch.autocast("cuda", dtype=torch.bfloat16):
    loss = model(x).sum()
scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update()
```

Good:
```python
import torch

amp_dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
scaler = torch.amp.GradScaler("cuda", enabled=amp_dtype == torch.float16)
with torch.autocast("cuda", dtype=amp_dtype):
    loss = model(x).sum()
scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update()
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        regions = model.autocast_regions()
        if not regions or any(model.region_dtype(r) != "bfloat16" for r in regions):
            return
        scaling = {dotted(c.func.value) for c in model.calls  # type: ignore[attr-defined]
                   if isinstance(c.func, cst.Attribute) and c.func.attr.value == "scale"
                   and model.is_scaler(c.func.value)}
        if not scaling:
            return
        for call in model.calls:
            if not model.is_api(call, "GradScaler"):
                continue
            enabled = model.scaler_enabled(call)
            if enabled is not None and (literal_bool(enabled) is False or model.float16_gated(enabled)):
                continue
            yield Violation(call, fix=self._fix(model, call, enabled, regions))

    @staticmethod
    def _fix(model: AmpModel, call: cst.Call, enabled: Optional[cst.BaseExpression],
             regions: List[Region]) -> Optional[Fix]:
        if any(a.star for a in call.args):
            return None
        texts = {model.code(r.dtype_node) if r.dtype_node is not None else None for r in regions}
        tie = None
        (text,) = texts if len(texts) == 1 else (None,)
        node = regions[0].dtype_node
        if text is not None and node is not None and model.dtype_name(node) == "dynamic" \
                and _readable(model, node, call):
            tie = f"{text} == {model.torch_alias() or 'torch'}.float16"
        if tie is None:
            value = "False"
        elif enabled is None or literal_bool(enabled) is True:
            value = tie
        else:
            value = f"({model.code(enabled)}) and {tie}"
        new = set_keyword(call, "enabled", cst.parse_expression(value))
        return Fix({call: new}, applicability=UNSAFE,
                   description=f"GradScaler enabled only for float16 (`enabled={value}`)")


def _readable(model: AmpModel, expr: cst.CSTNode, at: cst.CSTNode) -> bool:
    """The name or attribute chain `expr` (read at a region) means the same at `at`, and is set
    by then when `at`'s function (or the module) is where it is set."""
    key = dotted(expr)
    if key is None:
        return False
    root = key.split(".")[0]
    if root == "self":
        here, there = model.self_class(at), model.self_class(expr)
        if here is None or there is None or here not in model.related_classes(there):
            return False
    elif model.binding_scope(root, model.scope_of(at)) is not model.binding_scope(root, model.scope_of(expr)) \
            or model.binding_scope(root, model.scope_of(at)) is None:
        return False
    same = [n for n, _ in model.assignments_to(key) if model.scope_of(n) is model.scope_of(at)]
    return not same or any(model.before(n, at) for n in same)
