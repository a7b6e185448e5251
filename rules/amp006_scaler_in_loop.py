"""AMP006 scaler-in-loop."""

from __future__ import annotations

from typing import Iterator, List, Optional

import libcst as cst

from ampfix.fixes.edits import build_in_init, hoist_or_drop
from ampfix.model import AmpModel, Trace, TraceEvent, dotted, group_frame, group_loop, reads_writes, uses_only
from ampfix.model.construction import assigned_target, calls_in_args, hoist_site, init_home
from ampfix.model.events import OPT_NEW, SCALER_NEW, SCALER_STEP, UNSCALE, UPDATE
from ampfix.rule import SAFE, UNSAFE, FileContext, Fix, Rule, Violation


class ScalerInLoop(Rule):
    code = "AMP006"
    name = "scaler-in-loop"
    message = ("a GradScaler is built inside the training loop: it forgets its scale every iteration (starts "
               "again at 65536); build it once before the loop")
    triggers = ("GradScaler",)
    requires = ((".step(", ".update("),)
    fixable = "sometimes"
    fix_note = "safe (built before the loop) when its arguments read nothing the loop binds; per-step method: unsafe (`__init__`)"
    docs = """
A GradScaler learns its scale over the run: it starts at 65536, halves after every step whose
fp16 gradients overflow (skipping that step) and doubles after 2000 clean steps. Built anew in
every iteration, it starts at 65536 every time: with fp16 gradients that overflow at that
scale every step is skipped and the model never trains; otherwise the scale never adapts. The
PyTorch docs: one scaler per convergence run, built before the loop.

Found: a GradScaler built in the loop body (or in a helper the loop calls each epoch or
iteration) that is then stepped or updated in the same iteration, and a scaler built in a
function whose name says it runs once per step or epoch (`optimize_parameters(self,
current_iter)`, `train_one_epoch`) and not called in the file. Not found: a scaler built once
per run (in `main()`, in a function called once, in `__init__`, in a function that runs the
epochs itself whatever its parameters say: `train(self, ..., epoch=0)` with its loop over epochs),
lazily (`if self.scaler is None:`), in a loop that also builds the optimizer (a loop over folds,
trials or runs: each is a new run), or disabled (`enabled=False`: a no-op whatever its age).

With bfloat16 the mistake rarely shows (bfloat16 has float32's range: its gradients hardly
ever overflow, so the scale hardly matters); with float16 it does, on CUDA and on the CPU alike.

The fix moves the construction before the loop (safe when its arguments read nothing the loop
binds and call nothing; unsafe when they call something); a per-step method's scaler moves into
`__init__` (unsafe). No fix when the scaler is built in a helper the loop calls.

Bad:
```python
import torch

for x, y in loader:
    scaler = torch.amp.GradScaler("cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
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
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        done = set()
        for trace in model.traces():
            for new in trace.of(SCALER_NEW):
                if id(new.node) not in done:
                    v = self._judge(model, trace, new)
                    if v is not None:
                        done.add(id(new.node))
                        yield v

    def _judge(self, model: AmpModel, trace: Trace, new: TraceEvent) -> Optional[Violation]:
        stmt = model.statement_of(new.node)
        target = assigned_target(stmt, new.node)
        local_key = dotted(target)
        if local_key is None or model.built_disabled(new.node) or model.guarded_by_test_of(new.node, local_key):
            return None
        key = model.root_key(new, local_key)
        uses = [e for e in trace.after(new, SCALER_STEP, UPDATE, UNSCALE) if e.scaler == key
                and model.may_precede(trace, new, e)]
        if not uses:
            return None
        opt_news = trace.of(OPT_NEW)
        flagged = [g for g in new.loops() if any(g in u.ctx for u in uses)
                   and not any(g in n.ctx and not model.exclusive(n, new) for n in opt_news)]
        if flagged:
            return self._in_loop(model, trace, new, stmt, flagged)
        if new.loops():
            return None  # built once per fold/trial/run
        kind = model.per_step_name(trace.root)
        if kind is None or (kind == "step" and any(u.loops() for u in uses)) or \
                any(model.iterates_epochs(group_loop(g)) for u in uses for g in u.loops()):
            return None  # a step function that loops, or a function that runs the epochs itself
        name = trace.root.name.value  # type: ignore[attr-defined]
        message = (f"`{name}` builds a new GradScaler on every call, and it runs once per {kind}: the scale starts "
                   "again at 65536 each time; build the scaler once (in `__init__`, or before the loop) and reuse it")
        return Violation(new.node, message=message, fix=self._into_init(model, trace, new, stmt, target))

    def _in_loop(self, model: AmpModel, trace: Trace, new: TraceEvent, stmt, flagged: List) -> Violation:
        inner = flagged[-1]
        frame, loop = group_frame(inner), group_loop(inner)
        if len(frame) == len(new.frame):
            message = (f"a GradScaler is built in every iteration of the loop on line {model.line(loop)}: it forgets "
                       "its scale each time (starts again at 65536); build it once before the loop")
            return Violation(new.node, message=message, fix=self._hoist(model, new, stmt, flagged))
        call = new.path[len(frame)]
        what = model.code(call.func) if isinstance(call, cst.Call) else model.code(call)
        message = (f"a new GradScaler is built each time `{what}(...)` runs, and the loop on line {model.line(loop)} "
                   f"calls it every iteration (line {model.line(call)}): the scale starts again at 65536 each time; "
                   "build the scaler once before the loop and pass it in")
        return Violation(new.node, message=message)

    @staticmethod
    def _hoist(model: AmpModel, new: TraceEvent, stmt, flagged: List) -> Optional[Fix]:
        """Move the construction before the outermost flagged loop of its own function."""
        outer = hoist_site(model, new, stmt, flagged)
        if outer is None:
            return None
        reads, _ = reads_writes(new.node)
        applicability = SAFE if uses_only(new.node, reads) and not calls_in_args(new.node) else UNSAFE
        edit, removed = hoist_or_drop(model, stmt, outer)
        description = ("GradScaler construction removed from the loop (the same one is built before it)" if removed
                       else "GradScaler construction moved before the loop")
        return Fix(edit, applicability=applicability, description=description)

    @staticmethod
    def _into_init(model: AmpModel, trace: Trace, new: TraceEvent, stmt, target) -> Optional[Fix]:
        """A per-step method's scaler: built in `__init__` as `self.<name>`, the method reuses it."""
        home = init_home(model, trace, new, stmt, target)
        if home is None:
            return None
        return Fix(build_in_init(model, stmt, *home), applicability=UNSAFE,
                   description="GradScaler built once in __init__")
