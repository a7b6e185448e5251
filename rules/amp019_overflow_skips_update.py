"""AMP019 overflow-skips-update."""

from __future__ import annotations

from typing import Iterator, List, Optional

from ampfix.model import AmpModel, Trace, TraceEvent
from ampfix.model.events import BACKWARD, EXIT, SCALER_STEP, UNSCALE, UPDATE
from ampfix.rule import FileContext, Rule, Violation


class OverflowSkipsUpdate(Rule):
    code = "AMP019"
    name = "overflow-skips-update"
    message = ("{how} when the gradients are not finite: the GradScaler never sees the overflow, so it never lowers "
               "its scale, which keeps growing until most steps overflow and are skipped; let `scaler.step(optimizer)` "
               "skip the step (it does when the gradients hold inf or NaN) and call `scaler.update()` on this path too")
    triggers = (".scale(",)
    requires = ((".update(",), ("isfinite", "isnan", "isinf", "inf", "nan"))
    preview = True
    docs = """
A GradScaler finds out that its scale is too large by looking: `scaler.step(optimizer)`
unscales the gradients, finds inf or NaN in them, skips the optimizer's step, and the
`scaler.update()` that follows halves the scale. A training step that checks the gradients
itself after a scaled backward (`if not torch.isfinite(grad_norm): optimizer.zero_grad();
continue`) and skips both `step()` and `update()` on that path hides every overflow from the
scaler: the scale is never lowered, and it still doubles after every 2000 clean steps, so
overflows become more and more frequent and, with the scaler's own check bypassed, each of them
is a step lost. Nothing fails; the run trains on fewer and fewer steps.

Found, per iteration of the training loop (or per call of a step function), through helpers
and methods: after a scaled backward, a `continue` (or a step function's `return`) under a test
of whether the gradients or their norm are finite, where no `scaler.step()`, `unscale_()` or
`update()` of that scaler can run on the way; or an `update()` that runs only when such a test
says the gradients are finite, with none of them in the other branch (a loop over the
optimizers that steps and updates each in that branch is taken to update). The test may name
the norm under any name (`gn = clip_grad_norm_(...)`) or read a flag (`skip = not
torch.isfinite(gn)`; `valid = False` under `if not torch.isfinite(p.grad).all():` in a loop over
the parameters), or call a function or method of the same file that answers it (`if not
grads_finite(model):`, read through its `return`s and the tests they run under). A test answered
in another module, or a skip in a helper of another module, is not followed: silent. A path that
calls `unscale_` and then skips `update()` is AMP009 (the next `unscale_` raises). A test of the loss alone (a NaN loss skipped before or after the
backward) is not reported: the scale does not cause it. Not fixed: what the path should do
(let `step()` skip, or update and skip) is the author's choice.

Bad:
```python
import torch

scaler = torch.amp.GradScaler("cuda")
for x, y in loader:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
    if not torch.isfinite(grad_norm):
        optimizer.zero_grad()
        continue
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
```

Good:
```python
import torch

scaler = torch.amp.GradScaler("cuda")
for x, y in loader:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        shown = set()
        for trace in model.traces():
            for bw in trace.of(BACKWARD):
                if bw.event.detail != "scaled" or model.scaler_always_disabled(bw.event.scaler, trace.root):
                    continue
                for node, how in self._skips(model, trace, bw):
                    if id(node) not in shown:
                        shown.add(id(node))
                        yield Violation(node, message=self.message.format(how=how))

    @staticmethod
    def _skips(model: AmpModel, trace: Trace, bw: TraceEvent) -> Iterator[tuple]:
        """The places after the scaled backward `bw` where a finite test of the gradients skips
        the scaler's step and update: (node to report, what it does)."""
        scaler = bw.scaler

        def blocks(e: TraceEvent) -> bool:
            return e.scaler == scaler and e.kind in (UPDATE, SCALER_STEP, UNSCALE)

        group = model.iteration_of(trace, bw)
        updates = [u for u in trace.of(UPDATE) if u.scaler == scaler and model.in_iteration(u, group)
                   and model.may_precede(trace, bw, u)]
        if not updates or model.leaves_iteration_without(trace, bw, group, blocks) is None:
            return

        def finite_test(e: TraceEvent) -> Optional[object]:
            return next((g for g in e.ctx if g not in bw.ctx and model.gradient_finite_test(g)), None)

        def may_run_between(a: TraceEvent, b: TraceEvent) -> bool:
            """Some scaler call of `blocks` may run on a path from `a` to `b` (a loop over the
            optimizers that steps and updates each: not known to skip them, so not reported)."""
            return any(blocks(e) and model.may_precede(trace, a, e) and model.may_precede(trace, e, b)
                       for e in trace.span(a, b))

        for x in trace.of(EXIT):
            if x.event.foreign or x.order < bw.order or finite_test(x) is None:
                continue
            if _ends_iteration(x, group, updates) and model.may_precede(trace, bw, x) and not may_run_between(bw, x):
                yield x.node, f"`{x.event.detail}` skips `scaler.step()` and `scaler.update()`"
        for u in updates:
            test = finite_test(u)
            node = model.decision_node(trace, u, test) if test is not None and not u.event.foreign else None
            if node is None:
                continue
            arm = u.ctx[test]
            # the update's branch does not leave the iteration (that is a skip path that updates),
            # and no scaler call that may follow the backward runs outside it
            if any(x.ctx.get(test) == arm for x in trace.of(EXIT) if x.order > bw.order):
                continue
            if all(e.ctx.get(test) == arm for e in trace.events if blocks(e) and model.may_precede(trace, bw, e)):
                yield node.test, "`scaler.update()` runs only when this test passes, not"


def _ends_iteration(x: TraceEvent, group, updates: List[TraceEvent]) -> bool:
    """The exit `x` ends this iteration early and passes every `update()` by: a `continue` of
    the iteration's loop, or a `return` from a step function (or a helper holding every update)
    called inside the iteration (a `return` of the loop's own function ends the training)."""
    if x.event.detail == "continue":
        return group is not None and (x.frame, ("loop", x.event.loop)) == group
    if x.event.detail != "return" or (group is not None and len(x.frame) <= len(group[0])):
        return False
    return all(u.order > x.order and u.frame[:len(x.frame)] == x.frame for u in updates)

