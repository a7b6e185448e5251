"""AMP003 clip-scaled-gradients."""

from __future__ import annotations

from typing import Dict, Iterator, Optional, Tuple

import libcst as cst

from ampfix.fixes.edits import in_block, insert_where_bound
from ampfix.model import AmpModel, TraceEvent
from ampfix.model.events import EXIT, Event, GRAD_READ, SCALER_STEP, UNSCALE, UPDATE, ZERO_GRAD
from ampfix.rule import SAFE, FileContext, Fix, Rule, Violation


GRAD_ATTR = tuple(".grad" + c for c in " .)],:;=[}\n\t\r")


class ClipScaledGradients(Rule):
    code = "AMP003"
    name = "clip-scaled-gradients"
    message = ("gradients are clipped while still scaled by the GradScaler; "
               "call `scaler.unscale_(optimizer)` first")
    triggers = (".scale(",)
    requires = (("clip_grad", ".grad"), ("backward",))
    # `.grad` as a whole attribute (`p.grad.norm()`, `p.grad)`), not `self.grad_checkpointing` of every timm model
    project_requires = (("backward", "clip_grad", "unscale_", "scaler", "Scaler", *GRAD_ATTR),)
    fixable = "sometimes"
    fix_note = ("safe (`scaler.unscale_(opt)` before the clip; under the scaled backward's test where the scaler may be "
                "None) when the optimizer is unambiguous and every path after it updates the scaler")
    docs = """
After `scaler.scale(loss).backward()` every `.grad` is multiplied by the current scale
(e.g. 65536). Clipping then compares the norm against a threshold that is effectively 65536x
too small, so nearly every step is clipped hard and training stalls; reading `.grad` values
for a decision (a gradient-norm threshold that skips steps, a clipping coefficient computed by
hand) sees scaled values. Unscale first: `scaler.step()` knows the gradients were unscaled
already. A `.grad` value that is only printed, logged, stored or returned is not reported: it
decides nothing in training (the logged number is scaled, the training is not affected); nor
is a test of whether the gradients are finite (`torch.isfinite(p.grad)`, `g.isnan().any()`,
`torch.isfinite(p.grad.norm())`): a scaled gradient is finite exactly when the true one is. A
clip with an infinite threshold (`clip_grad_norm_(params, float("inf"))`) changes nothing and only
measures the norm: it is reported as a read is, where the norm decides something.

The check follows the step through helpers and methods (`self.clip_gradients(...)`, a loss
scaler's `__call__`), through a clipper chosen once (`self.clip_grad_fun =
build_gradient_clipper(cfg)`, a builder of another module returning `functools.partial(
nn.utils.clip_grad_norm_, max_norm=...)` or None: called where it is not None, it clips; a
callable that may be anything else, one passed in, is not known to clip), and through branches: an `unscale_` that runs only when logging is on
(`if log_grad_norm: scaler.unscale_(opt)`) does not cover a clip under `if clip > 0:`; one
under a test of the flag the scaler is built with (`GradScaler("cuda", enabled=use_amp)`, then
`if use_amp and clip > 0: scaler.unscale_(opt)`) does: where the flag is false the scaler
scales nothing. With
several optimizers, an `unscale_` for one of them is taken as enough unless the clipped
parameters are those an optimizer of the same function was built over
(`clip(model1.parameters())` with `opt1 = torch.optim.Adam(model1.parameters())`) and `opt1`
is not among those unscaled. Not reported where the training step hands the scaler to a
function of another module that rebinds it and then unscales, steps or updates it (`scaler =
scaler or self.default_scaler; scaler.unscale_(opt)`): whether it unscales this scaler is unknown.

The fix inserts `scaler.unscale_(optimizer)` before the clip (or the call that leads to it)
when the optimizer that the scaler steps next (or that owns the clipped parameters) is
unambiguous and no `unscale_` runs on some other path in between. It is not offered when some
path from there leaves the step without `scaler.update()` (a helper that returns early to skip
a step: the next `unscale_` would raise RuntimeError). Where the scaler may be None at the clip
(`self.scaler = GradScaler() if amp else None`) the `unscale_` goes under the test the scaled
backward runs under (`if self.scaler is not None:`), or is not offered.

Bad:
```python
import torch

scaler = torch.amp.GradScaler("cuda")
scaler.scale(loss).backward()
torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
scaler.step(optimizer)
scaler.update()
```

Good:
```python
import torch

scaler = torch.amp.GradScaler("cuda")
scaler.scale(loss).backward()
scaler.unscale_(optimizer)
torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
scaler.step(optimizer)
scaler.update()
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        for trace in model.traces():
            shared: Dict[int, Tuple[Optional[Fix], Optional[str]]] = {}  # one unscale_ serves every read after the same backward
            for read in trace.of(GRAD_READ):
                if (read.event.detail == "read" or model.dataflow.measures_only(read.node)) \
                        and not self._decides(model, read.node):
                    continue  # `.grad` read (or its norm measured) to be printed or logged: no training decision sees it
                bw = model.scaled_backward_before(trace, read)
                if bw is None:
                    continue
                scaler = bw.scaler
                if model.updates.touched_unseen(trace, scaler):
                    continue  # a wrapper of another module may unscale it (`scaler = scaler or default`)
                steps = [s for s in trace.after(read, SCALER_STEP) if s.scaler == scaler
                         and model.may_precede(trace, read, s)]
                if not steps:
                    continue
                local_owner = model.optimizer_over(read.node) if read.event.detail == "clip" else None
                owner = model.root_key(read, local_owner)

                def covers(e: TraceEvent) -> bool:
                    if e.kind == ZERO_GRAD or (e.kind == SCALER_STEP and e.scaler == scaler):
                        return True
                    return e.kind == UNSCALE and e.scaler == scaler and (owner is None or e.target in (owner, None))

                if not model.path_without(trace, bw, read, covers, acting=scaler) \
                        or model.within_one_call(bw, read, *steps):
                    continue  # (`if scaler: scaler.unscale_(opt)` after `scaler.scale(loss)` runs: it is not None)
                shown = model.anchor(bw, read)[1]
                unscales = [u for u in trace.between(bw, read, UNSCALE) if u.scaler == scaler]
                partial = [u for u in unscales if covers(u)]  # they run on some paths only
                later = [u for u in trace.after(read, UNSCALE) if covers(u)]
                fix, why = None, None
                if not partial and not later:
                    if id(bw.node) not in shared:
                        shared[id(bw.node)] = self._fix(model, trace, shown, bw, read, local_owner, steps)
                    fix, why = shared[id(bw.node)]
                message = self._message(model, read, shown, local_owner, owner, unscales, later, steps, fix)
                if why is not None:
                    message = f"{message or self.message} (not fixed: {why})"
                yield Violation(shown, message=message, fix=fix)

    def _decides(self, model: AmpModel, node: cst.CSTNode) -> bool:
        memo = self.__dict__.setdefault("_decides_memo", {})
        if id(node) not in memo:
            memo[id(node)] = model.dataflow.feeds_decision(node)
        return memo[id(node)]

    @staticmethod
    def _message(model: AmpModel, read: TraceEvent, shown: cst.CSTNode, local_owner: Optional[str],
                 owner: Optional[str], unscales: list, later: list, steps: list, fix: Optional[Fix]) -> Optional[str]:
        what = "clipped" if read.event.detail == "clip" else "read"
        if later and not unscales:
            u = later[0]
            call = model.code(u.node) if u.via == read.via else "`unscale_`"
            call = f"`{call}`" if not call.startswith("`") else call
            return (f"gradients are {what} while still scaled: {call} on line {model.line(u.node)} runs after this; "
                    "call it before" + model.where(read, shown))
        targets = sorted({s.event.target for s in steps if s.event.target})
        if fix is None and not unscales and owner is None and len(targets) > 1:
            names = ", ".join(f"`{t}`" for t in targets)
            return (f"gradients are {what} while still scaled by the GradScaler; call `scaler.unscale_(...)` first for "
                    f"the optimizer of these parameters (not fixed: the scaler steps {names}, which one owns them is "
                    "not known)" + model.where(read, shown))
        if unscales and owner is not None and all(u.target not in (owner, None) for u in unscales):
            owner = local_owner
            return (f"gradients of `{owner}`'s parameters are clipped while still scaled: `unscale_` was called for "
                    f"other optimizers only; call `unscale_({owner})` first" + model.where(read, shown))
        if unscales:
            lines = ", ".join(str(model.line(u.node)) for u in unscales)
            return (f"gradients are {what} while still scaled on some path: the `unscale_` on line {lines} does not run "
                    "on every path that reaches here; unscale under the same condition" + model.where(read, shown))
        if what == "read":
            return ("`.grad` is read while still scaled by the GradScaler; call `scaler.unscale_(optimizer)` first"
                    + model.where(read, shown))
        suffix = model.where(read, shown)
        return None if not suffix else ClipScaledGradients.message + suffix

    @staticmethod
    def _fix(model: AmpModel, trace, shown: cst.CSTNode, bw: TraceEvent, read: TraceEvent, owner: Optional[str],
             steps: list) -> Tuple[Optional[Fix], Optional[str]]:
        """`scaler.unscale_(opt)` before the statement that clips, written in that function's
        own names (the backward and the step run there too), and (fix, None) only when it cannot
        break the run: every path from there updates the scaler before the iteration ends (else
        the next iteration's `unscale_` raises), and the scaler is assigned and not None there
        (else the fix moves under the test the scaled backward runs under, or is not offered)."""
        frame = model.anchor(bw, read)
        if model.foreign_among(bw, read, *steps) or bw.node is not frame[0] or any(len(s.path) != len(bw.path) for s in steps):
            return None, None
        opts = {owner} if owner is not None else {s.event.target for s in steps}
        stmt = model.statement_of(shown)
        if len(opts) != 1 or None in opts or not isinstance(stmt, cst.SimpleStatementLine) or not in_block(model, stmt):
            return None, None
        (opt,) = opts
        code = f"{bw.event.scaler}.unscale_({opt})"
        what = "clipping" if read.event.detail == "clip" else "reading the gradients"
        description = f"scaler.unscale_(optimizer) inserted before {what}"
        # else under the test the scaled backward runs under (`if self.scaler is not None:`): the
        # gradients are scaled exactly when it holds
        edit, problem, tests = insert_where_bound(model, stmt, code, under=model.statement_of(bw.node))
        if edit is None:
            return None, f"{problem}: an `unscale_` there could raise"
        extra: dict = {}
        if tests:
            description += ", under the test the scaled backward runs under"
            extra = {g: br for g, br in bw.ctx.items() if g not in read.ctx}
        # every path from the new `unscale_` updates the scaler before the iteration ends
        point = TraceEvent(Event(UNSCALE, shown, scaler=bw.event.scaler, target=opt), bw.path[:-1] + (shown,),
                           read.order - 0.5, {**read.ctx, **extra}, read.region, scaler=bw.scaler, target=opt,
                           frame=read.frame, subst=read.subst)
        def updates(e: TraceEvent) -> bool:
            return e.kind == UPDATE and e.scaler == bw.scaler

        end = model.leaves_iteration_without(trace, point, model.iteration_of(trace, read), updates)
        if end is not None:
            # the exit named is one of the function that clips (not a helper's own `return`, which
            # goes back to it), reached from here without an update
            exits = [e for e in trace.of(EXIT) if e.order > point.order and e.event.detail in ("return", "continue", "break")
                     and e.frame == point.frame and model.path_avoiding(trace, point, e, updates)]
            leaving = end if end.kind == EXIT else (exits[0] if exits else None)
            how = (f"the `{leaving.event.detail}` on line {model.line(leaving.node)} leaves" if leaving is not None
                   else "a path ends the iteration")
            return None, (f"{how} without `scaler.update()` after this point, so an `unscale_` here would make the next "
                          "`unscale_` raise RuntimeError; update the scaler on that path too, then unscale")
        return Fix(edit, applicability=SAFE, description=description), None
