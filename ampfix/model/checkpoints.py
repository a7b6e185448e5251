"""Checkpoints: what a `torch.save` stores and what a resume restores.

`saved_states` finds the dicts a `torch.save` writes (written at the call, bound to a name, or
built by the caller of a `save_checkpoint(state, ...)` helper) and classifies their entries by
the object whose `state_dict()` they hold: model, optimizer, GradScaler, or other.
`restores` finds the `X.load_state_dict(...)` calls of a function that restore from a
`torch.load` result. `scalers_at` names the GradScalers code at a place can reach.
`wrapper_states` finds the optimizer wrappers whose own `state_dict()` leaves out their scaler.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, List, Optional, Tuple

import libcst as cst

from ampfix.model.facet import Facet
from ampfix.model.readwrite import binding_counts
from ampfix.model.summary import PARAM
from ampfix.model.syntax import call_name, literal_string, method_call
from ampfix.model.tree import dotted

if TYPE_CHECKING:
    from ampfix.model.foreign import ForeignFunction

SCALER_KEYS = ("scaler", "amp", "grad_scaler", "loss_scaler")
SPREAD = object()  # an entry's key: its value names a parameter whose dict is merged in (`Checkpoints._merged`)
# what may follow a scaler's name in a file where its state never changes: an assignment to it,
# or a call of a method that leaves the scale and its counters as they were
_SCALER_USE = re.compile(r"[ \t]*(?:=(?!=)|\.(\w+)[ \t]*\()")
_STATE_KEEPING = {"scale", "unscale_", "get_scale", "is_enabled", "get_growth_factor", "get_backoff_factor",
                  "get_growth_interval", "state_dict"}


@dataclass
class HelperRestore:
    """A resume done by a function of another module that the file calls."""

    call: cst.Call  # the call of the helper
    optimizers: List[cst.BaseExpression]  # the arguments it restores as optimizers
    scaler: bool  # it restores a GradScaler too
    written_in: Tuple[str, int, str]  # its path, the line of its first optimizer restore, its qualified name


@dataclass
class SavedState:
    save: cst.Call  # the torch.save call
    dict_node: cst.CSTNode  # the dict literal, dict(...) call or snapshot object it saves
    keys: List[str] = field(default_factory=list)  # literal keys
    entries: List[Tuple[str, cst.BaseExpression]] = field(default_factory=list)  # (literal key, value)
    optimizers: List[cst.CSTNode] = field(default_factory=list)  # receivers of optimizer state_dict()
    scaler_state: bool = False  # a GradScaler's state (or a key named for one) is in it
    opaque: bool = False  # a **spread, update() or key not known: it may hold anything
    # parameters of the saving function whose dicts are merged into it (`{**extra}`,
    # `ckpt.update(extra)`): what they hold is its callers' to say (here: anything)
    spread_params: List[str] = field(default_factory=list)
    # written by a function of another module (`save_checkpoint(path, optimizer, ...)`): its
    # path, the line of its `torch.save`, and its qualified name
    written_in: Optional[Tuple[str, int, str]] = None

    @property
    def unknown(self) -> bool:
        """It may hold entries this file cannot see."""
        return self.opaque or bool(self.spread_params)


@dataclass
class ScalerlessSave:
    """A resume checkpoint (it saves an optimizer's state) that leaves the GradScaler's state
    out, where code at it can reach a GradScaler or a run that saves it also steps one."""

    state: SavedState
    scalers: List[str]  # the GradScalers code at the checkpoint can reach (`scalers_at`)


@dataclass
class ScalerlessRestore:
    """An optimizer restored from a `torch.load` result by a function that restores no
    GradScaler, where code at the restore can reach a GradScaler or a run that reaches it
    steps one."""

    call: cst.Call  # the optimizer's `load_state_dict(...)`
    scalers: List[str]  # the GradScalers code at the restore can reach (`scalers_at`)


@dataclass
class WrapperState:
    """A class that steps an optimizer through a GradScaler it holds (`self._scaler.step(
    self._optimizer)`), and whose `state_dict()`, the state a checkpoint saves of it, holds the
    optimizer's state and not the scaler's."""

    dict_node: cst.Dict  # the dict its `state_dict()` returns
    cls: cst.ClassDef
    scaler: str  # the attribute that holds the scaler (`_scaler`)
    optimizer: str  # the attribute that holds the optimizer (`_optimizer`)


def _scalar(value: cst.BaseExpression) -> bool:
    """A number or string, never an object's state: a literal, `float(...)`, `int(...)`,
    `str(...)`, `bool(...)`, `round(...)`, `x.item()`."""
    if isinstance(value, (cst.Integer, cst.Float, cst.SimpleString, cst.FormattedString)):
        return True
    if isinstance(value, cst.Call):
        if isinstance(value.func, cst.Name) and value.func.value in ("float", "int", "str", "bool", "round"):
            return True
        return method_call(value, "item") is not None and not value.args
    return False


def _argument(bound: dict, receiver: str) -> Optional[cst.BaseExpression]:
    """The argument bound to the parameter that a summary's canonical text names
    (`__param__.optimizer`), if any."""
    prefix = PARAM + "."
    return bound.get(receiver[len(prefix):]) if receiver.startswith(prefix) else None


class Checkpoints(Facet):
    """Checkpoint contents: what is saved, what a resume restores (`model.checkpoints`)."""

    def saved_states(self) -> List[SavedState]:
        """What the file's checkpoints save (`torch.save` of a dict, here or through a helper of
        another module). Memoised: a module's summary asks once per function (`saves`), AMP013
        twice, and the answer depends on the model alone."""
        found = self.__dict__.get("_saved")
        if found is None:
            found = self.__dict__["_saved"] = self._saved_states()
        return list(found)

    def _saved_states(self) -> List[SavedState]:
        out = []
        for call in self.model.calls:
            if not self.model.is_api(call, "save") or not call.args or call.args[0].keyword is not None:
                continue
            for v in self.model.possible_values(call.args[0].value):
                state = self._state_of(call, v)
                if state is not None:
                    out.append(state)
        if self.model.foreign is not None:
            out.extend(self._saved_through_helpers())
        return out

    def handed_dicts(self, func: cst.FunctionDef) -> Iterator[Tuple[cst.Call, object, SavedState]]:
        """(call, the parameter's name or position, the dict) for each dict `func` builds and
        hands to a call whose name holds "save" or "checkpoint" (not `torch.save` itself),
        where the dict holds an optimizer's or a GradScaler's state or merges in a parameter:
        what a save helper of another module then writes (`save_model(path, extra=ckpt)`)."""
        for call in self.model._nodes_in_scope(func, cst.Call):
            name = (call_name(call) or "").lower()
            if not ("save" in name or "checkpoint" in name) or self.model.is_api(call, "save"):
                continue
            for i, arg in enumerate(call.args):
                if arg.star:
                    if arg.keyword is None and arg.star == "*":
                        break  # (the positions after it are not known)
                    continue
                values = self.model.possible_values(arg.value)
                state = self._state_of(call, values[0]) if len(values) == 1 else None
                node = state.dict_node if state is not None else None
                if not (isinstance(node, cst.Dict)
                        or isinstance(node, cst.Call) and self.model._is_builtin(node.func, "dict")):
                    continue
                if state.optimizers or state.scaler_state or state.spread_params:
                    yield call, (arg.keyword.value if arg.keyword is not None else i), state

    def _saved_through_helpers(self) -> List[SavedState]:
        """Checkpoints written by a function of another module that this file calls: the dict
        it is handed (built here), or what it saves of the objects it is handed (its summary):
        the state is the call's (`dict_node` is the call)."""
        out: List[SavedState] = []
        for call, ff, bound in self._helper_calls(("save", "checkpoint"), "saves"):
            for s in ff.summary.saves:
                if "via" in s:
                    state = self._forwarded(call, ff, bound, s)
                    if state is not None:
                        out.append(state)
                    continue
                param = s.get("param")
                if isinstance(param, str):
                    arg = bound.get(param)
                    for v in self.model.possible_values(arg) if arg is not None else []:
                        state = self._state_of(call, v)
                        if state is not None:
                            out.append(state)
                    continue
                line = s.get("line")
                state = SavedState(call, call, keys=[k for k in s.get("keys", []) if isinstance(k, str)],
                                   scaler_state=bool(s.get("scaler_state")), opaque=bool(s.get("opaque")),
                                   written_in=(ff.path, line, ff.qual) if isinstance(line, int) and line > 0 else None)
                self._add_summary_entries(state, call, bound, s)
                out.append(state)
        return out

    def _add_summary_entries(self, state: SavedState, call: cst.Call, bound: dict, s: dict) -> None:
        """What a summary's saved dict `s` (`Summarizer.saves`) holds, for the call `call` of this
        file whose arguments `bound` are: a GradScaler's or an optimizer's state (its receiver a
        parameter: the argument), and the dicts the call hands to the parameters merged in."""
        for key, what in (s.get("state") or {}).items():
            kind, _, receiver = str(what).partition("|")
            arg = _argument(bound, receiver)
            if arg is not None and self.model.scaler_key(arg) is not None:
                state.scaler_state = True
            elif kind == "optimizer" and (arg is None or self.model.is_optimizer(arg)):
                state.optimizers.append(arg if arg is not None else call)
        for param in s.get("spread") or ():
            arg = bound.get(param) if isinstance(param, str) else None
            self._add_entries(state, self._merged(arg, 0) if arg is not None else [(None, None)])

    def _forwarded(self, call: cst.Call, ff: ForeignFunction, bound: dict, s: dict) -> Optional[SavedState]:
        """The checkpoint a helper of another module (`ff`, called by `call`) writes by handing a
        dict it builds to a save function (`s`: a `via` entry of its summary) that merges that
        parameter into what it saves (`spread`): the saved keys are both; None when the save
        function is not known to do so."""
        target = self.model._foreign_function_named(ff.module, str(s.get("via")))
        arg = s.get("arg")
        if target is None or not isinstance(arg, (str, int)):
            return None
        if isinstance(arg, int):
            params = [p.name for p in target.summary.params if p.kind in ("posonly", "pos")]
            if target.summary.is_method or arg >= len(params):
                return None
            arg = params[arg]
        inner = next((t for t in target.summary.saves if arg in (t.get("spread") or ())), None)
        if inner is None:
            return None
        line = s.get("line")
        state = SavedState(call, call, keys=[k for k in [*inner.get("keys", []), *s.get("keys", [])] if isinstance(k, str)],
                           scaler_state=bool(inner.get("scaler_state") or s.get("scaler_state")),
                           opaque=bool(inner.get("opaque") or s.get("opaque"))
                           or any(p != arg for p in inner.get("spread") or ()),
                           written_in=(ff.path, line, ff.qual) if isinstance(line, int) and line > 0 else None)
        if any(str(w).startswith("scaler") for w in (inner.get("state") or {}).values()):
            state.scaler_state = True
        if any(str(w).startswith("optimizer") for w in (inner.get("state") or {}).values()):
            state.optimizers.append(call)
        self._add_summary_entries(state, call, bound, s)
        return state

    def _helper_calls(self, words: Tuple[str, ...], entries: str) -> Iterator[Tuple[cst.Call, ForeignFunction, dict]]:
        """(call, callee, the call's arguments by the callee's parameters) for each call of the
        file whose name holds one of `words` (lower-cased) and that runs a function of another
        module whose summary has `entries` (its `saves` or its `loads`)."""
        for call in self.model.calls:
            name = (call_name(call) or "").lower()
            if not any(w in name for w in words):
                continue
            ff = self.model._foreign_callee(call)
            if ff is not None and getattr(ff.summary, entries):
                yield call, ff, self.model._bind_foreign_arguments(call, ff)

    def _dict_entries(self, node: cst.CSTNode, depth: int) -> Optional[list]:
        """The (key, value) entries of a dict literal or `dict(...)` call and those added to the
        name it is bound to (`_added_entries`); None: not a dict of this kind. A key None: one
        not known; a key `SPREAD`: the value is the name of a parameter merged in (`_merged`)."""
        if isinstance(node, cst.Dict):
            entries = []
            for el in node.elements:
                if isinstance(el, cst.DictElement):
                    entries.append((literal_string(el.key), el.value))
                else:
                    entries.extend(self._merged(el.value, depth))
        elif isinstance(node, cst.Call) and self.model._is_builtin(node.func, "dict"):
            entries = [(a.keyword.value if a.keyword else None, a.value if a.keyword else None) for a in node.args]
        else:
            return None
        return entries + self._added_entries(node, depth)

    def _merged(self, value: cst.BaseExpression, depth: int) -> list:
        """The entries a dict spread or merged into a checkpoint's dict adds (`{**extra}`,
        `ckpt.update(extra)`): a parameter of the function, not bound again in it, is its
        callers' to say (`SPREAD`); a dict of the file (a literal, a name bound only to dicts)
        adds its entries; anything else, an unknown entry."""
        if isinstance(value, cst.Name):
            func = self.model.function_of(value)
            if isinstance(func, cst.FunctionDef) and self.model._is_param(func, value.value) \
                    and binding_counts(func, self.__dict__.setdefault("_bindings", {})).get(value.value) is None:
                return [(SPREAD, value.value)]
        if isinstance(value, cst.DictComp) and _scalar(value.value):
            return []  # (`{k: float(v) for ...}`: whatever its keys, no object's state)
        direct = self._dict_entries(value, depth + 1)
        if direct is not None:
            return direct
        if depth < 2:
            values = self.model.possible_values(value)
            out: list = []
            for v in values:
                got = self._dict_entries(v, depth + 1) if v is not value else None
                if got is None:
                    return [(None, None)]
                out.extend(got)
            if values:
                return out
        return [(None, None)]

    def _state_of(self, save: cst.Call, node: cst.CSTNode, depth: int = 0) -> Optional[SavedState]:
        entries = self._dict_entries(node, depth)
        if entries is not None:
            pass
        elif depth < 2 and self._snapshot_source(node) is not None:
            # `dataclasses.asdict(state)`, `vars(state)`, `state.__dict__`: what `state` holds
            for v in self.model.possible_values(self._snapshot_source(node)):  # type: ignore[arg-type]
                state = self._state_of(save, v, depth + 1)
                if state is not None:
                    return state
            return None
        elif isinstance(node, cst.Call) and self.snapshot_class(node) is not None:
            entries = self._snapshot_entries(node, self.snapshot_class(node))  # type: ignore[arg-type]
            entries += self._added_entries(node, depth)
        else:
            return None
        state = SavedState(save, node)
        self._add_entries(state, entries)
        return state

    def _add_entries(self, state: SavedState, entries: list) -> None:
        """What `entries` (`_dict_entries`) say of the checkpoint: its keys, an optimizer's or
        a GradScaler's state in it, what is not known."""
        for key, value in entries:
            if key is None:
                state.opaque = True
                continue
            if key is SPREAD:
                state.spread_params.append(value)
                continue
            state.keys.append(key)
            state.entries.append((key, value))
            receivers = self.state_receivers(value) if value is not None else []
            if any(self.model.scaler_key(r) is not None for r in receivers) or key.lower() in SCALER_KEYS \
                    or "scaler" in key.lower():
                state.scaler_state = True
            else:
                state.optimizers.extend([r for r in receivers if self.model.is_optimizer(r)][:1])

    def state_receivers(self, value: cst.CSTNode) -> List[cst.BaseExpression]:
        """The objects whose `X.state_dict()` the value `value` may hold: either branch of a
        conditional expression (`None if final else opt.state_dict()`: the resume path still
        saves it), a name bound to one followed to it."""
        out = []
        for leaf in self.model.possible_values(value):
            receiver = method_call(leaf, "state_dict")
            if receiver is not None:
                out.append(receiver)
        return out

    def _snapshot_source(self, node: cst.CSTNode) -> Optional[cst.BaseExpression]:
        """`x` of `dataclasses.asdict(x)`, `vars(x)`, `x.__dict__` (an object saved as its fields)."""
        if isinstance(node, cst.Attribute) and node.attr.value == "__dict__":
            return node.value
        if isinstance(node, cst.Call) and len(node.args) == 1 and node.args[0].keyword is None \
                and not node.args[0].star and (self.model._is_builtin(node.func, "vars")
                                                or "dataclasses.asdict" in self.model.qualnames(node.func)):
            return node.args[0].value
        return None

    def snapshot_class(self, call: cst.Call) -> Optional[cst.ClassDef]:
        """The class of this file whose instance `call` builds, when the call is what a
        `torch.save` writes (a training-state snapshot: its fields are the checkpoint's keys)."""
        return self.model._class_named(call.func)

    def _snapshot_entries(self, call: cst.Call, cls: cst.ClassDef) -> list:
        """The (field, value) pairs a snapshot object is built with: keyword arguments, and
        positional ones mapped to a dataclass's fields in order (else unknown: opaque)."""
        fields = [s.body[0].target.value for s in cls.body.body
                  if isinstance(s, cst.SimpleStatementLine) and isinstance(s.body[0], cst.AnnAssign)
                  and isinstance(s.body[0].target, cst.Name)]
        dataclass = any("dataclass" in (dotted(d.decorator.func if isinstance(d.decorator, cst.Call)
                                               else d.decorator) or "") for d in cls.decorators)
        out = []
        for i, a in enumerate(call.args):
            if a.star:
                out.append((None, None))
            elif a.keyword is not None:
                out.append((a.keyword.value, a.value))
            elif dataclass and i < len(fields):
                out.append((fields[i], a.value))
            else:
                out.append((None, None))
        return out

    def _added_entries(self, node: cst.CSTNode, depth: int = 0) -> list:
        """Entries added to the dict after it is built, on the name it is bound to (in the same
        scope): `ckpt["scaler"] = ...`, `ckpt.update(extra)` (what `_merged` reads of `extra`);
        `ckpt[k] = ...`, `ckpt.setdefault(...)` or another `update` make it opaque."""
        parent = self.model.parent(node)
        if not isinstance(parent, cst.Assign) or len(parent.targets) != 1:
            return []
        name = dotted(parent.targets[0].target)
        scope = self.model.scope_of(parent)
        out = []
        for assign, target, value in self.model._index.assignments:
            if isinstance(target, cst.Subscript) and dotted(target.value) == name and self.model.scope_of(assign) is scope:
                index = target.slice[0].slice if len(target.slice) == 1 else None
                key = literal_string(index.value) if isinstance(index, cst.Index) else None
                out.append((key, value))
        for call in self.model.calls_in_scope(scope):
            if method_call(call, "update", "setdefault") is None or dotted(call.func.value) != name:  # type: ignore[attr-defined]
                continue
            if call.func.attr.value == "update" and len(call.args) == 1 and not call.args[0].star \
                    and call.args[0].keyword is None:  # type: ignore[attr-defined]
                out.extend(self._merged(call.args[0].value, depth))
            else:
                out.append((None, None))
        return out

    def restores(self, scope: cst.CSTNode) -> List[cst.Call]:
        """`X.load_state_dict(...)` calls in `scope` whose argument comes from a `torch.load`."""
        out = []
        for call in self.model.calls_in_scope(scope):
            if method_call(call, "load_state_dict") is None or not call.args:
                continue
            arg = call.args[0].value
            while isinstance(arg, cst.Subscript):
                arg = arg.value
            if isinstance(arg, cst.Call) and method_call(arg, "get") is not None:
                arg = arg.func.value
            if any(isinstance(v, cst.Call) and self.model.is_api(v, "load") for v in self.model.possible_values(arg)):
                out.append(call)
        return out

    def restores_scaler(self, scope: cst.CSTNode, depth: int = 3) -> bool:
        """`scope` restores a GradScaler (`scaler.load_state_dict(...)`), itself or in a function of
        this file it calls, `depth` calls deep (super-gradients' `train()` restores the optimizer,
        then calls `self._initialize_mixed_precision(...)`, which restores the scaler from the
        same checkpoint)."""
        seen = {scope}
        todo = [(scope, 0)]
        while todo:
            at, level = todo.pop()
            for call in self.model.calls_in_scope(at):
                receiver = method_call(call, "load_state_dict")
                if receiver is not None and self.model.is_scaler(receiver):
                    return True
                if level < depth:
                    for f in self.model.callees(call):
                        if f not in seen:
                            seen.add(f)
                            todo.append((f, level + 1))
        return False

    def _run_restores_scaler(self, restore: cst.Call) -> bool:
        """A function of this file whose runs reach `restore` (one that encloses it or calls
        it, `functions_reaching`) restores a GradScaler: sockeye's `_load_optimizer_state(fname)`
        restores the optimizer alone, and the resume that calls it restores the scaler itself (its
        other caller, a mid-run reload of the best optimizer state, is no resume)."""
        own = self.model.function_of(restore)
        return any(f is not own and self.restores_scaler(f) for f in self.model.functions_reaching(restore))

    def saves_without_scaler(self) -> List[ScalerlessSave]:
        """The file's resume checkpoints (`saved_states` that hold an optimizer's state, with
        literal keys only) that leave the GradScaler's state out, where a GradScaler is
        reachable (`scalers_at`) or a run that saves also steps one (`runs_with_scaler`)."""
        out = []
        for state in self.saved_states():
            if state.scaler_state or state.unknown or not state.optimizers:
                continue
            scalers = self.scalers_at(state.dict_node)
            if scalers or self.model.runs_with_scaler(state.save):
                out.append(ScalerlessSave(state, scalers))
        return out

    def restores_without_scaler(self) -> List[ScalerlessRestore]:
        """The optimizers restored from a checkpoint (`restores`) by a function that restores
        no GradScaler, itself or through the functions it calls (`restores_scaler`), where a
        GradScaler is reachable (`scalers_at`) or a run that restores also steps one; by
        function, in the file's order."""
        m = self.model
        out = []
        scopes = {m.scope_of(c): None for c in m.calls if method_call(c, "load_state_dict") is not None}
        for scope in scopes:
            restores = self.restores(scope)
            if not restores or self.restores_scaler(scope) or self._run_restores_scaler(restores[0]):
                continue
            for call in restores:
                receiver = method_call(call, "load_state_dict")
                scalers = self.scalers_at(call)
                if receiver is not None and m.is_optimizer(receiver) and (scalers or m.runs_with_scaler(call)):
                    out.append(ScalerlessRestore(call, scalers))
        return out

    def helper_restores_without_scaler(self) -> List[HelperRestore]:
        """The resumes handed to a function of another module (`restored_through_helpers`) that
        restore an optimizer and no GradScaler, where the file restores no GradScaler itself,
        the call hands the function none, and a GradScaler is reachable at the call
        (`scalers_at`) or a run that makes it also steps one."""
        m = self.model
        restoring = any(m.is_scaler(method_call(c, "load_state_dict")) for c in m.calls)
        return [r for r in self.restored_through_helpers()
                if r.optimizers and not r.scaler and not restoring
                and not any(m.is_scaler(a.value) for a in r.call.args)
                and (self.scalers_at(r.call) or m.runs_with_scaler(r.call))]

    def restored_through_helpers(self) -> List[HelperRestore]:
        """The resumes the file hands to a function of another module (`load_checkpoint(path,
        model, optimizer)`): the arguments its summary restores as optimizers from a
        `torch.load`, and whether it restores a GradScaler too."""
        if self.model.foreign is None:
            return []
        out = []
        for call, ff, bound in self._helper_calls(("load", "resume", "restore", "checkpoint"), "loads"):
            loads = ff.summary.loads
            optimizers, lines = [], []
            for entry in loads:
                arg = _argument(bound, entry.get("receiver") or "")
                if entry.get("kind") == "optimizer" and arg is not None and self.model.is_optimizer(arg):
                    optimizers.append(arg)
                    lines.append(entry.get("line"))
            line = next((n for n in lines if isinstance(n, int) and n > 0), 0)
            out.append(HelperRestore(call, optimizers, any(e.get("kind") == "scaler" for e in loads),
                                     (ff.path, line, ff.qual)))
        return out

    def wrapper_states(self) -> List[WrapperState]:
        """The optimizer wrappers of the file whose `state_dict()` leaves out the GradScaler
        they step through (`WrapperState`): the class defines `state_dict` and
        `load_state_dict`, scales a loss and steps (or unscales) its optimizer with the scaler,
        returns a dict literal with `self.<optimizer>.state_dict()` and nothing of the scaler,
        reads neither `state_dict()` nor `load_state_dict` of the scaler, and the file builds a
        GradScaler, not built disabled, for that attribute. None where some file of the project
        reads the scaler's state through the attribute (`optim._scaler.state_dict()` beside
        `optim.state_dict()`), or where the project is not read (unknown)."""
        m = self.model
        out: List[WrapperState] = []
        if m.foreign is None:
            return out  # no project: who saves the scaler is not known
        for cls in m.classes.values():
            method = m.method(cls, "state_dict")
            if method is None or m.method(cls, "load_state_dict") is None:
                continue
            calls = [c for c in m.calls if m.is_ancestor(cls, c) and isinstance(c.func, cst.Attribute)]
            receivers = {(dotted(c.func.value), c.func.attr.value) for c in calls}
            for c in calls:
                s_key, o_key = dotted(c.func.value), dotted(c.args[0].value) if len(c.args) == 1 else None
                if c.func.attr.value not in ("step", "unscale_") or not s_key or not o_key \
                        or not s_key.startswith("self.") or not o_key.startswith("self.") \
                        or (s_key, "scale") not in receivers \
                        or (s_key, "state_dict") in receivers or (s_key, "load_state_dict") in receivers:
                    continue
                scaler, optimizer = s_key[5:], o_key[5:]
                state = self._wrapper_dict(method, o_key, s_key)
                if state is None or any(w.dict_node is state for w in out) or not self._builds_scaler(scaler):
                    continue
                holders = m.foreign.holders(m.path, f".{scaler}.state_dict(")
                if holders is None or holders:
                    continue
                out.append(WrapperState(state, cls, scaler, optimizer))
        return out

    def _wrapper_dict(self, method: cst.FunctionDef, optimizer: str, scaler: str) -> Optional[cst.Dict]:
        """The dict literal `method` returns, when it holds `<optimizer>.state_dict()` and no
        entry of the scaler (no `<scaler>` in the method, no key that names a scaler)."""
        m = self.model
        if scaler in m.code(method):
            return None
        for ret in m._nodes_in_scope(method, cst.Return):  # type: ignore[attr-defined]
            if not isinstance(ret.value, cst.Dict):
                continue
            elements = ret.value.elements
            if any(not isinstance(e, cst.DictElement) for e in elements):
                return None  # `**other`: it may hold anything
            keys = [literal_string(e.key) or "" for e in elements]  # type: ignore[union-attr]
            if any(k in SCALER_KEYS or "scaler" in k.lower() for k in keys):
                return None
            if any(dotted(method_call(e.value, "state_dict")) == optimizer for e in elements):  # type: ignore[union-attr]
                return ret.value
        return None

    def _builds_scaler(self, attr: str) -> bool:
        """Some assignment of the file to `<x>.<attr>` builds a GradScaler not built disabled
        (`self._scaler = GradScaler()`, `optimizer._scaler = GradScaler()` in a factory)."""
        m = self.model
        return any(self._enabled_scaler([v for _, v in m.assignments_to(key)])
                   for key in m.assigned_keys() if key.endswith("." + attr))

    def scalers_at(self, node: cst.CSTNode) -> List[str]:
        """The scaler keys code at `node` can reach: its function's names and the module's,
        and `self.` attributes of its class, when they hold an enabled (or possibly enabled)
        GradScaler."""
        scope = self.model.scope_of(node)
        cls = self.model.self_class(node)
        out = []
        for key in sorted(self.model.scalers):
            root, _, rest = key.partition(".")
            if root == "self":
                if cls is None or "." in rest or not self._enabled_scaler(self.model.attribute_values(cls, rest)):
                    continue
            elif rest or self.model.binding_scope(root, scope) is None:
                continue
            elif not self._enabled_scaler([v for n, v, s in self.model._by_key.get(key, [])
                                           if s is self.model.binding_scope(root, scope)]):
                continue
            static = self.__dict__.setdefault("_static_scalers", {})  # (asked per checkpoint and restore)
            if key not in static:
                static[key] = self._never_updated(key)
            if static[key]:
                continue
            out.append(key)
        return out

    def _never_updated(self, key: str) -> bool:
        """The file scales losses with the scaler `key`, and every use of it is an assignment to
        it or a call of a method that leaves its state as built (`scale`, `unscale_`,
        `get_scale`, ...): no `update()` runs on it (nor `step()`), it is handed to nothing, and
        for an attribute no module of the project calls `.<attr>.update(`. Its state never
        changes, so a checkpoint has nothing of it to keep (nerfacc's fixed loss scale,
        `GradScaler(2**10)` used for `scale(loss)` only)."""
        code = self.model.__dict__.get("source_text") or self.model.module.code  # (the engine's text: no codegen)
        scales = False
        for m in re.finditer(r"(?<![\w.])" + re.escape(key) + r"(?![\w])", code):
            use = _SCALER_USE.match(code, m.end())
            if use is None or (use.group(1) is not None and use.group(1) not in _STATE_KEEPING):
                return False
            scales = scales or use.group(1) == "scale"
        if not scales:
            return False  # built here, used elsewhere: not known
        if "." not in key:
            return True
        # an attribute: no module of the project updates it through that attribute (unknown
        # without the project)
        foreign = self.model.foreign
        holders = foreign.holders(self.model.path, "." + key.rpartition(".")[2] + ".update(") \
            if foreign is not None else None
        return holders is not None and not holders

    def scaler_saved_alone(self) -> Optional[cst.Call]:
        """The first `torch.save(scaler.state_dict(), path)` of the file: a GradScaler's state
        saved to a file of its own, not under a key of a checkpoint (sockeye's `grad_scaler.pkl`)."""
        for call in self.model.calls:
            if self.model.is_api(call, "save") and call.args and not call.args[0].keyword:
                receiver = method_call(call.args[0].value, "state_dict")
                if receiver is not None and self.model.is_scaler(receiver):
                    return call
        return None

    def scaler_key(self) -> Optional[str]:
        """The key under which this file's checkpoints already save (or its resumes read) a
        GradScaler's state, when there is exactly one."""
        keys = set()
        for state in self.saved_states():
            if state.scaler_state and isinstance(state.dict_node, cst.Dict):
                for el in state.dict_node.elements:
                    k = literal_string(el.key) if isinstance(el, cst.DictElement) else None
                    receiver = method_call(el.value, "state_dict") if isinstance(el, cst.DictElement) else None
                    if k is not None and (receiver is not None and self.model.is_scaler(receiver)
                                          or "scaler" in k.lower()):
                        keys.add(k)
        for call in self.model.calls:
            receiver = method_call(call, "load_state_dict")
            if receiver is not None and self.model.is_scaler(receiver) and call.args:
                arg = call.args[0].value
                if isinstance(arg, cst.Subscript) and len(arg.slice) == 1 and isinstance(arg.slice[0].slice, cst.Index):
                    k = literal_string(arg.slice[0].slice.value)
                    if k is not None:
                        keys.add(k)
        return keys.pop() if len(keys) == 1 else None

    def _enabled_scaler(self, values: List[cst.BaseExpression]) -> bool:
        for v in values:
            for leaf in self.model.possible_values(v):
                if isinstance(leaf, cst.Call) and self.model.is_api(leaf, "GradScaler") and not self.model.built_disabled(leaf):
                    return True
        return False
