"""AMP013 checkpoint-without-scaler."""

from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from ampfix.fixes.edits import comma, in_block, insert_after, string
from ampfix.model import AmpModel, method_call
from ampfix.model.checkpoints import SavedState
from ampfix.rule import UNSAFE, FileContext, Fix, Rule, Violation


class CheckpointWithoutScaler(Rule):
    code = "AMP013"
    name = "checkpoint-without-scaler"
    message = ("this resume checkpoint saves the optimizer but not the GradScaler's state: after a resume the "
               "scale restarts at 65536 and the first steps overflow and are skipped; save `scaler.state_dict()`")
    triggers = ("state_dict",)
    requires = (("GradScaler", ".scale("), ("torch.save", "torch.load", "save(", "load("))
    project_requires = (("save", "checkpoint", "state_dict"),)
    fixable = "unsafe"
    fix_note = "unsafe (a `scaler` entry saved, restored when present)"
    docs = """
A GradScaler's scale adapts during training (it backs off after overflows and grows after
2000 clean steps). A checkpoint meant for resuming that stores the model and optimizer state but
not `scaler.state_dict()` loses it: after a resume the scale restarts at its initial 65536, the
next steps overflow in float16 and are skipped while it backs off again, and the growth
interval starts over. The PyTorch AMP examples save and load the scaler with the model and
optimizer. The load side that restores the optimizer but not the scaler is the same mistake.

Only checkpoints that hold an optimizer's state count (a weights-only
`torch.save(model.state_dict(), path)` is not a resume checkpoint), only where an enabled
GradScaler is reachable or a run that saves also steps one, and the dict may be built where `torch.save` is called or by the caller
of a `save_checkpoint(state, ...)` helper. The fix (unsafe: it changes the checkpoint format)
adds a `"scaler"` entry, and on the load side restores it when the checkpoint has one, so older
checkpoints still load.

With bfloat16 the mistake rarely shows (its gradients hardly ever overflow, so the scale hardly
matters); with float16 a resume shows as skipped steps.

Bad:
```python
import torch

scaler = torch.amp.GradScaler("cuda")
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "ckpt.pt")
```

Good:
```python
import torch

scaler = torch.amp.GradScaler("cuda")
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict()}, "ckpt.pt")
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        for state in model.saved_states():
            if state.scaler_state or state.opaque or not state.optimizers:
                continue
            scalers = model.scalers_at(state.dict_node)
            if scalers or model.runs_with_scaler(state.save):
                yield Violation(state.dict_node, fix=self._save_fix(model, state, scalers))
        scopes = {model.scope_of(c): None for c in model.calls if method_call(c, "load_state_dict") is not None}
        for scope in scopes:
            restores = model.restores(scope)
            if any(model.is_scaler(method_call(c, "load_state_dict")) for c in restores):
                continue
            for call in restores:
                receiver = method_call(call, "load_state_dict")
                scalers = model.scalers_at(call)
                if receiver is not None and model.is_optimizer(receiver) and (scalers or model.runs_with_scaler(call)):
                    yield Violation(call, message=(
                        "the optimizer is restored from a checkpoint but the GradScaler is not: after a resume the "
                        "scale restarts at 65536; restore `scaler.load_state_dict(...)` too"),
                        fix=self._load_fix(model, call, scalers))

    @staticmethod
    def _save_fix(model: AmpModel, state: SavedState, scalers: list) -> Optional[Fix]:
        node = state.dict_node
        if len(scalers) != 1 or not isinstance(node, cst.Dict) or "scaler" in state.keys:
            return None
        last = node.elements[-1]
        entry = cst.DictElement(key=string("scaler", model.quote()), comma=last.comma,
                                value=cst.parse_expression(f"{scalers[0]}.state_dict()"))
        between = node.elements[-2].comma if len(node.elements) > 1 else None  # one entry a line stays so
        elements = [*node.elements[:-1], last.with_changes(comma=between if isinstance(between, cst.Comma)
                                                           else comma()), entry]
        return Fix({node: node.with_changes(elements=elements)}, applicability=UNSAFE,
                   description="GradScaler state saved in the checkpoint")

    @staticmethod
    def _load_fix(model: AmpModel, call: cst.Call, scalers: list) -> Optional[Fix]:
        arg = call.args[0].value
        stmt = model.statement_of(call)
        if len(scalers) != 1 or not isinstance(arg, cst.Subscript) or not isinstance(stmt, cst.SimpleStatementLine) \
                or not in_block(model, stmt):
            return None
        ckpt = model.code(arg.value)
        q = model.quote()
        code = f"if {q}scaler{q} in {ckpt}:\n    {scalers[0]}.load_state_dict({ckpt}[{q}scaler{q}])"
        return Fix(insert_after(model.module, stmt, [code]), applicability=UNSAFE,
                   description="GradScaler state restored from the checkpoint when it has one")
