"""AMP012 gradient-penalty-unscaled."""

from __future__ import annotations

from typing import Iterator, List, Optional

import libcst as cst

from ampfix.model import AmpModel, Trace, TraceEvent, get_arg, literal_bool
from ampfix.model.events import AUTOGRAD_GRAD, BACKWARD
from ampfix.rule import FileContext, Rule, Violation

RECIPE = ("pass `scaler.scale(loss)` to `autograd.grad`, then `inv_scale = 1. / scaler.get_scale()` and "
          "`grads = [g * inv_scale for g in grads]` before computing the penalty")


class GradientPenaltyUnscaled(Rule):
    code = "AMP012"
    name = "gradient-penalty-unscaled"
    message = "the gradients of this penalty are still scaled by the GradScaler; " + RECIPE
    triggers = ("autograd.grad", "autograd import grad")
    requires = (("create_graph",), (".scale(",))
    fixable = "none"
    fix_note = "none (reported with the documented recipe: divide by `scaler.get_scale()`)"
    docs = """
A gradient penalty (WGAN-GP, R1, an L2 penalty on parameter gradients) differentiates with
`torch.autograd.grad(..., create_graph=True)` and adds a function of those gradients to the
loss. With a GradScaler, the PyTorch AMP examples ("Gradient penalty") do it in three steps:
pass `scaler.scale(loss)` to `autograd.grad`, so the fp16 gradients do not underflow; divide
the result by `scaler.get_scale()` (the gradients belong to no optimizer, so `unscale_` does not
apply); then compute the penalty and backward the total with `scaler.scale(total).backward()`.

Reported:
* `autograd.grad` on `scaler.scale(...)` whose result is never multiplied or divided by a value
  computed from `scaler.get_scale()` (followed through names, comprehensions, loops and
  `return`s): the penalty is computed from gradients 65536x too large (a squared norm 65536^2x),
  so it swamps the loss or overflows;
* `autograd.grad` on an unscaled output computed under float16 autocast, whose penalty goes
  into a loss that is then backpropagated with `scaler.scale(...)`: the penalty's own gradients
  are not scaled and may underflow to zero in float16.

A penalty on the norm of the gradients is then the scale times too large (65536x at first; its
square for a squared norm): it dominates the loss, its own gradients overflow, the scaler skips
step after step and the loss can turn NaN. The second kind (underflow of unscaled float16
gradients) cannot happen with bfloat16 (float32's range), so it is not reported for bfloat16
regions.

Not reported: the documented recipe (`inv_scale = 1. / scaler.get_scale()`, or
`g / scaler.get_scale()`, with or without an epsilon), gradients used only through `.sign()`
(PGD steps: the scale does not change the sign), gradients written to `.grad` for
`scaler.step` (it unscales them), gradients handed to a function of this file or returned as
they are (where they go is not followed), `autograd.grad` without `create_graph=True`,
bfloat16 autocast, and a `GradScaler(enabled=False)`.

There is no automatic fix: report only, with the recipe.

Bad:
```python
import torch

scaler = torch.amp.GradScaler("cuda")
for x, y in loader:
    optimizer.zero_grad()
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model(x), y)
    grads = torch.autograd.grad(scaler.scale(loss), model.parameters(), create_graph=True)
    with torch.autocast("cuda", dtype=torch.float16):
        penalty = sum(g.pow(2).sum() for g in grads).sqrt()
        loss = loss + penalty
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
```

Good:
```python
import torch

scaler = torch.amp.GradScaler("cuda")
for x, y in loader:
    optimizer.zero_grad()
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model(x), y)
    scaled_grads = torch.autograd.grad(scaler.scale(loss), model.parameters(), create_graph=True)
    inv_scale = 1. / scaler.get_scale()
    grads = [g * inv_scale for g in scaled_grads]
    with torch.autocast("cuda", dtype=torch.float16):
        penalty = sum(g.pow(2).sum() for g in grads).sqrt()
        loss = loss + penalty
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        for trace in model.traces():
            for ev in trace.of(AUTOGRAD_GRAD):
                call = ev.node
                graph = get_arg(call, None, "create_graph")  # type: ignore[arg-type]
                outputs = get_arg(call, 0, "outputs")  # type: ignore[arg-type]
                if graph is None or literal_bool(graph.value) is not True or outputs is None:
                    continue
                sources = model.scale_sources(model.argument_at(ev, outputs.value))
                message = self._scaled(model, call, sources) if sources else self._unscaled(model, trace, ev, outputs)
                if message is not None:
                    yield Violation(call, message=message)

    @staticmethod
    def _scaled(model: AmpModel, call: cst.CSTNode, sources: List[cst.Call]) -> Optional[str]:
        """`autograd.grad(scaler.scale(loss), ...)` whose result is never divided by the scale."""
        scales = [c for c in sources if model.scale_call_scaler(c)]
        if not scales or len(scales) < len(sources) or model.scaler_disabled(scales[0].func.value):  # type: ignore[attr-defined]
            return None
        if model.dataflow.combined_with(call, model.dataflow.reads_get_scale) or model.dataflow.value_escapes(call):
            return None
        if len(model.dataflow.value_reads(call)) < 2 and isinstance(model.parent(call), (cst.Assign, cst.Expr)):
            return None  # the gradients are not used (or only through `.sign()`)
        scaler = model.code(scales[0].func.value)  # type: ignore[attr-defined]
        return (f"these gradients of `{scaler}.scale(...)` are never divided by `{scaler}.get_scale()`: the penalty "
                f"computed from them is scaled too (a squared norm by the scale squared); multiply them by "
                f"`inv_scale = 1. / {scaler}.get_scale()` before computing the penalty")

    @staticmethod
    def _unscaled(model: AmpModel, trace: Trace, ev: TraceEvent, outputs: cst.Arg) -> Optional[str]:
        """`autograd.grad` on an unscaled float16 output whose penalty joins a scaled loss."""
        regions = [r for r in ([ev.region] if ev.region else []) + model.value_regions(outputs.value)
                   if r.may_run_float16()]
        if not regions:
            return None
        reads = model.dataflow.value_reads(ev.node)
        for bw in trace.after(ev, BACKWARD):
            scales = [c for c in model.backward_scale_sources(bw) if model.scale_call_scaler(c)]
            if not scales or model.scaler_disabled(scales[0].func.value) or not model.may_precede(trace, ev, bw):
                continue
            tensor = model.backward_tensor(bw.node)
            if tensor is not None and any(r is tensor or model.is_ancestor(tensor, r) or model.is_ancestor(bw.node, r)
                                          for r in reads):
                scaler = model.code(scales[0].func.value)  # type: ignore[attr-defined]
                return (f"`autograd.grad` runs on the unscaled `{model.code(outputs.value)}`, computed under float16 "
                        f"autocast, while the loss it joins is scaled by `{scaler}`: the penalty's gradients may "
                        f"underflow; pass `{scaler}.scale(...)` to `autograd.grad` and divide the result by "
                        f"`{scaler}.get_scale()`")
        return None
