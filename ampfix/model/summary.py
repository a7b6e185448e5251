"""Module summaries: what other modules need to know of a module, from one parse of it.

A summary is plain data (JSON, cached by the module's content hash with the check cache), in
the model's own vocabulary:

* values are *canonical expressions*: source text in which every name is spelled so that it
  means the same thing anywhere: torch APIs by their qualified names (`torch.amp.GradScaler(
  "cuda", enabled=False)`, `torch.float16`), literals as written, a parameter of the function
  summarised as `__param__.name`, `self.x` as `__self__.x`, a definition of the module itself as
  `__local__.Name`, a name imported from another module of the project as
  `__imported__("pkg.mod.Name")` (the import as written, resolved by the project against the
  module's own path), and whatever cannot be spelled so (a local variable, a name the module
  cannot see) as `__unknown__`. The model reads a foreign value by parsing this text into an
  expression of its own (`model/foreign.py`), so every question it answers about an
  expression of the file (is it a GradScaler built with `enabled=False`? which dtype?) is
  answered the same way about a value of another module;
* a function's effects are its AMP events (`model/events.py`) in evaluation order, each with
  its kind, the scaler and optimizer it acts on in the function's own names (a parameter, a
  `self.` attribute), its conditional contexts as plain groups, and where it is (line and
  column, for related locations); calls to other functions are effects too (`CALL`), so the
  project composes summaries of helpers that call helpers;
* a class: its bases (values), its methods, and the values of its attributes (`self.x = ...`
  in its methods, class-level and dataclass fields);
* a module: its imports as written, its top-level constants, functions and classes, and the
  calls it makes to functions of other modules with the arguments it passes (so a callee
  learns what its parameters receive).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, Dict, List, Optional, Tuple

SUMMARY_VERSION = 10  # 2: `FunctionSummary.loads` filled; 3: a fall-through group names its `if`; 4: the body of an `if X and Y: ... else:` runs under X and Y too; 5: a returned local variable assigned in several places is one value per assignment; 6: a `**` parameter passed on in a call (`**__param__.kwargs`); 7: a `p.scale(loss).backward()` on a parameter `p` the function never rebinds names `p` as its scaler; 8: `Effect.owner_param`, the never-rebound parameter a `p.step(...)` (`unscale_`, `update`, `zero_grad`) of an unknown object is called on; 9: code after an `if` one branch of which always exits runs under the other branch (`Flow._guard_decision`), and `N is None` tests the branch that set `N` (`Flow._marker_decision`): decision contexts in effects; 10: saved dicts that merge a parameter's dict (`spread`), and dicts handed to a save helper (`via`)


class Stored(Enum):
    """What a summary store (`project.SummaryStore`) holds for a module that has no summary."""

    UNREADABLE = "unreadable"  # it could not be summarised (unparsable, or the model gave up on it)


UNREADABLE = Stored.UNREADABLE

UNKNOWN = "__unknown__"
PARAM = "__param__"
SELF = "__self__"
LOCAL = "__local__"
IMPORTED = "__imported__"


@dataclass(frozen=True)
class Value:
    """One value an expression may hold: a canonical expression (see the module docstring)."""

    text: str
    line: int = 0

    @property
    def unknown(self) -> bool:
        return self.text == UNKNOWN


@dataclass(frozen=True)
class Param:
    name: str
    kind: str = "pos"  # "posonly", "pos", "kwonly", "star", "starstar"
    default: Optional[Value] = None


@dataclass(frozen=True)
class Effect:
    """One AMP event of a function (see `model/events.py` for the kinds)."""

    kind: str
    line: int
    col: int
    text: str = ""  # the call as written (shortened), for messages
    # key in the function's names: "scaler", "self.scaler", "opt@<n>" (a local of a helper run, numbered
    # by the summary: `Summarizer._run_number`); a BACKWARD "tensor" of `p.scale(loss)`: the
    # parameter `p`, never rebound (a GradScaler where the caller passes one)
    scaler: Optional[str] = None
    target: Optional[str] = None
    detail: Optional[str] = None
    # conditional contexts: (group, branch); groups are lists such as ["if", 3], ["loop", 1],
    # ["cond", "use_amp", ["use_amp"]] (a stable test on parameters, `self` or globals)
    ctx: Tuple[Tuple[Tuple[Any, ...], Any], ...] = ()
    loop: Optional[int] = None  # continue/break: the loop (its group number) they leave
    # CALL: what runs. "local:Name" (a function of the module), "self:method" (a method on the
    # instance, dispatched on its class), "value:<canonical callee>" (an imported function, a
    # method of an object of another module); args: callee parameter -> key in these names
    callee: Optional[str] = None
    args: Tuple[Tuple[str, str], ...] = ()
    # a "value:" CALL of `step`/`unscale_`/`update`/`zero_grad` on an object the module does not know
    # (`p.step(optimizer)`): the parameter `p` whose object it is, when no statement of the function
    # (nor of a helper of the module it passes through) binds that name otherwise (an assignment, a
    # `for`/`with`/`except` target, a walrus, a nested `nonlocal`); None: rebound or not a parameter,
    # the object unknown (`Events._method_on_bound_object`)
    owner_param: Optional[str] = None
    region: Optional[str] = None  # the dtype of the autocast region the event runs in, when inside one
    # BACKWARD: "scaled" / "unscaled" (what it runs on), or "param:loss" (a parameter's value)
    scale_source: Optional[str] = None
    frame: Tuple[int, ...] = ()  # the calls of the module's own helpers that lead to it (numbered)


@dataclass
class FunctionSummary:
    name: str
    line: int
    params: List[Param] = field(default_factory=list)
    is_method: bool = False
    decorators: List[str] = field(default_factory=list)  # canonical decorator expressions
    effects: List[Effect] = field(default_factory=list)
    returns: List[Value] = field(default_factory=list)
    # the checkpoints it writes: {"keys": [...], "state": {key: what}, "line": n} where what is
    # "optimizer"/"scaler"/"model"/"other"/"unknown" (the object whose state_dict() is stored)
    saves: List[Dict[str, Any]] = field(default_factory=list)
    # what it restores from a `torch.load`: {"kind": "scaler"/"optimizer"/"other", "receiver":
    # canonical text (`__param__.optimizer`) or None, "line": n} per `X.load_state_dict(...)`
    loads: List[Dict[str, Any]] = field(default_factory=list)
    # the command-line options of the parser whose parse_args() it returns: dest -> values
    options: Dict[str, List[Value]] = field(default_factory=dict)
    opaque: bool = False  # it runs code the summary cannot follow (*args forwarding, getattr dispatch)
    # the autocast regions that compute what it returns (`Precision.computing_regions`): dtype
    # ("float16", ..., "unknown") -> the line of the first such region (or of the call leading to it)
    return_dtypes: Dict[str, int] = field(default_factory=dict)


@dataclass
class ClassSummary:
    name: str
    line: int
    bases: List[Value] = field(default_factory=list)
    methods: Dict[str, FunctionSummary] = field(default_factory=dict)
    attributes: Dict[str, List[Value]] = field(default_factory=dict)
    dynamic: bool = False  # setattr / __getattr__ / __dict__ updates: its attributes are not all seen
    fields: List[str] = field(default_factory=list)  # a dataclass's fields, in order (the constructor's parameters)


@dataclass
class OutgoingCall:
    """A call to a function of another module (or of this one), with what it passes."""

    callee: str  # canonical callee expression (`__imported__("engine.train")`, `__local__.train`)
    line: int
    positional: List[Value] = field(default_factory=list)
    keywords: Dict[str, Value] = field(default_factory=dict)
    star: bool = False  # *args / **kwargs: the binding is partial


@dataclass
class ModuleSummary:
    path: str
    digest: str
    imports: Dict[str, List[str]] = field(default_factory=dict)  # bound name -> qualified imports as written
    constants: Dict[str, List[Value]] = field(default_factory=dict)
    functions: Dict[str, FunctionSummary] = field(default_factory=dict)
    classes: Dict[str, ClassSummary] = field(default_factory=dict)
    calls: List[OutgoingCall] = field(default_factory=list)
    star_imports: List[str] = field(default_factory=list)
    version: int = SUMMARY_VERSION

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> Dict[str, Any]:
        """The summary as JSON values: what `dataclasses.asdict` gives, without its generic walk
        (a deep copy of every leaf), which took 86 ms for a large module's summary."""
        return _as_json(self)

    @classmethod
    def from_json(cls, raw: Dict[str, Any]) -> "ModuleSummary":
        """Rebuild a summary from `to_json`'s output; raises (ValueError, TypeError, KeyError)
        on anything of another shape, which the cache takes as a miss."""
        if not isinstance(raw, dict) or raw.get("version") != SUMMARY_VERSION:
            raise ValueError("not a module summary of this version")
        return cls(
            path=_str(raw["path"]), digest=_str(raw["digest"]),
            imports={_str(k): [_str(q) for q in _list(v)] for k, v in _dict(raw["imports"]).items()},
            constants={_str(k): [_value(x) for x in _list(v)] for k, v in _dict(raw["constants"]).items()},
            functions={_str(k): _function(v) for k, v in _dict(raw["functions"]).items()},
            classes={_str(k): _class(v) for k, v in _dict(raw["classes"]).items()},
            calls=[_call(c) for c in _list(raw["calls"])],
            star_imports=[_str(s) for s in _list(raw.get("star_imports", []))],
        )

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"))


# ---------------------------------------------------------------------- writer

_FIELDS: Dict[type, Tuple[str, ...]] = {}
_ATOMS = (str, int, float, bool, type(None))


def _as_json(x: Any) -> Any:
    """`dataclasses.asdict` of a summary's parts: a dataclass as a dict of its fields, lists
    and dicts copied, a tuple of atoms (an effect's contexts, arguments, frame) kept as it is,
    since nothing can change it."""
    t = type(x)
    names = _FIELDS.get(t)
    if names is not None:
        return {n: _as_json(getattr(x, n)) for n in names}
    if isinstance(x, _ATOMS):
        return x
    if t is list:
        return [_as_json(i) for i in x]
    if t is dict:
        return {k: _as_json(v) for k, v in x.items()}
    if t is tuple and _atoms(x):
        return x
    if t is tuple:
        return tuple(_as_json(i) for i in x)
    raise TypeError(f"not a summary's part: {t.__name__}")


def _atoms(x: tuple) -> bool:
    return all(isinstance(i, _ATOMS) or (type(i) is tuple and _atoms(i)) for i in x)


# ---------------------------------------------------------------------- strict readers

def _str(x: Any) -> str:
    if not isinstance(x, str):
        raise TypeError(f"expected a string, got {type(x).__name__}")
    return x


def _int(x: Any) -> int:
    if not isinstance(x, int) or isinstance(x, bool):
        raise TypeError(f"expected an integer, got {type(x).__name__}")
    return x


def _list(x: Any) -> list:
    if not isinstance(x, (list, tuple)):
        raise TypeError(f"expected a list, got {type(x).__name__}")
    return x


def _dict(x: Any) -> dict:
    if not isinstance(x, dict):
        raise TypeError(f"expected an object, got {type(x).__name__}")
    return x


def _opt_str(x: Any) -> Optional[str]:
    return None if x is None else _str(x)


def _value(raw: Any) -> Value:
    raw = _dict(raw)
    return Value(_str(raw["text"]), _int(raw["line"]))


def _freeze(x: Any) -> Any:
    if isinstance(x, (list, tuple)):
        return tuple(_freeze(i) for i in x)
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    raise TypeError(f"unexpected {type(x).__name__} in a context group")


def _effect(raw: Any) -> Effect:
    raw = _dict(raw)
    ctx = tuple((_freeze(_list(g)), _freeze(b)) for g, b in (_list(pair) for pair in _list(raw["ctx"])))
    return Effect(kind=_str(raw["kind"]), line=_int(raw["line"]), col=_int(raw["col"]), text=_str(raw["text"]),
                  scaler=_opt_str(raw["scaler"]), target=_opt_str(raw["target"]), detail=_opt_str(raw["detail"]),
                  ctx=ctx, loop=None if raw["loop"] is None else _int(raw["loop"]), callee=_opt_str(raw["callee"]),
                  args=tuple((_str(a), _str(b)) for a, b in (_list(p) for p in _list(raw["args"]))),
                  owner_param=_opt_str(raw["owner_param"]),
                  region=_opt_str(raw["region"]), scale_source=_opt_str(raw["scale_source"]),
                  frame=tuple(_int(i) for i in _list(raw["frame"])))


def _param(raw: Any) -> Param:
    raw = _dict(raw)
    return Param(_str(raw["name"]), _str(raw["kind"]), None if raw["default"] is None else _value(raw["default"]))


def _function(raw: Any) -> FunctionSummary:
    raw = _dict(raw)
    return FunctionSummary(
        name=_str(raw["name"]), line=_int(raw["line"]), params=[_param(p) for p in _list(raw["params"])],
        is_method=bool(raw["is_method"]), decorators=[_str(d) for d in _list(raw["decorators"])],
        effects=[_effect(e) for e in _list(raw["effects"])], returns=[_value(v) for v in _list(raw["returns"])],
        saves=[_dict(s) for s in _list(raw["saves"])], loads=[_dict(s) for s in _list(raw["loads"])],
        options={_str(k): [_value(v) for v in _list(vs)] for k, vs in _dict(raw["options"]).items()},
        opaque=bool(raw["opaque"]), return_dtypes={_str(k): _int(v) for k, v in _dict(raw.get("return_dtypes", {})).items()})


def _class(raw: Any) -> ClassSummary:
    raw = _dict(raw)
    return ClassSummary(
        name=_str(raw["name"]), line=_int(raw["line"]), bases=[_value(b) for b in _list(raw["bases"])],
        methods={_str(k): _function(v) for k, v in _dict(raw["methods"]).items()},
        attributes={_str(k): [_value(v) for v in _list(vs)] for k, vs in _dict(raw["attributes"]).items()},
        dynamic=bool(raw["dynamic"]), fields=[_str(f) for f in _list(raw["fields"])])


def _call(raw: Any) -> OutgoingCall:
    raw = _dict(raw)
    return OutgoingCall(callee=_str(raw["callee"]), line=_int(raw["line"]),
                        positional=[_value(v) for v in _list(raw["positional"])],
                        keywords={_str(k): _value(v) for k, v in _dict(raw["keywords"]).items()},
                        star=bool(raw["star"]))


_FIELDS.update((c, tuple(f.name for f in fields(c)))
               for c in (Value, Param, Effect, FunctionSummary, ClassSummary, OutgoingCall, ModuleSummary))

__all__ = ["ClassSummary", "Effect", "FunctionSummary", "ModuleSummary", "OutgoingCall", "Param", "Value",
           "UNKNOWN", "PARAM", "SELF", "LOCAL", "IMPORTED", "SUMMARY_VERSION"]
