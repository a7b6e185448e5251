"""Facts from other modules of the project, as the model of one file sees them.

The model of a file asks the project (`ampfix/project/`, through the `ForeignFacts` protocol
below: the model never imports the project) what a name imported from another module of the
project is: a function, a class, a constant, a module. The answers are summaries
(`model/summary.py`). They enter the file's own reasoning at a few places only:

* values: a name imported from a module of the project, an attribute of such a module, a
  `self.x` set in a base class of another module, an attribute of an instance of a class of
  another module, what a function of another module returns, what the other modules pass to
  a parameter: each is a canonical expression of the summary, *materialised* here as an
  expression node of this model (`materialize`): `torch.amp.GradScaler("cuda",
  enabled=False)` from another module is then a GradScaler construction to every question
  the model answers about expressions. A materialised node is *synthetic*: it is not part of
  the file (no position, never reported, never edited), and its special names
  (`__imported__(...)`, `__local__.X`, `__param__.p`, `__self__.x`) are resolved in the
  module it comes from;
* calls: a call that runs a function or method of another module (`foreign_callee`) is an
  event whose callee's effects the traces inline (`events.py`);
* classes: the bases of a class of this file that are defined in another module
  (`foreign_bases`), and whether every base of a class is known (`closed_class`): a class
  with a base nobody can see may hold any attribute, and that is unknown, not "absent".

Without a project (a file checked alone, the language server on an unsaved buffer) every
answer is "unknown": the model then behaves exactly as the one-file model did.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Dict, FrozenSet, List, Optional, Protocol, Tuple, Union

import libcst as cst

from ampfix.model.parsing import parse_expression
from ampfix.model.summary import (IMPORTED, LOCAL, PARAM, SELF, UNKNOWN, ClassSummary, FunctionSummary,
                                  ModuleSummary, OutgoingCall, Value)
from ampfix.model.syntax import literal_string
from ampfix.model.tree import copied, dotted

MAX_FOREIGN_DEPTH = 4
# parameters whose values the rules ask about (a scaler, an optimizer, a framework object, the
# precision and its configuration): only those are looked up at the calls of other modules
AMP_OBJECT_PARAM = re.compile(r"scaler|optim|^opt|fabric|accelerat|dtype|precision|amp|fp16|bf16|half|"
                              r"^cfg|config|^conf$|^args$|^opts?$|hparams|^hp$|settings", re.IGNORECASE)
MARKERS = (IMPORTED, LOCAL, PARAM, SELF, UNKNOWN)
# bases a class may have and still hold no attribute it does not show: the object model and
# the library classes whose instances carry no AMP object of their own
KNOWN_BASES = ("object", "builtins.object", "abc.ABC", "typing.Generic", "typing.Protocol", "enum.Enum",
               "enum.IntEnum", "str", "int", "dict", "Exception", "torch.nn.Module", "torch.nn.modules.module.Module",
               "torch.autograd.Function", "torch.autograd.function.Function", "torch.utils.data.Dataset",
               "torch.utils.data.dataset.Dataset", "torch.optim.Optimizer", "torch.nn.Sequential")


class ForeignModule:
    """A module of the project. Its summary is read (from the cache, or by one parse) only when
    a question needs more than what the module binds: most imports are resolved without it."""

    def __init__(self, path: str, load: Callable[[], ModuleSummary]):
        self.path = path
        self._load = load
        self._summary: Optional[ModuleSummary] = None

    @property
    def summary(self) -> ModuleSummary:
        if self._summary is None:
            self._summary = self._load()
        return self._summary

    def __repr__(self) -> str:
        return f"ForeignModule({self.path!r})"


class ForeignClass:
    def __init__(self, module: ForeignModule, qual: str):
        self.module, self.qual = module, qual

    @property
    def path(self) -> str:
        return self.module.path

    @property
    def key(self) -> Tuple[str, str]:
        return (self.module.path, self.qual)

    @property
    def summary(self) -> ClassSummary:
        found = self.module.summary.classes.get(self.qual)
        return found if found is not None else ClassSummary(self.qual, 0)

    def __repr__(self) -> str:
        return f"ForeignClass(path={self.path!r}, qual={self.qual!r})"


class ForeignFunction:
    def __init__(self, module: ForeignModule, qual: str, owner: Optional[ForeignClass] = None):
        self.module, self.qual, self.owner = module, qual, owner

    @property
    def path(self) -> str:
        return self.module.path

    @property
    def key(self) -> Tuple[str, str]:
        return (self.module.path, self.qual)

    @property
    def summary(self) -> FunctionSummary:
        s = self.module.summary
        if self.owner is not None:
            found = self.owner.summary.methods.get(self.qual.rpartition(".")[2])
        else:
            found = s.functions.get(self.qual)
        return found if found is not None else FunctionSummary(self.qual.rpartition(".")[2], 0, opaque=True)

    def __repr__(self) -> str:
        return f"ForeignFunction(path={self.path!r}, qual={self.qual!r})"


class ForeignConstant:
    def __init__(self, module: ForeignModule, name: str, values: Optional[Tuple[Value, ...]] = None):
        self.module, self.name, self._values = module, name, values

    @property
    def path(self) -> str:
        return self.module.path

    @property
    def values(self) -> Tuple[Value, ...]:
        if self._values is None:
            self._values = tuple(self.module.summary.constants.get(self.name, ()))
        return self._values

    def __repr__(self) -> str:
        return f"ForeignConstant(path={self.path!r}, name={self.name!r})"


Definition = Union[ForeignModule, ForeignClass, ForeignFunction, ForeignConstant]


_CANON_IMPORTED = re.compile(r'^__imported__\("([^"]*)"\)$')  # a canonical name imported, as it is

class ForeignFacts(Protocol):
    """What a file's model may ask of the project (`ampfix.project.Project` answers)."""

    def resolve(self, importer: str, qualified: str) -> Optional[Definition]:
        """The definition an import binding (`pkg.mod.name`, `..utils.f`, as the model records
        it) written in the file `importer` refers to; None: not a module of the project, or a
        name the module does not bind (unknown)."""

    def member(self, module: ForeignModule, name: str) -> Optional[Definition]:
        """What `name` is in `module`'s namespace (its own definitions, then its imports)."""

    def bases(self, cls: ForeignClass) -> List[Union[Definition, str, None]]:
        """The bases of a class of another module: a definition of the project, the canonical
        name of a library class (`torch.nn.Module`), or None when unknown."""

    def callers(self, path: str, qual: str) -> Optional[List[Tuple[ForeignModule, OutgoingCall]]]:
        """The calls other modules of the project make to the function `qual` of the module
        `path`; None when that cannot be known (too many candidates)."""

    def relevant(self, d: Definition) -> bool:
        """The code of `d` holds anything AMP code is made of (else it has no effects or values
        worth reading, and its module's summary is not needed for it)."""

    def relevant_to_traces(self, d: Definition) -> bool:
        """The code of `d` holds something a training step's events are made of (a trace
        inlines its effects only then)."""

    def lacks_relevant_method(self, cls: ForeignClass, name: str) -> bool:
        """Sure, from the texts, that no class `cls` may inherit from defines a method `name`
        with AMP code (False: not sure)."""

    def lacks_relevant_attributes(self, cls: ForeignClass) -> bool:
        """Sure, from the texts, that no class `cls` may inherit from holds AMP code or is a
        dataclass (False: not sure)."""

    def lacks_relevant_classes(self, cls: ForeignClass) -> bool:
        """Sure, from the texts, that no class `cls` may inherit from holds AMP code (False:
        not sure)."""

    def overridden_below(self, cls: ForeignClass, name: str) -> bool:
        """A class of the project that may derive from `cls` defines a method `name` (True:
        not sure that none does)."""

    def library_name(self, importer: str, qualified: str) -> Optional[str]:
        """The library name an import binding of `importer` stands for when one of the
        project's modules re-exports it (`from ..compat import torch`: "torch"); None: not so."""

    def holders(self, path: str, word: str) -> Optional[List[str]]:
        """The project's files (`path`'s own included) whose text holds `word`; None: not known
        (no project is read)."""

    def star_names(self, importer: str, module: str) -> Optional[FrozenSet[str]]:
        """The names `from <module> import *`, written in `importer`, binds when `module` is one
        of the project's (its `__all__`, else its public top-level names); None: not known."""


@dataclass
class Synthetic:
    """Where a materialised value comes from: its module, its class (for `__self__`), and the
    arguments of the call it was returned from (for `__param__`)."""

    module: Optional[ForeignModule]
    cls: Optional[ForeignClass] = None
    bindings: Optional[Dict[str, cst.BaseExpression]] = None
    line: int = 0
    depth: int = 0


class Foreign:
    """The facts of other modules (a part of `AmpModel`)."""

    def _init_foreign(self, foreign: Optional[ForeignFacts], path: str) -> None:
        self.foreign = foreign
        self.path = path
        self._synthetic: Dict[cst.CSTNode, Synthetic] = {}
        self._materialized: Dict[Tuple[int, str, int], cst.BaseExpression] = {}
        self._import_defs: Dict[cst.CSTNode, Optional[Definition]] = {}
        self._foreign_bases: Dict[cst.ClassDef, List[Union[Definition, str, None]]] = {}
        self._callee_memo: Dict[cst.CSTNode, Optional[ForeignFunction]] = {}

    def _foreign_function_named(self, module: ForeignModule, text: str) -> Optional[ForeignFunction]:
        """The function of the project a canonical callee of `module`'s summary names
        (`__imported__("pkg.mod.f")`, `__local__.f`); None: something else, or not known."""
        if self.foreign is None:
            return None
        d: Optional[Definition] = None
        m = _CANON_IMPORTED.match(text)
        if m is not None:
            d = self.foreign.resolve(module.path, m.group(1))
        elif text.startswith(LOCAL + ".") and text.count(".") == 1:
            d = self.foreign.member(module, text[len(LOCAL) + 1:])
        return d if isinstance(d, ForeignFunction) else None

    # ---------------------------------------------------------------- synthetic nodes
    def is_synthetic(self, node: cst.CSTNode) -> bool:
        """A value materialised from another module (not part of this file)."""
        return node in self._synthetic

    def _materialize(self, value: Value, origin: Synthetic) -> Optional[cst.BaseExpression]:
        """The canonical expression `value` as an expression node of this model (cached)."""
        if value.unknown or origin.depth > MAX_FOREIGN_DEPTH:
            return None
        key = (id(origin.module), value.text, id(origin.bindings) if origin.bindings else 0)
        cached = self._materialized.get(key)
        if cached is not None:
            return cached
        text = value.text
        if f"**{PARAM}." in text:  # a `**` parameter passed on: the caller's keywords in its place
            text = _spread(text, origin.bindings or {})
            if text is None:
                return None
        # only a text naming a bound parameter changes with the bindings (`__param__.p` -> the argument)
        binds = bool(origin.bindings) and f"{PARAM}." in text and \
            any(f"{PARAM}.{name}" in text for name in origin.bindings)  # type: ignore[union-attr]
        parsed = _PARSED.get(text)  # never a node of a model: each takes a copy
        if parsed is None:
            try:
                parsed = parse_expression(text)
            except Exception:
                return None
            if len(_PARSED) > 4096:
                _PARSED.clear()
            _PARSED[text] = parsed
        replace = None
        if binds:
            bindings = origin.bindings
            replace = (lambda n: bindings.get(n.attr.value)  # type: ignore[union-attr,misc]
                       if type(n) is cst.Attribute and type(n.value) is cst.Name and n.value.value == PARAM  # type: ignore[attr-defined]
                       else None)
        stamp = Synthetic(origin.module, origin.cls, origin.bindings, value.line, origin.depth)
        expr = _adopt(self, parsed, stamp, origin.bindings, replace)
        if expr is None:  # pragma: no cover - a node type `copied` does not know
            return None
        self._materialized[key] = expr
        return expr

    def _synthetic_values(self, expr: cst.CSTNode) -> Optional[List[cst.BaseExpression]]:
        """For a synthetic name or attribute (`__local__.X`, `__imported__("m.f")`,
        `__self__.x`, `__param__.p`, `torch.float16`): what it holds (None: not one of those;
        [] : unknown)."""
        origin = self._synthetic.get(expr)
        if origin is None:
            return None
        text = dotted(expr)
        if isinstance(expr, cst.Call) and _imported_name(expr) is not None:
            text = IMPORTED
        if text is None:
            return None
        root, _, rest = text.partition(".")
        if root == UNKNOWN:
            return []
        deeper = Synthetic(origin.module, origin.cls, origin.bindings, origin.line, origin.depth + 1)
        if root == LOCAL and origin.module is not None and self.foreign is not None:
            name, _, attr = rest.partition(".")
            return self._definition_values(self.foreign.member(origin.module, name), attr, deeper)
        if root == SELF and origin.cls is not None:
            attr, _, more = rest.partition(".")
            return [v for val in self._foreign_attribute(origin.cls, attr)
                    for v in [self._materialize(val, deeper)] if v is not None] if not more else []
        if root == PARAM:
            return []  # a parameter the call did not bind: unknown
        if text == IMPORTED:
            q = _imported_name(expr)
            if q is not None and origin.module is not None and self.foreign is not None:
                return self._definition_values(self.foreign.resolve(origin.module.path, q), "", deeper)
            return []
        return None  # a canonical library name (torch.float16): a leaf

    def _definition_values(self, d: Optional[Definition], attr: str, origin: Synthetic) -> List[cst.BaseExpression]:
        if d is None or self.foreign is None:
            return []
        if attr:
            first, _, more = attr.partition(".")
            if isinstance(d, ForeignModule):
                return self._definition_values(self.foreign.member(d, first), more, origin)
            if isinstance(d, ForeignClass) and not more:
                return [v for val in self._foreign_attribute(d, first) for v in [self._materialize(val, origin)]
                        if v is not None]
            return []
        if isinstance(d, ForeignConstant):
            sub = Synthetic(d.module, None, None, 0, origin.depth)
            return [v for val in d.values for v in [self._materialize(val, sub)] if v is not None]
        return [self._definition_node(d)]

    def _definition_node(self, d: Definition) -> cst.BaseExpression:
        """A synthetic name standing for a function, class or module of another module (what
        `from .utils import helper` binds): `foreign_definition` gives it back."""
        key = (id(d), "#def", 0)
        cached = self._materialized.get(key)
        if cached is None:
            cached = cst.Name(UNKNOWN)
            self._synthetic[cached] = Synthetic(None, None, None, 0, 0)
            self._definitions[cached] = d
            self._materialized[key] = cached
        return cached

    @property
    def _definitions(self) -> Dict[cst.CSTNode, Definition]:
        defs = self.__dict__.get("_defs")
        if defs is None:
            defs = self.__dict__["_defs"] = {}
        return defs

    # ---------------------------------------------------------------- definitions
    def _foreign_definition(self, expr: Optional[cst.CSTNode]) -> Optional[Definition]:
        """The definition of another module that the name or attribute `expr` refers to:
        through an import of this file (`helper` after `from .utils import helper`,
        `utils.helper` after `from . import utils`), or a synthetic value standing for one."""
        if expr is None or self.foreign is None:
            return None
        if expr in self._definitions:
            return self._definitions[expr]
        if expr in self._synthetic:
            return self._synthetic_definition(expr)
        if not isinstance(expr, (cst.Name, cst.Attribute)):
            return None
        if expr in self._import_defs:
            return self._import_defs[expr]
        self._import_defs[expr] = None
        found: Optional[Definition] = None
        for qn in sorted(self.qualnames(expr)):  # type: ignore[attr-defined]
            if qn == "torch" or qn.startswith(("torch.", "builtins.")):
                continue  # library names are never the project's
            d = self.foreign.resolve(self.path, qn)
            if d is not None:
                found = d
                break
        self._import_defs[expr] = found
        return found

    def _synthetic_definition(self, expr: cst.CSTNode) -> Optional[Definition]:
        origin = self._synthetic[expr]
        if isinstance(expr, cst.Call):
            q = _imported_name(expr)
            if q is not None and origin.module is not None:
                return self.foreign.resolve(origin.module.path, q)  # type: ignore[union-attr]
            return None
        text = dotted(expr)
        if text is None or origin.module is None:
            return None
        root, _, rest = text.partition(".")
        if root == LOCAL and rest:
            parts = rest.split(".")
            d = self.foreign.member(origin.module, parts[0])  # type: ignore[union-attr]
            for p in parts[1:]:
                d = self.foreign.member(d, p) if isinstance(d, ForeignModule) else None  # type: ignore[union-attr]
            return d
        if isinstance(expr, cst.Attribute):
            base = self._synthetic_definition(expr.value) if expr.value in self._synthetic else None
            if isinstance(base, ForeignModule):
                return self.foreign.member(base, expr.attr.value)  # type: ignore[union-attr]
        return None

    # ---------------------------------------------------------------- classes
    def foreign_bases(self, cls: cst.ClassDef) -> List[Union[Definition, str, None]]:
        """The bases of a class of this file that are not classes of this file: a definition of
        another module of the project, a library class's canonical name, or None (unknown)."""
        cached = self._foreign_bases.get(cls)
        if cached is not None:
            return cached
        out: List[Union[Definition, str, None]] = []
        for b in cls.bases:
            if b.keyword is not None:
                continue
            expr = b.value
            name = (dotted(expr) or "").rpartition(".")[2]
            if isinstance(expr, cst.Name) and name in self.classes and self.classes[name] is not cls:
                continue  # a class of this file
            d = self._foreign_definition(expr)
            if d is not None:
                out.append(d)
                continue
            qn = sorted(self.qualnames(expr)) if isinstance(expr, (cst.Name, cst.Attribute)) else []
            if qn:
                out.append(qn[0])
            elif isinstance(expr, cst.Name) and expr.value in ("object", "Exception", "dict", "str", "int"):
                out.append(expr.value)
            else:
                out.append(None)
        self._foreign_bases[cls] = out
        return out

    def closed_class(self, cls: cst.ClassDef) -> bool:
        """Every base of `cls` (and of its bases) is known: a class of this file, a class of
        the project, or a library class that holds no attributes of its own that matter here
        (`nn.Module`, `object`, ...). Attributes the class does not show are then absent."""
        seen: List[cst.ClassDef] = []
        todo = [cls]
        while todo:
            c = todo.pop()
            if c in seen:
                continue
            seen.append(c)
            for b in self.foreign_bases(c):
                if b is None or (isinstance(b, str) and b not in KNOWN_BASES):
                    return False
                if isinstance(b, ForeignClass) and not self._foreign_closed(b, 0):
                    return False
                if not isinstance(b, (str, ForeignClass)):
                    return False
            todo.extend(self._bases(c))  # type: ignore[attr-defined]
        return True

    def _foreign_closed(self, cls: ForeignClass, depth: int) -> bool:
        if depth > MAX_FOREIGN_DEPTH or self.foreign is None or cls.summary.dynamic:
            return False
        for b in self.foreign.bases(cls):
            if b is None or (isinstance(b, str) and b not in KNOWN_BASES):
                return False
            if isinstance(b, ForeignClass) and not self._foreign_closed(b, depth + 1):
                return False
            if not isinstance(b, (str, ForeignClass)):
                return False
        return True

    def foreign_mro(self, cls: ForeignClass) -> List[ForeignClass]:
        """`cls` and its bases of the project, depth first (Python's order for the usual
        single-inheritance trainers and mixins)."""
        out: List[ForeignClass] = []
        todo: List[Tuple[ForeignClass, int]] = [(cls, 0)]
        while todo:
            c, depth = todo.pop(0)
            if any(c.key == o.key for o in out) or depth > MAX_FOREIGN_DEPTH:
                continue
            out.append(c)
            if self.foreign is not None:
                todo[0:0] = [(b, depth + 1) for b in self.foreign.bases(c) if isinstance(b, ForeignClass)]
        return out

    def _foreign_attribute(self, cls: ForeignClass, attr: str) -> List[Value]:
        """The values `self.<attr>` may hold for an instance of a class of another module
        (assigned in it or in its bases; a class whose code holds no AMP code gives none)."""
        out: List[Value] = []
        if self.foreign is None or self.foreign.lacks_relevant_classes(cls):
            return out  # (no summary read: the texts of its classes show no AMP code)
        for c in self.foreign_mro(cls):
            if self.foreign.relevant(c):
                out.extend(c.summary.attributes.get(attr, []))
        return out

    def _foreign_method(self, cls: ForeignClass, name: str) -> Optional[ForeignFunction]:
        for c in self.foreign_mro(cls):
            f = c.summary.methods.get(name)
            if f is not None:
                return ForeignFunction(c.module, f"{c.qual}.{name}", c)
        return None

    def _inherited_method(self, cls: cst.ClassDef, name: str) -> Optional[ForeignFunction]:
        """`name` found in a base of another module of a class of this file (after its bases
        of this file, which `lookup_method` searches)."""
        todo = [cls]
        seen: List[cst.ClassDef] = []
        while todo:
            c = todo.pop(0)
            if c in seen:
                continue
            seen.append(c)
            for b in self.foreign_bases(c):
                if isinstance(b, ForeignClass):
                    m = self._foreign_method(b, name)
                    if m is not None:
                        return m
            todo.extend(self._bases(c))  # type: ignore[attr-defined]
        return None

    def inherited_attribute(self, cls: cst.ClassDef, attr: str) -> List[cst.BaseExpression]:
        """The values bases of another module give `self.<attr>` of a class of this file."""
        out: List[cst.BaseExpression] = []
        todo = [cls]
        seen: List[cst.ClassDef] = []
        while todo:
            c = todo.pop(0)
            if c in seen:
                continue
            seen.append(c)
            for b in self.foreign_bases(c):
                if isinstance(b, ForeignClass) and self.foreign is not None \
                        and not self.foreign.lacks_relevant_classes(b):  # (else no summary read)
                    for fc in self.foreign_mro(b):
                        if self.foreign is None or not self.foreign.relevant(fc):
                            continue
                        origin = Synthetic(fc.module, fc)
                        out.extend(v for val in fc.summary.attributes.get(attr, [])
                                   for v in [self._materialize(val, origin)] if v is not None)
            todo.extend(self._bases(c))  # type: ignore[attr-defined]
        return out

    def _foreign_class_of(self, value: cst.CSTNode) -> Optional[ForeignClass]:
        """The class of another module whose instance `value` builds (`Trainer(...)` with
        `Trainer` imported, a synthetic `__local__.Trainer(...)`)."""
        if isinstance(value, cst.Call):
            func = value.func
            if isinstance(func, cst.Attribute) and func.attr.value in ("cuda", "to", "train", "eval"):
                return self._foreign_class_of(func.value)
            d = self._foreign_definition(func)
            return d if isinstance(d, ForeignClass) else None
        if isinstance(value, cst.Name):
            return self._annotated_class(value)
        return None

    def _annotated_class(self, name: cst.Name) -> Optional[ForeignClass]:
        """The class of another module that the annotation of the parameter `name` names
        (`def __init__(self, model: LanguageModel)`), or, where it has none, the annotation of the
        attribute it is assigned to (`self.model: LanguageModel = model`), when the value is that
        parameter's (what a caller passes in): an instance of that class, or of a subclass, which
        the annotation promises acts like it (a method that a subclass of the project overrides
        is unknown: `_method_on_values`). None for any other annotation (`Optional[...]`, a
        string, a class of this file or of a third party): unknown."""
        func = self.binding_scope(name.value, self.scope_of(name))
        if type(func) is not cst.FunctionDef:
            return None
        param = self._param_of(func, name.value)  # type: ignore[attr-defined]
        if param is None:
            return None
        ann = param.annotation.annotation if param.annotation is not None else None
        holder = self.parent(name)
        if ann is None and isinstance(holder, cst.AnnAssign) and holder.value is name:
            ann = holder.annotation.annotation  # `self.model: LanguageModel = model`
        if not isinstance(ann, (cst.Name, cst.Attribute)):
            return None
        d = self._foreign_definition(ann)
        return d if isinstance(d, ForeignClass) else None

    # ---------------------------------------------------------------- calls
    def _foreign_callee(self, call: cst.Call) -> Optional[ForeignFunction]:
        """The function or method of another module that `call` runs, if known (computed once
        per call; a call met again while it is being resolved is unknown)."""
        if self.foreign is None:
            return None
        memo = self._callee_memo
        if call in memo:
            return memo[call]
        memo[call] = None
        found = self._foreign_callee_uncached(call)
        if found is not None and not self.foreign.relevant(found):
            found = None  # no AMP code in it: no effects, no value worth following
        memo[call] = found
        return found

    def _foreign_callee_uncached(self, call: cst.Call) -> Optional[ForeignFunction]:
        func = call.func
        d = self._foreign_definition(func) if isinstance(func, (cst.Name, cst.Attribute)) else None
        if isinstance(d, ForeignFunction):
            return d
        if isinstance(d, ForeignClass):
            if self.foreign.lacks_relevant_method(d, "__init__"):  # type: ignore[union-attr]
                return None  # what it would find has no AMP code: `foreign_callee` drops it
            return self._foreign_method(d, "__init__")
        if isinstance(func, cst.Attribute):
            owner, name = func.value, func.attr.value
            if isinstance(owner, cst.Call) and isinstance(owner.func, cst.Name) and owner.func.value == "super":
                cls = self.self_class(call)  # type: ignore[attr-defined]
                return self._inherited_method(cls, name) if cls is not None else None
            if isinstance(owner, cst.Name) and owner.value in ("self", "cls"):
                cls = self.self_class(call)  # type: ignore[attr-defined]
                if cls is not None and self.lookup_method(cls, name) is None:  # type: ignore[attr-defined]
                    return self._inherited_method(cls, name)
                return None
            found = self._method_on_values(owner, name, relevant_only=True)
            if found is not None:
                return found
        if isinstance(func, (cst.Name, cst.Attribute)):
            return self._method_on_values(func, "__call__", relevant_only=True)
        return None

    def _method_on_values(self, owner: cst.CSTNode, name: str, relevant_only: bool = False) -> Optional[ForeignFunction]:
        """The method `name` of the objects `owner` may be (one method for all, else None).
        `relevant_only`: the caller drops a method without AMP code (`foreign_callee`), so the
        classes are not read when their texts show none (`lacks_relevant_method`)."""
        classes = []
        for v in self.possible_values(owner):  # type: ignore[attr-defined]
            fc = self._foreign_class_of(v)
            if fc is None:
                return None  # some value is not an instance of a class of the project: unknown
            if _annotated_value(v) and self.foreign.overridden_below(fc, name):  # type: ignore[union-attr]
                return None  # an object of a subclass may run another `name`: unknown
            classes.append(fc)
        if relevant_only and all(self.foreign.lacks_relevant_method(c, name) for c in classes):  # type: ignore[union-attr]
            return None
        methods = [self._foreign_method(c, name) for c in classes]
        if methods and all(m is not None and m.key == methods[0].key for m in methods):  # type: ignore[union-attr]
            return methods[0]
        return None

    def _foreign_returned(self, call: cst.Call, callee: ForeignFunction, index: Optional[int]) -> List[cst.BaseExpression]:
        """What a call to a function of another module returns, materialised with the call's
        arguments bound to its parameters (element `index` of a returned tuple). Memoised per
        call, callee and index: the materialised values are the same nodes for every query."""
        memo = self.__dict__.setdefault("_foreign_returned_memo", {})
        key = (call, callee.key, index)
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = self._foreign_returned_uncached(call, callee, index)
        return hit

    def _foreign_returned_uncached(self, call: cst.Call, callee: ForeignFunction, index: Optional[int]) -> List[cst.BaseExpression]:
        bindings = self._bind_foreign_arguments(call, callee)
        origin = Synthetic(callee.module, callee.owner, bindings)
        out: List[cst.BaseExpression] = []
        for val in callee.summary.returns:
            expr = self._materialize(val, origin)
            if expr is None:
                continue
            if index is not None:
                if not isinstance(expr, (cst.Tuple, cst.List)) or index >= len(expr.elements):
                    return []
                expr = expr.elements[index].value
            out.append(expr)
        return out

    def _bind_foreign_arguments(self, call: cst.Call, callee: ForeignFunction) -> Dict[str, cst.BaseExpression]:
        """Parameter name -> the argument expression `call` passes to it (when certain). One dict
        per call and callee (materialised values are cached by it)."""
        memo = self.__dict__.setdefault("_foreign_bindings_memo", {})
        key = (call, callee.key)
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = self._bind_foreign_arguments_uncached(call, callee)
        return hit

    def _bind_foreign_arguments_uncached(self, call: cst.Call, callee: ForeignFunction) -> Dict[str, cst.BaseExpression]:
        params = [p for p in callee.summary.params if p.kind in ("posonly", "pos")]
        kw_names = {p.name for p in callee.summary.params if p.kind in ("pos", "kwonly")}
        if callee.summary.is_method and isinstance(call.func, cst.Attribute) or callee.qual.endswith(".__init__"):
            params = params[1:]
        # the `**` parameter: the call's other keywords, each bound as `<name>__kw__<keyword>`,
        # and the parameter itself to the call (its mark: what it holds is known); not when the
        # call passes a `**mapping` or a `*sequence` (which may hold keywords too)
        spread = next((p.name for p in callee.summary.params if p.kind == "starstar"), None)
        extra: List[cst.Arg] = []
        out: Dict[str, cst.BaseExpression] = {}
        pos = 0
        for arg in call.args:
            if arg.star:
                spread = None
                if arg.star == "*":
                    break
                continue
            if arg.keyword is not None:
                if arg.keyword.value in kw_names:
                    out[arg.keyword.value] = arg.value
                else:
                    extra.append(arg)
                continue
            if pos < len(params):
                out[params[pos].name] = arg.value
            pos += 1
        if spread is not None:
            out[spread] = call
            for arg in extra:
                out[f"{spread}{KEYWORD_OF}{arg.keyword.value}"] = arg.value  # type: ignore[union-attr]
        return out

    def foreign_argument_values(self, func: cst.FunctionDef, param: str) -> List[cst.BaseExpression]:
        """What the other modules of the project pass to parameter `param` of `func` (a
        function of this file): materialised argument values (empty: unknown or none)."""
        if self.foreign is None or self.class_of(func) is not None:  # type: ignore[attr-defined]
            return []
        if not AMP_OBJECT_PARAM.search(param):
            return []  # only the objects AMP questions are about are looked for in other modules
        if self.function_of(func) is not None:  # type: ignore[attr-defined]
            return []  # a nested function: not importable
        calls = self.foreign.callers(self.path, func.name.value)
        if not calls:
            return []
        params = [*func.params.posonly_params, *func.params.params]
        index = next((i for i, p in enumerate(params) if p.name.value == param), None)
        out: List[cst.BaseExpression] = []
        for module, c in calls:
            val: Optional[Value] = c.keywords.get(param)
            if val is None and index is not None and index < len(c.positional):
                val = c.positional[index]
            if val is None:
                continue
            expr = self._materialize(val, Synthetic(module))
            if expr is not None:
                out.append(expr)
        return out


#: the expressions of materialised values, by text, shared by the models of one process (the
#: language server analyses a file again on every change; nodes are immutable). A value that
#: names a bound parameter is parsed anew: its binding shares the unchanged parts of the parse.
_PARSED: Dict[str, cst.BaseExpression] = {}


#: how the keywords a call passes to a `**` parameter are bound (`_bind_foreign_arguments`):
#: `kwargs__kw__dtype`, the `dtype=` keyword that `**kwargs` holds
KEYWORD_OF = "__kw__"
_SPREAD = re.compile(r"(, )?\*\*%s\.(\w+)(, )?" % PARAM)


def _spread(text: str, bindings: Dict[str, cst.BaseExpression]) -> Optional[str]:
    """`text` (a summary's value) with each `**__param__.kwargs` argument replaced by the
    keywords the call passed to that parameter (`dtype=__param__.kwargs__kw__dtype`, which the
    bindings then replace with the call's argument; none: the argument is dropped); None when
    the call's keywords are not known (it passes a `**mapping`, or is not bound)."""
    unknown = False

    def keywords(m: "re.Match[str]") -> str:
        nonlocal unknown
        name = m.group(2)
        if name not in bindings:
            unknown = True
            return m.group(0)
        prefix = f"{name}{KEYWORD_OF}"
        passed = [k[len(prefix):] for k in bindings if k.startswith(prefix)]
        if not passed:  # the argument goes, and one of the separators around it
            return ", " if m.group(1) and m.group(3) else ""
        return (m.group(1) or "") + ", ".join(f"{k}={PARAM}.{prefix}{k}" for k in passed) + (m.group(3) or "")

    out = _SPREAD.sub(keywords, text)
    return None if unknown else out


def _adopt(model, expr: cst.CSTNode, stamp: Synthetic, bindings: Optional[Dict[str, cst.BaseExpression]],
           replace: Optional[Callable[[cst.CSTNode], Optional[cst.CSTNode]]]) -> Optional[cst.CSTNode]:
    """A copy of `expr` (a parse kept in `_PARSED`) made of new nodes, each recorded as
    synthetic with its parent: a node is one model's, once. `replace` puts the bound arguments
    in (`__param__.p` -> the argument): they are nodes of the file, used as they are, and they
    keep their parents."""
    synthetic = model._synthetic
    adopt = model._index.adopt

    def each(node: cst.CSTNode, parent: Optional[cst.CSTNode]) -> None:
        synthetic[node] = stamp
        if parent is not None:
            adopt(node, parent)

    return copied(expr, {id(b) for b in (bindings or {}).values()}, each, replace)


def _imported_name(call: cst.CSTNode) -> Optional[str]:
    """For `__imported__("pkg.mod.name")`: the qualified name."""
    if isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value == IMPORTED \
            and len(call.args) == 1 and isinstance(call.args[0].value, cst.SimpleString):
        return literal_string(call.args[0].value)
    return None


def synthetic_leaf(expr: cst.CSTNode) -> bool:
    """A canonical name that stands for nothing more (`__unknown__`, an unbound parameter)."""
    text = dotted(expr)
    return text is not None and text.split(".")[0] in (UNKNOWN, PARAM)


def _annotated_value(v: cst.CSTNode) -> bool:
    """`v` is what a parameter holds (`_annotated_class`), or a `.cuda()`, `.to()`, `.train()`
    or `.eval()` of it: its class is the annotation's, not a constructor's."""
    while isinstance(v, cst.Call) and isinstance(v.func, cst.Attribute) \
            and v.func.attr.value in ("cuda", "to", "train", "eval"):
        v = v.func.value
    return isinstance(v, cst.Name)


__all__ = ["Definition", "Foreign", "ForeignClass", "ForeignConstant", "ForeignFacts", "ForeignFunction",
           "ForeignModule", "Synthetic", "MARKERS", "KNOWN_BASES", "synthetic_leaf"]
