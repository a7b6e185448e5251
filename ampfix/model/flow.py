"""Paths: which code may run after which, within one run of a function or one loop iteration.

Every node gets its *conditional contexts* within its function: the decisions that must go a
certain way for it to run (an `if` branch, a loop body, a short-circuit operand, an `except`
handler, the fall-through after an `if` that ends in `continue`/`return`/...). A context is a
(group, branch) pair. Two nodes whose contexts take different branches of one group never run
in the same pass (`exclusive`). `if` tests that are *stable* (names, attributes, comparisons:
no calls, the names not reassigned in between) form one group per text, so `if use_amp:` in two
places is one decision, and `if amp: A` ... `if not amp: B` are exclusive.

Traces (`events.py`) qualify the contexts of a callee's nodes with the call path, so the same
questions are answered across helpers, methods and closures:

* `exclusive(a, b)`: never both in one pass;
* `mandatory_between(c, a, b)`: every path from `a` to `b` runs `c`;
* `may_precede(a, b)`: some path runs `a` and then `b` (in text order, not exclusive, and no
  `continue`/`break`/`return`/`raise` that runs on every path in between cuts it);
* `path_without(a, b, pred)`: some path from `a` to `b` runs no event matching `pred`.
"""

from __future__ import annotations

import re
from typing import Dict, Hashable, List, Optional, Tuple

import libcst as cst

from ampfix.model.readwrite import binding_counts
from ampfix.model.tree import COMPREHENSIONS, FUNCTION_BOUNDARY, LOOP_TYPES, child_nodes, dotted, node_types

Group = Hashable
Contexts = Tuple[Tuple[Group, Hashable], ...]

_STABLE_NODES = (cst.Name, cst.Attribute, cst.Comparison, cst.UnaryOperation, cst.BooleanOperation,
                 cst.BinaryOperation, cst.Integer, cst.Float, cst.SimpleString, cst.Subscript, cst.Index,
                 cst.SubscriptElement, cst.ComparisonTarget, cst.Not, cst.And, cst.Or, cst.Is, cst.IsNot,
                 cst.Equal, cst.NotEqual, cst.LessThan, cst.LessThanEqual, cst.GreaterThan, cst.GreaterThanEqual,
                 cst.In, cst.NotIn, cst.Modulo, cst.Add, cst.Subtract, cst.Multiply, cst.FloorDivide, cst.Divide,
                 cst.LeftParen, cst.RightParen, cst.Dot, cst.LeftSquareBracket, cst.RightSquareBracket,
                 cst.SimpleWhitespace, cst.ParenthesizedWhitespace, cst.TrailingWhitespace, cst.Newline,
                 cst.Comment, cst.EmptyLine, cst.BitAnd, cst.BitOr)
_STABLE_TYPES = node_types(*_STABLE_NODES)
_IFS, _LOOPS, _COMPREHENSIONS = node_types(cst.If, cst.IfExp), node_types(*LOOP_TYPES), node_types(*COMPREHENSIONS)
_SPACE = re.compile(r"\s+")


class Flow:
    """Conditional contexts and path queries (a part of `AmpModel`)."""

    def _init_flow(self) -> None:
        self._contexts_memo: Dict[cst.CSTNode, Contexts] = {}
        self._stable: Dict[cst.CSTNode, Optional[Tuple[Hashable, bool]]] = {}
        self._fall: Dict[cst.CSTNode, Dict[cst.CSTNode, Contexts]] = {}

    # ---------------------------------------------------------------- contexts
    def _contexts(self, node: cst.CSTNode) -> Contexts:
        """The conditional contexts of `node` within its function, outermost first. Groups are
        local: ("if", node), ("cond", scope, text, version, names), ("loop", node), ... (see module
        docstring); `events.py` qualifies them with the call path."""
        cached = self._contexts_memo.get(node)
        if cached is not None:
            return cached
        out: List[Tuple[Group, Hashable]] = []
        child = node
        for anc in self.ancestors(node):
            kind = type(anc)  # (one type test per branch: `node_types`)
            if kind in FUNCTION_BOUNDARY:
                break
            if kind in _IFS:
                if child is anc.body:  # type: ignore[attr-defined]
                    out.extend(reversed(self._body_decisions(anc)))
                elif child is anc.orelse:  # type: ignore[attr-defined]
                    out.append(self._decision(anc, False))
            elif kind in _LOOPS:
                if child is anc.body:  # type: ignore[attr-defined]
                    out.append((("loop", anc), True))
                elif child is anc.orelse:  # type: ignore[attr-defined]
                    out.append((("loop-else", anc), True))
            elif kind is cst.BooleanOperation:
                if child is anc.right:  # type: ignore[attr-defined]
                    out.append((("bool", anc), True))
            elif kind is cst.ExceptHandler:
                out.append((("except", anc), True))
            elif kind is cst.MatchCase:
                out.append((("match", self.parent(anc)), id(anc)))
            elif kind in _COMPREHENSIONS:
                if child is not _comp_iter(anc):
                    out.append((("comp", anc), True))
            elif kind is cst.IndentedBlock:
                out.extend(reversed(self._fallthrough(anc).get(child, ())))
            child = anc
        result = tuple(reversed(out))
        self._contexts_memo[node] = result
        return result

    def _fallthrough(self, block: cst.IndentedBlock) -> Dict[cst.CSTNode, Contexts]:
        """For each statement of `block`: the early-`return` guards before it (`if not x:
        return`), whose fall-through it runs in, and the decisions of the guards that exit
        (`_guard_decision`): after `if not step: raise ...` the code runs where `step` holds, so a
        later `if step:` of the same stable test can only take its true branch there. (Loop
        guards such as `if skip: continue` add neither: the loop body is a context already, the
        exit cuts paths by itself, and what they decide for the rest of their iteration the path
        queries read apart, `_loop_forced`.)"""
        cached = self._fall.get(block)
        if cached is None:
            cached = {}
            acc: Contexts = ()
            for stmt in block.body:
                cached[stmt] = acc
                if isinstance(stmt, cst.If):
                    acc = acc + self._guard_contexts(stmt)
            self._fall[block] = cached
        return cached

    def _guard_contexts(self, stmt: cst.If) -> Contexts:
        """The contexts the statements after the `if` `stmt` (in its block) run in: its
        fall-through group when a branch always returns or raises, and its stable decision
        (`_guard_decision`)."""
        out: Contexts = ((("fallthrough", stmt), True),) if self._returns(stmt) else ()
        decision = self._guard_decision(stmt)
        return out + (decision,) if decision is not None else out

    def _guard_decision(self, stmt: cst.If) -> Optional[Tuple[Group, Hashable]]:
        """The branch of the stable test of `stmt` that the code after it runs in, where exactly
        one branch always leaves the call (ends in `return` or `raise`, `leaves_block`; an `if`
        without `else` has an empty false branch): the other one. None for a test that is not
        stable (it may decide differently the next time) or when no branch, or both, exit. A
        later test of the same text with none of its names assigned in between is the same group
        (`_stable_expr`), so it can only take that branch where the code goes on."""
        body, orelse = leaves_block(stmt.body), leaves_block(stmt.orelse)
        if body == orelse or self._stable_test(stmt) is None:
            return None
        return self._decision(stmt, not body)

    def _loop_forced(self, node: cst.If) -> Tuple[Tuple[Group, Hashable], ...]:
        """The decisions an earlier loop guard of the same iteration has already taken where
        `node` runs: for each `if` before `node` in a block around it (within its function)
        whose one branch always ends in `continue` or `break` (`leaves_iteration`), the other
        branch of its stable test. In `if not boundary: continue` ... `if boundary:
        scaler.step(opt); scaler.update()`, the second test is true wherever it runs, so its
        body runs wherever the code after the guard runs (`_forced_decisions`, which the path
        queries read). Unlike the exit guards of `_guard_decision`, these decisions are not
        contexts of the code after the guard: they hold for one iteration only, and the
        queries that take a loop body to run at least once would read them as conditions on the
        whole loop (the unscale_ after `if i != idx: continue` in a loop over the optimizers). No
        loop may lie between the guard's block and `node` (a name of the test could be assigned
        in an earlier pass of it); the decision is the same group only where the names of the
        test hold the same assignments (`_stable_expr`'s version)."""
        memo = self.__dict__.setdefault("_loop_forced_memo", {})
        cached = memo.get(node)
        if cached is not None:
            return cached
        out: List[Tuple[Group, Hashable]] = []
        if self._stable_test(node) is not None:
            child: cst.CSTNode = node
            for anc in self.ancestors(node):
                kind = type(anc)
                if kind in FUNCTION_BOUNDARY or kind in _LOOPS or kind in _COMPREHENSIONS:
                    break
                if kind is cst.IndentedBlock:
                    for stmt in anc.body:  # type: ignore[attr-defined]
                        if stmt is child:
                            break
                        if type(stmt) is not cst.If:
                            continue
                        body, orelse = leaves_iteration(stmt.body), leaves_iteration(stmt.orelse)
                        if body != orelse and self._stable_test(stmt) is not None:
                            out.append(self._decision(stmt, not body))
                child = anc
        result = tuple(out)
        memo[node] = result
        return result

    def _forced_decisions(self, node: cst.CSTNode) -> Contexts:
        """The contexts of `node` (within its function) that a loop guard earlier in the same
        iteration has already decided (`_loop_forced`): the branch of an `if` around `node` that
        is taken wherever the code reaches that `if`. Path queries read them as decided where
        `node` runs; they stay contexts (the untaken arm is still exclusive with it)."""
        out: List[Tuple[Group, Hashable]] = []
        child = node
        for anc in self.ancestors(node):
            kind = type(anc)
            if kind in FUNCTION_BOUNDARY:
                break
            if kind is cst.If and (child is anc.body or child is anc.orelse):  # type: ignore[attr-defined]
                forced = self._loop_forced(anc)  # type: ignore[arg-type]
                if forced:
                    mine = self._body_decisions(anc) if child is anc.body else [self._decision(anc, False)]  # type: ignore[attr-defined]
                    out.extend(d for d in mine if d in forced)
            child = anc
        return tuple(out)

    def _fallthrough_at_end(self, block: cst.CSTNode) -> Contexts:
        """The early-`return` guards of `block` (an `IndentedBlock`) that a path reaching its end
        has fallen through (`_fallthrough` after its last statement): a path that took one of
        them left the function before the end."""
        if not isinstance(block, cst.IndentedBlock) or not block.body:
            return ()
        last = block.body[-1]
        acc = self._fallthrough(block)[last]
        if isinstance(last, cst.If):
            acc = acc + self._guard_contexts(last)
        return acc

    @staticmethod
    def _returns(stmt: cst.If) -> bool:
        """Some branch of this `if` always ends in `return`/`raise`."""
        return ends_in_exit(stmt.body) or ends_in_exit(stmt.orelse)

    def _decision(self, node: cst.CSTNode, polarity: bool) -> Tuple[Group, Hashable]:
        marker = self._marker_decision(node, polarity)
        if marker is not None:
            return marker
        stable = self._stable_test(node)
        if stable is None:
            return (("if", node), polarity)
        group, positive = stable
        return (group, polarity if positive else not polarity)

    def _marker_decision(self, node: cst.CSTNode, polarity: bool) -> Optional[Tuple[Group, Hashable]]:
        """A test `N is None` (`is not None`, negated) of a local `N` that marks whether an
        earlier `if` took a branch: before the test the function binds `N` exactly twice,
        `N = None` right before that `if` (in a block the test comes later in) and, as a
        statement of one branch of it, `N = <a value never None>` (a literal, True/False, a
        container, an arithmetic or comparison result, `clip_grad_norm_(...)`); any other binding
        of `N` is a plain assignment after the test, with no loop between the test and that block
        (it cannot run before the test again). The test is then that `if`'s decision: deepinv's
        `grad_norm = None; if clip: unscale_(); grad_norm = clip_grad_norm_()` and later
        `if grad_norm is not None: ... else: unscale_()` never unscale twice. None for any other
        test (or one whose `N` may be bound otherwise: a loop target, `del`, `with ... as`, a
        nested `nonlocal`)."""
        memo = self.__dict__.setdefault("_marker_memo", {})
        if node in memo:
            found = memo[node]
        else:
            memo[node] = None
            found = memo[node] = self._marker_of(node)
        if found is None:
            return None
        guard, taken, true_when_none = found
        is_none = polarity == true_when_none
        return self._decision(guard, (not taken) if is_none else taken)

    def _marker_of(self, node: cst.CSTNode) -> Optional[Tuple[cst.If, bool, bool]]:
        """(the `if` whose branch `N` marks, the branch that assigns it, whether `node`'s test is
        true when `N` is None) for `_marker_decision`."""
        if type(node) is not cst.If:
            return None
        test, true_when_none = node.test, True  # type: ignore[attr-defined]
        while isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            test, true_when_none = test.expression, not true_when_none
        if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and isinstance(test.left, cst.Name)
                and isinstance(test.comparisons[0].operator, (cst.Is, cst.IsNot))
                and _is_none(test.comparisons[0].comparator)):
            return None
        if isinstance(test.comparisons[0].operator, cst.IsNot):
            true_when_none = not true_when_none
        name, func = test.left.value, self.function_of(node)
        if func is None or self.binding_scope(name, func) is not func or self._is_param(func, name):
            return None
        entries = [(n, v) for n, v, sc in self._by_key.get(name, []) if sc is func]
        if binding_counts(func, self.__dict__.setdefault("_bindings_memo", {})).get(name) != len(entries):
            return None  # bound otherwise too (a loop target, `del`, `with ... as`, a nested `nonlocal`)
        later = [n for n, _ in entries if not self.before(n, node)]
        entries = [(n, v) for n, v in entries if self.before(n, node)]
        if len(entries) != 2 or not all(isinstance(n, cst.Assign) and len(n.targets) == 1
                                        and isinstance(n.targets[0].target, cst.Name) for n, _ in entries):
            return None
        nones = [n for n, v in entries if _is_none(v)]
        values = [n for n, v in entries if not _is_none(v) and self._never_none(v)]
        if len(nones) != 1 or len(values) != 1:
            return None
        none_stmt, value_stmt = self.statement_of(nones[0]), self.statement_of(values[0])
        branch_block = self.parent(value_stmt) if value_stmt is not None else None
        owner = self.parent(branch_block) if isinstance(branch_block, cst.IndentedBlock) else None
        if isinstance(owner, cst.Else):
            guard, taken = self.parent(owner), False
        else:
            guard, taken = owner, True
        if type(guard) is not cst.If or guard is node or (taken and guard.body is not branch_block):
            return None
        block = self.block_of(guard)
        if block is None or self.block_of(none_stmt) is not block:
            return None
        body = list(block.body)
        at = self._statement_in(node, block)
        i = body.index(guard)
        if i == 0 or body[i - 1] is not none_stmt or at is None or body.index(at) <= i:
            return None
        if later and any(type(a) in _LOOPS or type(a) in _COMPREHENSIONS
                         for a in self._ancestors_below(node, block)):
            return None  # an assignment after the test may run before it again (a loop around it)
        return guard, taken, true_when_none

    def _ancestors_below(self, node: cst.CSTNode, top: cst.CSTNode) -> List[cst.CSTNode]:
        out = []
        for anc in self.ancestors(node):
            if anc is top:
                break
            out.append(anc)
        return out

    def _never_none(self, value: cst.CSTNode) -> bool:
        """`value` cannot evaluate to None (`_marker_of`)."""
        if isinstance(value, (cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString, cst.ConcatenatedString,
                              cst.FormattedString, cst.List, cst.Tuple, cst.Dict, cst.Set, cst.ListComp,
                              cst.SetComp, cst.DictComp, cst.GeneratorExp, cst.Lambda, cst.Comparison)):
            return True
        if isinstance(value, cst.Name):
            return value.value in ("True", "False")
        if isinstance(value, cst.BinaryOperation):
            return True  # (an operator's result; `__add__` returning None is not code anyone writes)
        if isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.Not):
            return True
        if isinstance(value, cst.Call):
            api = self.api_of(value)  # type: ignore[attr-defined]
            return api is not None and api.kind == "clip_grad" and "clip_grad_norm" in api.qualname
        return False

    def _body_decisions(self, node: cst.CSTNode) -> List[Tuple[Group, Hashable]]:
        """The decisions the body of the `if` (or conditional expression) `node` runs under,
        outermost first: each operand's for `if X and Y:` with no `else` and no exit
        (`_conjuncts`); else the whole test's (innermost), after each operand's where the test is
        a conjunction of stable tests (`_operands`)."""
        parts = self._conjuncts(node)
        if parts is not None:
            return parts
        return [*(self._operands(node) or () if type(node) is cst.If else ()), self._decision(node, True)]

    def _conjuncts(self, node: cst.CSTNode) -> Optional[List[Tuple[Group, Hashable]]]:
        """The body of `if X and Y:` runs where X and where Y: one context per operand, when
        every operand is a stable test, the `if` has no `else` and no branch of it exits (the
        decision of a whole test is kept where its false branch matters: an `else`, the code an
        early `return` falls through to). So `if use_amp and clip:` after `if use_amp:` is the
        same decision on `use_amp` (`scaler.unscale_` there runs wherever the scaled backward
        and the clip both run)."""
        if type(node) is not cst.If or node.orelse is not None or self._returns(node):  # type: ignore[arg-type]
            return None
        return self._operands(node)

    def _operands(self, node: cst.If) -> Optional[List[Tuple[Group, Hashable]]]:
        """The decisions of the operands of `node`'s test `X and Y`, when every operand is a
        stable test; None otherwise. Where the whole test is the decision (`_conjuncts`: an
        `else`, an exit), its body also runs under each of them: `if use_amp and fp16:
        scaler.scale(loss).backward() else: loss.backward()` and a later `if use_amp and fp16:
        scaler.unscale_(opt)` run on the same paths."""
        memo = self.__dict__.setdefault("_operands_memo", {})
        if node in memo:
            return memo[node]
        memo[node] = None
        operands: List[cst.BaseExpression] = []
        stack = [node.test]  # type: ignore[attr-defined]
        while stack:
            t = stack.pop()
            if isinstance(t, cst.BooleanOperation) and isinstance(t.operator, cst.And):
                stack.extend((t.right, t.left))
            else:
                operands.append(t)
        if len(operands) < 2:
            return None
        out = []
        for t in operands:
            stable = self._stable_expr(t, node)  # (group, positive): the body runs where it holds
            if stable is None:
                return None
            out.append(stable)
        memo[node] = out
        return out

    def _stable_test(self, node: cst.CSTNode) -> Optional[Tuple[Hashable, bool]]:
        """For an `if` whose test is stable: (group, whether the text is the positive form)."""
        if node in self._stable:
            return self._stable[node]
        result = self._stable_expr(node.test, node)  # type: ignore[attr-defined]
        self._stable[node] = result
        return result

    def _stable_expr(self, test: cst.CSTNode, node: cst.CSTNode) -> Optional[Tuple[Hashable, bool]]:
        """`_stable_test` of the test expression `test` of the `if` (or operand of its test) `node`."""
        positive = True
        while isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            test, positive = test.expression, not positive
        result: Optional[Tuple[Hashable, bool]] = None
        if self._is_stable(test):
            text = _SPACE.sub(" ", self.code(test))
            if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
                op = test.comparisons[0].operator
                if isinstance(op, (cst.IsNot, cst.NotEqual, cst.NotIn)):
                    positive = not positive
                    text = text.replace(" is not ", " is ").replace(" != ", " == ").replace(" not in ", " in ")
            func = self.function_of(node)
            roots = tuple(sorted({(dotted(n) or "").split(".")[0] for n in self._names_in(test)}))
            # a test on locals is this call's own decision; one on parameters, `self` and globals
            # is portable: through a call it is the caller's test on the arguments' names
            local = func is not None and any(
                r != "self" and self.binding_scope(r, func) is func and not self._is_param(func, r) for r in roots)
            version = tuple(sorted(id(a) for a in self._assignments_before(test, node)))
            result = (("cond", func if local else None, text, version, roots), positive)
        return result

    def _is_stable(self, test: cst.CSTNode) -> bool:
        stack = [test]
        while stack:
            n = stack.pop()
            if type(n) not in _STABLE_TYPES:
                return False
            stack.extend(child_nodes(n))
        return True

    def _names_in(self, test: cst.CSTNode) -> List[cst.CSTNode]:
        out: List[cst.CSTNode] = []
        stack = [test]
        while stack:
            n = stack.pop()
            if isinstance(n, (cst.Name, cst.Attribute)) and dotted(n) is not None:
                out.append(n)
                continue
            stack.extend(child_nodes(n))
        return out

    def _assignments_before(self, test: cst.CSTNode, at: cst.CSTNode) -> List[cst.CSTNode]:
        """For each name in the test: its last assignment in the same function before `at`."""
        scope = self.scope_of(at)
        out = []
        for n in self._names_in(test):
            last = None
            for node, _, s in self._by_key.get(dotted(n) or "", []):
                if s is scope and self.before(node, at):
                    last = node
            if last is not None:
                out.append(last)
        return out

    # ---------------------------------------------------------------- exits
    def _exit_kind(self, stmt: cst.CSTNode) -> Optional[str]:
        """"continue"/"break"/"return"/"raise"/"exit" for a statement that leaves its block."""
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Continue):
                    return "continue"
                if isinstance(small, cst.Break):
                    return "break"
                if isinstance(small, cst.Return):
                    return "return"
                if isinstance(small, cst.Raise):
                    return None if self._caught(stmt) else "raise"
                if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                    if dotted(small.value.func) in ("sys.exit", "exit", "quit", "os._exit"):
                        return "exit"
        return None

    def _caught(self, node: cst.CSTNode) -> bool:
        """`node` is inside a `try` body that has handlers (a raise there may be caught)."""
        child = node
        for anc in self.ancestors(node):
            if isinstance(anc, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return False
            if isinstance(anc, (cst.Try, cst.TryStar)) and child is anc.body and anc.handlers:
                return True
            child = anc
        return False


def _is_none(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"


def _comp_iter(comp: cst.CSTNode) -> Optional[cst.CSTNode]:
    """The first iterable of a comprehension: evaluated once, unconditionally."""
    for_in = getattr(comp, "for_in", None)
    return for_in


__all__ = ["Flow", "Contexts"]


def ends_in_exit(block: Optional[cst.CSTNode]) -> bool:
    """The block (a branch of an `if`) ends in `return`/`raise` (`Flow._returns`; a module
    function, not a closure: a recursive closure is a reference cycle per call)."""
    if isinstance(block, cst.Else):
        block = block.body
    if isinstance(block, cst.If):
        return ends_in_exit(block.body) or ends_in_exit(block.orelse)
    body = getattr(block, "body", None)
    if not isinstance(body, (list, tuple)) or not body:
        return False
    last = body[-1]
    return isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[-1], (cst.Return, cst.Raise))


def leaves_block(block: Optional[cst.CSTNode]) -> bool:
    """The branch of an `if` (a block, an `else`, an `elif`) always ends in `return` or `raise`:
    no path of this call goes on after the `if` from it (`Flow._guard_decision`). (`continue` and
    `break` leave one iteration: the decision would hold for the rest of that iteration only,
    and the queries that take a loop body to run at least once would read it as a condition on
    the whole loop; `leaves_iteration` and `Flow._loop_forced` take those.)"""
    if isinstance(block, cst.Else):
        block = block.body
    if isinstance(block, cst.If):
        return leaves_block(block.body) and leaves_block(block.orelse)
    body = getattr(block, "body", None)
    if not isinstance(body, (list, tuple)) or not body:
        return False
    last = body[-1]
    return isinstance(last, cst.SimpleStatementLine) and isinstance(
        last.body[-1], (cst.Return, cst.Raise))


def leaves_iteration(block: Optional[cst.CSTNode]) -> bool:
    """The branch of an `if` always ends in `continue` or `break` (or, in an `elif`/`else`
    chain, each branch ends in one of those or in `return`/`raise`, at least one a loop exit):
    no path of this iteration goes on after the `if` from it (`Flow._loop_forced`)."""
    return _ends(block) == "loop"


def _ends(block: Optional[cst.CSTNode]) -> Optional[str]:
    """"loop" (`continue`/`break`), "call" (`return`/`raise`) or None for a branch that may go
    on; a chain whose branches all leave is "loop" when any of them is."""
    if isinstance(block, cst.Else):
        block = block.body
    if isinstance(block, cst.If):
        a, b = _ends(block.body), _ends(block.orelse)
        if a is None or b is None:
            return None
        return "loop" if "loop" in (a, b) else "call"
    body = getattr(block, "body", None)
    if not isinstance(body, (list, tuple)) or not body:
        return None
    last = body[-1]
    if not isinstance(last, cst.SimpleStatementLine):
        return None
    small = last.body[-1]
    if isinstance(small, (cst.Continue, cst.Break)):
        return "loop"
    return "call" if isinstance(small, (cst.Return, cst.Raise)) else None
