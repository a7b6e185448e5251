"""AMP001 backward-in-autocast."""

from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from ampfix.model import AmpModel, call_name
from ampfix.rule import FileContext, Fix, Rule, Violation

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
    fixable = "sometimes"
    docs = """
Backward ops already run in the dtype autocast chose for the matching forward ops, so the
PyTorch docs advise against running `backward()` under autocast. In eager mode built-in ops give
the same gradients either way, but custom `torch.autograd.Function`s whose `backward` lacks
`@torch.amp.custom_bwd`, and compiled autograd under `torch.compile`, run their backward in a
different precision than their forward.

The fix moves the backward call, and the statements after it, out of the `with` block. It is
safe when only backward/optimizer/scaler/scheduler/zero_grad calls move, unsafe otherwise (or
when the file defines a custom autograd Function without `custom_bwd`). No fix is offered when
the backward is nested deeper in the block, or the `with` has other context managers.

Bad:
```python
with torch.autocast("cuda", dtype=torch.float16):
    loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
scaler.step(optimizer)
```

Good:
```python
with torch.autocast("cuda", dtype=torch.float16):
    loss = loss_fn(model(x), y)
scaler.scale(loss).backward()
scaler.step(optimizer)
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        for bw in model.backward_calls:
            region = model.region_of(bw.call)
            if region is None:
                continue
            yield Violation(bw.call, fix=self._fix(model, bw.call, region.node))

    def _fix(self, model: AmpModel, call: cst.Call, region_node: cst.CSTNode) -> Optional[Fix]:
        if not isinstance(region_node, cst.With) or len(region_node.items) != 1:
            return None
        if region_node.asynchronous is not None:
            return None
        stmt = model.statement_of(call)
        body = region_node.body
        if not isinstance(body, cst.IndentedBlock) or stmt is None:
            return None
        index = next((i for i, s in enumerate(body.body) if s is stmt), None)
        if index is None or index == 0:
            return None  # nested deeper, or nothing would stay in the block
        if model.block_of(region_node) is None:
            return None
        moved = list(body.body[index:])
        kept = list(body.body[:index])
        safe = all(_is_training_call(s) for s in moved) and not model.custom_functions_without_custom_bwd()
        # LibCST renders nested blocks relative to their parent, so the moved statements
        # take the `with` statement's indentation by themselves.
        new_with = region_node.with_changes(body=body.with_changes(body=kept))
        return Fix({region_node: cst.FlattenSentinel([new_with, *moved])}, safe=safe,
                   description="backward moved out of the autocast region")


def _is_training_call(stmt: cst.BaseStatement) -> bool:
    """`loss.backward()`, `optimizer.step()`, `scaler.update()`, `opt.zero_grad()`, ... alone."""
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    for small in stmt.body:
        if not isinstance(small, cst.Expr) or not isinstance(small.value, cst.Call):
            return False
        if call_name(small.value) not in TRAINING_METHODS:
            return False
    return True
