"""AMP006 scaler-in-loop."""

from __future__ import annotations

from typing import Iterator, List, Optional

import libcst as cst

from ampfix.fixes.edits import hoist_before, in_block, insert_after, remove_statement, replace_statement
from ampfix.model import (AmpModel, Trace, TraceEvent, dotted, group_frame, group_loop, names_bound, reads_writes,
                          uses_only)
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
        target = _assigned(stmt, new.node)
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
        loops = [group_loop(g) for g in flagged if len(group_frame(g)) == len(new.frame)]
        if not loops or not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
            return None
        outer = loops[0]
        cur = stmt  # only loop bodies between the statement and the outer loop
        while cur is not outer:
            block = model.block_of(cur)
            loop = model.parent(block) if block is not None else None
            if not isinstance(loop, (cst.For, cst.While)) or loop.body is not block \
                    or (cur is stmt and len(block.body) < 2):
                return None
            cur = loop
        if not in_block(model, outer):
            return None
        bound = names_bound([outer])
        reads, _ = reads_writes(new.node)
        name = (dotted(_assigned(stmt, new.node)) or "").split(".")[0]
        if reads & bound or model.bound.touched_before(outer, stmt, name):
            return None
        applicability = SAFE if uses_only(new.node, reads) and not _calls_in_args(new.node) else UNSAFE
        body = list(model.block_of(outer).body)
        previous = body[body.index(outer) - 1] if body.index(outer) > 0 else None
        # the same scaler is already built right before the loop
        if isinstance(previous, cst.SimpleStatementLine) and len(previous.body) == 1 \
                and model.code(previous.body[0]) == model.code(stmt.body[0]):
            return Fix(remove_statement(model, stmt), applicability=applicability,
                       description="GradScaler construction removed from the loop (the same one is built before it)")
        return Fix(hoist_before(stmt, outer), applicability=applicability,
                   description="GradScaler construction moved before the loop")

    @staticmethod
    def _into_init(model: AmpModel, trace: Trace, new: TraceEvent, stmt, target) -> Optional[Fix]:
        """A per-step method's scaler: built in `__init__` as `self.<name>`, the method reuses it."""
        root = trace.root
        cls = model.class_of(root) if isinstance(root, cst.FunctionDef) else None
        init = model.method(cls, "__init__") if cls is not None else None
        if init is None or new.via or not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1 \
                or model.block_of(stmt) is not root.body or not isinstance(init.body, cst.IndentedBlock):
            return None
        reads, _ = reads_writes(new.node)
        if any(model.binding_scope(n, root) not in (model.module, None) for n in reads):
            return None  # reads the method's locals or parameters
        text = dotted(target) or ""
        attr = text if text.startswith("self.") else f"self.{text}"
        if "." in attr[5:] or (attr != text and (model.attribute_values(cls, attr[5:]) or model.has_unseen_bases(cls))):
            return None  # assigned already, or maybe by a base class in another module
        built = model.code(stmt.body[0].value)
        last = init.body.body[-1]
        fix = insert_after(model.module, last, [f"{attr} = {built}"])
        if attr != text:
            fix.update(replace_statement(model.module, stmt, [f"{text} = {attr}"]))
        else:
            fix.update(remove_statement(model, stmt))
        return Fix(fix, applicability=UNSAFE, description="GradScaler built once in __init__")


def _assigned(stmt, call: cst.Call):
    """The target of `x = GradScaler(...)` (also `x = GradScaler(...) if c else None`)."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    small = stmt.body[0]
    if isinstance(small, cst.Assign) and len(small.targets) == 1:
        target, value = small.targets[0].target, small.value
    elif isinstance(small, cst.AnnAssign) and small.value is not None:
        target, value = small.target, small.value
    else:
        return None
    if value is call or (isinstance(value, cst.IfExp) and call in (value.body, value.orelse)):
        return target
    return None


def _calls_in_args(call: cst.Call) -> bool:
    found = []

    class V(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            found.append(node)

    for a in call.args:
        a.visit(V())
    return bool(found)


