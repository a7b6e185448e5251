"""AMP004 update-per-optimizer."""

from __future__ import annotations

from typing import Iterator, List, Optional

import libcst as cst

from ampfix.model import AmpModel, dotted, is_expression_statement_of
from ampfix.rule import FileContext, Fix, Rule, Violation


class UpdatePerOptimizer(Rule):
    code = "AMP004"
    name = "update-per-optimizer"
    message = ("`scaler.update()` runs between the optimizer steps of one iteration; "
               "step every optimizer first, then call `update()` once")
    triggers = ("GradScaler", ".scale(")
    requires = ((".update(",), (".step(",))
    fixable = "sometimes"
    docs = """
With several optimizers, call `scaler.step(opt)` for each of them and then ONE
`scaler.update()`. Updating after each step changes the scale between the steps of one
iteration: the next step's inf/NaN check and unscaling use a different scale than the one its
gradients were produced with, and the scale grows or backs off several times per iteration.

The fix removes the extra `update()` calls (or moves the one in a `for opt in optimizers:`
loop after the loop), leaving one update after the last step.

Bad:
```python
scaler.step(optimizer0)
scaler.update()
scaler.step(optimizer1)
scaler.update()
```

Good:
```python
scaler.step(optimizer0)
scaler.step(optimizer1)
scaler.update()
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        for scope in model.scopes:
            calls = model.calls_in_scope(scope)
            updates = [c for c in calls if model.scaler_method(c, "update") is not None]
            if not updates:
                continue
            steps = [c for c in calls if model.scaler_method(c, "step") is not None]
            for upd in updates:
                key = model.scaler_method(upd, "update")
                same = [s for s in steps if model.scaler_method(s, "step") == key]
                v = self._in_optimizer_loop(model, upd, same) or self._between_steps(model, upd, same, updates)
                if v is not None:
                    yield v

    def _in_optimizer_loop(self, model: AmpModel, upd: cst.Call, steps: List[cst.Call]) -> Optional[Violation]:
        """`for opt in optimizers: scaler.step(opt); scaler.update()`."""
        loop = model.loop_of(upd)
        if not isinstance(loop, cst.For):
            return None
        target = dotted(loop.target)
        if target is None:
            return None
        inner = [s for s in steps if model.is_ancestor(loop, s) and s.args and dotted(s.args[0].value) == target]
        if not inner:
            return None
        message = ("`scaler.update()` runs once per optimizer inside the loop over optimizers; "
                   "move it after the loop")
        stmt = model.statement_of(upd)
        fix = None
        body = loop.body
        if (is_expression_statement_of(stmt, upd) and isinstance(body, cst.IndentedBlock)
                and any(s is stmt for s in body.body) and len(body.body) > 1 and loop.orelse is None
                and model.block_of(loop) is not None and all(model.before(s, upd) for s in inner)):
            new_loop = loop.with_changes(body=body.with_changes(body=[s for s in body.body if s is not stmt]))
            moved = stmt.with_changes(leading_lines=())
            fix = Fix({loop: cst.FlattenSentinel([new_loop, moved])}, safe=True,
                      description="scaler.update() moved after the loop over optimizers")
        return Violation(upd, message=message, fix=fix)

    def _between_steps(self, model: AmpModel, upd: cst.Call, steps: List[cst.Call],
                       updates: List[cst.Call]) -> Optional[Violation]:
        """`scaler.step(o1); scaler.update(); scaler.step(o2)` in one iteration."""
        loop = model.loop_of(upd)
        same_iter = [s for s in steps if model.loop_of(s) is loop and not model.exclusive(s, upd)]
        earlier = [s for s in same_iter if model.before(s, upd)]
        later = [s for s in same_iter if model.before(upd, s)]
        if not earlier or not later:
            return None
        stmt = model.statement_of(upd)
        fix = None
        last_step = later[-1]
        final_update = any(model.before(last_step, u) and model.loop_of(u) is loop and not model.exclusive(u, last_step)
                           for u in updates)
        if is_expression_statement_of(stmt, upd) and model.block_of(stmt) is not None:
            if final_update:
                fix = Fix({stmt: cst.RemoveFromParent()}, safe=True,
                          description="extra scaler.update() removed")
            else:
                last_stmt = model.statement_of(last_step)
                if last_stmt is not None and model.block_of(last_stmt) is model.block_of(stmt):
                    moved = stmt.with_changes(leading_lines=())
                    fix = Fix({stmt: cst.RemoveFromParent(), last_stmt: cst.FlattenSentinel([last_stmt, moved])},
                              safe=True, description="scaler.update() moved after the last step")
        return Violation(upd, fix=fix)
