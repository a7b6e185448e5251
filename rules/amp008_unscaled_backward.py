"""AMP008 unscaled-backward."""

from __future__ import annotations

from typing import Iterator, Optional, Set

import libcst as cst

from ampfix.model import AmpModel, Trace, TraceEvent, get_arg
from ampfix.model.events import BACKWARD, GRAD_READ, OPT_STEP, SCALE, SCALER_STEP, UPDATE, ZERO_GRAD
from ampfix.rule import SAFE, UNSAFE, FileContext, Fix, Rule, Violation


class UnscaledBackward(Rule):
    code = "AMP008"
    name = "unscaled-backward"
    message = ("`backward()` runs on an unscaled loss but the optimizer is stepped with `scaler.step`, which "
               "divides the gradients by the scale; call `scaler.scale(loss).backward()`")
    triggers = ("GradScaler", ".scale(")
    requires = (("backward",), (".step(",))
    project_requires = (("backward",),)
    fixable = "sometimes"
    fix_note = "safe (`scaler.scale(loss).backward()`, or the scaled loss already computed); unsafe when the gradients are read before the step"
    docs = """
`scaler.step(optimizer)` unscales: it divides every `.grad` by the current scale (65536 by
default) before stepping. That is right only when the gradients came from
`scaler.scale(loss).backward()`. After a plain `loss.backward()` the update is 65536x too small
and training silently stalls (when the scaler never scaled anything in the process, torch
raises at the first `step` instead: "Attempted unscale_ but _scale is None"). A common way to
get here is computing `scaled_loss = scaler.scale(loss)` and then calling `.backward()` on
the wrong variable, or a second loss's `backward()` next to a scaled first one.

With SGD the updates are then 1/scale of what they should be (1/65536 at first): the loss
hardly moves. Adam hides most of it (its update is nearly invariant to a constant gradient
scale), but its `eps` becomes relatively 65536x larger.

Not reported: the two-branch code (`if use_amp: scaler.scale(loss).backward() else:
loss.backward()`, with the step chosen the same way, also across helpers such as
`backward(loss, scaler)`), a backward of a scaled value (`scaled = scaler.scale(loss);
scaled.backward()`, `torch.autograd.backward(scaler.scale(loss))`, a helper called with
`scaler.scale(loss)`), a warm-up backward followed by `zero_grad()` before the loop, wrappers
such as `optimizer.backward(loss)` / `accelerator.backward(loss)`, `x.backward(gradient)` with
explicit gradients, and a `GradScaler(enabled=False)`.

The fix writes `scaler.scale(loss).backward()` (or `scaled.backward()` when
`scaled = scaler.scale(loss)` is already computed): safe when the backward and the step are in one
function and nothing reads the gradients in between (a clip there would then see scaled
gradients: unsafe).

Bad:
```python
import torch

scaler = torch.amp.GradScaler("cuda")
for x, y in loader:
    optimizer.zero_grad()
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model(x), y)
    loss.backward()
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
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        for trace in model.traces():
            seen: Set[int] = set()
            for step in trace.of(SCALER_STEP):
                if model.scaler_disabled(step.node.func.value):  # type: ignore[attr-defined]
                    continue
                for bw in trace.before(step, BACKWARD):
                    if id(bw.node) in seen or not self._unscaled(model, trace, bw, step) \
                            or model.within_one_call(bw, step):
                        continue
                    seen.add(id(bw.node))
                    shown = model.anchor(bw, step)[0]
                    scaler = model.code(step.node.func.value)  # type: ignore[attr-defined]
                    tensor = model.backward_tensor(bw.node)
                    what = f"`{model.code(tensor)}`" if tensor is not None else "an unscaled loss"
                    message = (f"backward of {what}, which is not scaled, but `{scaler}.step(...)` on line "
                               f"{model.line(step.node)} divides the gradients by the scale: the update is ~65536x "
                               f"too small; call `{scaler}.scale(...).backward()`" + model.where(bw, shown))
                    yield Violation(shown, message=message, fix=self._fix(model, trace, bw, step, shown))

    @staticmethod
    def _unscaled(model: AmpModel, trace: Trace, bw: TraceEvent, step: TraceEvent) -> bool:
        """`bw` runs on an unscaled tensor and its gradients reach `step`."""
        call = bw.node
        if bw.event.detail == "scaled" or model.backward_scale_sources(bw):
            return False
        if bw.event.detail == "tensor" and any(a.keyword is None for a in call.args):  # type: ignore[attr-defined]
            return False  # optimizer.backward(loss), accelerator.backward(loss), x.backward(gradient)
        if bw.event.detail == "autograd" and get_arg(call, 1, "grad_tensors") is not None:  # type: ignore[arg-type]
            return False
        if any(model.exclusive(b, bw) and (b.event.detail == "scaled" or model.backward_scale_sources(b))
               for b in trace.of(BACKWARD)):
            return False  # `if amp: scaler.scale(loss).backward() else: loss.backward()`
        return model.path_without(trace, bw, step, lambda e: e.kind in (ZERO_GRAD, OPT_STEP, SCALER_STEP, UPDATE))

    @staticmethod
    def _fix(model: AmpModel, trace: Trace, bw: TraceEvent, step: TraceEvent, shown: cst.CSTNode) -> Optional[Fix]:
        tensor = model.backward_tensor(bw.node)
        if model.foreign_among(bw, step) or shown is not bw.node or bw.via != step.via or tensor is None:
            return None
        scaler = model.code(step.node.func.value)  # type: ignore[attr-defined]
        bare = tensor.with_changes(lpar=[], rpar=[]) if hasattr(tensor, "lpar") else tensor
        text = model.module.code_for_node(bare).strip()
        new = cst.parse_expression(f"{scaler}.scale({text})")
        for e in trace.before(bw, SCALE):  # `scaled = scaler.scale(loss)` already there: back-propagate it
            assign = model.parent(e.node)
            if e.via == bw.via and e.scaler == step.scaler and model.mandatory_between(e, None, bw) \
                    and len(e.node.args) == 1 \
                    and model.code(e.node.args[0].value) == text and isinstance(assign, cst.Assign) \
                    and len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name) \
                    and len(model.assignments_to(assign.targets[0].target.value)) == 1:
                new = cst.Name(assign.targets[0].target.value)
        reads = [e for e in trace.between(bw, step, GRAD_READ) if model.may_precede(trace, bw, e)]
        return Fix({tensor: new}, applicability=UNSAFE if reads else SAFE,
                   description="backward on the scaled loss")
