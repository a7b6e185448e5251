"""AMP018 autocast-joined-by-and."""

from __future__ import annotations

from typing import Iterator, List, Optional

import libcst as cst

from ampfix.model import AmpModel
from ampfix.rule import UNSAFE, FileContext, Fix, Rule, Violation


class AutocastJoinedByAnd(Rule):
    code = "AMP018"
    name = "autocast-joined-by-and"
    message = ("`with {joined}:` enters only `{entered}`: a context manager is true, so `{op}` gives {which} "
               "and {dropped} never entered{harm}; write `with {items}:`")
    triggers = ("autocast",)
    requires = ((" and ", " or "),)
    fixable = "sometimes"
    fix_note = "unsafe (the managers joined by `and`/`or` become the items of the `with`: what was dropped runs)"
    docs = """
`with A and B:` does not enter `A` and `B`. Python evaluates `A and B` first: a context manager
object is true, so the expression is `B`, and only `B` is entered (`A` is built and dropped;
`A or B` enters only `A`). Written with an autocast (`with torch.autocast("cuda") and
torch.no_grad():`), the autocast that was meant to run the block in float16 or bfloat16 is never
entered, so the block runs in float32, or, the other way round, `no_grad()` is dropped and the
block records a graph. Nothing warns: the code runs, slower or with more memory.

Found: a `with` item that joins context managers with `and` or `or` when one of them is an
autocast (any spelling: `torch.autocast`, `torch.amp.autocast`, the deprecated
`torch.cuda.amp.autocast`, an Accelerator's or Fabric's, a partial of one). The fix makes each of
them an item of the `with` (`with A, B:`), which enters all of them, as meant; it is unsafe: what
the block computes under autocast (or with gradients off) changes.

Bad:
```python
import torch

def validate(model, batch):
    with torch.autocast("cuda") and torch.no_grad():
        return model(batch)
```

Good:
```python
import torch

def validate(model, batch):
    with torch.autocast("cuda"), torch.no_grad():
        return model(batch)
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        for node in model.nodes_of(cst.With):
            for item in node.items:
                expr = item.item
                if not isinstance(expr, cst.BooleanOperation) or item.asname is not None:
                    continue
                parts, ops = _operands(expr)
                autocasts = [p for p in parts if isinstance(p, cst.Call) and model.opens_region(p)]
                if not autocasts or len(set(ops)) != 1 or not all(isinstance(p, cst.Call) for p in parts):
                    continue  # (a test like `use_amp and autocast()` is a value, not managers joined)
                op = ops[0]
                entered = parts[-1] if op == "and" else parts[0]
                dropped = [p for p in parts if p is not entered]
                harm = (": the block runs without autocast" if entered not in autocasts else
                        f": the block runs under autocast only, without {_names(model, dropped)}")
                message = self.message.format(
                    joined=model.code(expr), entered=model.code(entered), op=op,
                    which="its last operand" if op == "and" else "its first operand",
                    dropped=_names(model, dropped) + (" is" if len(dropped) == 1 else " are"), harm=harm,
                    items=", ".join(model.code(p) for p in parts))
                yield Violation(expr, message=message, fix=self._fix(node, item, parts))

    @staticmethod
    def _fix(node: cst.With, item: cst.WithItem, parts: List[cst.BaseExpression]) -> Optional[Fix]:
        """Each joined manager an item of the `with`, in their order."""
        if node.asynchronous is not None:
            return None
        new = [cst.WithItem(item=p, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))) for p in parts]
        new[-1] = new[-1].with_changes(comma=item.comma)
        return Fix({item: cst.FlattenSentinel(new)}, applicability=UNSAFE,
                   description="the managers joined by and/or made items of the with")


def _operands(expr: cst.BaseExpression):
    """The operands of a chain of `and`/`or` (left to right) and its operators."""
    if isinstance(expr, cst.BooleanOperation) and not expr.lpar:
        left, lops = _operands(expr.left)
        right, rops = _operands(expr.right)
        op = "and" if isinstance(expr.operator, cst.And) else "or"
        return left + right, lops + [op] + rops
    return [expr], []


def _names(model: AmpModel, nodes: List[cst.BaseExpression]) -> str:
    return ", ".join(f"`{model.code(n)}`" for n in nodes)
