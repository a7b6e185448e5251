"""AMP004 update-per-optimizer."""

from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from ampfix.fixes.edits import in_block, move_after, remove_statement
from ampfix.model import AmpModel, TraceEvent, UpdateMisplaced, UpdatePlace, is_expression_statement_of
from ampfix.model.events import UPDATE
from ampfix.rule import SAFE, UNSAFE, FileContext, Fix, Rule, Violation


class UpdatePerOptimizer(Rule):
    code = "AMP004"
    name = "update-per-optimizer"
    message = ("`scaler.update()` runs between the optimizer steps of one iteration; "
               "step every optimizer first, then call `update()` once")
    triggers = ("GradScaler", ".scale(")
    requires = ((".update(",), (".step(",))
    fixable = "sometimes"
    fix_note = "safe (one `update()` after the last step); wrong scaler: unsafe rename"
    docs = """
With several optimizers, call `scaler.step(opt)` for each of them and then ONE
`scaler.update()`. Updating after each step changes the scale between the steps of one
iteration: the next step's inf/NaN check and unscaling use a different scale than the one its
gradients were produced with, and the scale grows or backs off several times per iteration.
The same goes when each step goes through a helper (`apply_step(scaler, opt)` called per
optimizer, a loss-scaler object called once per loss, `for opt in optimizers: opt_step(opt)`).
With several scalers, each must be updated once after its own steps: `scaler_g.update()` after
`scaler_d.step(...)` leaves one scaler never updated and the other updated twice.

A path that leaves the iteration early (`continue` after its own `update()`) is a separate
iteration, not a second update; so is a step whose gradients are all made after the update (a
backward runs between them, and it steps the same optimizer again, or an optimizer whose
gradients were zeroed after the first backward): a step-and-update helper called twice runs
two iterations. A loop over optimizers whose body the loop's variable restricts to one of
them (`if i != idx: continue`, `if idx is not None and i != idx: continue`, `if i == idx:`),
as GAN trainers alternate the generator and the discriminator, is not reported: it may step and
update one optimizer per iteration. The fix removes the extra `update()` calls (or moves the one
in a `for opt in optimizers:` loop after the loop), leaving one update after the last step;
for the wrong scaler it renames the receiver (unsafe). No fix when the update is in a helper.

Bad:
```python
import torch

scaler = torch.amp.GradScaler("cuda")
scaler.scale(loss0 + loss1).backward()
scaler.step(optimizer0)
scaler.update()
scaler.step(optimizer1)
scaler.update()
```

Good:
```python
import torch

scaler = torch.amp.GradScaler("cuda")
scaler.scale(loss0 + loss1).backward()
scaler.step(optimizer0)
scaler.step(optimizer1)
scaler.update()
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        for trace in model.traces():
            for upd in trace.of(UPDATE):
                fact = model.updates.update_misplaced(trace, upd)
                if fact is not None:
                    yield (self._in_optimizer_loop if fact.place is UpdatePlace.OPTIMIZER_LOOP else self._between_steps
                           if fact.place is UpdatePlace.BETWEEN_STEPS else self._wrong_scaler)(model, fact)

    @staticmethod
    def _in_optimizer_loop(model: AmpModel, fact: UpdateMisplaced) -> Violation:
        upd, loop, shown = fact.update, fact.loop, fact.shown
        message = ("`scaler.update()` runs once per optimizer inside the loop over optimizers; move it after "
                   "the loop" + model.where(upd, shown))
        stmt = model.statement_of(upd.node)
        body = loop.body
        fix = None
        if shown is upd.node and not upd.event.foreign and is_expression_statement_of(stmt, upd.node) \
                and isinstance(body, cst.IndentedBlock) \
                and any(s is stmt for s in body.body) and len(body.body) > 1 and loop.orelse is None \
                and in_block(model, loop) and all(model.before(s.node, upd.node) for s in fact.steps):
            new_loop = loop.with_changes(body=body.with_changes(body=[s for s in body.body if s is not stmt]))
            fix = Fix({loop: cst.FlattenSentinel([new_loop, stmt.with_changes(leading_lines=())])},
                      applicability=SAFE, description="scaler.update() moved after the loop over optimizers")
        return Violation(shown, message=message, fix=fix)

    def _between_steps(self, model: AmpModel, fact: UpdateMisplaced) -> Violation:
        """`scaler.step(o1); scaler.update(); scaler.step(o2)` in one iteration."""
        upd, shown = fact.update, fact.shown
        message = self._between_message(model, fact.earlier, upd, fact.later) + model.where(upd, shown)
        if shown is not upd.node:
            return Violation(shown, message=message)
        fix = None if model.foreign_among(upd, fact.last, fact.final) else \
            self._fix_between(model, upd, fact.last, fact.final)
        return Violation(upd.node, message=message, fix=fix)

    @staticmethod
    def _between_message(model: AmpModel, earlier: TraceEvent, upd: TraceEvent, later: TraceEvent) -> str:
        """Names what runs, as the reported function shows it: "`scaler.step(opt0)` (line 16) steps,
        `scaler.update()` (line 17) updates, then `scaler.step(opt1)` (line 18) steps ..."."""
        a, u, b = model.anchor(earlier, upd, later)

        def shown(node: cst.CSTNode) -> str:
            text = " ".join(model.code(node).split())
            return f"`{text if len(text) <= 60 else text[:57] + '...'}` (line {model.line(node)})"

        first = f"{shown(a)} steps and updates the scaler" if a is u else \
            f"{shown(a)} steps, {shown(u)} updates the scaler"
        return (f"the scaler is updated between two optimizer steps of one iteration: {first}, then {shown(b)} steps, "
                "unscaling with the new scale gradients made (at least in part) at the old one; step every optimizer "
                "first, then call `update()` once")

    @staticmethod
    def _fix_between(model: AmpModel, upd: TraceEvent, last: TraceEvent, final: Optional[TraceEvent]) -> Optional[Fix]:
        stmt = model.statement_of(upd.node)
        if not is_expression_statement_of(stmt, upd.node) or not in_block(model, stmt):
            return None
        if final is not None:
            return Fix(remove_statement(model, stmt), applicability=SAFE, description="extra scaler.update() removed")
        last_stmt = model.statement_of(last.node)
        if last.via or last_stmt is None or model.block_of(last_stmt) is not model.block_of(stmt):
            return None
        return Fix(move_after(model.module, stmt, last_stmt), applicability=SAFE,
                   description="scaler.update() moved after the last step")

    @staticmethod
    def _wrong_scaler(model: AmpModel, fact: UpdateMisplaced) -> Violation:
        """An update of a scaler that has not stepped since its last update, right after the
        step of another scaler that is never updated afterwards."""
        upd, prev, shown = fact.update, fact.other, fact.shown
        other = prev.event.scaler
        message = (f"`{upd.event.scaler}.update()` follows `{other}.step(...)`: `{upd.event.scaler}` is updated twice "
                   f"this iteration and `{other}` never; call `{other}.update()` here" + model.where(upd, shown))
        fix = None
        func = upd.node.func
        if shown is upd.node and not prev.via and isinstance(func, cst.Attribute) and other \
                and not model.foreign_among(prev, upd):
            fix = Fix({func.value: cst.parse_expression(other)}, applicability=UNSAFE,
                      description="update() called on the scaler that stepped")
        return Violation(shown, message=message, fix=fix)
