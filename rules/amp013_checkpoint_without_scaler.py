"""AMP013 checkpoint-without-scaler."""

from __future__ import annotations

from typing import Dict, Iterator, Optional, Tuple

import libcst as cst

from ampfix.fixes.edits import add_dict_entry, guard_test, in_block, insert_where_bound, string
from ampfix.model import AmpModel, method_call
from ampfix.model.checkpoints import SavedState
from ampfix.rule import UNSAFE, FileContext, Fix, Rule, Violation


class CheckpointWithoutScaler(Rule):
    code = "AMP013"
    name = "checkpoint-without-scaler"
    message = ("this resume checkpoint saves the optimizer but not the GradScaler's state: after a resume the "
               "scale restarts at 65536 and the first steps overflow and are skipped; save `scaler.state_dict()`")
    triggers = ("state_dict",)
    requires = (("GradScaler", ".scale("), ("torch.save", "torch.load", "save(", "load(", "def load_state_dict"))
    project_requires = (("save", "checkpoint", "state_dict"),)
    fixable = "unsafe"
    fix_note = ("unsafe (a `scaler` entry saved, restored when present: every save and load of the file, or none; a load "
                "only when a save holds the scaler)")
    docs = """
A GradScaler's scale adapts during training (it backs off after overflows and grows after
2000 clean steps). A checkpoint meant for resuming that stores the model and optimizer state but
not `scaler.state_dict()` loses it: after a resume the scale restarts at its initial 65536, the
next steps overflow in float16 and are skipped while it backs off again, and the growth
interval starts over. The PyTorch AMP examples save and load the scaler with the model and
optimizer. The load side that restores the optimizer but not the scaler is the same mistake (a
scaler restored by a function of the file that the resume calls counts: a trainer's
`_initialize_mixed_precision()` that builds the scaler and restores it), also when a
function of another module does the restore (`load_checkpoint(path, model, optimizer)`, reported at its call with
that restore as a related location, not fixed; silent where the call hands it a scaler or the file restores one).

Only checkpoints that hold an optimizer's state count (a weights-only
`torch.save(model.state_dict(), path)` is not a resume checkpoint), only where an enabled
GradScaler is reachable or a run that saves also steps one, and the dict may be built where `torch.save` is called or by the caller
of a `save_checkpoint(state, ...)` helper, or written whole by a function or method of another module that is handed the
optimizer (`self.model.save_checkpoint(path, optimizer, epoch)`, with `model: LanguageModel` annotated with a class of the
project; reported with that `torch.save` as a related location, not fixed). An entry may be conditional (`None if final else
optimizer.state_dict()`: the resume path still holds the optimizer's state), and the checkpoint may be
a snapshot object of a class of the file (`TrainState(model=..., optimizer=..., step=...)`, saved as
it is or as `dataclasses.asdict(state)`; reported, not fixed: the class needs a field). The fix (unsafe: it changes the checkpoint format)
adds a `"scaler"` entry, and on the load side restores it when the checkpoint has one, so older
checkpoints still load: every save and load of the file together, or none (a format saved on
one side only breaks resuming). A load is fixed only when a checkpoint of the file saves the
scaler; where the scaler is created after the restore, its restore goes after it, under the
resume's own test.

A project's optimizer wrapper that owns the GradScaler (`self._scaler.scale(loss).backward()`,
`self._scaler.step(self._optimizer)`) makes the same mistake in its own `state_dict()`, which is
what the checkpoints save of it, when that returns the optimizer's state and not the scaler's:
reported there, not fixed, unless some module of the project reads the scaler's state through the
attribute (`optim._scaler.state_dict()`), or the project is not read.
A GradScaler the file never updates (a fixed loss scale: `scale(loss)` only, nerfacc's recipe)
keeps the state it is built with, and is not asked for.
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
        saves = []  # (state, scalers): checkpoints that leave the scaler out
        for state in model.checkpoints.saved_states():
            if state.scaler_state or state.opaque or not state.optimizers:
                continue
            scalers = model.checkpoints.scalers_at(state.dict_node)
            if scalers or model.runs_with_scaler(state.save):
                saves.append((state, scalers))
        loads = []  # (optimizer restore call, scalers): resumes that leave the scaler out
        scopes = {model.scope_of(c): None for c in model.calls if method_call(c, "load_state_dict") is not None}
        for scope in scopes:
            restores = model.checkpoints.restores(scope)
            if model.checkpoints.restores_scaler(scope):
                continue
            for call in restores:
                receiver = method_call(call, "load_state_dict")
                scalers = model.checkpoints.scalers_at(call)
                if receiver is not None and model.is_optimizer(receiver) and (scalers or model.runs_with_scaler(call)):
                    loads.append((call, scalers))
        # resumes done by a function of another module: reported at its call, not fixed
        restoring = any(model.is_scaler(method_call(c, "load_state_dict")) for c in model.calls)
        helpers = [r for r in model.checkpoints.restored_through_helpers()
                   if r.optimizers and not r.scaler and not restoring
                   and not any(model.is_scaler(a.value) for a in r.call.args)
                   and (model.checkpoints.scalers_at(r.call) or model.runs_with_scaler(r.call))]
        fixes, why = self._fixes(model, saves, loads)
        for state, _ in saves:
            where = state.written_in
            note = f"the checkpoint, saved by `{where[2]}` without the scaler's state" if where else ""
            related = ((where[0], where[1], 1, note),) if where else ()
            yield Violation(state.dict_node, message=self._not_fixed(None, why.get(id(state.dict_node))),
                            fix=fixes.get(id(state.dict_node)), related=related)
        for call, _ in loads:
            yield Violation(call, message=self._not_fixed(LOAD_MESSAGE, why.get(id(call))), fix=fixes.get(id(call)))
        for w in model.checkpoints.wrapper_states():
            yield Violation(w.dict_node, message=WRAPPER_MESSAGE.format(cls=w.cls.name.value, scaler=w.scaler))
        for r in helpers:
            path, line, qual = r.written_in
            note = f"the optimizer, restored by `{qual}` without the scaler"
            yield Violation(r.call, message=self._not_fixed(LOAD_MESSAGE, f"the optimizer is restored by `{qual}` in "
                                                            "another module; restore the scaler there"),
                            related=((path, line, 1, note),) if line else ())

    def _not_fixed(self, message: Optional[str], why: Optional[str]) -> Optional[str]:
        return message if why is None else f"{message or self.message} (not fixed: {why})"

    def _fixes(self, model: AmpModel, saves, loads) -> Tuple[Dict[int, Fix], Dict[int, str]]:
        """The fixes of the file's checkpoint findings, as one group: a checkpoint that starts to
        save the scaler is restored where the file resumes, or neither changes. A resume is only
        fixed when some checkpoint of the file saves the scaler (already, or by this group)."""
        fixes: Dict[int, Fix] = {}
        why: Dict[int, str] = {}
        key = model.checkpoints.scaler_key()
        saved = key is not None or bool(saves)
        key = key or "scaler"
        if not saved:
            for call, _ in loads:
                why[id(call)] = ("no checkpoint saved in this file holds the GradScaler's state; save it "
                                 f"(`\"{key}\": scaler.state_dict()`) first, then restore it")
            return fixes, why
        edits: Dict[int, Dict] = {}
        for state, scalers in saves:
            edit, reason = self._save_edit(model, state, scalers, key)
            if edit is None:
                why[id(state.dict_node)] = reason  # type: ignore[assignment]
            else:
                edits[id(state.dict_node)] = edit
        for call, scalers in loads:
            edit, reason = self._load_edit(model, call, scalers, key)
            if edit is None:
                why[id(call)] = reason  # type: ignore[assignment]
            else:
                edits[id(call)] = edit
        if why:  # one place cannot change: none does (a checkpoint format saved here and not read back there)
            first = next(iter(why.values()))
            lines = {id(state.dict_node): model.line(state.dict_node) for state, _ in saves}
            lines.update({id(call): model.line(call) for call, _ in loads})
            blocker = next(i for i in why)
            for i in edits:
                why[i] = (f"the checkpoint saved and loaded here changes everywhere in the file or nowhere, and line "
                          f"{lines[blocker]} cannot change: {first}")
            return {}, why
        for state, _ in saves:
            fixes[id(state.dict_node)] = Fix(edits[id(state.dict_node)], applicability=UNSAFE, group="checkpoint",
                                             description="GradScaler state saved in the checkpoint")
        for call, _ in loads:
            fixes[id(call)] = Fix(edits[id(call)], applicability=UNSAFE, group="checkpoint",
                                  description="GradScaler state restored from the checkpoint when it has one")
        if len(fixes) == 1:
            only = next(iter(fixes.values()))
            only.group = None
        return fixes, why

    @staticmethod
    def _save_edit(model: AmpModel, state: SavedState, scalers: list, key: str):
        """A `"scaler": scaler.state_dict()` entry after the dict's last one, in its layout, every
        comment staying on the line it was on."""
        node = state.dict_node
        if len(scalers) != 1:
            return None, ("several GradScalers are reachable here" if scalers else "no GradScaler is reachable here")
        if isinstance(node, cst.Call) and model.checkpoints.snapshot_class(node) is not None:
            return None, (f"the checkpoint is a `{model.checkpoints.snapshot_class(node).name.value}` object; give it a field for "
                          f"`{scalers[0]}.state_dict()`")
        if state.written_in is not None:
            return None, f"the checkpoint is written by `{state.written_in[2]}` in another module; save the scaler there"
        if not isinstance(node, cst.Dict) or not node.elements or key in state.keys:
            return None, "the checkpoint is not a dict literal ampfix can extend"
        new = add_dict_entry(node, string(key, model.quote()), cst.parse_expression(f"{scalers[0]}.state_dict()"))
        return {node: new}, None

    @staticmethod
    def _load_edit(model: AmpModel, call: cst.Call, scalers: list, key: str):
        """`if "scaler" in ckpt: scaler.load_state_dict(ckpt["scaler"])` after the optimizer's
        restore, or, where the scaler is not assigned yet there, after the scaler is created
        (under the test the restore runs under); never where the scaler may be unassigned or
        None."""
        arg = call.args[0].value
        stmt = model.statement_of(call)
        if len(scalers) != 1:
            return None, ("several GradScalers are reachable here" if scalers else "no GradScaler is reachable here")
        if not isinstance(arg, cst.Subscript) or not isinstance(stmt, cst.SimpleStatementLine) \
                or not in_block(model, stmt):
            return None, "the optimizer is not restored from `checkpoint[key]` in a statement of its own"
        ckpt = model.code(arg.value)
        q = model.quote()
        scaler = scalers[0]
        has = f"{q}{key}{q} in {ckpt}"
        restore = f"{scaler}.load_state_dict({ckpt}[{q}{key}{q}])"
        indent = model.module.default_indent
        code = f"if {has}:\n{indent}{restore}"
        edit, problem, _ = insert_where_bound(model, stmt, code, after=True)
        if edit is not None:
            return edit, None
        # after the scaler is created, later in the same function, under the resume's own test
        for place in model.bound.later_assignments(scaler, stmt):
            tests = model.bound.branch_tests(stmt, place)
            if tests is None:
                continue
            moved = f"if {guard_test(model, tests)} and {has}:\n{indent}{restore}" if tests else code
            edit, _, _ = insert_where_bound(model, place, moved, after=True)
            if edit is not None:
                return edit, None
        return None, f"{problem}, so restoring the scaler there would raise"


LOAD_MESSAGE = ("the optimizer is restored from a checkpoint but the GradScaler is not: after a resume the "
                "scale restarts at 65536; restore `scaler.load_state_dict(...)` too")
WRAPPER_MESSAGE = ("this `state_dict()` of `{cls}`, what a checkpoint saves of it, holds the optimizer's state but not "
                   "that of the GradScaler it steps through (`self.{scaler}`): after a resume the scale restarts at "
                   "65536 and the first steps overflow and are skipped; add `self.{scaler}.state_dict()` (when it is "
                   "not None) and restore it in `load_state_dict`")
