"""AMP013 checkpoint-without-scaler."""

from __future__ import annotations

from typing import Dict, Iterator, List, Optional, Tuple

import libcst as cst

from ampfix.fixes.checkpoints import helper_writes_checkpoint, scaler_restore, unnamed_scaler
from ampfix.fixes.edits import add_dict_entry, string
from ampfix.model import AmpModel
from ampfix.model.checkpoints import SavedState, ScalerlessRestore, ScalerlessSave
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
        saves = model.checkpoints.saves_without_scaler()
        loads = model.checkpoints.restores_without_scaler()
        # resumes done by a function of another module: reported at its call, not fixed
        helpers = model.checkpoints.helper_restores_without_scaler()
        fixes, why = self._fixes(model, saves, loads)
        for save in saves:
            state, where = save.state, save.state.written_in
            note = f"the checkpoint, saved by `{where[2]}` without the scaler's state" if where else ""
            related = ((where[0], where[1], 1, note),) if where else ()
            yield Violation(state.dict_node, message=self._not_fixed(None, why.get(id(state.dict_node))),
                            fix=fixes.get(id(state.dict_node)), related=related)
        for load in loads:
            call = load.call
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

    def _fixes(self, model: AmpModel, saves: List[ScalerlessSave],
               loads: List[ScalerlessRestore]) -> Tuple[Dict[int, Fix], Dict[int, str]]:
        """The fixes of the file's checkpoint findings, as one group: a checkpoint that starts to
        save the scaler is restored where the file resumes, or neither changes. A resume is only
        fixed when some checkpoint of the file saves the scaler (already, or by this group)."""
        fixes: Dict[int, Fix] = {}
        why: Dict[int, str] = {}
        key = model.checkpoints.scaler_key()
        saved = key is not None or bool(saves)
        key = key or "scaler"
        if not saved:
            alone = model.checkpoints.scaler_saved_alone()
            for load in loads:
                why[id(load.call)] = (f"the GradScaler's state is saved to a file of its own (line {model.line(alone)}); "
                                      "restore it from there" if alone is not None else
                                      "no checkpoint saved in this file holds the GradScaler's state; save it "
                                      f"(`\"{key}\": scaler.state_dict()`) first, then restore it")
            return fixes, why
        edits: Dict[int, Dict] = {}
        for save in saves:
            edit, reason = self._save_edit(model, save.state, save.scalers, key)
            if edit is None:
                why[id(save.state.dict_node)] = reason  # type: ignore[assignment]
            else:
                edits[id(save.state.dict_node)] = edit
        for load in loads:
            edit, reason = self._load_edit(model, load.call, load.scalers, key)
            if edit is None:
                why[id(load.call)] = reason  # type: ignore[assignment]
            else:
                edits[id(load.call)] = edit
        if why:  # one place cannot change: none does (a checkpoint format saved here and not read back there)
            first = next(iter(why.values()))
            lines = {id(s.state.dict_node): model.line(s.state.dict_node) for s in saves}
            lines.update({id(r.call): model.line(r.call) for r in loads})
            blocker = next(i for i in why)
            for i in edits:
                why[i] = (f"the checkpoint saved and loaded here changes everywhere in the file or nowhere, and line "
                          f"{lines[blocker]} cannot change: {first}")
            return {}, why
        for s in saves:
            fixes[id(s.state.dict_node)] = Fix(edits[id(s.state.dict_node)], applicability=UNSAFE, group="checkpoint",
                                               description="GradScaler state saved in the checkpoint")
        for r in loads:
            fixes[id(r.call)] = Fix(edits[id(r.call)], applicability=UNSAFE, group="checkpoint",
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
        if state.written_in is not None:
            return None, helper_writes_checkpoint(model, state.save, state.written_in[2], scalers)
        if len(scalers) != 1:
            return None, unnamed_scaler(model, node, scalers)
        if isinstance(node, cst.Call) and model.checkpoints.snapshot_class(node) is not None:
            return None, (f"the checkpoint is a `{model.checkpoints.snapshot_class(node).name.value}` object; give it a field for "
                          f"`{scalers[0]}.state_dict()`")
        if not isinstance(node, cst.Dict) or not node.elements or key in state.keys:
            return None, "the checkpoint is not a dict literal ampfix can extend"
        new = add_dict_entry(node, string(key, model.quote()), cst.parse_expression(f"{scalers[0]}.state_dict()"))
        return {node: new}, None

    @staticmethod
    def _load_edit(model: AmpModel, call: cst.Call, scalers: list, key: str):
        """The scaler restored, when the checkpoint has it, where the optimizer's is
        (`scaler_restore`)."""
        if len(scalers) != 1:
            return None, unnamed_scaler(model, call, scalers, restore=True)
        return scaler_restore(model, call, scalers[0], key)


LOAD_MESSAGE = ("the optimizer is restored from a checkpoint but the GradScaler is not: after a resume the "
                "scale restarts at 65536; restore `scaler.load_state_dict(...)` too")
WRAPPER_MESSAGE = ("this `state_dict()` of `{cls}`, what a checkpoint saves of it, holds the optimizer's state but not "
                   "that of the GradScaler it steps through (`self.{scaler}`): after a resume the scale restarts at "
                   "65536 and the first steps overflow and are skipped; add `self.{scaler}.state_dict()` (when it is "
                   "not None) and restore it in `load_state_dict`")
