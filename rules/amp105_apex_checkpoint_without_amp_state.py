"""AMP105 apex-checkpoint-without-amp-state."""

from __future__ import annotations

from typing import Iterator, List, Optional

import libcst as cst

from ampfix.model import AmpModel, get_arg
from ampfix.model.syntax import literal_string
from ampfix.rule import FileContext, Rule, Violation

DYNAMIC_LEVELS = ("O1", "O2")  # apex's loss_scale default for these is "dynamic"; O0 and O3: 1.0


class ApexCheckpointWithoutAmpState(Rule):
    code = "AMP105"
    name = "apex-checkpoint-without-amp-state"
    message = ("this resume checkpoint saves the optimizer but not apex amp's loss scale: `amp.initialize` here "
               "scales the loss dynamically, so after a resume the scale restarts at 65536 and the first steps "
               "overflow and are skipped; save `amp.state_dict()` and restore it with `amp.load_state_dict()` "
               "after `amp.initialize`")
    triggers = ("initialize",)
    requires = (("apex",), ("save", "checkpoint"))
    preview = True
    fix_note = "none (`amp.load_state_dict()` must run after `amp.initialize`, which resumes often precede)"
    docs = """
apex's `amp.initialize` with a dynamic loss scale (the default for `opt_level="O1"`, apex's
default level, and `"O2"`, or `loss_scale="dynamic"` at any level) keeps the scale and its
count of clean steps in apex's own state, not in the optimizer: `optimizer.state_dict()` does
not hold it. A checkpoint meant for resuming that saves the model and optimizer but not
`amp.state_dict()` loses it: after a resume the scale restarts at 65536 and the first steps
overflow in float16 and are skipped while it backs off again. apex's documentation saves
`amp.state_dict()` in the checkpoint and restores it with `amp.load_state_dict()` after
`amp.initialize` (the GradScaler form of this mistake is AMP013's).

Reported where the file shows the loss scale dynamic: `opt_level` absent, a literal, a name
bound to literals only, or `args.X` of a command-line option of the file whose `default=` is a
literal, and `loss_scale` absent, None or `"dynamic"`; an `enabled=` other than `True`, a
`**kwargs`, a static `loss_scale=128.0`, O0 or O3, or a level the file does not show is silent.
Only checkpoints that hold an optimizer's state count (the same resume checkpoints as AMP013:
built here, or written by a helper of another module that this file hands the optimizer), in
the function, class or module top level that calls `amp.initialize`, and only in a file that
never calls `amp.state_dict()` (saved elsewhere, perhaps to a file of its own) nor
`amp.load_state_dict()`. Not fixed: the
restore must run after `amp.initialize`, which the resume often precedes (an optimizer restored
before it).

Bad:
```python
import torch
from apex import amp

model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "ckpt.pt")
```

Good:
```python
import torch
from apex import amp

model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "amp": amp.state_dict()}, "ckpt.pt")
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        inits = [c for c in model.calls if "apex.amp.initialize" in model.qualnames(c.func)]
        owners = [_owner(model, c) for c in inits if _dynamic(model, c)]
        amp_state = ("apex.amp.state_dict", "apex.amp.load_state_dict")
        if not owners or any(q in amp_state for c in model.calls for q in model.qualnames(c.func)):
            return  # (the file saves or restores apex's state somewhere: it knows of it)
        for state in model.checkpoints.saved_states():
            if state.scaler_state or state.unknown or not state.optimizers:
                continue
            if _owner(model, state.save) in owners:
                where = state.written_in
                note = f"the checkpoint, saved by `{where[2]}` without `amp.state_dict()`" if where else ""
                yield Violation(state.dict_node, related=((where[0], where[1], 1, note),) if where else ())


def _owner(model: AmpModel, node: cst.CSTNode) -> Optional[cst.CSTNode]:
    """The class whose methods run `node`, else its function; None at module level."""
    func = model.function_of(node)
    if func is None:
        return None
    cls = model.class_of(func)
    return cls if cls is not None else func


def _literals(model: AmpModel, expr: cst.BaseExpression) -> Optional[List[object]]:
    """The literal values `expr` may hold (a string, None, a number's code); None: some are not
    known. `args.X` of a command-line option of the file: its literal default."""
    default = model.precision.option_default(expr)
    values = [default] if default is not None else model.possible_values(expr)
    out: List[object] = []
    for v in values:
        s = literal_string(v)
        if s is not None:
            out.append(s)
        elif isinstance(v, cst.Name) and v.value == "None":
            out.append(None)
        elif isinstance(v, (cst.Integer, cst.Float)):
            out.append(v.value)
        else:
            return None
    return out or None


def _dynamic(model: AmpModel, call: cst.Call) -> bool:
    """`amp.initialize(...)` scales the loss dynamically, as far as the file shows it."""
    if any(a.star for a in call.args):
        return False
    enabled = get_arg(call, 2, "enabled")
    if enabled is not None and not (isinstance(enabled.value, cst.Name) and enabled.value.value == "True"):
        return False
    scale = get_arg(call, 8, "loss_scale")
    scales = _literals(model, scale.value) if scale is not None else [None]
    if scales is None or any(s not in (None, "dynamic") for s in scales):
        return False
    if all(s == "dynamic" for s in scales):
        return True
    level = get_arg(call, 3, "opt_level")
    levels = _literals(model, level.value) if level is not None else ["O1"]
    return levels is not None and all(v in DYNAMIC_LEVELS for v in levels)
