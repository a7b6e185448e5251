"""AMP021 autocast-never-exited."""

from __future__ import annotations

from typing import Iterator

from ampfix.model.events import BACKWARD, OPT_STEP, SCALER_STEP
from ampfix.rule import FileContext, Rule, Violation


class AutocastNeverExited(Rule):
    code = "AMP021"
    name = "autocast-never-exited"
    message = ("this autocast region is entered by hand and never exited: the backward and the optimizer's step "
               "run inside it, and autocast clears its cache of low-precision weight casts only when the outermost "
               "region exits, so every later forward reuses the casts of the weights from before the optimizer's "
               "step (the model stops following its updates); put the forward and the loss in "
               "`with autocast(...):`, or call `__exit__(None, None, None)` before the backward")
    triggers = ("__enter__",)
    requires = (("autocast",),)
    preview = True
    docs = """
`ctx.__enter__()` on an autocast context opens a region that lasts until `ctx.__exit__()`. A
training step that enters it by hand and never leaves it runs its backward and its optimizer's
step inside the region (what AMP001 reports for `with` blocks), and worse: autocast keeps the
float16/bfloat16 copies it casts of the weights (leaf tensors that require grad) for as long as
the region lasts, and clears that cache only when the outermost region exits. When it never
exits, every forward after the first one computes with the weights as they were cast then: the
optimizer updates the float32 weights in place, the forward does not see it, and the loss stops
following the updates. Nothing fails. (Entering it again each step only nests the region
deeper.)

Found per function: an `X.__enter__()` statement on an object the file shows to be an autocast
(`torch.autocast`, `torch.amp.autocast`, `torch.cuda.amp.autocast`, ..., held in a name or a
`self.` attribute, or built on the spot), followed on some path by a backward or an optimizer
step, where the file never calls `X.__exit__(...)` and the function uses `X` in no other way (a
`with`, an `ExitStack.enter_context(X)`, an argument, an alias). An inference script that
enters autocast for good is not reported (no backward), nor a region built `enabled=False`, with
a float32 dtype (it casts nothing) or with `cache_enabled=False`. A dtype chosen at run time
(`getattr(torch, precision)`) is reported: it matters when it is float16 or bfloat16. Not fixed:
where the region should end is the author's choice.

Bad:
```python
import torch

amp_context = torch.autocast("cuda", dtype=torch.bfloat16)
for x, y in loader:
    amp_context.__enter__()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
```

Good:
```python
import torch

for x, y in loader:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        shown = set()
        for entry in model.entered.left_open():
            if entry.key is not None and (entry.scope, entry.key) in shown:
                continue  # entered again (pufferlib enters twice per step): one finding, at the first
            trace = model.trace(entry.scope)
            here = model.point(trace, model.statement_of(entry.call))
            later = [e for e in trace.of(BACKWARD, OPT_STEP, SCALER_STEP) if model.may_precede(trace, here, e)]
            if not later:
                continue  # inference: nothing trains inside the region
            shown.add((entry.scope, entry.key))
            what = "backward" if later[0].kind == BACKWARD else "optimizer step"
            note = f" (the {what} on line {model.line(model.anchor(here, later[0])[1])}"
            again = [model.line(e.call) for e in model.entered.entries if e is not entry and e.key is not None
                     and (e.scope, e.key) == (entry.scope, entry.key)]
            note += f"; entered again on line {', '.join(map(str, again))})" if again else ")"
            if entry.region.dtype == "dynamic":
                note += "; the dtype is chosen at run time: it matters when it is float16 or bfloat16"
            yield Violation(entry.call, message=self.message + note)
