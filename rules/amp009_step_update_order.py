"""AMP009 step-update-order."""

from __future__ import annotations

from typing import Iterator, List, Optional, Tuple

import libcst as cst

from ampfix.fixes.edits import insert_method_call_after
from ampfix.model import AmpModel, Trace, TraceEvent, group_loop
from ampfix.model.events import SCALER_STEP, UNSCALE, UPDATE
from ampfix.model.updates import RAISES, MissingUpdate
from ampfix.rule import SAFE, FileContext, Fix, Rule, Violation


class StepUpdateOrder(Rule):
    code = "AMP009"
    name = "step-update-order"
    message = ("`scaler.step()` with no `scaler.update()` after it in the iteration: the next `step()` raises "
               "RuntimeError and the scale never adapts; call `scaler.update()` after the last step")
    triggers = (".scale(",)
    requires = ((".step(", ".unscale_("),)
    project_requires = ((".scale(", ".step(", ".update(", "unscale_"),)
    fixable = "sometimes"
    fix_note = ("safe (`update()` after the iteration's last step; under the step's test where the scaler may be None) when "
                "the iteration has none; otherwise none")
    docs = """
Each iteration of a GradScaler is `scale(loss).backward()`, at most one `unscale_(opt)` and one
`step(opt)` per optimizer, then ONE `update()`. `update()` adapts the scale and resets the
per-optimizer state; without it the next `step(opt)` raises RuntimeError ("step() has already
been called since the last update()"), and so does a second `unscale_(opt)`. An `update()`
before any `step()` of the iteration raises AssertionError ("No inf checks were recorded prior
to update"). With a disabled scaler all of these are no-ops, so the mistake hides until AMP is
switched on.

Found, per iteration of the training loop (or per call of a step function whose caller is in
another file), through helpers, methods and wrappers: a `step`/`unscale_` from which some path
reaches the end of the iteration (or a `continue`) without `update()`, e.g. an update only
under a condition; `unscale_` or `step` twice on one optimizer before `update()`, or `unscale_`
after `step`; `update()` before the iteration's `step()`; `step` on every batch while `update()`
runs only after the loop over the batches (once per epoch; reported, not fixed; a loop that
steps a different optimizer on each pass, then updates once, is correct). A step function with no `update()` is
reported only when nothing in the file updates that scaler (its caller may). Several updates
between steps and the wrong scaler's update are AMP004; `unscale_`/`step`/`update` on every
micro-batch of gradient accumulation are AMP010.

Paths the code ties together are read as one: after `if not step_now: raise` (or `return`, or,
within one iteration, `continue`/`break`), a later `if step_now:` is taken wherever the code goes
on; a local set to None and then, in one branch, to a value that is never None marks that branch
for a later `is None` test. Not reported where the scaler is handed, itself, to code ampfix cannot
read, or to a function of another module that rebinds it before stepping or updating it
(`scaler = scaler or self.default_scaler`): whether that call updates this scaler is unknown.

The fix inserts `scaler.update()` after the last step of the iteration when the iteration has
none at all (safe); the other cases are reported.

Bad:
```python
import torch

scaler = torch.amp.GradScaler("cuda")
for x, y in loader:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
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
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        shown = set()
        for trace in model.traces():
            skip = {id(m.event) for m in model.accumulation_misplaced(trace)}  # AMP010's
            theirs = model.updates.misplaced_updates(trace)  # AMP004's
            found = [*self._missing(model, trace, skip, theirs), *self._twice(model, trace, skip),
                     *self._update_first(model, trace, theirs)]
            for v in found:
                if id(v.node) not in shown:
                    shown.add(id(v.node))
                    yield v

    @staticmethod
    def _disabled(model: AmpModel, trace: Trace, ev: TraceEvent) -> bool:
        return model.scaler_always_disabled(ev.event.scaler, trace.root)

    # ------------------------------------------------------------------ no update after step/unscale_
    def _missing(self, model: AmpModel, trace: Trace, skip, theirs: List[TraceEvent]) -> Iterator[Violation]:
        for ev in trace.of(SCALER_STEP, UNSCALE):
            if id(ev) in skip or self._disabled(model, trace, ev):
                continue
            missing = model.updates.missing_update(trace, ev, theirs)
            if missing is None:
                continue
            shown = model.anchor(ev, missing.end)[0]
            if missing.later is not None:
                yield Violation(shown, message=self._once_per_loop(model, missing, shown))
                continue
            fix, why = (None, None) if missing.updates else self._fix(model, trace, ev, missing.group)
            message = self._message(model, missing, shown)
            if why is not None:
                message += f" (not fixed: {why})"
            yield Violation(shown, message=message, fix=fix)

    @staticmethod
    def _message(model: AmpModel, missing: MissingUpdate, shown) -> str:
        ev, end, updates = missing.event, missing.end, missing.updates
        call = "scaler.step()" if ev.kind == SCALER_STEP else "scaler.unscale_()"
        again = ('the next `step()` raises RuntimeError ("step() has already been called since the last update()")'
                 if ev.kind == SCALER_STEP else
                 'the next `unscale_()` raises RuntimeError ("unscale_() has already been called on this optimizer '
                 'since the last update()")')
        where = model.where(ev, shown)
        if end.kind == "exit" and end.event.detail == "continue":
            return (f"`{call}` is not followed by `scaler.update()` on the path that leaves the iteration with "
                    f"`continue` (line {model.line(end.node)}): {again}; update before continuing" + where)
        if end.kind == "exit" and any(ev.ctx.get(g) != br for g, br in end.ctx.items()):
            return (f"`{call}` is not followed by `scaler.update()` on the path that returns early (line "
                    f"{model.line(end.node)}): {again}; update before returning" + where)
        if updates:
            lines = ", ".join(str(model.line(u.node)) for u in updates)
            return (f"`scaler.update()` (line {lines}) runs only on some paths after `{call}`: on the others {again}; "
                    "update on every path" + where)
        if ev.kind == UNSCALE:
            return f"`{call}` with no `scaler.update()` after it in the iteration: {again}" + where
        return StepUpdateOrder.message + where

    @staticmethod
    def _once_per_loop(model: AmpModel, missing: MissingUpdate, shown) -> str:
        loop = group_loop(missing.group)
        where = f"the loop on line {model.line(loop)}" if isinstance(loop, cst.CSTNode) else "the loop"
        return (f"`scaler.step()` runs on every iteration of {where}, but `scaler.update()` (line "
                f"{model.line(missing.later.node)}) only after that loop: the second `step()` raises RuntimeError "
                "(\"step() has already been called since the last update()\"); update after every step, in the loop"
                + model.where(missing.event, shown))

    @staticmethod
    def _fix(model: AmpModel, trace: Trace, ev: TraceEvent, group) -> Tuple[Optional[Fix], Optional[str]]:
        """`scaler.update()` after the iteration's last step (`updates.update_site`); under the
        test the step runs under where the scaler may be None after it, not offered where even
        that is not proven: (fix, why not)."""
        stmt = model.updates.update_site(trace, ev, group)
        if stmt is None:
            return None, None
        edit, problem, tests = insert_method_call_after(model, stmt, ev.node, "update")
        if edit is None:
            return None, f"{problem}: `update()` there could raise"
        under = ", under the test the step runs under" if tests else ""
        return Fix(edit, applicability=SAFE, description="scaler.update() inserted after the last step" + under), None

    # ------------------------------------------------------------------ twice before update
    @staticmethod
    def _twice(model: AmpModel, trace: Trace, skip) -> Iterator[Violation]:
        for first, second in model.updates.raising_pairs(trace, skip):
            kinds = (first.kind, second.kind)
            shown = model.anchor(first, second)[1]
            what = "step" if second.kind == SCALER_STEP else "unscale_"
            after = "after `step()`" if kinds == (SCALER_STEP, UNSCALE) else "a second time"
            message = (f"`scaler.{what}({second.event.target})` runs {after} on this optimizer before "
                       f"`scaler.update()` (line {model.line(first.node)}): it raises {RAISES[kinds]}"
                       + model.where(second, shown))
            yield Violation(shown, message=message)

    # ------------------------------------------------------------------ update before step
    def _update_first(self, model: AmpModel, trace: Trace, theirs: List[TraceEvent]) -> Iterator[Violation]:
        for upd in trace.of(UPDATE):
            if any(upd is t for t in theirs) or self._disabled(model, trace, upd):
                continue
            step = model.updates.step_after_update(trace, upd)
            if step is None:
                continue
            shown = model.anchor(upd, step)[0]
            message = (f"`scaler.update()` runs before the iteration's `scaler.step()` (line "
                       f"{model.line(step.node)}): the first `update()` raises AssertionError (\"No inf checks "
                       "were recorded prior to update\"); call it once after the last step" + model.where(upd, shown))
            yield Violation(shown, message=message)
