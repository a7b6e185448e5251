"""AMP009 step-update-order."""

from __future__ import annotations

from typing import Iterator, List, Optional, Tuple

import libcst as cst

from ampfix.fixes.edits import in_block, insert_where_bound
from ampfix.model import AmpModel, Trace, TraceEvent, group_loop, is_expression_statement_of
from ampfix.model.events import SCALER_STEP, UNSCALE, UPDATE
from ampfix.rule import SAFE, FileContext, Fix, Rule, Violation

RAISES = {
    (SCALER_STEP, SCALER_STEP): 'RuntimeError "step() has already been called since the last update()"',
    (UNSCALE, UNSCALE): 'RuntimeError "unscale_() has already been called on this optimizer since the last update()"',
    (SCALER_STEP, UNSCALE): 'RuntimeError "unscale_() is being called after step()"',
}


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
            theirs = [u for u in trace.of(UPDATE) if model.updates.update_misplaced(trace, u) is not None]  # AMP004's
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
            scaler = ev.scaler
            if any(model.may_precede(trace, ev, u) for u in theirs):
                continue  # AMP004 reports where the updates stand (per optimizer, the other scaler's)
            group = model.iteration_of(trace, ev)

            def blocks(e: TraceEvent) -> bool:
                return e.scaler == scaler and (e.kind == UPDATE or (ev.kind == UNSCALE and e.kind == SCALER_STEP
                                                                    and e.target == ev.target))

            end = model.leaves_iteration_without(trace, ev, group, blocks)
            if end is None or (ev.event.foreign and group is not None and not isinstance(group_loop(group), cst.CSTNode)):
                continue  # the iteration of a helper of another module: reported there
            updates = [u for u in trace.of(UPDATE) if u.scaler == scaler and model.in_iteration(u, group)
                       and model.may_precede(trace, ev, u)]
            later = model.after_iteration(trace, ev, group, UPDATE) if not updates and ev.kind == SCALER_STEP else []
            if later and not ev.event.foreign:
                shown = model.anchor(ev, end)[0]
                yield Violation(shown, message=self._once_per_loop(model, ev, later[0], group, shown))
                continue
            if not updates and not (model.updates.never_updated(ev)
                                    and (group is not None or model.updates.scaler_built_here(ev))):
                continue  # updated elsewhere, or a step method whose caller (elsewhere) hands in the scaler
            shown = model.anchor(ev, end)[0]
            fix, why = (None, None) if updates else self._fix(model, trace, ev, group)
            message = self._message(model, ev, end, updates, shown)
            if why is not None:
                message += f" (not fixed: {why})"
            yield Violation(shown, message=message, fix=fix)

    @staticmethod
    def _message(model: AmpModel, ev: TraceEvent, end: TraceEvent, updates, shown) -> str:
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
    def _once_per_loop(model: AmpModel, ev: TraceEvent, update: TraceEvent, group, shown) -> str:
        loop = group_loop(group)
        where = f"the loop on line {model.line(loop)}" if isinstance(loop, cst.CSTNode) else "the loop"
        return (f"`scaler.step()` runs on every iteration of {where}, but `scaler.update()` (line "
                f"{model.line(update.node)}) only after that loop: the second `step()` raises RuntimeError (\"step() "
                "has already been called since the last update()\"); update after every step, in the loop"
                + model.where(ev, shown))

    @staticmethod
    def _fix(model: AmpModel, trace: Trace, ev: TraceEvent, group) -> Tuple[Optional[Fix], Optional[str]]:
        """`scaler.update()` after the iteration's last step, when this is it and every other
        step of the scaler in the iteration comes before it; under the test the step runs under
        where the scaler may be None after it (`if scaler is not None: scaler.step(opt)` in a loop
        over the optimizers), not offered where even that is not proven: (fix, why not)."""
        if ev.kind != SCALER_STEP or ev.event.foreign:
            return None, None
        frame = group[0] if group is not None else ()
        if ev.frame != frame:
            return None, None  # the step is in a helper
        steps = [s for s in trace.of(SCALER_STEP) if s.scaler == ev.scaler and model.in_iteration(s, group)]
        if any(s is not ev and not model.may_precede(trace, s, ev) for s in steps):
            return None, None
        stmt = model.statement_of(ev.node)
        if not is_expression_statement_of(stmt, ev.node):
            return None, None
        stop = group_loop(group)
        while True:  # out of loops over optimizers inside the iteration
            loop = model.loop_of(stmt, stop)
            if loop is None:
                break
            stmt = loop
        if not in_block(model, stmt):
            return None, None
        receiver = model.code(ev.node.func.value)  # type: ignore[attr-defined]
        code = f"{receiver}.update()"
        edit, problem, tests = insert_where_bound(model, stmt, code, after=True, under=model.statement_of(ev.node))
        if edit is None:
            return None, f"{problem}: `update()` there could raise"
        under = ", under the test the step runs under" if tests else ""
        return Fix(edit, applicability=SAFE, description="scaler.update() inserted after the last step" + under), None

    # ------------------------------------------------------------------ twice before update
    def _twice(self, model: AmpModel, trace: Trace, skip) -> Iterator[Violation]:
        events = [e for e in trace.of(SCALER_STEP, UNSCALE) if e.target is not None and id(e) not in skip]
        for j, second in enumerate(events):
            # an update() on every path to `second`: pairs with an earlier `first` are cut by it
            barrier = model.barrier_before(trace, second, lambda e: e.kind == UPDATE and e.scaler == second.scaler)
            cut_all = barrier is not None and model.beyond_barrier(trace, barrier, second)
            for first in reversed(events[:j]):
                kinds = (first.kind, second.kind)
                if first.scaler != second.scaler or first.target != second.target or kinds not in RAISES:
                    continue
                if barrier is not None and first.order < barrier.order:
                    if cut_all:
                        break
                    if not model.exclusive(first, second) and not model.exclusive(first, barrier):
                        continue
                if second.kind == UNSCALE and not second.event.foreign and model.guards.in_stage_test(second.node):
                    break  # it unscales only an optimizer not unscaled yet
                if self._disabled(model, trace, second) or model.within_one_call(first, second) or not model.path_avoiding(
                        trace, first, second, lambda e: e.kind == UPDATE and e.scaler == first.scaler):
                    continue
                shown = model.anchor(first, second)[1]
                what = "step" if second.kind == SCALER_STEP else "unscale_"
                after = "after `step()`" if kinds == (SCALER_STEP, UNSCALE) else "a second time"
                message = (f"`scaler.{what}({second.event.target})` runs {after} on this optimizer before "
                           f"`scaler.update()` (line {model.line(first.node)}): it raises {RAISES[kinds]}"
                           + model.where(second, shown))
                yield Violation(shown, message=message)
                break

    # ------------------------------------------------------------------ update before step
    def _update_first(self, model: AmpModel, trace: Trace, theirs: List[TraceEvent]) -> Iterator[Violation]:
        for upd in trace.of(UPDATE):
            if any(upd is t for t in theirs) or self._disabled(model, trace, upd) \
                    or upd.node.args:  # type: ignore[attr-defined]
                continue  # update(new_scale) sets the scale: no step needed
            group = model.iteration_of(trace, upd)
            outer = model.loop_context(trace, group) if group is not None else {}
            own = {g: br for g, br in upd.ctx.items() if g not in outer and g != group}
            later = [s for s in trace.after(upd, SCALER_STEP) if s.scaler == upd.scaler
                     and model.in_iteration(s, group) and model.may_precede(trace, upd, s)
                     and all(s.ctx.get(g) == br for g, br in own.items())]
            if not later or model.within_one_call(upd, later[0]):
                continue
            if not model.path_avoiding(trace, None, upd, lambda e: e.kind in (SCALER_STEP, UNSCALE)
                                      and e.scaler == upd.scaler and model.in_iteration(e, group)):
                continue
            shown = model.anchor(upd, later[0])[0]
            message = (f"`scaler.update()` runs before the iteration's `scaler.step()` (line "
                       f"{model.line(later[0].node)}): the first `update()` raises AssertionError (\"No inf checks "
                       "were recorded prior to update\"); call it once after the last step" + model.where(upd, shown))
            yield Violation(shown, message=message)
