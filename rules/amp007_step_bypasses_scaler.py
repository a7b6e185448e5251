"""AMP007 step-bypasses-scaler."""

from __future__ import annotations

from typing import Dict, Iterator, List, Optional, Tuple

import libcst as cst

from ampfix.fixes.edits import guarded, in_block, replace_small_statement, replace_statement, statement
from ampfix.model import AmpModel, Trace, TraceEvent, is_expression_statement_of
from ampfix.model.events import BACKWARD, OPT_STEP, SCALER_STEP, UNSCALE, UPDATE, ZERO_GRAD
from ampfix.rule import UNSAFE, FileContext, Fix, Rule, Violation

Hit = Tuple[TraceEvent, TraceEvent, cst.Call, Optional[str]]  # step, backward, scale call, scaler key


class StepBypassesScaler(Rule):
    code = "AMP007"
    name = "step-bypasses-scaler"
    message = ("`optimizer.step()` applies gradients still scaled by the GradScaler, with no inf/NaN check; "
               "call `scaler.step(optimizer)`")
    triggers = (".scale(",)
    requires = ((".step(",), ("backward",))
    project_requires = ((".step(",),)
    fixable = "unsafe"
    fix_note = ("unsafe (`scaler.step(opt)`, plus `scaler.update()` when the scaler is never stepped; under the scaled "
                "backward's test where the scaler may be None)")
    docs = """
After `scaler.scale(loss).backward()` every `.grad` is the true gradient times the scale
(65536 by default). `scaler.step(optimizer)` divides them back and skips the step when they
hold inf/NaN (an fp16 overflow); a direct `optimizer.step()` does neither: the update is 65536x
too large (SGD diverges at once; Adam hides most of it, but its epsilon no longer matches), and
overflowed steps are applied, writing inf/NaN into the weights. Without `scaler.step` nothing
records an inf check either, so the scale never adapts.

Not reported: `optimizer.step()` in the non-AMP branch of `if use_amp:` (correlated `if`s in
separate statements count as one decision), an optimizer whose gradients were unscaled with
`scaler.unscale_(optimizer)` first (only the inf/NaN skip is lost), a step after `zero_grad()`
or after the scaler's `update()` (a later, unscaled backward feeds it), a loop with no scaler,
`lr_scheduler.step()`, a `GradScaler(enabled=False)` (its `scale()` returns the loss as it is;
only a literal `False` counts), `scaler.step(optimizer)` on a project's own scaler class (one with
`scale` and `step` methods, such as a no-op scaler for fp32 runs whose `step()` calls
`optimizer.step()`), a step that runs only where the scaler is None (`if self.scaler is None:
optimizer.step()`): after `scaler.scale(loss)` the scaler is not None, and a loss scaler that is
not a GradScaler (a class of the project, or of a library other than torch, with no `step`
method: fairseq's, Uni-Core's, apex's dynamic loss scalers, whose trainer unscales the
gradients and skips an overflowed step itself), even where it is named `scaler`.

With SGD (with or without momentum) every update is the scale times too large (65536x at
first) and the loss diverges within a few steps. With Adam the damage is smaller (its update is
nearly invariant to a constant gradient scale, though its `eps` and weight decay are not), but
no step is ever skipped on an overflow, so inf/NaN gradients reach the weights.

The fix replaces `optimizer.step()` with `scaler.step(optimizer)`, and adds `scaler.update()`
when the scaler is never stepped nor updated (only when the scaled backward runs on every path
to the step, in the same function: `if scaler is None: loss.backward() else: ...` is reported
without a fix). It is unsafe: the updates become 1/scale of what
they were, which changes training (for the better, unless the learning rate was tuned around
the scaled gradients, as some code does on purpose with a fixed `init_scale`).

Bad:
```python
import torch

scaler = torch.amp.GradScaler("cuda")
for x, y in loader:
    optimizer.zero_grad()
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    optimizer.step()
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
            hits = [h for h in (self._hit(model, trace, s) for s in trace.of(OPT_STEP)) if h is not None]
            by_backward: Dict[int, List[Hit]] = {}
            for h in hits:
                by_backward.setdefault(id(h[1].node), []).append(h)
            for group in by_backward.values():
                fixes, why = self._fixes(model, trace, group)
                for (step, bw, scale, _), fix in zip(group, fixes):
                    shown = model.anchor(bw, step)[1]
                    opt = model.code(step.node.func.value)  # type: ignore[attr-defined]
                    scaler = model.code(scale.func.value)  # type: ignore[attr-defined]
                    message = (f"`{opt}.step()` applies the gradients of `{scaler}.scale(...)` (backward on line "
                               f"{model.line(bw.node)}) still scaled, with no inf/NaN check; call "
                               f"`{scaler}.step({opt})`" + model.where(step, shown))
                    if why is not None:
                        message += f" (not fixed: {why})"
                    yield Violation(shown, message=message, fix=fix)

    @staticmethod
    def _hit(model: AmpModel, trace: Trace, step: TraceEvent) -> Optional[Hit]:
        """The scaled backward whose gradients `step` applies, if any."""
        if any(s.kind == SCALER_STEP and model.exclusive(s, step) for s in trace.of(SCALER_STEP)):
            return None  # `if use_amp: scaler.step(opt) else: opt.step()`
        for bw in reversed(trace.before(step, BACKWARD)):
            scales = [c for c in model.backward_scale_sources(bw) if model.scale_call_scaler(c)]
            if not scales or model.scaler_disabled(scales[0].func.value):
                continue
            key = model.scaler_of_scale(bw, scales[0])
            if model.runs_only_without(step, key):
                continue  # `if self.scaler is None: optimizer.step()`: the scale() above proves it is not

            def blocks(e: TraceEvent) -> bool:
                if e.kind == ZERO_GRAD or (e.kind == UPDATE and e.scaler == key):
                    return True
                return e.kind in (SCALER_STEP, UNSCALE, OPT_STEP) and e.target == step.target

            if not model.path_without(trace, bw, step, blocks) or model.within_one_call(bw, step):
                continue
            # `scaler.step(opt_d)` then an unscaled `g_loss.backward()`: that backward feeds this step
            consumed = [e for e in trace.between(bw, step, SCALER_STEP) if model.mandatory_between(e, bw, step)]
            if consumed and any(not model.backward_scale_sources(b) and model.mandatory_between(b, consumed[0], step)
                                for b in trace.between(consumed[0], step, BACKWARD)):
                continue
            return step, bw, scales[0], key
        return None

    @staticmethod
    def _fixes(model: AmpModel, trace: Trace, group: List[Hit]) -> Tuple[List[Optional[Fix]], Optional[str]]:
        """`scaler.step(opt)` for every step fed by one backward, plus `scaler.update()` after the
        last one when the scaler is never stepped nor updated; all or none, and none where the
        scaler may be unassigned or None (`if self.scaler is None: optimizer.step()`): (fixes,
        why not)."""
        stmts = []
        if any(model.foreign_among(step, bw) for step, bw, _, _ in group):
            return [None] * len(group), None
        conditional = False  # the scaled backward runs only under a test the step is not under
        for step, bw, scale, _ in group:
            stmt = model.statement_of(step.node)
            if step.via != bw.via or model.scope_of(scale) is not model.scope_of(step.node) \
                    or step.node.args or not is_expression_statement_of(stmt, step.node) \
                    or not isinstance(stmt.body[0], cst.Expr) or not in_block(model, stmt):  # type: ignore[union-attr]
                return [None] * len(group), None
            if not model.mandatory_between(bw, None, step):
                if len(group) != 1:
                    return [None] * len(group), None
                conditional = True
            stmts.append(stmt)
        _, _, first_scale, key = group[0]
        scaler = model.code(first_scale.func.value)  # type: ignore[attr-defined]
        needs_update = not any(e.scaler == key for e in trace.of(UPDATE, SCALER_STEP))
        if needs_update and any(set(step.loops()) - set(bw.loops()) for step, bw, _, _ in group):
            return [None] * len(group), None  # `for opt in optimizers: opt.step()`: one update after that loop, by hand
        last = max(range(len(group)), key=lambda i: model.start(stmts[i]))
        fixes: List[Optional[Fix]] = []
        for i, ((step, bw, _, _), stmt) in enumerate(zip(group, stmts)):
            opt = model.code(step.node.func.value)  # type: ignore[attr-defined]
            then = [f"{scaler}.update()"] if needs_update and i == last else []
            problem = model.bound.insertion_problem([statement(model.module, c) for c in (f"{scaler}.step({opt})", *then)],
                                              stmt)
            if conditional:  # only the guarded step is right: without the scaled backward, a plain step
                moved = StepBypassesScaler._guarded(model, bw, stmt, scaler, opt, then)
                return [moved], None if moved is not None else (problem and f"{problem}: `{scaler}.step(...)` there "
                                                                 "could raise")
            if problem is not None:
                moved = StepBypassesScaler._guarded(model, bw, stmt, scaler, opt, then) if len(group) == 1 else None
                if moved is not None:
                    return [moved], None
                return [None] * len(group), f"{problem}: `{scaler}.step(...)` there could raise"
            fixes.append(Fix(replace_small_statement(model.module, stmt, f"{scaler}.step({opt})", then),
                             applicability=UNSAFE,
                             description="optimizer.step() replaced by scaler.step(optimizer)"
                             + (" and scaler.update()" if needs_update else ""),
                             group=f"bw{model.line(bw.node)}" if len(group) > 1 else None))
        return fixes, None

    @staticmethod
    def _guarded(model: AmpModel, bw: TraceEvent, stmt, scaler: str, opt: str, then: List[str]) -> Optional[Fix]:
        """Where the scaler may be None (`self.scaler = GradScaler() if amp else None`): the step
        goes through the scaler under the test the scaled backward runs under, and stays a plain
        `optimizer.step()` otherwise."""
        bw_stmt = model.statement_of(bw.node)
        tests = model.bound.branch_tests(bw_stmt, stmt) if bw_stmt is not None else None
        if not tests:
            return None
        indent = model.module.default_indent
        body = "".join(f"{indent}{c}\n" for c in (f"{scaler}.step({opt})", *then))
        code = f"{guarded(model, tests, '')[:-len(indent)].rstrip()}\n{body}else:\n{indent}{model.code(stmt.body[0])}"
        new = statement(model.module, code)
        # the plain step itself (its comment with it) goes to the `else:`
        assert isinstance(new, cst.If) and isinstance(new.orelse, cst.Else)
        new = new.with_changes(orelse=new.orelse.with_changes(body=new.orelse.body.with_changes(
            body=[stmt.with_changes(leading_lines=())])))
        if model.bound.insertion_problem([new], stmt) is not None:
            return None
        return Fix(replace_statement(model.module, stmt, [new]), applicability=UNSAFE,
                   description="optimizer.step() replaced by scaler.step(optimizer) under the test the scaled "
                               "backward runs under" + (" and scaler.update()" if then else ""))
