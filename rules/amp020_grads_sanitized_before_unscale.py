"""AMP020 grads-sanitized-before-unscale."""

from __future__ import annotations

from typing import Iterator

from ampfix.model.events import GRAD_SANITIZE, SCALER_STEP, UNSCALE, ZERO_GRAD, TraceEvent
from ampfix.rule import FileContext, Rule, Violation


class GradsSanitizedBeforeUnscale(Rule):
    code = "AMP020"
    name = "grads-sanitized-before-unscale"
    message = ("non-finite gradients are replaced before the GradScaler looks at them: it never sees the overflow, so "
               "it never lowers its scale and steps with the overflowed values replaced; call "
               "`scaler.unscale_(optimizer)` first (it records the overflow, and `scaler.step()` then skips the step), "
               "or leave the inf and NaN to the scaler")
    triggers = (".scale(",)
    requires = (("nan_to_num", "isnan", "isinf", "isfinite"),)
    project_requires = ((".scale(",),)  # the scaled backward here, the replacement in a helper of another module
    preview = True
    docs = """
A GradScaler finds out that its scale is too large by looking: `scaler.unscale_(optimizer)`
(or `scaler.step(optimizer)`, which unscales first) searches the gradients for inf and NaN,
records what it finds, skips the optimizer's step when it found some, and the `scaler.update()`
that follows halves the scale. Code that replaces the non-finite values of the gradients
after a scaled backward and before the scaler looks (`torch.nan_to_num_`, `p.grad[torch.isnan(
p.grad)] = 0`, `masked_fill_` of a NaN mask) hides every overflow from it: the scale is never
lowered and still doubles after every 2000 clean steps, so overflows come more and more often,
and each of them is a step taken with the overflowed entries replaced by 0 (or, with
`nan_to_num`'s defaults, by the largest float) instead of a step skipped. Nothing fails.

Found per training step, through helpers and methods: after a scaled backward, a replacement of
non-finite values in a `.grad` that runs before any `unscale_()` or `step()` of that scaler on
some path, where the scaler steps afterwards. Replacing them after `unscale_()` is not
reported: the overflow is recorded there, and `step()` skips the step whatever the gradients
hold then. A scaler built `enabled=False` is not reported. Not fixed: whether to move the
replacement after `unscale_()` or drop it is the author's choice.

Bad:
```python
import torch

scaler = torch.amp.GradScaler("cuda")
scaler.scale(loss).backward()
for p in model.parameters():
    if p.grad is not None:
        p.grad[torch.isnan(p.grad)] = 0.0
scaler.step(optimizer)
scaler.update()
```

Good:
```python
import torch

scaler = torch.amp.GradScaler("cuda")
scaler.scale(loss).backward()
scaler.unscale_(optimizer)
for p in model.parameters():
    if p.grad is not None:
        p.grad[torch.isnan(p.grad)] = 0.0
scaler.step(optimizer)
scaler.update()
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        shown = set()
        for trace in model.traces():
            for fix in trace.of(GRAD_SANITIZE):
                bw = model.scaled_backward_before(trace, fix)
                if bw is None:
                    continue
                scaler = bw.scaler
                steps = [s for s in trace.after(fix, SCALER_STEP) if s.scaler == scaler and model.may_precede(trace, fix, s)]
                if not steps:
                    continue

                def looks(e: TraceEvent) -> bool:  # the scaler has seen the gradients (or they are gone)
                    return e.kind == ZERO_GRAD or (e.kind in (UNSCALE, SCALER_STEP) and e.scaler == scaler)

                if not model.path_without(trace, bw, fix, looks, acting=scaler) or model.within_one_call(bw, fix, *steps):
                    continue
                node = model.anchor(bw, fix)[1]
                if id(node) not in shown:
                    shown.add(id(node))
                    yield Violation(node, message=self.message + model.where(fix, node))
