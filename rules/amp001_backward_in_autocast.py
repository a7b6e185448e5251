"""AMP001 backward-in-autocast."""

from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from ampfix.model import AmpModel, call_name
from ampfix.model.events import BACKWARD
from ampfix.rule import SAFE, UNSAFE, FileContext, Fix, Rule, Violation

# Statements that may leave the autocast block with no change in meaning.
TRAINING_METHODS = {"backward", "step", "zero_grad", "update", "unscale_"}


class BackwardInAutocast(Rule):
    code = "AMP001"
    name = "backward-in-autocast"
    message = (
        "`backward()` runs inside an autocast region; leave the `with` block first "
        "(custom autograd Functions without custom_bwd and compiled autograd see other dtypes)"
    )
    triggers = ("autocast",)
    requires = (("backward",),)
    project_requires = (("with",), ("autocast", ".backward("))
    fixable = "sometimes"
    fix_note = "safe when only backward/step/zero_grad/scaler calls move, else unsafe"
    docs = """
Backward ops already run in the dtype autocast chose for the matching forward ops, so the
PyTorch docs advise against running `backward()` under autocast. In eager mode built-in ops give
the same gradients either way, but custom `torch.autograd.Function`s whose `backward` lacks
`@torch.amp.custom_bwd`, and compiled autograd under `torch.compile`, run their backward in a
different precision than their forward.

The region may be opened anywhere the file shows: `with torch.autocast(...)`, a context bound to
a name or module global (`ctx = nullcontext() if cpu else torch.autocast(...)`), a trainer's
`self.amp_autocast = partial(torch.autocast, ...)`, a framework's `accelerator.autocast()` or
`fabric.autocast()` on an Accelerator or Fabric the code builds (unless it runs no mixed
precision); and the backward may run in a helper or closure called inside the region (reported
at that call).

The fix moves the backward call, and the statements after it, out of the `with` block. It is
safe when only backward/optimizer/scaler/scheduler/zero_grad calls move, unsafe otherwise (or
when the file defines a custom autograd Function without `custom_bwd`). No fix is offered when
the backward is nested deeper in the block or runs in a helper, or the `with` has other context
managers.

Bad:
```python
import torch

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
            for bw in trace.of(BACKWARD):
                if bw.region is None:
                    continue
                shown = model.shown_in_region(bw)
                if shown is bw.node:
                    yield Violation(bw.node, message=self._shared_with(model, bw.region.node),
                                    fix=self._fix(model, bw.node, bw.region.node))
                else:
                    yield Violation(shown, message=(
                        f"`{model.code(shown.func) if isinstance(shown, cst.Call) else model.code(shown)}()` runs "
                        f"`backward()` (line {model.line(bw.node)}) inside this autocast region; call it after the "
                        "`with` block, or leave the region inside it before `backward()`"))

    def _shared_with(self, model: AmpModel, region_node: cst.CSTNode) -> Optional[str]:
        """The message when the region's `with` also enters other context managers (DDP's
        `no_sync()`, a profiler), which `backward()` may need to stay inside: only the autocast
        is to be left. None: the rule's own message."""
        if not isinstance(region_node, cst.With) or len(region_node.items) < 2:
            return None
        others = model.items_outside_region(region_node)
        if not others or len(others) == len(region_node.items):
            return None
        shown = ", ".join(f"`{model.code(i.item)}`" for i in others)
        return (f"`backward()` runs inside an autocast region; the `with` on line {model.line(region_node)} also enters "
                f"{shown}: give the autocast a `with` of its own around the forward pass and call `backward()` after "
                "it (custom autograd Functions without custom_bwd and compiled autograd see other dtypes)")

    def _fix(self, model: AmpModel, call: cst.Call, region_node: cst.CSTNode) -> Optional[Fix]:
        if not isinstance(region_node, cst.With) or len(region_node.items) != 1 or region_node.asynchronous:
            return None
        stmt = model.statement_of(call)
        body = region_node.body
        if not isinstance(body, cst.IndentedBlock) or stmt is None or model.block_of(region_node) is None:
            return None
        index = next((i for i, s in enumerate(body.body) if s is stmt), None)
        if index is None or index == 0:
            return None  # nested deeper, or nothing would stay in the block
        moved, kept = list(body.body[index:]), list(body.body[:index])
        safe = all(_is_training_call(s) for s in moved) and not model.autograd.functions_without_custom_bwd()
        # LibCST renders nested blocks relative to their parent, so the moved statements
        # take the `with` statement's indentation by themselves.
        new_with = region_node.with_changes(body=body.with_changes(body=kept))
        return Fix({region_node: cst.FlattenSentinel([new_with, *moved])}, applicability=SAFE if safe else UNSAFE,
                   description="backward moved out of the autocast region")


def _is_training_call(stmt: cst.BaseStatement) -> bool:
    """`loss.backward()`, `optimizer.step()`, `scaler.update()`, `opt.zero_grad()`, ... alone."""
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    return all(isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)
               and call_name(small.value) in TRAINING_METHODS for small in stmt.body)
