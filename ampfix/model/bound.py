"""Bound: what a name or a `self.` attribute may be at a point of its function, on every path.

Fixes that insert code ask this before they insert it (`insertion_problem`): every name the
new code reads must be assigned on every path that reaches the insertion point, and an object
the new code calls a method on must not be None on any of them. Without the proof a fix moves,
becomes unsafe with the reason, or is not offered.

One forward pass over a scope's statements (if/elif/else, for/while with their back edge and
`break`/`continue`, try/except/else/finally, with, match, `return`/`raise`) keeps, for every
*key* (a plain name, or a dotted `self.x` / `args.x` the code assigns or tests), the set of
things it may be at each statement boundary, as *tags*:

* "unbound": not assigned on some path (reading it raises NameError, UnboundLocalError or
  AttributeError);
* "none": None on some path (a method call on it raises AttributeError);
* "value": anything else.

Where they start: a parameter is a value (or None when it defaults to None); a local is
unbound; a global is a value when the module binds it somewhere (None too when one of those
bindings is None); a builtin is a value. `self.x` in a method is what the `__init__` of its
class (or of a base class of this file) leaves it, or what the class body assigns; anything
else (set in another method, by a parent class of another module) is *possibly unbound*.
`__init__` includes the methods it calls on `self` directly in its body (`self.configure_amp()`,
not under an `if`, a loop, a `try` or a `with`), walked from the state at the call (and so on,
MAX_INIT_CALLS deep): what they assign on every path to their end is bound after the call, with
its value; only a plain method of the class or of its bases of this file that no subclass of this
file overrides (else, or past the bound, the call assigns nothing known). A method that `__init__`
calls (directly or through those calls, anywhere in it) also sees `self.x` as it is at each such
call: not yet bound where `__init__` assigns it only after the call.

Evidence refines: a test (`if x is not None`, `if x:`, `isinstance(x, T)`, `hasattr(self, "x")`,
`assert`, an early `return`), and an unconditional dereference (`x.m()`, `x.a`, `x[i]`: had x
been None or unbound, the run would have raised there already).

A tag may carry the *stable conditions* it holds under (tests of names and attributes, not
calls, such as `if use_amp:` or `if self.scaler is not None:`): where two branches of such a
test leave a key different, each side's tags remember the branch, and a later test of the same
condition (the same text, its names not assigned in between) keeps only the tags of the branch
it takes. So `if use_amp: scaler.scale(loss).backward()` ... `if use_amp: scaler.unscale_(opt)`
is proven, and `scaler = GradScaler() if use_amp else None` is not None under `if use_amp:`.

Not modelled (taken as not happening): a call that rebinds a global or sets an attribute to
None behind the scenes, `del` through `globals()`, `exec`.
"""

from __future__ import annotations

import builtins
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

import libcst as cst

from ampfix.model.facet import Facet
from ampfix.model.parsing import parse_statement
from ampfix.model.readwrite import names_bound, reads_writes
from ampfix.model.syntax import literal_string
from ampfix.model.tree import child_nodes, dotted, target_names

UNBOUND, NONE, VALUE = "unbound", "none", "value"
BUILTINS = set(dir(builtins)) | {"__name__", "__file__", "__doc__", "__spec__", "__loader__", "__package__",
                                 "__builtins__", "__path__", "__debug__"}
MAX_CONDS = 4  # conditions a tag remembers (more: dropped, which only loses precision)
MAX_LOOP_PASSES = 5
MAX_INIT_CALLS = 3  # how deep the `self.m()` calls of `__init__` (and of the methods it calls) are followed
MAX_INIT_EFFORT = 20_000  # statement visits of those methods per `__init__`: past it, later calls stay unknown
MAX_STATEMENTS = 100_000  # statement visits per walk: past it, loops get one pass (less precise, never slow)
_SPACE = re.compile(r"\s+")

# a stable condition: (normalised test text, the keys it reads)
Cond = Tuple[str, FrozenSet[str]]


@dataclass(frozen=True)
class Tag:
    kind: str  # UNBOUND, NONE or VALUE
    conds: FrozenSet[Tuple[Cond, bool]] = frozenset()
    origin: Optional[cst.CSTNode] = field(default=None, compare=False, hash=False, repr=False)


State = Dict[str, FrozenSet[Tag]]


def _tags(*kinds: str, origin: Optional[cst.CSTNode] = None) -> FrozenSet[Tag]:
    return frozenset(Tag(k, frozenset(), origin) for k in kinds)


@dataclass
class Problem:
    """Why a key is not usable at a point."""

    key: str
    kind: str  # UNBOUND or NONE
    origin: Optional[cst.CSTNode] = None


class _Loop:
    def __init__(self) -> None:
        self.breaks: List[Optional[State]] = []
        self.continues: List[Optional[State]] = []


class _Walker:
    """The forward pass over one scope (see the module docstring)."""

    def __init__(self, bound: "Bound", scope: cst.CSTNode, start: Optional[State] = None,
                 inherit: Optional[Callable[[str], FrozenSet[Tag]]] = None, calls: Optional[int] = None,
                 running: Tuple[cst.CSTNode, ...] = ()) -> None:
        self.bound = bound
        self.scope = scope
        self.before: Dict[cst.CSTNode, Optional[State]] = {}
        self.after: Dict[cst.CSTNode, Optional[State]] = {}
        self.loops: List[_Loop] = []
        self.collectors: List[List[Optional[State]]] = []
        self.start = start or {}
        self.checking = False
        self.problems: List[Problem] = []
        self._initial: Dict[str, FrozenSet[Tag]] = {}
        self.visits = 0
        # a method `__init__` calls, walked from the state at the call: its `self.` keys start
        # as the caller has them there (`inherit`); `calls`: how deep the `self.m()` calls of
        # the body are followed (None: not at all, see `Bound._call_effects`)
        self.inherit = inherit
        self.calls = calls
        self.running = running  # the methods being walked from a call (no recursion)
        self.assigned: Set[str] = set()  # the keys this walk assigns (a caller takes them over)
        self.done = False  # the pass is over (the tables are whole)
        self.effort = [0]  # statement visits of the methods walked from calls (shared with them)

    # ---------------------------------------------------------------- states
    def initial(self, key: str) -> FrozenSet[Tag]:
        hit = self._initial.get(key)
        if hit is None:
            if self.inherit is not None and key.startswith("self."):
                hit = self.inherit(key)
            else:
                hit = self.start.get(key) or self.bound._initial_tags(self.scope, key)
            self._initial[key] = hit
        return hit

    def get(self, state: State, key: str) -> FrozenSet[Tag]:
        tags = state.get(key)
        return self.initial(key) if tags is None else tags

    def join(self, *states: Optional[State]) -> Optional[State]:
        live = [s for s in states if s is not None]
        if not live:
            return None
        if len(live) == 1:
            return dict(live[0])
        keys = set().union(*live)
        return {k: frozenset().union(*(self.get(s, k) for s in live)) for k in keys}

    def join_branches(self, body: Optional[State], other: Optional[State], cond: Optional[Tuple[Cond, bool]]
                      ) -> Optional[State]:
        """The state after an if/else whose branches end in `body` and `other`: where they
        differ, a stable test's branch is remembered on each side's tags."""
        if body is None or other is None or cond is None:
            return self.join(body, other)
        c, positive = cond
        out: State = {}
        for k in set(body) | set(other):
            tb, te = self.get(body, k), self.get(other, k)
            if tb == te:
                out[k] = tb
                continue
            both = tb & te
            out[k] = both | {_with_cond(t, (c, positive)) for t in tb - both} \
                | {_with_cond(t, (c, not positive)) for t in te - both}
        return out

    def assume(self, state: Optional[State], cond: Optional[Tuple[Cond, bool]]) -> Optional[State]:
        """Keep only the tags compatible with the stable condition `cond` holding."""
        if state is None or cond is None:
            return state
        c, value = cond
        out = dict(state)
        for k, tags in state.items():
            kept = frozenset(t for t in tags if (c, not value) not in t.conds)
            if kept != tags:
                out[k] = kept or frozenset({Tag(VALUE)})
        # keys not in the state yet start from their initial tags, which may be conditional too
        for k, tags in self._initial.items():
            if k not in out and any(c2 == c for t in tags for c2, _ in t.conds):
                kept = frozenset(t for t in tags if (c, not value) not in t.conds)
                out[k] = kept or frozenset({Tag(VALUE)})
        return out

    def record(self, table: Dict[cst.CSTNode, Optional[State]], node: cst.CSTNode, state: Optional[State]) -> None:
        table[node] = None if state is None else dict(state)
        for c in self.collectors:
            c.append(state)

    # ---------------------------------------------------------------- assignment
    def assign(self, state: State, key: str, tags: FrozenSet[Tag]) -> None:
        state[key] = tags
        self.assigned.add(key)
        prefix = key + "."
        for k in list(state):
            if k.startswith(prefix):
                del state[k]  # `x = ...` makes what we knew of `x.a` stale
        # conditions that read `key` are no longer the same test
        for k, ts in list(state.items()):
            if any(_reads_key(c, key) for t in ts for c, _ in t.conds):
                state[k] = frozenset(Tag(t.kind, frozenset(e for e in t.conds if not _reads_key(e[0], key)), t.origin)
                                     for t in ts)

    def value_tags(self, expr: Optional[cst.BaseExpression], state: State, origin: cst.CSTNode,
                   depth: int = 0) -> FrozenSet[Tag]:
        """What an assigned value may be."""
        if expr is None or depth > 6:
            return _tags(VALUE, origin=origin)
        if isinstance(expr, cst.Name) and expr.value == "None":
            return _tags(NONE, origin=origin)
        if isinstance(expr, cst.IfExp):
            body = self.value_tags(expr.body, state, origin, depth + 1)
            other = self.value_tags(expr.orelse, state, origin, depth + 1)
            cond = self.bound._stable_cond(expr.test)
            if cond is None or body == other:
                return body | other
            c, positive = cond
            return frozenset({_with_cond(t, (c, positive)) for t in body}
                             | {_with_cond(t, (c, not positive)) for t in other})
        if isinstance(expr, cst.BooleanOperation):
            left = self.value_tags(expr.left, state, origin, depth + 1)
            right = self.value_tags(expr.right, state, origin, depth + 1)
            if isinstance(expr.operator, cst.Or):  # `x or default`: x only when truthy
                left = frozenset(t for t in left if t.kind != NONE)
            return left | right
        if isinstance(expr, cst.NamedExpr):
            return self.value_tags(expr.value, state, origin, depth + 1)
        key = dotted(expr)
        if key is not None:
            tags = frozenset(t for t in self.get(state, key) if t.kind != UNBOUND)
            return tags or _tags(VALUE, origin=origin)
        if isinstance(expr, cst.Call):
            name = expr.func.attr.value if isinstance(expr.func, cst.Attribute) else \
                expr.func.value if isinstance(expr.func, cst.Name) else ""
            args = [a for a in expr.args if not a.star]
            if name == "getattr" and len(args) == 3 and _is_none(args[2].value):
                return _tags(VALUE, NONE, origin=origin)
            if name in ("get", "pop") and isinstance(expr.func, cst.Attribute) and (
                    (name == "get" and len(args) == 1) or (len(args) == 2 and _is_none(args[1].value))):
                return _tags(VALUE, NONE, origin=origin)
        return _tags(VALUE, origin=origin)

    def bind_target(self, state: State, target: cst.CSTNode, tags: FrozenSet[Tag]) -> None:
        key = dotted(target)
        if key is not None:
            self.assign(state, key, tags)
            return
        if isinstance(target, (cst.Tuple, cst.List)):
            for el in target.elements:
                self.bind_target(state, el.value, _tags(VALUE, origin=target))
        elif isinstance(target, cst.StarredElement):
            self.bind_target(state, target.value, _tags(VALUE, origin=target))
        # subscripts (`d[k] = v`) bind nothing we track

    # ---------------------------------------------------------------- evaluation
    def evaluate(self, state: State, *exprs: Optional[cst.CSTNode]) -> None:
        """The names read and the keys dereferenced by evaluating `exprs` (their unconditional
        parts): after it, none of them is unbound, and the dereferenced are not None."""
        reads: List[str] = []
        derefs: List[str] = []
        for e in exprs:
            if e is not None:
                _uses(e, reads, derefs, unconditional=True)
        if self.checking:
            for e in exprs:
                if e is not None:
                    self._check_expr(state, e)
        for key in reads:
            self._refine(state, key, drop=(UNBOUND,))
        for key in derefs:
            self._refine(state, key, drop=(UNBOUND, NONE))

    def _check_expr(self, state: State, expr: cst.CSTNode) -> None:
        """Check every read and dereference of `expr`; the right of `and`/`or` and the branches
        of an `if`-expression in the state their test leaves (`resume and "scaler" in ckpt`)."""
        if isinstance(expr, cst.BooleanOperation):
            self._check_expr(state, expr.left)
            right = self.refine_test(state, expr.left, isinstance(expr.operator, cst.And))
            self._check_expr(right if right is not None else state, expr.right)
            return
        if isinstance(expr, cst.IfExp):
            self._check_expr(state, expr.test)
            for branch, value in ((expr.body, True), (expr.orelse, False)):
                sub = self.refine_test(state, expr.test, value)
                self._check_expr(sub if sub is not None else state, branch)
            return
        nested: List[cst.CSTNode] = []
        reads: List[str] = []
        derefs: List[str] = []
        _uses(expr, reads, derefs, unconditional=False, nested=nested)
        for key in dict.fromkeys(reads):
            self._check(state, key, deref=False)
        for key in dict.fromkeys(derefs):
            self._check(state, key, deref=True)
        for n in nested:
            self._check_expr(state, n)

    def _check(self, state: State, key: str, deref: bool) -> None:
        for t in self.get(state, key):
            if t.kind == UNBOUND or (deref and t.kind == NONE):
                self.problems.append(Problem(key, t.kind, t.origin))
                return

    def _refine(self, state: State, key: str, drop: Tuple[str, ...] = (), keep: Tuple[str, ...] = ()) -> None:
        tags = self.get(state, key)
        kept = frozenset(t for t in tags if t.kind not in drop and (not keep or t.kind in keep))
        if kept != tags:
            state[key] = kept or frozenset({Tag(keep[0] if keep else VALUE)})

    def refine_test(self, state: Optional[State], test: cst.BaseExpression, value: bool) -> Optional[State]:
        """`state` where `test` evaluated to `value`."""
        if state is None:
            return None
        out = dict(state)
        self._refine_into(out, test, value)
        return self.assume(out, self.bound._stable_cond(test, value))

    def _refine_into(self, state: State, test: cst.BaseExpression, value: bool) -> None:
        while isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            test, value = test.expression, not value
        if isinstance(test, cst.BooleanOperation):
            if isinstance(test.operator, cst.And) and value or isinstance(test.operator, cst.Or) and not value:
                for operand in (test.left, test.right):  # each operand has that value too
                    self._refine_into(state, operand, value)
                    assumed = self.assume(state, self.bound._stable_cond(operand, value))
                    if assumed is not None:
                        state.update(assumed)
            return
        if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
            op, right = test.comparisons[0].operator, test.comparisons[0].comparator
            left = test.left
            if _is_none(left):
                left, right = right, left
            key = dotted(left)
            if key is not None and _is_none(right) and isinstance(op, (cst.Is, cst.IsNot, cst.Equal, cst.NotEqual)):
                is_none = value if isinstance(op, (cst.Is, cst.Equal)) else not value
                if is_none:
                    nones = frozenset(t for t in self.get(state, key) if t.kind == NONE)
                    state[key] = nones or frozenset({Tag(NONE, frozenset(), test)})
                else:
                    self._refine(state, key, drop=(UNBOUND, NONE))
            return
        if isinstance(test, cst.Call) and isinstance(test.func, cst.Name):
            args = [a.value for a in test.args if not a.star]
            if test.func.value == "isinstance" and len(args) == 2 and value:
                key = dotted(args[0])
                if key is not None:
                    self._refine(state, key, drop=(UNBOUND, NONE))
            elif test.func.value == "hasattr" and len(args) == 2:
                base, attr = dotted(args[0]), _string(args[1])
                if base is not None and attr is not None:
                    key = f"{base}.{attr}"
                    if value:
                        self._refine(state, key, drop=(UNBOUND,))
                    else:
                        state[key] = frozenset({Tag(UNBOUND, frozenset(), test)})
            return
        key = dotted(test)
        if key is not None and value:
            self._refine(state, key, drop=(UNBOUND, NONE))

    # ---------------------------------------------------------------- statements
    def block(self, body: Sequence[cst.CSTNode], state: Optional[State]) -> Optional[State]:
        self.visits += len(body)
        top = self.calls is not None and body is getattr(getattr(self.scope, "body", None), "body", None)
        for stmt in body:
            self.record(self.before, stmt, state)
            if state is not None:
                state = self.statement(stmt, dict(state))
                if top and state is not None:  # `self.configure_amp()`, directly in `__init__`'s body
                    state = self.bound._call_effects(self, stmt, state)
            self.record(self.after, stmt, state)
        return state

    def suite(self, suite: cst.BaseSuite, state: Optional[State]) -> Optional[State]:
        if isinstance(suite, cst.SimpleStatementSuite):
            if state is None:
                return None
            state = dict(state)
            for small in suite.body:
                state = self.small(small, state)
                if state is None:
                    return None
            return state
        return self.block(suite.body, state)

    def statement(self, stmt: cst.CSTNode, state: State) -> Optional[State]:
        if isinstance(stmt, cst.SimpleStatementLine):
            cur: Optional[State] = state
            for small in stmt.body:
                cur = self.small(small, cur)  # type: ignore[arg-type]
                if cur is None:
                    return None
            return cur
        if isinstance(stmt, cst.If):
            return self.if_(stmt, state)
        if isinstance(stmt, (cst.For, cst.While)):
            return self.loop(stmt, state)
        if isinstance(stmt, (cst.Try, cst.TryStar)):
            return self.try_(stmt, state)
        if isinstance(stmt, cst.With):
            self.evaluate(state, *[i.item for i in stmt.items])
            for i in stmt.items:
                if i.asname is not None:
                    self.bind_target(state, i.asname.name, _tags(VALUE, origin=i))
            return self.suite(stmt.body, state)
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            self.evaluate(state, *_definition_expressions(stmt))
            self.assign(state, stmt.name.value, _tags(VALUE, origin=stmt))
            return state
        if isinstance(stmt, cst.Match):
            return self.match(stmt, state)
        return state

    def small(self, small: cst.BaseSmallStatement, state: State) -> Optional[State]:
        if isinstance(small, (cst.Return, cst.Raise)):
            if isinstance(small, cst.Return):
                self.evaluate(state, small.value)
            else:
                self.evaluate(state, small.exc, small.cause)
            return None
        if isinstance(small, cst.Continue):
            if self.loops:
                self.loops[-1].continues.append(state)
            return None
        if isinstance(small, cst.Break):
            if self.loops:
                self.loops[-1].breaks.append(state)
            return None
        if isinstance(small, cst.Expr):
            self.evaluate(state, small.value)
            if isinstance(small.value, cst.Call) and dotted(small.value.func) in ("sys.exit", "exit", "quit", "os._exit"):
                return None
            return state
        if isinstance(small, cst.Assign):
            self.evaluate(state, small.value, *[_target_reads(t.target) for t in small.targets])
            tags = self.value_tags(small.value, state, small)
            for t in small.targets:
                self.bind_target(state, t.target, tags)
            return state
        if isinstance(small, cst.AnnAssign):
            if small.value is not None:
                self.evaluate(state, small.value, _target_reads(small.target))
                self.bind_target(state, small.target, self.value_tags(small.value, state, small))
            return state
        if isinstance(small, cst.AugAssign):
            self.evaluate(state, small.value, small.target)
            self.bind_target(state, small.target, _tags(VALUE, origin=small))
            return state
        if isinstance(small, cst.Assert):
            self.evaluate(state, small.test)
            return self.refine_test(state, small.test, True)
        if isinstance(small, cst.Del):
            self.evaluate(state, _target_reads(small.target))
            for name in _del_keys(small.target):
                self.assign(state, name, _tags(UNBOUND, origin=small))
            return state
        if isinstance(small, cst.Import):
            for a in small.names:
                if a.asname is not None and isinstance(a.asname.name, cst.Name):
                    self.assign(state, a.asname.name.value, _tags(VALUE, origin=small))
                else:
                    self.assign(state, (dotted(a.name) or "").split(".")[0], _tags(VALUE, origin=small))
            return state
        if isinstance(small, cst.ImportFrom):
            if not isinstance(small.names, cst.ImportStar):
                for a in small.names:
                    name = a.asname.name.value if a.asname is not None and isinstance(a.asname.name, cst.Name) \
                        else dotted(a.name)
                    if name:
                        self.assign(state, name, _tags(VALUE, origin=small))
            return state
        return state  # pass, global, nonlocal

    def if_(self, stmt: cst.If, state: State) -> Optional[State]:
        self.evaluate(state, stmt.test)
        cond = self.bound._stable_cond(stmt.test)
        body = self.suite(stmt.body, self.refine_test(state, stmt.test, True))
        other_entry = self.refine_test(state, stmt.test, False)
        if isinstance(stmt.orelse, cst.If):
            self.record(self.before, stmt.orelse, other_entry)
            other = self.if_(stmt.orelse, dict(other_entry)) if other_entry is not None else None
            self.record(self.after, stmt.orelse, other)
        elif isinstance(stmt.orelse, cst.Else):
            other = self.suite(stmt.orelse.body, other_entry)
        else:
            other = other_entry
        return self.join_branches(body, other, cond)

    def loop(self, stmt, state: State) -> Optional[State]:
        if isinstance(stmt, cst.For):
            self.evaluate(state, stmt.iter)
        else:
            self.evaluate(state, stmt.test)
        forever = isinstance(stmt, cst.While) and _literal_true(stmt.test)
        head: Optional[State] = state
        ctx = _Loop()
        for _ in range(MAX_LOOP_PASSES):
            ctx = _Loop()
            self.loops.append(ctx)
            if isinstance(stmt, cst.For):
                entry = dict(head) if head is not None else None
                if entry is not None:
                    self.evaluate(entry, _target_reads(stmt.target))
                    self.bind_target(entry, stmt.target, _tags(VALUE, origin=stmt))
            else:
                entry = self.refine_test(head, stmt.test, True)
            end = self.suite(stmt.body, entry)
            self.loops.pop()
            new_head = self.join(state, end, *ctx.continues)
            if new_head == head:
                break
            head = new_head
            if self.visits > MAX_STATEMENTS:
                break
        if isinstance(stmt, cst.For):
            normal = head
        else:
            normal = None if forever else self.refine_test(head, stmt.test, False)
        if stmt.orelse is not None:
            normal = self.suite(stmt.orelse.body, normal)
        return self.join(normal, *ctx.breaks)

    def try_(self, stmt, state: State) -> Optional[State]:
        seen: List[Optional[State]] = [dict(state)]
        self.collectors.append(seen)
        end = self.suite(stmt.body, state)
        self.collectors.pop()
        raised = self.join(*seen)
        ends = []
        for h in stmt.handlers:
            entry = dict(raised) if raised is not None else None
            if entry is not None:
                self.evaluate(entry, h.type)
                if h.name is not None:
                    self.bind_target(entry, h.name.name, _tags(VALUE, origin=h))
            h_end = self.suite(h.body, entry)
            if h_end is not None and h.name is not None and isinstance(h.name.name, cst.Name):
                self.assign(h_end, h.name.name.value, _tags(UNBOUND, origin=h))
            ends.append(h_end)
        if stmt.orelse is not None:
            end = self.suite(stmt.orelse.body, end)
        after = self.join(end, *ends)
        if stmt.finalbody is not None:
            entry = after if after is not None else raised
            fin = self.suite(stmt.finalbody.body, entry)
            return fin if after is not None else None
        return after

    def match(self, stmt: cst.Match, state: State) -> Optional[State]:
        self.evaluate(state, stmt.subject)
        ends: List[Optional[State]] = []
        irrefutable = False
        for case in stmt.cases:
            entry = dict(state)
            for name in _pattern_names(case.pattern):
                self.assign(entry, name, _tags(VALUE, origin=case))
            if case.guard is not None:
                self.evaluate(entry, case.guard)
                entry = self.refine_test(entry, case.guard, True)  # type: ignore[assignment]
            elif isinstance(case.pattern, cst.MatchAs) and case.pattern.pattern is None:
                irrefutable = True
            ends.append(self.suite(case.body, entry))
        return self.join(*ends, *(() if irrefutable else (state,)))


# ----------------------------------------------------------------------------- helpers


def _with_cond(tag: Tag, cond: Tuple[Cond, bool]) -> Tag:
    conds = tag.conds | {cond}
    if len(conds) > MAX_CONDS:
        return tag
    return Tag(tag.kind, frozenset(conds), tag.origin)


def _reads_key(cond: Cond, key: str) -> bool:
    return any(k == key or k.startswith(key + ".") for k in cond[1])


def _is_none(node: Optional[cst.CSTNode]) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"


def _literal_true(node: cst.CSTNode) -> bool:
    return (isinstance(node, cst.Name) and node.value == "True") or (isinstance(node, cst.Integer) and node.value != "0")


def _string(node: cst.CSTNode) -> Optional[str]:
    """A string literal's value (`literal_string`), for one literal only (no concatenation)."""
    return literal_string(node) if isinstance(node, cst.SimpleString) else None


def _target_reads(target: cst.CSTNode) -> Optional[cst.CSTNode]:
    """The part of an assignment target that is evaluated (read): `a` of `a.b = ...`, `d` and `k`
    of `d[k] = ...`; None for a plain name."""
    if isinstance(target, cst.Attribute):
        return target.value
    if isinstance(target, cst.Subscript):
        return target
    if isinstance(target, (cst.Tuple, cst.List)):
        parts = [_target_reads(el.value) for el in target.elements]
        parts = [p for p in parts if p is not None]
        return cst.Tuple(elements=[cst.Element(p) for p in parts]) if parts else None  # type: ignore[misc]
    if isinstance(target, cst.StarredElement):
        return _target_reads(target.value)
    return None


def _del_keys(target: cst.CSTNode) -> List[str]:
    if isinstance(target, (cst.Tuple, cst.List)):
        return [k for el in target.elements for k in _del_keys(el.value)]
    key = dotted(target)
    return [key] if key is not None else []


def _pattern_names(pattern: cst.CSTNode) -> List[str]:
    out: List[str] = []

    class V(cst.CSTVisitor):
        def visit_MatchAs(self, node: cst.MatchAs) -> None:
            if node.name is not None:
                out.append(node.name.value)

        def visit_MatchStar(self, node: cst.MatchStar) -> None:
            if node.name is not None:
                out.append(node.name.value)

        def visit_MatchMapping(self, node: cst.MatchMapping) -> None:
            if node.rest is not None:
                out.append(node.rest.value)

    pattern.visit(V())
    return out


def _uses(expr: cst.CSTNode, reads: List[str], derefs: List[str], unconditional: bool,
          nested: Optional[List[cst.CSTNode]] = None) -> None:
    """Keys read and keys dereferenced (`k.attr`, `k[...]`) by evaluating `expr`; with
    `unconditional`, only the parts that always run (not an `if`-expression's branches, the
    right of `and`/`or`, lambdas and comprehension bodies). With `nested`, the `and`/`or` and
    `if`-expressions inside are not walked but handed back there (to be checked with their
    tests' refinements)."""
    stack = [expr]
    while stack:
        node = stack.pop()
        if nested is not None and node is not expr and isinstance(node, (cst.BooleanOperation, cst.IfExp)):
            nested.append(node)
            continue
        if isinstance(node, (cst.Lambda, cst.FunctionDef, cst.ClassDef)):
            continue
        if isinstance(node, (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)):
            if unconditional:
                stack.append(node.for_in.iter)
                continue
            _uses_comprehension(node, reads, derefs)
            continue
        if isinstance(node, cst.IfExp) and unconditional:
            stack.append(node.test)
            continue
        if isinstance(node, cst.BooleanOperation) and unconditional:
            stack.append(node.left)
            continue
        if isinstance(node, cst.Name):
            reads.append(node.value)
            continue
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
                and (dotted(node.func) or "").count(".") == 1 and dotted(node.func.value) == "self":
            # `self.method(...)`: a method of the class or of a base class (another module's,
            # perhaps), not an attribute some code must have assigned
            reads.append("self")
            derefs.append("self")
            stack.extend(reversed(node.args))
            continue
        if isinstance(node, cst.Attribute):
            key = dotted(node)
            if key is not None:
                base = dotted(node.value)
                reads.append(key.split(".")[0])
                if key.startswith("self."):  # reading self.x: it must exist
                    reads.append(".".join(key.split(".")[:2]))
                # every prefix is dereferenced: `a.b.c` reads a.b from a and c from a.b
                parts = key.split(".")
                for i in range(1, len(parts)):
                    derefs.append(".".join(parts[:i]))
                if base is None:  # pragma: no cover - dotted implies base
                    stack.append(node.value)
                continue
            stack.append(node.value)
            continue
        if isinstance(node, cst.Subscript):
            key = dotted(node.value)
            if key is not None:
                derefs.append(key)
            stack.append(node.value)
            stack.extend(node.slice)
            continue
        if isinstance(node, cst.Arg):
            stack.append(node.value)
            continue
        stack.extend(reversed(child_nodes(node)))


def _uses_comprehension(comp: cst.CSTNode, reads: List[str], derefs: List[str]) -> None:
    """A comprehension's uses, minus the names its own `for` targets bind."""
    inner_reads: List[str] = []
    inner_derefs: List[str] = []
    bound: Set[str] = set()
    for_in = comp.for_in
    first = True
    while for_in is not None:
        _uses(for_in.iter, reads if first else inner_reads, derefs if first else inner_derefs, False)
        bound.update(target_names(for_in.target))
        for cond in for_in.ifs:
            _uses(cond.test, inner_reads, inner_derefs, False)
        for_in = for_in.inner_for_in
        first = False
    for part in ("elt", "key", "value"):
        node = getattr(comp, part, None)
        if node is not None:
            _uses(node, inner_reads, inner_derefs, False)
    reads.extend(k for k in inner_reads if k.split(".")[0] not in bound)
    derefs.extend(k for k in inner_derefs if k.split(".")[0] not in bound)


# ----------------------------------------------------------------------------- the model part


class Bound(Facet):
    """Definite assignment and None-ness at a point, for fixes that insert code (`model.bound`)."""

    def _walker(self, scope: cst.CSTNode) -> _Walker:
        cache = self.__dict__.setdefault("_bound_walkers", {})
        hit = cache.get(id(scope))
        if hit is not None and hit[0] is scope:
            return hit[1]
        init = isinstance(scope, cst.FunctionDef) and scope.name.value == "__init__" and self._self_param(scope)
        walker = _Walker(self, scope, calls=0 if init else None)
        cache[id(scope)] = (scope, walker)
        body = getattr(scope, "body", None)
        if isinstance(scope, cst.Module):
            walker.block(scope.body, {})
        elif isinstance(body, cst.BaseSuite):
            walker.suite(body, {})
        walker.done = True
        return walker

    def _state_at(self, stmt: cst.CSTNode, after: bool = False) -> Optional[State]:
        """What each key may be right before (or after) the statement `stmt` (a statement of
        a block of its scope); None where no path reaches it."""
        walker = self._walker(self._bound_scope(stmt))
        table = walker.after if after else walker.before
        if stmt not in table:
            return {}
        return table[stmt]

    def _bound_scope(self, node: cst.CSTNode) -> cst.CSTNode:
        scope = self.model.scope_of(node)
        while isinstance(scope, cst.Lambda):
            scope = self.model.scope_of(scope)
        return scope

    # ---------------------------------------------------------------- the queries, never raising
    def insertion_problem(self, new: Sequence[cst.BaseStatement], stmt: cst.CSTNode, after: bool = False,
                          ) -> Optional[str]:
        """Why the statements `new`, inserted before (or after) `stmt`, could fail on some path
        that reaches them, or None when every read is proven (see `_insertion_problem`). A shape
        the analysis cannot follow is a reason too: an unproven fix is not offered."""
        try:
            return self._insertion_problem(new, stmt, after)
        except Exception as exc:  # never let a proof crash the check
            return f"ampfix could not prove this fix ({type(exc).__name__})"

    def replacement_problem(self, old: cst.CSTNode, new: Sequence[cst.BaseStatement],
                            created: Set[str] = frozenset()) -> Optional[str]:  # type: ignore[assignment]
        """Why the statements `new`, in place of the statement `old`, could fail where `old` would
        not (see `_replacement_problem`); a shape the analysis cannot follow is a reason too."""
        try:
            return self._replacement_problem(old, new, created)
        except Exception as exc:  # never let a proof crash the check
            return f"ampfix could not prove this fix ({type(exc).__name__})"

    def usable(self, key: str, stmt: cst.CSTNode, after: bool = False, deref: bool = True) -> Optional[str]:
        """None when `key` is assigned on every path that reaches the point before (or after)
        `stmt` and, with `deref`, is not None on any of them (a method can be called on it);
        else why not, in a sentence for a finding's message."""
        return self.insertion_problem([_expr_statement(key, deref)], stmt, after)

    def later_assignments(self, key: str, stmt: cst.CSTNode) -> List[cst.CSTNode]:
        """The statements of `stmt`'s function that assign `key` after it, directly in a block
        and in the loop `stmt` is in (no other): where code that needs `key`, written for
        `stmt`, can go instead (a restore after the object it restores is created)."""
        func = self.model.scope_of(stmt)
        loop = self.model.loop_of(stmt)
        out = []
        for node, _ in self.model.assignments_to(key):
            line = self.model.statement_of(node)
            if line is None or self.model.scope_of(line) is not func or not self.model.before(stmt, line) \
                    or self.model.block_of(line) is None or self.model.loop_of(line) is not loop:
                continue
            out.append(line)
        return out

    def assigned_between(self, key: str, scope: cst.CSTNode, a: cst.CSTNode, b: cst.CSTNode) -> bool:
        """`key` is assigned in `scope` (its own binding scope) after `a` and before `b`."""
        return any(self.model.scope_of(node) is scope and self.model.before(a, node) and self.model.before(node, b)
                   for node, _ in self.model.assignments.get(key, []))

    def reads_same_at(self, expr: cst.CSTNode, at: cst.CSTNode) -> bool:
        """The name or attribute chain `expr` (read at a region) means the same at `at`, and is set
        by then when `at`'s function (or the module) is where it is set."""
        model = self.model
        key = dotted(expr)
        if key is None:
            return False
        root = key.split(".")[0]
        if root == "self":
            here, there = model.self_class(at), model.self_class(expr)
            if here is None or there is None or here not in model.related_classes(there):
                return False
        else:
            scope = model.binding_scope(root, model.scope_of(at))
            if scope is None or scope is not model.binding_scope(root, model.scope_of(expr)):
                return False
        same = [n for n, _ in model.assignments_to(key) if model.scope_of(n) is model.scope_of(at)]
        return not same or any(model.before(n, at) for n in same)

    def read_outside(self, stmts: Sequence[cst.CSTNode], block: cst.CSTNode) -> bool:
        """Some statement of `stmts` binds a name that code of `block`'s scope reads outside
        `block` and `stmts` (`grad_norm` logged after a boundary): moved into `block`, the name
        would be missing or stale where `block` does not run."""
        bound = names_bound(stmts)
        if not bound:
            return False
        scope = self.model.scope_of(block)
        for line in self.model.nodes_of(cst.SimpleStatementLine):
            if self.model.scope_of(line) is not scope or self.model.is_ancestor(block, line) \
                    or any(line is s or self.model.is_ancestor(s, line) for s in stmts):
                continue
            if reads_writes(line)[0] & bound:
                return True
        return False

    def touched_before(self, outer: cst.CSTNode, stmt: cst.CSTNode, name: str) -> bool:
        """A simple statement inside `outer` (a loop), before `stmt`, reads or binds `name`."""
        for s in self.model.nodes_of(cst.SimpleStatementLine):
            if s is not stmt and self.model.is_ancestor(outer, s) and self.model.before(s, stmt):
                reads, writes = reads_writes(s)
                if name in reads or name in writes:
                    return True
        return False

    def _insertion_problem(self, new: Sequence[cst.BaseStatement], stmt: cst.CSTNode, after: bool = False,
                          ) -> Optional[str]:
        """Why the statements `new`, inserted before (or after) `stmt`, could fail on some path
        that reaches them: a name they read may be unassigned there, or an object they call a
        method on (or read an attribute or item of) may be None. None when every read is proven.

        The new statements are walked from the state at that point, so their own tests refine
        (`if scaler is not None: scaler.update()` is proven). A read the original code makes
        anyway, unconditionally and before anything could rebind it, from that point on (the
        statement the code goes before, and the statements after it in the same block up to one
        that may leave the block) proves nothing new can fail: the original run would have
        raised there too."""
        scope = self._bound_scope(stmt)
        walker = self._walker(scope)
        state = self._state_at(stmt, after)
        if state is None:
            return None  # nothing reaches it: nothing can fail there
        checker = _Walker(self, scope)
        checker._initial = dict(walker._initial)
        state = dict(state)
        reads, derefs = self._later_uses(stmt, after)
        for key in reads:
            checker._refine(state, key, drop=(UNBOUND,))
        for key in derefs:
            checker._refine(state, key, drop=(UNBOUND, NONE))
        checker.checking = True
        checker.block(list(new), state)
        if not checker.problems:
            return None
        problems = sorted(checker.problems, key=lambda p: (p.kind != NONE, p.key.startswith("self.")))
        return self._explain(problems[0], stmt, scope)

    def _replacement_problem(self, old: cst.CSTNode, new: Sequence[cst.BaseStatement],
                            created: Set[str] = frozenset()) -> Optional[str]:  # type: ignore[assignment]
        """Why the statements `new`, in place of the statement `old` (a statement of a block),
        could fail where `old` would not: what may fail in `new` (a read of a name that may be
        unassigned, a dereference of something that may be None) and does not in `old`, walked
        from the same state (what the code after it reads anyway counts as proven, as in
        `insertion_problem`). Keys in `created` (attributes the fix itself creates) are the
        fix's own business."""
        if self.model.block_of(old) is None:
            return None  # a one-line suite: nothing to place the proof on
        scope = self._bound_scope(old)
        walker = self._walker(scope)
        start = self._state_at(old)
        if start is None:
            return None
        reads, derefs = self._later_uses(old, True)

        def problems(stmts) -> List[Problem]:
            checker = _Walker(self, scope)
            checker._initial = dict(walker._initial)
            state = dict(start)  # type: ignore[arg-type]
            for key in reads:
                checker._refine(state, key, drop=(UNBOUND,))
            for key in derefs:
                checker._refine(state, key, drop=(UNBOUND, NONE))
            checker.checking = True
            checker.block(list(stmts), state)
            return checker.problems

        before = {(p.key, p.kind) for p in problems([old])}
        after = [p for p in problems(new) if (p.key, p.kind) not in before
                 and not (p.kind == UNBOUND and p.key in created)]
        if not after:
            return None
        after.sort(key=lambda p: (p.kind != NONE, p.key.startswith("self.")))
        return self._explain(after[0], old, scope)

    def head_problems(self, stmt: cst.CSTNode, new: Optional[Callable[[cst.CSTNode], bool]] = None) -> List[Problem]:
        """What may fail in what the statement `stmt` evaluates first (a simple line, or a compound
        statement's test / iterable / context managers) where it stands: reads of names that may be
        unassigned, dereferences of things that may be None (reads the code after it makes anyway
        excepted, as in `insertion_problem`; `new` tells the statements that are not the original
        code's, whose reads prove nothing)."""
        scope = self._bound_scope(stmt)
        state = self._state_at(stmt)
        if state is None:
            return []
        walker = self._walker(scope)
        checker = _Walker(self, scope)
        checker._initial = dict(walker._initial)
        state = dict(state)
        reads, derefs = self._later_uses(stmt, True, new)
        later = set(derefs)
        for key in reads:
            checker._refine(state, key, drop=(UNBOUND,))
        for key in derefs:
            checker._refine(state, key, drop=(UNBOUND, NONE))
        checker.checking = True
        checker.evaluate(state, *_head_expressions(stmt))
        return [p for p in checker.problems if not (p.kind == NONE and p.key in later)]

    def _later_uses(self, stmt: cst.CSTNode, after: bool, new: Optional[Callable[[cst.CSTNode], bool]] = None
                    ) -> Tuple[List[str], List[str]]:
        """Keys the original code reads / dereferences unconditionally from the point before (or
        after) `stmt` on, in its block, before anything assigns them and before a statement that
        may leave the block."""
        block = self.model.block_of(stmt)
        if block is None:
            return [], []
        body = list(block.body)
        index = next((i for i, s in enumerate(body) if s is stmt), None)
        if index is None:
            return [], []
        reads: List[str] = []
        derefs: List[str] = []
        assigned: Set[str] = set()
        for s in body[index + 1 if after else index:]:
            if new is not None and new(s):
                break  # code the fix brings: it proves nothing
            r: List[str] = []
            d: List[str] = []
            for e in _head_expressions(s):
                _uses(e, r, d, unconditional=True)
            reads += [k for k in r if not _touches(k, assigned)]
            derefs += [k for k in d if not _touches(k, assigned)]
            if isinstance(s, cst.BaseCompoundStatement) or self._may_leave(s):
                break  # what runs after it is not certain
            assigned |= _assigned_keys(s)
        return reads, derefs

    def _may_leave(self, stmt: cst.CSTNode) -> bool:
        return isinstance(stmt, cst.SimpleStatementLine) and any(
            isinstance(sm, (cst.Return, cst.Raise, cst.Break, cst.Continue)) for sm in stmt.body)

    def _explain(self, p: Problem, stmt: cst.CSTNode, scope: cst.CSTNode) -> str:
        where = f"line {self.model.line(stmt)}"
        origin_line = self._line_or_none(p.origin)
        origin = f" (line {origin_line})" if origin_line is not None else ""
        if p.kind == NONE:
            return f"`{p.key}` may be None at {where}{origin}"
        if p.key.startswith("self.") and isinstance(p.origin, cst.Call) and origin_line is not None and \
                isinstance(scope, cst.FunctionDef) and dotted(p.origin.func) == f"self.{scope.name.value}":
            caller = self.model.function_of(p.origin)
            return (f"`{p.key}` is not assigned yet where `{caller.name.value if caller else 'the class'}` calls "
                    f"`self.{scope.name.value}()` (line {origin_line}), while the object is built")
        if p.key.startswith("self.") and origin_line is None:
            cls = self.model.self_class(stmt)
            owner = f"`{cls.name.value}`" if cls is not None else "the class"
            return (f"`{p.key}` is not assigned in `__init__` or the class body of {owner} (nor before {where} "
                    "on every path)")
        if origin_line is None and isinstance(scope, (cst.FunctionDef, cst.Module)) and \
                p.key in self.model._index.local_names.get(scope, ()):
            later = [n for n, _, s in self.model._by_key.get(p.key, []) if s is scope]
            if later and not any(self.model.before(n, stmt) for n in later):
                owner = f"in `{scope.name.value}`" if isinstance(scope, cst.FunctionDef) else \
                    f"on line {self.model.line(later[0])}"
                return f"`{p.key}` is not assigned yet at {where} (it is assigned later {owner})"
        return f"`{p.key}` is not assigned on every path that reaches {where}{origin}"

    def _line_or_none(self, node: Optional[cst.CSTNode]) -> Optional[int]:
        if node is None:
            return None
        try:
            return self.model.line(node)
        except KeyError:  # a node of the code being inserted
            return None

    def branch_tests(self, node: cst.CSTNode, point: cst.CSTNode) -> Optional[List[Tuple[cst.BaseExpression, bool]]]:
        """The decisions `node` runs under that the statement `point` (later in the same
        function, outside them) does not: [(an `if`'s test, the value it has when `node` runs)],
        outermost first. None when one of them is not an `if` with a stable test (a loop body,
        an `except`, a test that calls something): then no guard can say when `node` ran."""
        out: List[Tuple[cst.BaseExpression, bool]] = []
        child = node
        for anc in self.model.ancestors(node):
            if isinstance(anc, (cst.FunctionDef, cst.Lambda, cst.ClassDef, cst.Module)):
                break
            if anc is point or self.model.is_ancestor(anc, point):
                # a block that holds both: what runs before `point` in it is common ground
                if isinstance(anc, (cst.If, cst.IfExp)) and (child is anc.body or child is anc.orelse):
                    if self.model.is_ancestor(child, point) or child is point:
                        child = anc
                        continue
                    return None  # `node` and `point` in different branches: never both
                child = anc
                continue
            if isinstance(anc, cst.If) and (child is anc.body or child is anc.orelse):
                if self._stable_cond(anc.test) is None:
                    return None
                out.append((anc.test, child is anc.body))
            elif isinstance(anc, (cst.For, cst.While, cst.ExceptHandler, cst.IfExp, cst.BooleanOperation,
                                  cst.MatchCase, cst.Else)) or isinstance(anc, (cst.ListComp, cst.SetComp, cst.DictComp,
                                                                               cst.GeneratorExp)):
                if isinstance(anc, cst.Else):
                    child = anc
                    continue  # the `else:` of an if is handled at the `if`
                return None
            child = anc
        out.reverse()
        return out

    # ---------------------------------------------------------------- stable conditions
    def _stable_cond(self, test: cst.BaseExpression, value: bool = True) -> Optional[Tuple[Cond, bool]]:
        """A test that names the same decision wherever it is written (names, attributes,
        comparisons and constants: no calls), normalised: (condition, the value it has when
        `test` is `value`)."""
        positive = value
        while isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            test, positive = test.expression, not positive
        if not self.model._is_stable(test):
            return None
        text = _SPACE.sub(" ", self.model.code(test))
        if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and \
                isinstance(test.comparisons[0].operator, (cst.IsNot, cst.NotEqual, cst.NotIn)):
            positive = not positive
            text = text.replace(" is not ", " is ").replace(" != ", " == ").replace(" not in ", " in ")
        keys = frozenset(k for k in (dotted(n) for n in self.model._names_in(test)) if k)
        return (text, keys), positive

    # ---------------------------------------------------------------- where keys start
    def _initial_tags(self, scope: cst.CSTNode, key: str) -> FrozenSet[Tag]:
        root, _, rest = key.partition(".")
        if rest:
            if root == "self" and "." not in rest and isinstance(scope, cst.FunctionDef):
                cls = self.model.class_of(scope)
                if cls is not None and self.model._is_method(scope):
                    return self._attribute_tags(cls, rest, scope)
            return _tags(VALUE)
        return self._name_tags(scope, root)

    def _name_tags(self, scope: cst.CSTNode, name: str) -> FrozenSet[Tag]:
        index = self.model._index
        declared = index.declared.get(scope, set())
        if isinstance(scope, (cst.FunctionDef, cst.Lambda)) and name not in declared:
            if self.model._is_param(scope, name):
                return self._parameter_tags(scope, name)
            p = scope.params
            if any(isinstance(s, cst.Param) and s.name.value == name for s in (p.star_arg, p.star_kwarg)):
                return _tags(VALUE)
            if name in index.local_names.get(scope, ()) or name in index.imports.get(scope, {}):
                return _tags(UNBOUND)
        if isinstance(scope, (cst.Module, cst.ClassDef)) and name not in declared and (
                name in index.local_names.get(scope, ()) or name in index.imports.get(scope, {})):
            return _tags(UNBOUND)
        # an enclosing function's, the module's, a builtin
        outer = None if isinstance(scope, cst.Module) else index.scope_of(scope, self.model.module)
        while outer is not None:
            if isinstance(outer, cst.ClassDef):
                outer = index.scope_of(outer, self.model.module)
                continue
            if name in index.local_names.get(outer, ()) or name in index.imports.get(outer, {}):
                if isinstance(outer, (cst.FunctionDef, cst.Lambda)) and self.model._is_param(outer, name):
                    return self._parameter_tags(outer, name)
                return self._global_tags(outer, name)
            if isinstance(outer, cst.Module):
                break
            outer = index.scope_of(outer, self.model.module)
        if isinstance(scope, cst.Module) or name in declared:
            if name in index.local_names.get(self.model.module, ()) or name in index.imports.get(self.model.module, {}):
                return self._global_tags(self.model.module, name)
        if name in BUILTINS or self._star_import():
            return _tags(VALUE)
        return _tags(UNBOUND)

    def _star_import(self) -> bool:
        return any(isinstance(n.names, cst.ImportStar) for n in self.model.nodes_of(cst.ImportFrom))

    def _parameter_tags(self, func: cst.CSTNode, name: str) -> FrozenSet[Tag]:
        p = func.params
        for param in (*p.posonly_params, *p.params, *p.kwonly_params):
            if param.name.value == name:
                if _is_none(param.default):
                    return frozenset({Tag(VALUE), Tag(NONE, frozenset(), param)})
                return _tags(VALUE)
        return _tags(VALUE)

    def _global_tags(self, scope: cst.CSTNode, name: str) -> FrozenSet[Tag]:
        """A name bound somewhere in an enclosing scope, read from a nested function: a value
        (the enclosing code ran first), None too when one of its assignments is None."""
        tags = {Tag(VALUE)}
        for node, value, s in self.model._by_key.get(name, []):
            if s is scope or (scope is self.model.module and name in self.model._index.declared.get(s, ())):
                if any(_is_none(leaf) for leaf in _leaves(value)):
                    tags.add(Tag(NONE, frozenset(), node))
        return frozenset(tags)

    def _attribute_tags(self, cls: cst.ClassDef, attr: str, method: cst.FunctionDef) -> FrozenSet[Tag]:
        """`self.<attr>` where a method starts: what the `__init__` of its class (or of the
        base classes of this file) leaves it, or the class body's assignment; None too when any
        method of these classes sets it to None; possibly unbound when neither assigns it."""
        chain = self._class_chain(cls)
        tags: Set[Tag] = set()
        bound = False
        key = f"self.{attr}"
        for c in chain:
            for node, value, scope in self.model._by_key.get(attr, []):
                if scope is c:  # a class attribute
                    bound = True
                    tags |= self._walker(c).value_tags(value, {}, node)
        for c in chain:
            init = self.model.method(c, "__init__")
            if init is None or init is method:
                continue
            end = self._init_end(init)
            if end is None:
                continue
            at_end = self._walker(init).get(end, key)
            portable = {_portable(t, self._set_in_init_only) for t in at_end}
            if not any(t.kind == UNBOUND for t in at_end):
                bound = True
            tags |= {t for t in portable if t.kind != UNBOUND}
        for node, value, scope in self.model._by_key.get(key, []):
            owner = self.model.self_class(node)
            if owner in chain and self.model.function_of(node) is not method:
                if any(_is_none(leaf) for leaf in _leaves(value)):
                    fn = self.model.function_of(node)
                    if fn is None or fn.name.value != "__init__":
                        tags.add(Tag(NONE, frozenset(), node))
        if not bound:
            tags.add(Tag(UNBOUND))
        if method.name.value != "__init__":
            tags |= self._at_call_sites(cls, key, method)
        if not any(t.kind in (VALUE, NONE) for t in tags):
            tags.add(Tag(VALUE))  # set by some other method (or another module)
        return frozenset(tags)

    # ---------------------------------------------------------------- the methods `__init__` calls
    def _self_param(self, func: cst.FunctionDef) -> bool:
        """`func` is a plain method of a class whose first parameter is `self`."""
        params = [*func.params.posonly_params, *func.params.params]
        return self.model.class_of(func) is not None and self.model._is_method(func) and \
            params[0].name.value == "self" and not any(
                isinstance(d.decorator, cst.Name) and d.decorator.value == "classmethod" for d in func.decorators)

    def _call_effects(self, walker: _Walker, stmt: cst.CSTNode, state: State) -> Optional[State]:
        """The state after `stmt`, a statement directly in the body of `__init__` (or of a method
        it calls this way), when it is a call of a method of the class on `self` alone
        (`self.configure_amp()`): that method walked from the state at the call, to its normal end
        or a `return`; what it assigns on `self` is then what it left it (bound when assigned on
        every path). Anything else, a method that cannot be resolved (see `_init_callee`), or
        past MAX_INIT_CALLS calls deep: `state` unchanged (what the call assigns stays unknown:
        possibly unbound)."""
        if walker.calls is None or walker.calls >= MAX_INIT_CALLS or walker.effort[0] > MAX_INIT_EFFORT \
                or not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1 \
                or not isinstance(stmt.body[0], cst.Expr):
            return state
        call = stmt.body[0].value
        if not isinstance(call, cst.Call) or not isinstance(call.func, cst.Attribute) \
                or dotted(call.func.value) != "self" or any(a.star for a in call.args):
            return state
        method = self._init_callee(walker.scope, call.func.attr.value)  # type: ignore[arg-type]
        if method is None or method in walker.running or method is walker.scope:
            return state
        at = dict(state)
        nested = _Walker(self, method, inherit=lambda key: _self_conds(walker.get(at, key)),
                         calls=walker.calls + 1, running=(*walker.running, walker.scope))
        nested.effort = walker.effort
        ends = [nested.suite(method.body, {})]
        for r in self.model._nodes_in_scope(method, cst.Return):
            line = self.model.statement_of(r)
            ends.append(nested.before.get(line))  # type: ignore[arg-type]
        end = nested.join(*ends)
        walker.effort[0] += nested.visits
        if end is None:
            return state  # it always raises (a hook a subclass of another module may override): unknown
        out = dict(state)
        for key in sorted(k for k in end if k.startswith("self.")):
            tags = frozenset(_self_conds(end[key]))
            if key in nested.assigned:
                walker.assign(out, key, tags)
            elif tags != nested.initial(key):
                out[key] = tags  # a refinement (`self.optimizer.zero_grad()` ran)
        return out

    def _init_callee(self, caller: cst.FunctionDef, name: str) -> Optional[cst.FunctionDef]:
        """The method `self.<name>()` runs in `caller` (a method), when it is certain: a plain
        method (no decorator, not async, not a generator, `self` its first parameter) of the
        caller's class or of its bases of this file (every base of the way resolved), that no
        subclass of this file overrides and no code assigns as an instance attribute."""
        cls = self.model.class_of(caller)
        if cls is None or self.model._by_key.get(f"self.{name}"):
            return None
        method = self._resolved_method(cls, name, 0)
        if method is None or method.decorators or method.asynchronous is not None or not self._self_param(method) \
                or self.model._nodes_in_scope(method, cst.Yield):
            return None
        for sub in self.model.nodes_of(cst.ClassDef):
            if sub is not cls and cls in self._class_chain(sub) and self._resolved_method(sub, name, 0) is not method:
                return None
        return method

    def _resolved_method(self, cls: cst.ClassDef, name: str, depth: int) -> Optional[cst.FunctionDef]:
        """`name` of `cls` or of its bases, when every base on the way is a class of this file
        (else a base of another module might define it first) and they agree."""
        own = self.model.method(cls, name)
        if own is not None or depth > 8:
            return own
        bases = self.model._bases(cls)
        named = [b for b in cls.bases if not (isinstance(b.value, cst.Name) and b.value.value == "object")]
        if len(bases) != len(named) or cls.keywords:
            return None
        found = {self._resolved_method(b, name, depth + 1) for b in bases}
        return found.pop() if len(found) == 1 else None

    def _init_call_sites(self, cls: cst.ClassDef, method: cst.FunctionDef) -> List[Tuple[cst.FunctionDef, cst.Call]]:
        """The calls `self.<method>(...)` that may run while an object of `cls` is built: in the
        `__init__` of `cls`, of its bases and of its subclasses of this file, and in the methods
        those call on `self`, and so on (by name: any method of those classes of a name called)."""
        memo = self.__dict__.setdefault("_init_sites", {})
        hit = memo.get((id(cls), id(method)))
        if hit is not None:
            return hit
        related = [c for c in self.model.nodes_of(cst.ClassDef) if c is cls or cls in self._class_chain(c)]
        related += [c for c in self._class_chain(cls) if c not in related]
        funcs = [f for c in related for f in self.model.methods(c)]

        def self_calls(f: cst.FunctionDef) -> List[cst.Call]:
            return [c for c in self.model._nodes_in_scope(f, cst.Call) if isinstance(c.func, cst.Attribute)
                    and isinstance(c.func.value, cst.Name) and c.func.value.value == "self"]

        names = {"__init__"}
        grew = True
        while grew:
            grew = False
            for f in funcs:
                if f.name.value in names:
                    for c in self_calls(f):
                        if c.func.attr.value not in names:  # type: ignore[attr-defined]
                            names.add(c.func.attr.value)  # type: ignore[attr-defined]
                            grew = True
        hit = [(f, c) for f in funcs if f.name.value in names and f is not method
               for c in self_calls(f) if c.func.attr.value == method.name.value]  # type: ignore[attr-defined]
        memo[(id(cls), id(method))] = hit
        return hit

    def _at_call_sites(self, cls: cst.ClassDef, key: str, method: cst.FunctionDef) -> Set[Tag]:
        """What `key` may be where a call that builds the object runs `method` (`_init_call_sites`):
        a method `__init__` calls sees what `__init__` has assigned by then, not what it assigns
        after the call. Possibly unbound where the state there is not known."""
        out: Set[Tag] = set()
        busy = self.__dict__.setdefault("_sites_busy", set())
        for func, call in self._init_call_sites(cls, method):
            stmt = self.model.statement_of(call)
            if (id(func), key) in busy or self._bound_scope(call) is not func:
                out.add(Tag(UNBOUND, frozenset(), call))
                continue
            busy.add((id(func), key))
            try:
                walker = self._walker(func)
                if not walker.done or stmt not in walker.before:
                    out.add(Tag(UNBOUND, frozenset(), call))
                    continue
                state = walker.before[stmt]
                if state is None:
                    continue  # never reached
                for t in walker.get(state, key):
                    t = _portable(t, self._set_in_init_only)
                    out.add(Tag(UNBOUND, frozenset(), call) if t.kind == UNBOUND else t)
            finally:
                busy.discard((id(func), key))
        return out

    def _class_chain(self, cls: cst.ClassDef) -> List[cst.ClassDef]:
        out = [cls]
        i = 0
        while i < len(out) and len(out) < 8:
            for b in self.model._bases(out[i]):
                if b not in out:
                    out.append(b)
            i += 1
        return out

    def _init_end(self, init: cst.FunctionDef) -> Optional[State]:
        """The state at the end of `__init__` (a join of its normal end and its `return`s)."""
        walker = self._walker(init)
        body = init.body
        if not isinstance(body, cst.IndentedBlock) or not body.body:
            return None
        states = [walker.after.get(body.body[-1])]
        for r in self.model.nodes_of(cst.Return):
            if self.model.function_of(r) is init:
                line = self.model.statement_of(r)
                states.append(walker.before.get(line))
        return walker.join(*states)

    def _set_in_init_only(self, key: str) -> bool:
        """`self.model.x` assigned only in `__init__` methods and class bodies (a stable attribute)."""
        if not key.startswith("self.") or key.count(".") != 1:
            return False
        for node, _, _ in self.model._by_key.get(key, []):
            fn = self.model.function_of(node)
            if fn is None or fn.name.value != "__init__":
                return False
        return True


def _self_conds(tags: FrozenSet[Tag]) -> FrozenSet[Tag]:
    """Tags handed between a method and the `__init__` that calls it: only conditions on `self.`
    attributes name the same decision in both (a local of one is not the other's)."""
    out = set()
    for t in tags:
        kept = frozenset(c for c in t.conds if c[0][1] and all(k == "self" or k.startswith("self.") for k in c[0][1]))
        out.add(t if kept == t.conds else Tag(t.kind, kept, t.origin))
    return frozenset(out)


def _portable(tag: Tag, stable) -> Tag:
    """A tag of `__init__`'s end as seen from another method: only conditions on `self.`
    attributes that nothing but `__init__` assigns still name the same decision there."""
    kept = frozenset(c for c in tag.conds if all(stable(k) or k == "self" for k in c[0][1]) and c[0][1])
    return tag if kept == tag.conds else Tag(tag.kind, kept, tag.origin)


def _leaves(value: cst.CSTNode) -> List[cst.CSTNode]:
    if isinstance(value, cst.IfExp):
        return _leaves(value.body) + _leaves(value.orelse)
    if isinstance(value, cst.BooleanOperation):
        return _leaves(value.left) + _leaves(value.right)
    return [value]


def _head_expressions(stmt: cst.CSTNode) -> List[cst.CSTNode]:
    """The expressions a statement evaluates before anything else: all of a simple line's, a
    compound statement's test / iterable / context managers."""
    if isinstance(stmt, cst.SimpleStatementLine):
        out: List[cst.CSTNode] = []
        for sm in stmt.body:
            if isinstance(sm, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
                if sm.value is not None:
                    out.append(sm.value)
                targets = [t.target for t in sm.targets] if isinstance(sm, cst.Assign) else [sm.target]
                out += [r for r in (_target_reads(t) for t in targets) if r is not None]
            elif isinstance(sm, (cst.Expr, cst.Return)) and sm.value is not None:
                out.append(sm.value)
            elif isinstance(sm, cst.Assert):
                out.append(sm.test)
        return out
    if isinstance(stmt, (cst.If, cst.While)):
        return [stmt.test]
    if isinstance(stmt, cst.For):
        return [stmt.iter]
    if isinstance(stmt, cst.With):
        return [i.item for i in stmt.items]
    return []


def _definition_expressions(node: cst.CSTNode) -> List[cst.CSTNode]:
    out: List[cst.CSTNode] = [d.decorator for d in node.decorators]
    if isinstance(node, cst.FunctionDef):
        p = node.params
        out += [x.default for x in (*p.posonly_params, *p.params, *p.kwonly_params) if x.default is not None]
    elif isinstance(node, cst.ClassDef):
        out += [a.value for a in (*node.bases, *node.keywords)]
    return out


def _assigned_keys(stmt: cst.CSTNode) -> Set[str]:
    out: Set[str] = set()
    for node, target, _ in _assignments_in(stmt):
        key = dotted(target)
        if key is not None:
            out.add(key)
        out.update(target_names(target))
    return out


def _assignments_in(stmt: cst.CSTNode):
    found = []

    class V(cst.CSTVisitor):
        def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
            found.append((node, node.target, None))

        def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
            found.append((node, node.target, None))

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            found.append((node, node.target, None))

        def visit_Del(self, node: cst.Del) -> None:
            found.append((node, node.target, None))

        def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
            found.append((node, node.target, None))

    stmt.visit(V())
    return found


def _touches(key: str, assigned: Set[str]) -> bool:
    """`key` (or what it is an attribute of) was assigned."""
    parts = key.split(".")
    return any(".".join(parts[:i]) in assigned for i in range(1, len(parts) + 1))


def _expr_statement(key: str, deref: bool) -> cst.BaseStatement:
    code = f"{key}.__class__" if deref else key
    return parse_statement(code + "\n")


# the statement heads and the uses in them, for the engine's check of a pass of fixes
head_expressions = _head_expressions
uses = _uses

__all__ = ["Bound", "State", "Tag", "UNBOUND", "NONE", "VALUE", "head_expressions", "uses"]
