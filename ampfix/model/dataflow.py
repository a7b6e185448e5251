"""Where a value goes: the names bound from it in its function, the places that read it, and
whether it is ever combined with some factor.

`derived_names(source)`: the names of `source`'s function that are bound, after `source`, to
values computed from it: assignments, augmented assignments (`norm += g.pow(2).sum()`), `for`
targets and comprehension variables over it, lists it is appended to; to a fixed point. Name
based and flow-insensitive after the source (a name re-bound later to something else stays
derived), which is what a rule wants for "is this value ever divided by the scale?": it may
over-approximate where the value goes, never miss a place. A value that only goes through a
scale-invariant function (`g.sign()`) stops there.

`value_reads(source)`: the expressions that read the value: `source` itself and every read of a
derived name after it; a value returned from a function of this file goes on at the calls to
that function (`value_escapes` tells where it leaves what this file shows).

`combined_with(source, factor)`: some read of the value is multiplied or divided
(`*`, `/`, `.mul(...)`, `torch.div(...)`, `torch._foreach_mul_(...)`) by an expression that
`factor` accepts. `reads_get_scale(expr)`: `expr` contains `X.get_scale()` or reads a name
computed from one (`inv_scale = 1. / scaler.get_scale()`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Set, Tuple

import libcst as cst

from ampfix.model.facet import Facet
from ampfix.model.syntax import call_name, get_arg, literal_string
from ampfix.model.tree import dotted, nodes_under, target_names

if TYPE_CHECKING:  # pragma: no cover
    from ampfix.model import AmpModel

Site = Tuple[cst.CSTNode, Tuple[str, ...], Tuple[cst.CSTNode, ...]]  # (node, names bound, value expressions)
SCALE_INVARIANT = {"sign", "sgn", "isfinite", "isnan", "isinf", "ne", "eq"}
_INVARIANT_FUNCS = {f"{m}.{f}" for m in ("torch", "math", "numpy") for f in SCALE_INVARIANT}
_VALUE_KEEPING = {"item", "float", "double", "detach", "cpu", "clone"}
MUL_DIV_METHODS = {"mul", "mul_", "div", "div_", "true_divide", "true_divide_", "multiply", "divide"}
MUL_DIV_FUNCS = {"torch.mul", "torch.div", "torch.true_divide", "torch.multiply", "torch.divide",
                 "torch._foreach_mul", "torch._foreach_mul_", "torch._foreach_div", "torch._foreach_div_"}
APPEND_METHODS = {"append", "extend", "insert", "add"}
MAX_RETURN_HOPS = 3


class Dataflow(Facet):
    """Value flow within a function and through `return` (`model.dataflow`)."""

    def __init__(self, model: "AmpModel") -> None:
        super().__init__(model)
        self._sites: Dict[cst.CSTNode, List[Site]] = {}
        self._names_in_scope: Optional[Dict[cst.CSTNode, List[cst.Name]]] = None
        self._bound_names: Set[cst.Name] = set()

    # ---------------------------------------------------------------- binding sites
    def _binding_sites(self, scope: cst.CSTNode) -> List[Site]:
        cached = self._sites.get(scope)
        if cached is not None:
            return cached
        sites: List[Site] = []

        def add(node: cst.CSTNode, target: cst.CSTNode, *values: Optional[cst.CSTNode]) -> None:
            names = tuple(target_names(target))
            self._bound_names.update(_bound_under(target))
            vals = tuple(v for v in values if v is not None)
            if names and vals:
                sites.append((node, names, vals))

        for node in self.model.nodes_of(cst.Assign, cst.AnnAssign, cst.AugAssign, cst.NamedExpr, cst.For, cst.CompFor,
                                  cst.Call):
            if self.model.scope_of(node) is not scope:
                continue
            if isinstance(node, cst.Assign):
                for t in node.targets:
                    add(node, t.target, node.value)
            elif isinstance(node, cst.AnnAssign):
                add(node, node.target, node.value)
            elif isinstance(node, cst.AugAssign):
                add(node, node.target, node.value, node.target)
            elif isinstance(node, cst.NamedExpr):
                add(node, node.target, node.value)
            elif isinstance(node, (cst.For, cst.CompFor)):
                add(node, node.target, node.iter)
            elif isinstance(node, cst.Call) and call_name(node) in APPEND_METHODS \
                    and isinstance(node.func, cst.Attribute) and isinstance(node.func.value, cst.Name):
                sites.append((node, (node.func.value.value,), tuple(a.value for a in node.args)))
        self._sites[scope] = sites
        return sites

    def _reads(self, expr: cst.CSTNode, derived: Set[str]) -> bool:
        """`expr` reads a derived name outside a scale-invariant call."""
        return any(n.value in derived and not self._invariant_use(n) for n in _names_under(expr)
                   if n not in self._bound_names and self._is_read(n))

    def _invariant_use(self, node: cst.CSTNode) -> bool:
        """`node` is consumed by a scale-invariant function (`g.sign()`, `torch.sign(g)`,
        `math.isfinite(norm)`), also through conversions that keep its value (`norm.item()`,
        `float(norm)`)."""
        node = self._converted(node)
        parent = self.model.parent(node)
        if isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value in SCALE_INVARIANT:
            return isinstance(self.model.parent(parent), cst.Call)
        if isinstance(parent, cst.Arg):
            call = self.model.parent(parent)
            return isinstance(call, cst.Call) and bool(self.model.qualnames(call.func) & _INVARIANT_FUNCS)
        return False

    def _converted(self, node: cst.CSTNode) -> cst.CSTNode:
        """The outermost conversion of `node` that keeps its value: `node.item()`, `.float()`,
        `.detach()`, `.cpu()`, `float(node)` (else `node` itself)."""
        while True:
            parent = self.model.parent(node)
            if isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value in _VALUE_KEEPING:
                call = self.model.parent(parent)
                if not (isinstance(call, cst.Call) and call.func is parent and not call.args):
                    return node
                node = call
            elif isinstance(parent, cst.Arg):
                call = self.model.parent(parent)
                if not (isinstance(call, cst.Call) and dotted(call.func) == "float" and len(call.args) == 1):
                    return node
                node = call
            else:
                return node

    def measures_only(self, clip: cst.Call) -> bool:
        """The clip call `clip` has an infinite threshold (`clip_grad_norm_(params,
        float("inf"))`, `max_norm=math.inf`): it changes no gradient that a GradScaler would not
        skip anyway, and only measures their norm."""
        arg = get_arg(clip, 1, "clip_value" if call_name(clip) == "clip_grad_value_" else "max_norm")
        if arg is None:
            return False
        v = arg.value
        if isinstance(v, cst.Call) and call_name(v) == "float" and len(v.args) == 1:
            text = literal_string(v.args[0].value)
            return text is not None and text.strip().lower() in ("inf", "+inf", "infinity")
        return bool(self.model.qualnames(v) & {"math.inf", "torch.inf", "numpy.inf"})

    def _invariant_call(self, call: cst.Call) -> bool:
        """`call` is itself scale-invariant (`g.isfinite()`, `torch.isnan(g)`, `math.isinf(x)`)."""
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in SCALE_INVARIANT:
            return True
        return bool(self.model.qualnames(call.func) & _INVARIANT_FUNCS)

    def _is_read(self, name: cst.Name) -> bool:
        parent = self.model.parent(name)
        if isinstance(parent, cst.Attribute) and parent.attr is name:
            return False
        if isinstance(parent, cst.Arg) and parent.keyword is name:
            return False
        return not isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.Param, cst.ImportAlias, cst.AsName))

    # ---------------------------------------------------------------- queries
    def derived_names(self, source: cst.CSTNode, seeds: Tuple[str, ...] = ()) -> Set[str]:
        """The names of `source`'s function bound from its value (see the module docstring).
        `seeds`: names that hold the value from the start (a parameter it is passed to)."""
        scope = self.model.scope_of(source)
        sites = self._binding_sites(scope)
        start = self.model._index.order_of(source)
        derived: Set[str] = set(seeds)
        for node, names, values in sites:
            if any(v is source or self.model.is_ancestor(v, source) for v in values):
                derived.update(names)
        changed = True
        while changed:
            changed = False
            for node, names, values in sites:
                if self.model._index.order_of(node) < start or set(names) <= derived:
                    continue
                if any(self._reads(v, derived) for v in values):
                    derived.update(names)
                    changed = True
        return derived

    def raw_names(self, source: cst.CSTNode) -> Set[str]:
        """The derived names that hold `source`'s value itself, not a value computed from it:
        bound from it as it is, a subscript of it, or a loop over it (`grads = autograd.grad(...)`,
        `(g,) = ...`, `g = grads[0]`, `for p, g in zip(params, grads)`)."""
        scope = self.model.scope_of(source)
        start = self.model._index.order_of(source)
        raw: Set[str] = set()

        def plain(v: cst.CSTNode) -> bool:
            while isinstance(v, cst.Subscript):
                v = v.value
            if v is source or (isinstance(v, cst.Name) and v.value in raw):
                return True
            if isinstance(v, cst.Call) and isinstance(v.func, cst.Name) \
                    and v.func.value in ("zip", "enumerate", "list", "tuple", "reversed"):
                return any(plain(a.value) for a in v.args)
            if isinstance(v, (cst.Tuple, cst.List)):
                return any(plain(e.value) for e in v.elements)
            return False

        changed = True
        while changed:
            changed = False
            for node, names, values in self._binding_sites(scope):
                if self.model._index.order_of(node) >= start or any(v is source or self.model.is_ancestor(v, source) for v in values):
                    if not set(names) <= raw and isinstance(node, (cst.Assign, cst.For, cst.CompFor)) \
                            and any(plain(v) for v in values):
                        raw.update(names)
                        changed = True
        return raw

    def value_reads(self, source: cst.CSTNode, hops: int = 0) -> List[cst.CSTNode]:
        """`source` and every read of a name derived from it, after it in its function; when
        the value is returned from a function of this file, the reads at its callers too."""
        derived = self.derived_names(source)
        scope = self.model.scope_of(source)
        start = self.model._index.order_of(source)
        reads: List[cst.CSTNode] = [source]
        for n in self._scope_names(scope):
            if n.value in derived and self.model._index.order_of(n) > start and n not in self._bound_names \
                    and self._is_read(n) and not self._invariant_use(n):
                reads.append(n)
        if hops < MAX_RETURN_HOPS and isinstance(scope, cst.FunctionDef):
            for call in self._returned_at(scope, reads):
                reads.extend(self.value_reads(call, hops + 1))
        return reads

    def _returned_at(self, func: cst.FunctionDef, reads: List[cst.CSTNode]) -> List[cst.Call]:
        """The calls to `func` when one of `reads` is (part of) a returned value."""
        for r in reads:
            ret = next((a for a in self.model.ancestors(r) if isinstance(a, (cst.Return, cst.FunctionDef))), None)
            if isinstance(ret, cst.Return):
                return list(self.model.callers(func))
        return []

    def value_escapes(self, source: cst.CSTNode) -> List[cst.CSTNode]:
        """Reads of the value itself (`raw_names`) that hand it to code this analysis does not
        follow: an argument of a function of this file or of a call whose result is dropped
        (`set_grads(g, params)`), a store into `.grad` (`p.grad = g`: the optimizer's), a
        `yield`, the value returned from a function no call of this file reaches."""
        out: List[cst.CSTNode] = []
        raw = self.raw_names(source)
        for r in self.value_reads(source):
            if r is not source and not (isinstance(r, cst.Name) and r.value in raw):
                continue  # a value computed from it (a penalty) does not escape by being logged
            child = r
            for anc in self.model.ancestors(r):
                if isinstance(anc, (cst.SimpleStatementLine, cst.BaseCompoundStatement, cst.Lambda)):
                    break
                if isinstance(anc, cst.Arg) and isinstance(self.model.parent(anc), cst.Call):
                    call = self.model.parent(anc)
                    if self.model.callees(call) or isinstance(self.model.parent(call), cst.Expr):
                        out.append(r)  # a function of this file, or a call whose result is dropped
                        break
                if isinstance(anc, (cst.Assign, cst.AugAssign, cst.AnnAssign)) and child is getattr(anc, "value", None):
                    targets = [t.target for t in anc.targets] if isinstance(anc, cst.Assign) else [anc.target]
                    if any(isinstance(t, cst.Attribute) and t.attr.value == "grad" for t in targets):
                        out.append(r)
                    break
                if isinstance(anc, cst.Yield):
                    out.append(r)
                    break
                if isinstance(anc, cst.Return):
                    func = self.model.function_of(anc)
                    whole = anc.value is r or (isinstance(anc.value, (cst.Tuple, cst.List))
                                               and any(e.value is r for e in anc.value.elements))
                    if whole and (func is None or not self.model.callers(func)):
                        out.append(r)
                    break
                child = anc
        return out

    def feeds_decision(self, source: cst.CSTNode) -> bool:
        """Some read of `source`'s value (`value_reads`) decides something in training: it is in
        the test of an `if`/`while`/conditional expression/`assert`, in a comparison, or in the
        arguments of a call that changes gradients (`p.grad.mul_(coef)`, `torch._foreach_mul_`,
        a clip). A value that is only printed, logged, stored or returned decides nothing this
        file shows; nor does a scale-invariant one (`torch.isfinite(p.grad)`, `g.isnan()`), or one
        only such a call reads (`torch.isfinite(p.grad.norm())`): it is the same whatever the
        GradScaler's scale (the names derived from `source` are tested so in `value_reads`)."""
        if isinstance(source, cst.Call) and self._invariant_call(source):
            return False
        for r in self.value_reads(source):
            child = r
            for anc in self.model.ancestors(r):
                if self._invariant_use(child):
                    break  # `math.isfinite(norm.item())`, `g.isnan()`: the same whatever the scale
                if isinstance(anc, (cst.SimpleStatementLine, cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                    break
                if isinstance(anc, (cst.If, cst.While, cst.IfExp, cst.Assert)) and child is anc.test:
                    return True
                if isinstance(anc, cst.BaseCompoundStatement):
                    break
                if isinstance(anc, cst.Comparison):
                    return True
                if isinstance(anc, cst.Call) and child is not anc.func and _changes_gradients(self.model, anc):
                    return True
                child = anc
        return False

    def combined_with(self, source: cst.CSTNode, factor: Callable[[cst.CSTNode], bool]) -> bool:
        """Some read of `source`'s value is multiplied or divided by an expression `factor`
        accepts (see the module docstring)."""
        for r in self.value_reads(source):
            child = r
            for anc in self.model.ancestors(r):
                if isinstance(anc, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                    break
                if isinstance(anc, cst.BinaryOperation) and isinstance(anc.operator, (cst.Multiply, cst.Divide)):
                    other = anc.right if child is anc.left else anc.left
                    if factor(other):
                        return True
                if isinstance(anc, cst.Call):
                    if call_name(anc) in MUL_DIV_METHODS and isinstance(anc.func, cst.Attribute):
                        others = [a.value for a in anc.args] if child is anc.func else [anc.func.value]
                        if any(factor(o) for o in others):
                            return True
                    if self.model.qualnames(anc.func) & MUL_DIV_FUNCS:
                        if any(factor(a.value) for a in anc.args if a.value is not child):
                            return True
                child = anc
        return False

    def reads_get_scale(self, expr: cst.CSTNode) -> bool:
        """`expr` contains `X.get_scale()` (any receiver) or reads a name of its function
        computed from one (`inv_scale = 1. / scaler.get_scale()`)."""
        calls = [c for c in nodes_under(expr, cst.Call) if call_name(c) in ("get_scale", "_get_scale_async")]
        if calls:
            return True
        scope = self.model.scope_of(expr)
        derived: Set[str] = set()
        for c in self.model.calls_in_scope(scope):
            if call_name(c) in ("get_scale", "_get_scale_async"):
                derived |= self.derived_names(c)
        return bool(derived) and any(n.value in derived for n in _names_under(expr) if self._is_read(n))

    def _scope_names(self, scope: cst.CSTNode) -> List[cst.Name]:
        if self._names_in_scope is None:
            by_scope: Dict[cst.CSTNode, List[cst.Name]] = {}
            for n in self.model.nodes_of(cst.Name):
                by_scope.setdefault(self.model.scope_of(n), []).append(n)  # type: ignore[arg-type]
            self._names_in_scope = by_scope
        self._binding_sites(scope)  # fills the bound names of this scope
        return self._names_in_scope.get(scope, [])


def _changes_gradients(model, call: cst.Call) -> bool:
    """`call` writes gradients: a method of a `.grad` tensor (`p.grad.mul_(c)`,
    `p.grad.data.div_(c)`), a `torch._foreach_*` function, or a torch clip."""
    func = call.func
    if isinstance(func, cst.Attribute):
        obj = func.value
        while isinstance(obj, cst.Attribute) and obj.attr.value == "data":
            obj = obj.value
        if isinstance(obj, cst.Attribute) and obj.attr.value == "grad":
            return True
    names = model.qualnames(func)
    return any(n.startswith("torch._foreach_") or n.startswith("torch.nn.utils.clip_grad") for n in names)


def _names_under(node: cst.CSTNode) -> List[cst.Name]:
    return nodes_under(node, cst.Name)  # type: ignore[return-value]


def _bound_under(target: cst.CSTNode) -> List[cst.Name]:
    """The Name nodes an assignment target binds (not the `p` of `p.grad = ...`)."""
    if isinstance(target, cst.Name):
        return [target]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for el in target.elements for n in _bound_under(el.value)]
    if isinstance(target, cst.StarredElement):
        return _bound_under(target.value)
    return []


__all__ = ["Dataflow"]
