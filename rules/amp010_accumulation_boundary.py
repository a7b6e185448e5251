"""AMP010 accumulation-boundary."""

from __future__ import annotations

from typing import Dict, Iterator, List, Optional

import libcst as cst

from ampfix.fixes.edits import move_into_block
from ampfix.model import AmpModel, Misplaced, Trace, group_loop
from ampfix.model.events import SCALER_STEP, UNSCALE
from ampfix.rule import SAFE, UNSAFE, FileContext, Fix, Rule, Violation


class AccumulationBoundary(Rule):
    code = "AMP010"
    name = "accumulation-boundary"
    message = ("`scaler.unscale_()` runs on every micro-batch, but the optimizer steps only on the accumulation "
               "boundary; unscale under the boundary, right before `scaler.step()`")
    triggers = (".scale(",)
    requires = ((".step(",), ("%", "accum", "ACCUM", "Accum", "should_step", "update_grad", "need_update", "sync_grad",
                              "boundary", "update_freq", "optimizer_step", "do_step", "grad_acc", "acc_step",
                              "len(", "last", "= 0", "-="))
    fixable = "sometimes"
    fix_note = ("safe (scaler and clip calls moved under the boundary) when next to it; unsafe when they assign, "
                "or move a clipping call while the scaler may be off")
    docs = """
With gradient accumulation the backward of every micro-batch adds its scaled gradients, and
the optimizer steps once per accumulation window: `unscale_`, `step` and `update` belong under
the same boundary test as the step (`if (i + 1) % accum == 0:`). Run on every micro-batch,
`unscale_` raises RuntimeError on the second micro-batch ("unscale_() has already been called
on this optimizer since the last update()") or, with an `update()` per micro-batch, divides
gradients that are still accumulating; `step` + `update` on every micro-batch (with `zero_grad`
only on the boundary) apply each partial sum of the gradients, so the model takes `accum`
steps per window on stale, growing gradients; an `update()` on every micro-batch while `step`
waits for the boundary raises AssertionError ("No inf checks were recorded prior to update").

Found: a boundary is an `if` inside the training iteration whose test is a modulo test, names
accumulation or a should-step flag (`accum`, `should_step`, `update_grad`, `sync_gradients`,
...), says the micro-batch is the last one (`(i + 1) == len(loader)`, `is_last_batch`) or
compares a counter that the `if` resets (`if tokens_seen >= tokens_per_step: ... tokens_seen =
0`), and that guards the optimizer's `scaler.step` or `zero_grad`, while a backward of the same
iteration runs outside it. Also found: `unscale_` inside the loop over micro-batches (the loop
that runs the backward) when the optimizer steps after that loop (reported, not fixed). A test
that guards neither (logging every N steps, evaluation on the last batch) is not a boundary.
Not found: code that already steps on the boundary (also through
helpers and wrappers called with `update_grad=...`), an inner `for micro_step in
range(accum):` loop with the step after it, `scaler.scale(loss / accum).backward()` on every
micro-batch (correct), a flush after the loop, and a GAN whose second optimizer steps every k
iterations (`if i % n_critic == 0:` around its own backward).

The fix moves the statements right before the boundary into its start (right after it: into
its end) when they sit next to it in the same block: safe when they are only scaler and
clipping calls, unsafe when they assign (a gradient norm logged later would only exist on
boundary micro-batches) or when they move a clipping call and the scaler may be off
(`enabled=use_amp`, a scaler passed in): with the scaler off nothing raises, and clipping once
per window instead of each micro-batch's partial sum trains differently. Otherwise reported.

Bad:
```python
import torch

scaler = torch.amp.GradScaler("cuda")
for i, (x, y) in enumerate(loader):
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model(x), y) / accum
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    if (i + 1) % accum == 0:
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
```

Good:
```python
import torch

scaler = torch.amp.GradScaler("cuda")
for i, (x, y) in enumerate(loader):
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model(x), y) / accum
    scaler.scale(loss).backward()
    if (i + 1) % accum == 0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        shown_at = set()
        for trace in model.traces():
            found = [m for m in model.accumulation_misplaced(trace)
                     if not model.scaler_always_disabled(m.event.event.scaler, trace.root)
                     and not model.within_one_call(m.event, m.guarded)]
            fixes = self._fixes(model, trace, found)
            for m in found:
                shown = model.anchor(m.event, m.guarded)[0]
                if id(shown) in shown_at:
                    continue
                shown_at.add(id(shown))
                yield Violation(shown, message=self._message(model, trace, m, shown), fix=fixes.get(id(m)))

    @staticmethod
    def _message(model: AmpModel, trace: Trace, m: Misplaced, shown: cst.CSTNode) -> str:
        if m.boundary == m.iteration:  # the micro-batch loop itself: the step runs after it
            loop = group_loop(m.boundary)
            which = f"the loop on line {model.line(loop)}" if isinstance(loop, cst.CSTNode) else "the loop"
            return (f"`scaler.unscale_()` runs on every micro-batch of {which} that runs the backward, but the "
                    f"optimizer steps after that loop (`scaler.step()` on line {model.line(m.guarded.node)}): the "
                    "second micro-batch raises RuntimeError (\"unscale_() has already been called on this optimizer "
                    "since the last update()\"); unscale once, after the loop, right before `scaler.step()`"
                    + model.where(m.event, shown))
        if_node = model.decision_node(trace, m.guarded, m.boundary)
        test = f"`if {model.code(if_node.test)}:` on line {model.line(if_node)}" if if_node is not None \
            else f"the boundary of line {model.line(m.guarded.node)}"
        where = model.where(m.event, shown)
        kind = m.event.kind
        if kind == UNSCALE:
            return ("`scaler.unscale_()` runs on every micro-batch, but the optimizer steps only on the accumulation "
                    f"boundary ({test}): the second micro-batch raises RuntimeError (\"unscale_() has already been "
                    "called on this optimizer since the last update()\"), or accumulating gradients are unscaled "
                    "repeatedly; unscale (and clip) under the boundary, right before `scaler.step()`" + where)
        if kind == SCALER_STEP:
            return ("`scaler.step()` runs on every micro-batch, but the gradients are zeroed only on the accumulation "
                    f"boundary ({test}): every micro-batch applies the partial sum of the window's gradients; step "
                    "(and update) under the boundary" + where)
        return ("`scaler.update()` runs on every micro-batch, but `scaler.step()` only on the accumulation boundary "
                f"({test}): on the other micro-batches it raises AssertionError (\"No inf checks were recorded prior "
                "to update\"), or moves the scale between the steps; update under the boundary, after the step" + where)

    @staticmethod
    def _fixes(model: AmpModel, trace: Trace, found: List[Misplaced]) -> Dict[int, Optional[Fix]]:
        """One fix per boundary: the misplaced statements next to it move into it."""
        out: Dict[int, Optional[Fix]] = {}
        by_boundary: Dict[object, List[Misplaced]] = {}
        for m in found:
            by_boundary.setdefault(m.boundary, []).append(m)
        for boundary, ms in by_boundary.items():
            foreign = any(model.foreign_among(m.event, m.guarded) for m in ms)
            fix = None if foreign else _move_fix(model, trace, ms)
            for m in ms:
                out[id(m)] = fix
        return out


def _move_fix(model: AmpModel, trace: Trace, ms: List[Misplaced]) -> Optional[Fix]:
    """The misplaced statements next to the boundary moved into it (`model.boundary_move`)."""
    move = model.boundary_move(trace, ms)
    if move is None:
        return None
    if_node, before, after = move
    stmts = [*before, *after]
    replacements = move_into_block(before, if_node, after)
    # a clipping call moved under the boundary clips once per window instead of each
    # micro-batch's partial sum: a change of training whenever the scaler is off (with it on,
    # the original raised at the second micro-batch, so nothing that ran changes)
    clip_moves = any(model.clips_gradients(s) for s in stmts)
    safe = all(model.only_scaler_or_clip(s) for s in stmts) and (
        not clip_moves or all(model.scaler_always_enabled(m.event.event.scaler, trace.root) for m in ms))
    return Fix(replacements, applicability=SAFE if safe else UNSAFE,
               description="scaler calls moved under the accumulation boundary")
