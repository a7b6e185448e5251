"""Conditions: the values a name can hold when every one of them is known, and the tests those
values decide (a GradScaler's `enabled=(args.dtype == "float16")` when `--dtype` only takes
fp16, bf16 or fp32: never true).

* `known_values(expr)`: the literal values (strings, numbers, True/False/None) `expr` may hold,
  when every source of them is seen: a literal; a conditional expression's branches; a name
  whose every binding in its scope is a plain assignment of known values; a parameter every
  call of this file passes (or leaves at its default), of a function not used as a value; a
  `self.` attribute every assignment of which is in this file's classes (no base of another
  module, no dataclass, no `obj.<attr> = ...` elsewhere); a command-line option (`args.<name>`,
  `args` every value of which is this file's `parser.parse_args()`) declared with `choices=`
  (its default and its choices); and, where those leave it unknown, a key a `{"a": ..., "b":
  ...}[key]` table of the same function read before on every path (else a KeyError: `key` is
  one of the table's keys) with nothing between that may rebind it. None when any value may be
  something else: a configuration file, an option without `choices=`, `**kwargs`, a caller not
  seen, an attribute a base class of another module may set.
* `test_value(expr)`: True or False when the test `expr` is always or never true by those
  values (`x == "lit"`, `x != "lit"`, `x in ("a", "b")`, `x not in ...`, `not`, `and`, `or`);
  None when not known. A plain name is not judged (only comparisons).
* `never_true_reason(expr)`: for a test that is never true, the name compared and its values
  (what a message says); a `NeverTrue` holds the test with both (`never_true_float16_gate`
  gives one for a GradScaler's `enabled=`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import libcst as cst

from ampfix.model.syntax import call_name, literal_bool, literal_string
from ampfix.model.tree import dotted
from ampfix.model.training import calls_under

MAX_KNOWN_DEPTH = 8
_UNKNOWN = None
_COMPARE = (cst.Equal, cst.NotEqual, cst.In, cst.NotIn)


def literal_value(node: cst.CSTNode) -> Tuple[bool, object]:
    """(True, value) for a literal string, integer, True/False/None; (False, None) otherwise."""
    s = literal_string(node)
    if s is not None:
        return True, s
    if isinstance(node, cst.Integer):
        return True, int(node.value.replace("_", ""), 0)
    if isinstance(node, cst.Name) and node.value in ("True", "False", "None"):
        return True, {"True": True, "False": False, "None": None}[node.value]
    return False, None


@dataclass(frozen=True)
class NeverTrue:
    """A test that can never be true (`test_value` False): the test, the expression it compares
    (as written) and every value that expression may hold (`never_true_reason`)."""

    test: cst.BaseExpression
    compared: str
    values: Tuple[object, ...]


class Conditions:
    """Known values and the tests they decide (a part of `AmpModel`)."""

    # ---------------------------------------------------------------- tests
    def test_value(self, expr: Optional[cst.CSTNode]) -> Optional[bool]:
        """True/False when `expr` is always/never true by the known values of what it compares."""
        if expr is None:
            return None
        b = literal_bool(expr)
        if b is not None:
            return b
        if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not):
            inner = self.test_value(expr.expression)
            return None if inner is None else not inner
        if isinstance(expr, cst.BooleanOperation):
            left, right = self.test_value(expr.left), self.test_value(expr.right)
            if isinstance(expr.operator, cst.And):
                return False if False in (left, right) else True if left is right is True else None
            return True if True in (left, right) else False if left is right is False else None
        decided = self._comparison(expr)
        return None if decided is None else decided[0]

    def never_true_reason(self, expr: Optional[cst.CSTNode]) -> Optional[Tuple[str, List[object]]]:
        """For a test that is never true (`test_value` False): the expression compared and its
        known values, from the first comparison that decides it."""
        if expr is None or self.test_value(expr) is not False:
            return None
        stack = [expr]
        while stack:
            n = stack.pop()
            decided = self._comparison(n)
            if decided is not None:
                return self.code(decided[1]), decided[2]  # type: ignore[attr-defined]
            if isinstance(n, cst.BooleanOperation):
                stack += [n.right, n.left]
            elif isinstance(n, cst.UnaryOperation):
                stack.append(n.expression)
        return None

    def _comparison(self, expr: cst.CSTNode) -> Optional[Tuple[bool, cst.BaseExpression, List[object]]]:
        """(outcome, the side compared, its values) for `x == lit`, `lit == x`, `x != lit`,
        `x in (lits)`, `x not in (lits)` whose outcome every known value of `x` decides alike."""
        if not isinstance(expr, cst.Comparison) or len(expr.comparisons) != 1:
            return None
        op, right = expr.comparisons[0].operator, expr.comparisons[0].comparator
        if not isinstance(op, _COMPARE):
            return None
        if isinstance(op, (cst.In, cst.NotIn)):
            if not isinstance(right, (cst.Tuple, cst.List, cst.Set)):
                return None
            pairs = [literal_value(e.value) for e in right.elements if not isinstance(e, cst.StarredElement)]
            if len(pairs) != len(right.elements) or not all(ok for ok, _ in pairs):
                return None
            side, members = expr.left, [v for _, v in pairs]
        else:
            ok, lit = literal_value(right)
            side = expr.left
            if not ok:
                ok, lit = literal_value(expr.left)
                side = right
            if not ok:
                return None
            members = [lit]
        values = self.known_values(side)
        if not values:
            return None
        hits = {any(_same(v, m) for m in members) for v in values}
        if len(hits) != 1:
            return None
        outcome = hits.pop() == isinstance(op, (cst.Equal, cst.In))
        return outcome, side, values

    # ---------------------------------------------------------------- values
    def known_values(self, expr: cst.CSTNode) -> Optional[List[object]]:
        """Every literal value `expr` may hold (see the module docstring), in order, without
        repeats; None when some value is not known."""
        leaves = self._known_leaves(expr, 0)
        if leaves is None:
            leaves = self._table_keys_before(expr)
        if leaves is None:
            return None
        out: List[object] = []
        for leaf in leaves:
            ok, v = literal_value(leaf)
            if not ok:
                return None
            if not any(_same(v, o) for o in out):
                out.append(v)
        return out

    def _known_leaves(self, expr: cst.CSTNode, depth: int) -> Optional[List[cst.CSTNode]]:
        """The expressions `expr` may evaluate to when every source is seen (literals, calls),
        names followed through complete bindings; None when unknown."""
        if depth > MAX_KNOWN_DEPTH:
            return None
        if literal_value(expr)[0]:
            return [expr]
        if isinstance(expr, cst.IfExp):
            a, b = self._known_leaves(expr.body, depth + 1), self._known_leaves(expr.orelse, depth + 1)
            return None if a is None or b is None else a + b
        if isinstance(expr, cst.Call):
            return [expr] if call_name(expr) == "parse_args" and isinstance(expr.func, cst.Attribute) else None
        key = dotted(expr)
        if key is None or self.is_synthetic(expr):  # type: ignore[attr-defined]
            return None
        if isinstance(expr, cst.Name):
            return self._name_leaves(expr, depth)
        head, attr = expr.value, expr.attr.value  # type: ignore[attr-defined]
        if self._assigned_elsewhere(attr, own=isinstance(head, cst.Name) and head.value == "self"):
            return None
        if isinstance(head, cst.Name) and head.value == "self":
            return self._self_attribute_leaves(expr, attr, depth)
        return self._option_leaves(head, attr, depth)

    def _name_leaves(self, expr: cst.Name, depth: int) -> Optional[List[cst.CSTNode]]:
        name = expr.value
        scope = self.binding_scope(name, self.scope_of(expr))  # type: ignore[attr-defined]
        if scope is None or name in self._index.imports.get(scope, {}) \
                or any(name in names for names in self._index.declared.values()):  # type: ignore[attr-defined]
            return None
        out: List[cst.CSTNode] = []
        for node, target, value in self._index.assignments:  # type: ignore[attr-defined]
            if name not in _target_names(target) or self.scope_of(node) is not scope:  # type: ignore[attr-defined]
                continue
            if value is None or not (isinstance(target, cst.Name) and isinstance(node, (cst.Assign, cst.AnnAssign))):
                return None  # `for x in ...`, `x += ...`, `a, x = ...`, `with ... as x`
            found = self._known_leaves(value, depth + 1)
            if found is None:
                return None
            out += found
        param = self._param_of(scope, name)  # type: ignore[attr-defined]
        if param is not None:
            passed = self._parameter_leaves(scope, param, depth)
            if passed is None:
                return None
            out += passed
        elif any(isinstance(f, (cst.FunctionDef, cst.ClassDef)) and f.name.value == name  # type: ignore[attr-defined]
                 and self.scope_of(f) is scope for f in self.nodes_of(cst.FunctionDef) + self.nodes_of(cst.ClassDef)):  # type: ignore[attr-defined]
            return None
        return out or None

    def _parameter_leaves(self, func: cst.CSTNode, param: cst.Param, depth: int) -> Optional[List[cst.CSTNode]]:
        """What every call of this file passes for `param` (its default where a call leaves it);
        None for a lambda, a function used as a value, one no call of this file runs, a call
        with `*args`/`**kwargs`."""
        if not isinstance(func, cst.FunctionDef) or func.name.value in self.functions_used_as_values():  # type: ignore[attr-defined]
            return None
        target, cls = func.name.value, self.class_of(func)  # type: ignore[attr-defined]
        if target == "__init__" and cls is not None:  # `Trainer(args)` runs `Trainer.__init__`
            target = cls.name.value
            callers = [c for c in self.calls if self._class_named(c.func) is cls]  # type: ignore[attr-defined]
        else:
            callers = self.callers(func)  # type: ignore[attr-defined]
        if not callers or any(n.value == target and not self._called_or_defined(n)
                              for n in self.nodes_of(cst.Name)):  # type: ignore[attr-defined]
            return None  # passed on, stored, subclassed: run by code not seen
        out: List[cst.CSTNode] = []
        for call in callers:
            if any(a.star for a in call.args):
                return None
            passed = _bind_construction(call, func, param) if target != func.name.value \
                else self.bind_arguments(call, func).get(param.name.value)  # type: ignore[attr-defined]
            if passed is None and param.default is None:
                return None
            found = self._known_leaves(passed if passed is not None else param.default, depth + 1)
            if found is None:
                return None
            out += found
        return out

    def _called_or_defined(self, name: cst.Name) -> bool:
        parent = self.parent(name)  # type: ignore[attr-defined]
        if isinstance(parent, (cst.FunctionDef, cst.ClassDef)) and parent.name is name:
            return True
        if isinstance(parent, cst.Call) and parent.func is name:
            return True
        return isinstance(parent, cst.Attribute) and parent.attr is name  # `obj.name`: another object's

    def _self_attribute_leaves(self, expr: cst.Attribute, attr: str, depth: int) -> Optional[List[cst.CSTNode]]:
        cls = self.self_class(expr)  # type: ignore[attr-defined]
        if cls is None or self._has_unseen_bases(cls) or any(  # type: ignore[attr-defined]
                d.decorator for c in self.related_classes(cls) for d in c.decorators):  # type: ignore[attr-defined]
            return None  # a base of another module, a dataclass: set where this file does not show
        out: List[cst.CSTNode] = []
        for node, target, value in self._index.assignments:  # type: ignore[attr-defined]
            if dotted(target) == f"self.{attr}" and self.self_class(node) in self.related_classes(cls):  # type: ignore[attr-defined]
                if value is None or not isinstance(node, (cst.Assign, cst.AnnAssign)):
                    return None
        for value in self.attribute_values(cls, attr):  # type: ignore[attr-defined]
            found = self._known_leaves(value, depth + 1)
            if found is None:
                return None
            out += found
        return out or None

    def _assigned_elsewhere(self, attr: str, own: bool) -> bool:
        """Some assignment of this file sets `<obj>.<attr>` on an object other than `self` (or,
        for an option, any object): `trainer.dtype = ...`, `args.dtype = ...`; `setattr` too."""
        for _, target, _ in self._index.assignments:  # type: ignore[attr-defined]
            if isinstance(target, cst.Attribute) and target.attr.value == attr \
                    and not (own and isinstance(target.value, cst.Name) and target.value.value == "self"):
                return True
        return any(call_name(c) in ("setattr", "set_defaults") for c in self.calls)  # type: ignore[attr-defined]

    def _option_leaves(self, head: cst.BaseExpression, attr: str, depth: int) -> Optional[List[cst.CSTNode]]:
        """`args.<attr>` where every value of `args` is this file's `parser.parse_args()`: the
        default and the choices of `add_argument("--<attr>", ..., choices=[...])`."""
        from ampfix.model.summarize import option_value_set

        heads = self._known_leaves(head, depth + 1)
        if not heads or not all(isinstance(h, cst.Call) for h in heads):
            return None
        decls = [c for c in self.calls if call_name(c) == "add_argument" and _declares(c, attr)]  # type: ignore[attr-defined]
        if not decls:
            return None
        out: List[cst.CSTNode] = []
        for call in decls:
            kw = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
            if any(a.star for a in call.args) or "nargs" in kw or "type" in kw and dotted(kw["type"]) != "str" \
                    or literal_string(kw.get("action")) not in (None, "store", "store_true", "store_false"):
                return None  # `type=str.lower`, `nargs="+"`, `action="append"`: values of its own
            for v in option_value_set(self, call):
                if v is None:
                    return None
                out.append(v)
        return out

    def _table_keys_before(self, expr: cst.CSTNode) -> Optional[List[cst.CSTNode]]:
        """The keys of a `{"a": ..., "b": ...}[<expr>]` table read in a statement that runs
        before `expr` on every path of its function (an earlier statement of a block that holds
        it, not in a `try`), when nothing between may rebind `expr` (no assignment to it or to
        its head in the function, no call of this file's functions in between)."""
        key, func = dotted(expr), self.function_of(expr)  # type: ignore[attr-defined]
        if key is None or func is None:
            return None
        heads = {key.rsplit(".", i)[0] for i in range(key.count(".") + 1)} - {"self"}
        if any(dotted(t) in heads for n, t, _ in self._index.assignments  # type: ignore[attr-defined]
               if self.function_of(n) is func):  # type: ignore[attr-defined]
            return None
        stmt = self.statement_of(expr)  # type: ignore[attr-defined]
        while stmt is not None and stmt is not func:
            block = self.block_of(stmt)  # type: ignore[attr-defined]
            if block is None:
                break
            body = list(block.body)
            at = next(i for i, s in enumerate(body) if s is stmt)
            for i in range(at - 1, -1, -1):
                keys = _table_read(body[i], key)
                if keys is not None:
                    between = body[i + 1:at + 1]
                    if self._in_try(body[i], func) or any(self.callees(c) for s in between  # type: ignore[attr-defined]
                                                          for c in calls_under(s)):
                        return None
                    return keys
            stmt = next((a for a in self.ancestors(block) if isinstance(a, cst.BaseCompoundStatement)), None)  # type: ignore[attr-defined]
        return None

    def _in_try(self, stmt: cst.CSTNode, func: cst.CSTNode) -> bool:
        for a in self.ancestors(stmt):  # type: ignore[attr-defined]
            if a is func:
                return False
            if isinstance(a, (cst.Try, cst.TryStar)):
                return True
        return False


def _same(a: object, b: object) -> bool:
    return type(a) is type(b) and a == b or (isinstance(a, (int, float)) and isinstance(b, (int, float))
                                             and not isinstance(a, bool) and not isinstance(b, bool) and a == b)


def _target_names(target: cst.CSTNode) -> List[str]:
    from ampfix.model.tree import target_names

    return target_names(target)


def _bind_construction(call: cst.Call, init: cst.FunctionDef, param: cst.Param) -> Optional[cst.BaseExpression]:
    """What the construction `call` passes to `param` of the class's `__init__` (after `self`)."""
    positional = [*init.params.posonly_params, *init.params.params][1:]
    for i, a in enumerate(call.args):
        if a.keyword is not None and a.keyword.value == param.name.value:
            return a.value
        if a.keyword is None and i < len(positional) and positional[i] is param:
            return a.value
    return None


def _declares(call: cst.Call, attr: str) -> bool:
    """`add_argument("--attr", ...)` / `add_argument("-a", "--attr")` / `dest="attr"`."""
    for a in call.args:
        if a.keyword is not None and a.keyword.value == "dest":
            return literal_string(a.value) == attr
    return any((literal_string(a.value) or "").startswith("--")
               and (literal_string(a.value) or "")[2:].replace("-", "_") == attr for a in call.args if a.keyword is None)


def _table_read(stmt: cst.CSTNode, key: str) -> Optional[List[cst.CSTNode]]:
    """The literal keys of the table `stmt` reads with `key`: `x = {"a": ..., ...}[key]` (the
    statement's one assignment, whose value is that read); None otherwise."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    small = stmt.body[0]
    value = small.value if isinstance(small, (cst.Assign, cst.AnnAssign, cst.Expr)) else None
    if not (isinstance(value, cst.Subscript) and isinstance(value.value, cst.Dict) and len(value.slice) == 1
            and isinstance(value.slice[0].slice, cst.Index) and dotted(value.slice[0].slice.value) == key):
        return None
    keys = []
    for el in value.value.elements:
        if not isinstance(el, cst.DictElement) or literal_string(el.key) is None:
            return None
        keys.append(el.key)
    return keys or None
