"""Iterations: which training iteration an event runs in, where that iteration ends, and the
gradient-accumulation boundaries inside it.

A trace is one pass of its root with no loop back-edge, so "the next iteration" is not a place
in it. What a rule about the GradScaler's life cycle needs is the *end* of the iteration: the
point after the last event of the loop body, and every `continue` that leaves that body early.
`iteration_of` picks the loop that is the training iteration of an event (the innermost loop
around it that also runs a backward: a loop over optimizers is not one), or None when the
whole call of the root is one iteration (a per-step method called from elsewhere).
`iteration_ends` gives its end points as trace events (synthetic "end" points carry the loop's
own conditional contexts), so the path queries of `events.py` answer "can this step reach the
end of its iteration without an `update()`?".

Accumulation boundaries: an `if` inside the iteration whose test says "this micro-batch steps"
(a modulo test such as `(i + 1) % accum == 0`, or a flag named like `should_step`,
`update_grad`, `accumulate`...), and that guards the optimizer's step or `zero_grad` while a
backward of the same iteration runs outside it (`accumulation_misplaced`).

Also here: optimizer construction (`builds_optimizer`, the OPT_NEW event), lazily initialised
objects (`guarded_by_test_of`), literally disabled scalers (`scaler_always_disabled`) and the
root functions whose name says they run once per step or epoch (`per_step_name`).
"""

from __future__ import annotations

import functools
import itertools
import re
from dataclasses import dataclass
from typing import Callable, Dict, Hashable, List, Optional, Tuple

import libcst as cst

from ampfix.model.events import BACKWARD, EXIT, SCALER_STEP, UNSCALE, UPDATE, ZERO_GRAD, Event, Trace, TraceEvent
from ampfix.model.flow import ends_in_exit
from ampfix.model.parsing import parse_expression
from ampfix.model.readwrite import reads_writes
from ampfix.model.syntax import call_name, literal_bool
from ampfix.model.tree import child_nodes, dotted, nodes_under
from ampfix.model.values import ReturnedElement

Group = Hashable
# a test that names gradient accumulation or "this micro-batch steps"
# a test that says "this is the last micro-batch" (of the loader, the window)
LAST_TEST = re.compile(r"\bis_last|last_batch|last_micro|last_iter_in|end_of_accum", re.IGNORECASE)
ACCUM_TEST = re.compile(r"accum|grad_acc|acc_step|accu_step|should_step|do_step|update_grad|need_update|"
                        r"sync_grad|optimizer_step|is_last_micro|boundary|update_freq", re.IGNORECASE)
# a test of whether the gradients (or their norm) are finite: `not torch.isfinite(grad_norm)`,
# `math.isnan(total_norm)`, `grad_norm == float("inf")` (a test of the loss alone is not one)
NONFINITE_WORD = re.compile(r"\b(?:isfinite|isnan|isinf|isposinf|isneginf|inf|nan)\b", re.IGNORECASE)
GRADIENT_WORD = re.compile(r"grad|norm", re.IGNORECASE)
_NAME = re.compile(r"(?<![\w.])[A-Za-z_]\w*")
_CALLED = re.compile(r"(?<![\w])([A-Za-z_]\w*)\s*\(")  # a called name, a method's too (`self.f(`)
FACTORY_EXCLUDE = re.compile(r"step|zero|load|state|sched|param|wrap|close|restore", re.IGNORECASE)
PER_STEP_TOKENS = {"step", "iter", "iteration", "batch", "epoch", "optimize"}
NOT_PER_STEP_TOKENS = {"setup", "init", "build", "create", "make", "configure", "prepare", "get", "test", "main",
                       "demo", "example", "benchmark", "bench"}
PER_STEP_PARAMS = {"current_iter", "cur_iter", "curr_iter", "iteration", "global_step", "step", "batch_idx",
                   "batch_nb", "batch_index", "i_iter", "epoch"}


@dataclass
class Misplaced:
    """A scaler call that runs on every micro-batch although its optimizer steps only on an
    accumulation boundary."""

    event: TraceEvent  # the unscale_/step/update that runs outside the boundary
    guarded: TraceEvent  # the step (or zero_grad) the boundary guards
    boundary: Group  # the boundary's decision group
    iteration: Optional[Group]


def _tokens(name: str) -> List[str]:
    name = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return [t for t in name.lower().split("_") if t]


EPOCH_TOKENS = {"epoch", "epochs"}
_SCALER_CALLS = {"unscale_", "step", "update"}


class Iterations:
    """Training iterations, their ends, accumulation boundaries (a part of `AmpModel`)."""

    # ---------------------------------------------------------------- iterations and their ends
    def iteration_of(self, trace: Trace, ev: TraceEvent) -> Optional[Group]:
        """The loop (a qualified group `(frame, ("loop", node))`) that is `ev`'s training
        iteration: the innermost loop around it that also runs a backward. None: one call of the
        root is the iteration."""
        loops = ev.loops()
        if not loops:
            return None
        with_backward = trace.groups_of(BACKWARD)
        for group in reversed(loops):
            if group in with_backward:
                return group
        return None

    def _loop_context(self, trace: Trace, group: Group) -> Dict[Group, Hashable]:
        """The contexts the loop `group` itself runs in (its body adds `group`): in a member's
        contexts, those recorded before the loop's own group (the traces record a caller's
        contexts first, then each function's contexts outermost first)."""
        member = trace.members(group)[0]
        out: Dict[Group, Hashable] = {}
        for g, br in member.ctx.items():
            if g == group:
                break
            out[g] = br
        return out

    def _iteration_ends(self, trace: Trace, group: Optional[Group]) -> List[TraceEvent]:
        """The places one iteration ends: a synthetic end point after the last event of the loop
        body (for None: of the root), then every `continue` of that loop (for None: every
        `return` of the root's own body)."""
        if not trace.events:
            return []
        if group is None:
            # the end of the root's body: past its early returns (`if overflow: ...; return`)
            body = getattr(trace.root, "body", None)
            ctx = {self._qualify(g, ()): br for g, br in self._fallthrough_at_end(body)}
            end = TraceEvent(Event("end", trace.root), (trace.root,), len(trace.events) - 0.5, ctx, None)
            exits = [e for e in trace.of(EXIT) if e.event.detail == "return" and not e.frame]
            return [end, *exits]
        frame, (_, loop) = group
        members = trace.members(group)
        ctx = dict(self._loop_context(trace, group))
        ctx[group] = True
        if not isinstance(loop, cst.CSTNode):  # a loop of another module's function: ends at its call
            end = TraceEvent(Event("end", members[-1].node), members[-1].path, members[-1].order + 0.5, ctx, None,
                             frame=frame)
            exits = [e for e in trace.of(EXIT) if e.event.detail == "continue" and e.event.loop == group]
            return [end, *exits]
        prefix = members[0].path[:len(frame)]
        end = TraceEvent(Event("end", loop), prefix + (loop,), members[-1].order + 0.5, ctx, None, frame=frame)
        exits = [e for e in trace.of(EXIT) if e.event.detail == "continue" and e.event.loop is loop
                 and (e.frame, ("loop", loop)) == group]
        return [end, *exits]

    def leaves_iteration_without(self, trace: Trace, ev: TraceEvent, group: Optional[Group],
                                 blocks: Callable[[TraceEvent], bool]) -> Optional[TraceEvent]:
        """An end of `ev`'s iteration (see `iteration_ends`) that some path from `ev` reaches with
        no event `blocks` accepts in between; None when every path meets one."""
        for end in self._iteration_ends(trace, group):
            if end.order > ev.order and self.path_avoiding(trace, ev, end, blocks):
                return end
        return None

    def path_avoiding(self, trace: Trace, a: Optional[TraceEvent], b: TraceEvent,
                      blocks: Callable[[TraceEvent], bool]) -> bool:
        """Some path runs `a` (None: from the start) then `b` and none of the events `blocks`
        accepts in between. Unlike `path_without`, which asks whether one such event is
        mandatory, this also sees events that cover every path together (one `update()` in each
        arm of an if/else). Loops entered after `a` are taken to run at least once (a loop over
        optimizers); when the decisions are too many to enumerate the answer is False."""
        if a is not None and not self.may_precede(trace, a, b):
            return False
        actx = a.ctx if a is not None else {}
        known = self._known_tests({**actx, **b.ctx})
        for e in (a, b):
            facts = self._receiver_not_none(e)
            known.update(facts)
            for key in facts:  # (they hold whatever the assignments)
                known.versions.pop(key, None)  # type: ignore[attr-defined]
        constraints: List[Dict[Group, Hashable]] = []
        for e in trace.span(a, b):
            if not blocks(e) or self.exclusive(e, b) or (a is not None and self.exclusive(e, a)):
                continue
            extra = {}
            forced = self._forced_in_trace(trace, e)
            for g, br in e.ctx.items():
                if g in actx or g in b.ctx or _is_loop(g) or (forced and forced.get(g, _OTHER) == br):
                    continue
                value = self._test_value(g, known)
                if value is None:
                    extra[g] = br
                elif value != br:
                    break  # decided the other way on this path: `e` does not run
            else:
                if not extra:
                    return False  # it runs on every path
                constraints.append(extra)
        if not constraints:
            return True
        domains: Dict[Group, List[Hashable]] = {}
        for c in constraints:
            for g, br in c.items():
                domains.setdefault(g, [])
                if br not in domains[g]:
                    domains[g].append(br)
        links = _fallthrough_links(domains)
        falls = {ft for ft, _ in links.values()}
        for g, values in domains.items():
            if g in links:  # an early-return `if`: both branches; the fall-through after it follows
                domains[g] = [links[g][1], not links[g][1]]
            elif g in falls:
                domains[g] = [True, _OTHER]
            elif not (_is_binary(g) and set(values) == {True, False}):
                values.append(_OTHER)  # a branch none of them takes (not entered, another case)
        groups = list(domains)
        total = 1
        for g in groups:
            total *= len(domains[g])
            if total > 4096:
                return False
        pairs = [(groups.index(g), groups.index(ft), through) for g, (ft, through) in links.items()]
        return any(all((choice[i] == through) == (choice[j] is True) for i, j, through in pairs)
                   and all(any(choice[groups.index(g)] != br for g, br in c.items()) for c in constraints)
                   for choice in itertools.product(*(domains[g] for g in groups)))

    def _forced_in_trace(self, trace: Trace, ev: TraceEvent) -> Dict[Group, Hashable]:
        """The decisions of `ev`'s contexts (qualified as in the trace) that a loop guard earlier
        in the same iteration has taken wherever it runs (`Flow._forced_decisions`), in its own
        function and at each call site on its path: `if not boundary: continue` ...
        `if boundary: scaler.update()` runs that update wherever the code after the guard runs."""
        memo = self.__dict__.setdefault("_forced_memo", {})
        hit = memo.get(id(ev))
        if hit is not None and hit[0] is ev:
            return hit[1]
        out: Dict[Group, Hashable] = {}
        for depth, node in enumerate(ev.path):
            found = self._forced_decisions(node)
            if not found:
                continue
            frame = tuple(id(p) for p in ev.path[:depth])
            subst = ev.subst if frame == ev.frame else next((e.subst for e in trace.events if e.frame == frame), {})
            for g, br in found:
                out[self._qualify(g, frame, subst)] = br
        memo[id(ev)] = (ev, out)
        return out

    def in_iteration(self, ev: TraceEvent, group: Optional[Group]) -> bool:
        return group is None or group in ev.ctx

    # ---------------------------------------------------------------- tests known on a path
    def _known_tests(self, ctx: Dict[Group, Hashable]) -> Dict[Tuple, bool]:
        """(scope, frame, normalised test text) -> its value, for the stable tests `ctx` decides,
        and for the operands a decided `and`/`or` implies (`if a and b:` taken: a and b). Each
        value holds for the assignments of the test's names it was decided under (`versions`,
        see `_test_value`)."""
        known = _Known()
        for g, br in ctx.items():
            where, text = _cond_parts(g)
            if text is None or not isinstance(br, bool):
                continue
            key = (*where, text)
            known[key] = br
            version = _cond_version(g)
            known.versions[key] = version
            expr = _parse(text)
            if isinstance(expr, cst.BooleanOperation):
                implied = isinstance(expr.operator, cst.And) if br else isinstance(expr.operator, cst.Or)
                if implied:
                    for operand in _operands(expr, type(expr.operator)):
                        t, positive = _normal(operand)
                        if (*where, t) not in known:
                            known[(*where, t)] = br if positive else not br
                            known.versions[(*where, t)] = self._version_of_names(version, t)
        return known

    def _receiver_not_none(self, ev: Optional[TraceEvent]) -> Dict[Tuple, bool]:
        """Where a scaler event runs, its scaler is not None: `scaler.unscale_(opt)` ran, so a
        later `if scaler is not None:` is taken (in the trace's names, and in the function's)."""
        if ev is None or ev.scaler is None or ev.event.scaler is None:
            return {}
        memo = self.__dict__.setdefault("_not_none_memo", {})
        hit = memo.get(id(ev))
        if hit is not None and hit[0] is ev:
            return hit[1]
        out = self._receiver_not_none_uncached(ev)
        memo[id(ev)] = (ev, out)
        return out

    def _receiver_not_none_uncached(self, ev: TraceEvent) -> Dict[Tuple, bool]:
        func = self.function_of(ev.node)
        out: Dict[Tuple, bool] = {}
        for where, key in (((None, None), ev.scaler),
                           ((id(func) if func is not None else None, ev.frame), ev.event.scaler)):
            out[(*where, _canon(f"{key} is None"))] = False
            out[(*where, _canon(key))] = True
        return out

    def _test_value(self, group: Group, known: Dict[Tuple, bool]) -> Optional[bool]:
        """The value of a stable test on a path where the tests in `known` are decided: the same
        test, or an `and`/`or`/`not` of decided tests (`if a and b:` after `if a:` and `if b:`).
        A decided test counts only where its names hold the same assignments as in `group`
        (`if not step: raise` ... `step = ready()` ... `if step:` is another decision)."""
        where, text = _cond_parts(group)
        if text is None:
            return None
        version = _cond_version(group)
        versions = getattr(known, "versions", {})

        def lookup(t: str) -> Optional[bool]:
            value = known.get((*where, t))
            if value is None:
                return None
            decided = versions.get((*where, t))
            if decided is not None and version is not None and decided != self._version_of_names(version, t):
                return None  # a name of the test was assigned in between
            return value

        value = lookup(text)
        if value is not None:
            return value
        expr = _parse(text)
        return None if expr is None else _evaluate(expr, lookup)

    def _version_of_names(self, version: Optional[Tuple], text: str) -> Optional[Tuple]:
        """The part of a stable test's `version` (the ids of the last assignments of its names
        before it, `Flow._stable_expr`) that assigns the names `text` reads."""
        if not version:
            return version
        expr = _parse(text)
        if expr is None:
            return None
        ids = {id(node) for n in self._names_in(expr)
               for node, _, _ in self._by_key.get(dotted(n) or "", [])}
        return tuple(i for i in version if i in ids)

    # ---------------------------------------------------------------- accumulation boundaries
    def _decision_test(self, group: Group) -> Optional[str]:
        """The source text of the test behind a decision group (an `if`), else None."""
        local = group[1] if isinstance(group, tuple) and len(group) == 2 and isinstance(group[1], tuple) else group
        if not isinstance(local, tuple) or not local:
            return None
        if local[0] == "if" and isinstance(local[1], (cst.If, cst.IfExp)):
            return self.code(local[1].test)
        if local[0] == "cond" and len(local) >= 4 and isinstance(local[2], str):
            return local[2]
        return None

    def gradient_finite_test(self, group: Group) -> bool:
        """The decision `group` tests whether the gradients or their norm are finite
        (`if not torch.isfinite(grad_norm):`, `if math.isnan(total_norm):`): after a scaled
        backward, the overflow the GradScaler exists to see. A name the test reads is followed
        through its assignments in the test's function, two steps deep, with the tests of the
        `if`s an assignment runs under: `gn = clip_grad_norm_(...)` is a norm of the gradients,
        `skip = not torch.isfinite(gn)` a finite test of it, and so is `valid = False` under
        `if not torch.isfinite(p.grad).all():`."""
        text = self._decision_test(group)
        if text is None:
            return False
        if NONFINITE_WORD.search(text) and GRADIENT_WORD.search(text):
            return True
        local = _local(group)
        # the `if`, or a stable test's function (None: a test on globals, parameters or `self`,
        # followed through the module's top-level assignments)
        where = local[1] if isinstance(local, tuple) and len(local) >= 2 else None
        if where is not None and not isinstance(where, cst.CSTNode):
            return False
        func = where if isinstance(where, cst.FunctionDef) or where is None else self.function_of(where)

        def values_of(code: str) -> List[str]:
            """What the names of `code` are assigned in the function, and the tests of the `if`s
            an assignment runs under (`valid = False` under `if not torch.isfinite(p.grad).all():`)."""
            out: List[str] = []
            for name in set(_NAME.findall(code)):
                for _, v in self.assignments_to(name):
                    if isinstance(v, ReturnedElement):  # `x, ok = f()`: the call, where it is written
                        v = v.call
                    if v is None or self.function_of(v) is not func:
                        continue
                    out.append(self.code(v))
                    out.extend(self.code(a.test) for a in self.ancestors(v) if isinstance(a, cst.If))
            return out

        def answers_of(code: str) -> List[str]:
            """What the functions of this file that `code` calls return, and the tests of the `if`s
            a `return` runs under (`if not torch.isfinite(p.grad).all(): return False`)."""
            out: List[str] = []
            for name in set(_CALLED.findall(code)):
                for f in self.functions.get(name, ()):
                    for ret in self._nodes_in_scope(f, cst.Return):  # type: ignore[attr-defined]
                        if ret.value is not None:
                            out.append(self.code(ret.value))
                        out.extend(self.code(a.test) for a in self.ancestors(ret) if isinstance(a, cst.If))
            return out

        values = values_of(text)
        values += [w for v in values for w in values_of(v)]  # `skip = not isfinite(gn)`, `gn = clip_grad_norm_(...)`
        values += [w for v in (text, *values) for w in answers_of(v)]  # `if not grads_finite(model):`
        finite = bool(NONFINITE_WORD.search(text)) or any(NONFINITE_WORD.search(v) for v in values)
        return finite and any(GRADIENT_WORD.search(v) for v in values)

    def _is_accumulation_test(self, group: Group) -> bool:
        """The decision is "this micro-batch steps": a modulo test (`(i + 1) % accum == 0`,
        `not step % n`), or a test naming accumulation or a should-step flag
        (`is_last_accum_step`, `update_grad`, `self.steps_since_update == self.grad_acc_steps`).
        A comparison of the accumulation count with a number (`if args.accum_freq == 1:`,
        `if ACCUMULATION_STEPS > 1:`) is a mode switch, not a boundary."""
        text = self._decision_test(group)
        if text is None:
            return False
        expr = _parse(text)
        if expr is None:
            return False
        if _has_modulo(expr) or LAST_TEST.search(text) or _last_of_sized(expr):
            return True
        if not ACCUM_TEST.search(text):
            return False
        while isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not):
            expr = expr.expression
        if isinstance(expr, cst.Comparison):
            sides = (expr.left, *(c.comparator for c in expr.comparisons))
            if any(isinstance(n, (cst.Integer, cst.Float)) for n in sides):
                return False
        return True

    def _is_boundary(self, trace: Trace, ev: TraceEvent, group: Group) -> bool:
        """The decision `group` on `ev`'s path is an accumulation boundary: an accumulation test
        (`is_accumulation_test`), or the `if` of a counter it resets (`if tokens_seen >=
        tokens_per_step: ... tokens_seen = 0`, `if micro == n: ... micro = 0`)."""
        if self._is_accumulation_test(group):
            return True
        node = self.decision_node(trace, ev, group) if _is_binary(group) else None
        return node is not None and _resets_counter(node)

    def decision_node(self, trace: Trace, ev: TraceEvent, group: Group) -> Optional[cst.If]:
        """The `if` statement behind `group` on `ev`'s path."""
        for depth in range(len(ev.path)):
            frame = tuple(id(p) for p in ev.path[:depth])
            subst = next((e.subst for e in trace.events if e.frame == frame), {})
            for anc in self.ancestors(ev.path[depth]):
                if isinstance(anc, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                    break
                if isinstance(anc, cst.If) and any(  # (the whole test's group, or one of its operands')
                        self._qualify(g, frame, subst) == group
                        for g, _ in self._body_decisions(anc)):  # type: ignore[attr-defined]
                    return anc
        return None

    def accumulation_misplaced(self, trace: Trace) -> List[Misplaced]:
        """Scaler calls that run on every micro-batch of a gradient-accumulation loop: an
        `unscale_` or `step` of an optimizer whose step (or `zero_grad`) is guarded by an
        accumulation boundary that the call is outside of (and no other boundary guards it); an
        `update()` outside the boundaries of every step of its scaler in the iteration. The
        iteration must run a backward outside the boundary (micro-batches); events of other
        optimizers are not concerned (a GAN's `if i % n_critic == 0:` generator step), nor
        events of another iteration (a flush after the loop)."""
        cached = getattr(self, "_misplaced", None)
        if cached is None:
            cached = self._misplaced = {}
        if id(trace) in cached:
            return cached[id(trace)]
        out: List[Misplaced] = []
        for guarded in trace.of(SCALER_STEP, ZERO_GRAD):
            if guarded.target is None:
                continue
            group = self.iteration_of(trace, guarded)
            for g in self._boundaries(trace, guarded, group):
                for e in trace.of(UNSCALE, SCALER_STEP):
                    if e is guarded or e.target != guarded.target or any(m.event is e for m in out):
                        continue
                    if guarded.kind == SCALER_STEP and e.scaler != guarded.scaler:
                        continue
                    if guarded.kind == ZERO_GRAD and e.kind == UNSCALE:
                        continue  # an unscale_ is judged against its own step's boundary
                    if g in e.ctx or self.exclusive(e, guarded) or self.iteration_of(trace, e) != group \
                            or self._boundaries(trace, e, group):
                        continue
                    out.append(Misplaced(e, guarded, g, group))
        for e in trace.of(UNSCALE):  # an unscale_ in the micro-batch loop, the step after that loop
            group = self.iteration_of(trace, e)
            if group is None or any(m.event is e for m in out) or any(
                    s.target == e.target and s.scaler == e.scaler and self.in_iteration(s, group)
                    for s in trace.of(SCALER_STEP)):
                continue
            after = self._after_iteration(trace, e, group, SCALER_STEP)
            if after:
                out.append(Misplaced(e, after[0], group, group))
        for upd in trace.of(UPDATE):
            group = self.iteration_of(trace, upd)
            if self._boundaries(trace, upd, group):
                continue
            steps = (s for s in self._steps_by_iteration(trace).get((upd.scaler, group), ())
                     if not self.exclusive(s, upd))  # lazily: the walk below often stops at the first
            reason: Optional[Misplaced] = None
            for s in steps:
                mis = next((m for m in out if m.event is s), None)
                if mis is not None:
                    reason = reason or mis
                    continue
                outside = self._boundaries(trace, s, group)
                if not outside:
                    reason = None
                    break
                reason = reason or Misplaced(upd, s, outside[0], group)
            if reason is not None:
                out.append(Misplaced(upd, reason.guarded, reason.boundary, group))
        out.sort(key=lambda m: m.event.order)
        cached[id(trace)] = out
        return out

    def boundary_move(self, trace: Trace, ms: List[Misplaced]
                      ) -> Optional[Tuple[cst.If, List[cst.BaseStatement], List[cst.BaseStatement]]]:
        """How the misplaced calls `ms` (of one boundary) move under it: (the boundary's `if`,
        the statements right before it that go to the start of its body, those right after it
        that go to its end). They are the statements of the calls, in the `if`'s block, and the
        scaler or clipping statements between them and the `if` (`only_scaler_or_clip`). None
        when the boundary is not an `if` with an indented body and no `else`, a call runs in a
        helper or in another call of the boundary's function, another statement lies in between
        (its order would change), a moved statement holds a backward, or code outside reads a
        name one binds."""
        guarded = ms[0].guarded
        if_node = self.decision_node(trace, guarded, ms[0].boundary)
        if if_node is None or if_node.orelse is not None or not isinstance(if_node.body, cst.IndentedBlock):
            return None
        block = self.block_of(if_node)
        if block is None:
            return None
        depth = self._depth_in(guarded, if_node)
        stmts = []
        for m in ms:
            if depth is None or len(m.event.path) <= depth or m.event.path[:depth] != guarded.path[:depth]:
                return None  # in a helper, or in another call of the boundary's function
            stmt = self._statement_in(m.event.path[depth], block)
            if stmt is None:
                return None
            if stmt not in stmts:
                stmts.append(stmt)
        body = list(block.body)
        at = body.index(if_node)
        first = min((body.index(s) for s in stmts), default=at)
        last = max((body.index(s) for s in stmts), default=at)
        before, after = body[first:at], body[at + 1:last + 1]
        if any(s not in stmts and not self.only_scaler_or_clip(s) for s in (*before, *after)):
            return None  # other statements in between: their order would change
        moved = [*before, *after]
        if any(self.is_ancestor(s, b.call) for s in moved for b in self.backward_calls) \
                or self.bound.read_outside(moved, if_node):
            return None
        return if_node, before, after

    def _depth_in(self, ev: TraceEvent, if_node: cst.If) -> Optional[int]:
        """The index in `ev.path` of the node that lies in the `if`'s function."""
        for i, node in enumerate(ev.path):
            if self.is_ancestor(if_node, node):
                return i
        return None

    def clips_gradients(self, stmt: cst.CSTNode) -> bool:
        """`stmt` calls a gradient-clipping function."""
        stack = [stmt]
        while stack:
            node = stack.pop()
            if isinstance(node, cst.Call) and (api := self.api_of(node)) is not None and api.kind == "clip_grad":
                return True
            stack.extend(child_nodes(node))
        return False

    def only_scaler_or_clip(self, stmt: cst.CSTNode) -> bool:
        """`stmt` is expression statements of scaler calls (`unscale_`/`step`/`update`) and
        gradient clipping, or an `if` of only those."""
        if isinstance(stmt, cst.If):
            branches = [stmt.body.body]
            orelse = stmt.orelse
            while orelse is not None:
                if isinstance(orelse, cst.If):
                    branches.append(orelse.body.body)
                    orelse = orelse.orelse
                else:
                    branches.append(orelse.body.body)
                    orelse = None
            return all(self.only_scaler_or_clip(s) for b in branches for s in b)
        if not isinstance(stmt, cst.SimpleStatementLine):
            return False
        for small in stmt.body:
            if not (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)):
                return False
            call = small.value
            api = self.api_of(call)
            if not ((api is not None and api.kind == "clip_grad")
                    or (call_name(call) in _SCALER_CALLS and any(self._scaler_method(call, m) for m in _SCALER_CALLS))):
                return False
        return True

    def _after_iteration(self, trace: Trace, ev: TraceEvent, group: Optional[Group], kind: str) -> List[TraceEvent]:
        """The events `kind` of `ev`'s scaler (and optimizer, for a step or `unscale_`) that run
        after `ev`'s iteration, the loop `group`, is over, in the same call: once per pass of an
        enclosing loop (`scaler.update()` once per epoch, `scaler.step()` after the loop over
        micro-batches) or once after it; none when an event of that kind in the iteration may
        follow `ev`."""
        if group is None or ev.scaler is None:
            return []

        def same(e: TraceEvent) -> bool:
            return e.scaler == ev.scaler and (kind == UPDATE or e.target == ev.target)

        if any(same(e) and self.in_iteration(e, group) and e.order > ev.order for e in trace.of(kind)) \
                or self._varies_with_loop(ev, group):
            return []
        return [e for e in trace.of(kind) if same(e) and e.order > ev.order and not self.in_iteration(e, group)
                and self.may_precede(trace, ev, e)]

    def _varies_with_loop(self, ev: TraceEvent, group: Group) -> bool:
        """`ev`'s optimizer may change with the loop's passes: it reads a name the loop binds (a
        loop over optimizers and their losses, `for opt, loss in zip(...)`: one step of each,
        then one update, is correct), or, in a helper the loop calls, comes from the helper's
        parameters and the call reads such a name. Unknown loops count as varying."""
        frame, (_, loop) = group
        if not isinstance(loop, cst.CSTNode) or len(ev.path) <= len(frame) or not isinstance(ev.node, cst.Call):
            return True
        own = reads_writes(ev.node.args[0].value)[0] if ev.node.args else set()
        site = ev.path[len(frame)]
        if site is not ev.node:  # in a helper: its own optimizer (`self.optimizer`), or the caller's
            func = self.function_of(ev.node)  # type: ignore[attr-defined]
            if func is None or any(self._is_param(func, n) and n not in ("self", "cls")  # type: ignore[attr-defined]
                                   for n in own):
                own = reads_writes(site)[0]
            elif "self" not in own:
                return False
            else:
                own = {"self"}
        return bool(own & reads_writes(loop)[1])

    def _steps_by_iteration(self, trace: Trace) -> Dict[Tuple, List[TraceEvent]]:
        """(scaler, iteration group) -> the trace's scaler steps, in order (built once per trace)."""
        memo = self.__dict__.setdefault("_steps_memo", {})
        hit = memo.get(id(trace))
        if hit is None or hit[0] is not trace:
            index: Dict[Tuple, List[TraceEvent]] = {}
            for s in trace.of(SCALER_STEP):
                index.setdefault((s.scaler, self.iteration_of(trace, s)), []).append(s)
            hit = memo[id(trace)] = (trace, index)
        return hit[1]

    def _boundaries(self, trace: Trace, ev: TraceEvent, group: Optional[Group]) -> List[Group]:
        """The accumulation boundaries that guard `ev` within its iteration `group`: decisions
        that are accumulation tests, taken inside the iteration, with a backward of the same
        iteration outside them (the micro-batches); also the test of an earlier
        `if not is_last_accum_step: continue` of the iteration (`ev` runs only when it does not
        leave)."""
        outer = self._loop_context(trace, group) if group is not None else {}
        out = []
        for g, br in ev.ctx.items():
            if g in outer or g == group or not self._is_boundary(trace, ev, g):
                continue
            if any(self.in_iteration(b, group) and b.ctx.get(g) != br and not self.exclusive(b, ev)
                   for b in trace.of(BACKWARD)):
                out.append(g)
        if group is not None:
            for x in trace.of(EXIT):
                if x.order > ev.order or x.event.detail != "continue" or (x.frame, ("loop", x.event.loop)) != group \
                        or self.exclusive(x, ev):
                    continue
                out.extend(g for g, br in x.ctx.items() if g not in outer and g != group and g not in ev.ctx
                           and self._is_boundary(trace, x, g) and g not in out)
        return out

    # ---------------------------------------------------------------- objects
    def builds_optimizer(self, call: cst.Call) -> bool:
        """`call` constructs an optimizer: a torch.optim class, or a factory named like one
        (`create_optimizer(...)`, `build_optimizer(cfg)`) whose result is assigned."""
        if self.is_api(call, "optimizer"):
            return True
        name = call_name(call) or ""
        if "optim" not in name.lower() or FACTORY_EXCLUDE.search(name):
            return False
        parent = self.parent(call)
        return isinstance(parent, (cst.Assign, cst.AnnAssign)) and parent.value is call

    def guarded_by_test_of(self, node: cst.CSTNode, key: str) -> bool:
        """`node` runs only under a test that reads `key` or asks whether it exists: lazy
        initialisation (`if self.scaler is None: self.scaler = GradScaler()`,
        `if not hasattr(self, "scaler")`, `x = x or GradScaler()`)."""
        last = key.rpartition(".")[2]
        child = node
        for anc in self.ancestors(node):
            if isinstance(anc, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return False
            test = None
            if isinstance(anc, (cst.If, cst.IfExp, cst.While)) and child is not anc.test:
                test = anc.test
            elif isinstance(anc, cst.BooleanOperation) and child is anc.right:
                test = anc.left
            if test is not None:
                text = self.code(test)
                if re.search(r"(?<![\w.])" + re.escape(key) + r"(?!\w)", text) or \
                        re.search(r"""hasattr\([^)]*['"]""" + re.escape(last) + r"""['"]""", text):
                    return True
            child = anc
        return False

    def _scaler_values(self, key: str, root: Optional[cst.CSTNode] = None) -> List[cst.BaseExpression]:
        """The values assigned to the scaler `key` that a trace rooted at `root` (a function or
        the module) sees: a plain name's assignments in the scope whose binding `root` reads,
        `self.x`'s in the classes of `root`'s method (`attribute_values`). Every assignment to
        `key` in the file where that is not known, or holds none: `root` None, a name that is a
        parameter there (what its callers pass), `self` outside a method, a longer dotted key."""
        every = [v for _, v in self.assignments_to(key)]
        if root is None:
            return every
        inside = root.body if isinstance(root, cst.FunctionDef) else root  # (a node `root` runs)
        first, _, rest = key.partition(".")
        seen: List[cst.BaseExpression] = []
        if first == "self" and rest and "." not in rest:
            cls = self.self_class(inside)
            seen = self.attribute_values(cls, rest) if cls is not None else []
        elif not rest:
            scope = self.binding_scope(first, root if isinstance(root, cst.FunctionDef) else self.module)
            if scope is not None and not self._is_param(scope, first):
                seen = [v for _, v, s in self._by_key.get(key, []) if s is scope]
        return seen or every

    def scaler_always_disabled(self, key: Optional[str], root: Optional[cst.CSTNode] = None) -> bool:
        """Every GradScaler assigned to `key` that a trace rooted at `root` sees
        (`_scaler_values`) is built with a literal `enabled=False` (a no-op scaler), and there
        is at least one."""
        if key is None:
            return False
        calls = [v for v in self._scaler_values(key, root) if isinstance(v, cst.Call) and self.is_api(v, "GradScaler")]
        return bool(calls) and all(self.built_disabled(c) for c in calls)  # type: ignore[attr-defined]

    def scaler_always_enabled(self, key: Optional[str], root: Optional[cst.CSTNode] = None) -> bool:
        """Every value assigned to `key` that a trace rooted at `root` sees (`_scaler_values`) is
        a GradScaler built enabled (no `enabled` argument, or a literal True), and there is at
        least one: the scaler cannot be off. A parameter, a `None`, `enabled=use_amp` or a
        project's own class: not known."""
        if key is None:
            return False
        def on(v: cst.CSTNode) -> bool:
            if not (isinstance(v, cst.Call) and self.is_api(v, "GradScaler")):  # type: ignore[attr-defined]
                return False
            enabled = self.scaler_enabled(v)  # type: ignore[attr-defined]
            return enabled is None or literal_bool(enabled) is True

        values = self._scaler_values(key, root)
        return bool(values) and all(on(v) for v in values)

    def scaler_enabled_flag(self, key: Optional[str], root: Optional[cst.CSTNode] = None) -> Optional[str]:
        """The flag the scaler `key` is switched by, in the names of a trace rooted at `root`:
        `use_amp` for `scaler = GradScaler("cuda", enabled=use_amp)` in `root` itself (or at
        module level, when `root` does not bind the name again), `self.use_amp` for
        `self.scaler = GradScaler(enabled=self.use_amp)` in a method of the class. Every value
        of `key` the trace sees must be a GradScaler built with that same flag; else None. Where
        the flag is false the scaler scales nothing (`scaler.scale(loss)` returns the loss)."""
        if key is None or root is None:
            return None
        flags = set()
        for v in self._scaler_values(key, root):
            if not (isinstance(v, cst.Call) and self.is_api(v, "GradScaler")):  # type: ignore[attr-defined]
                return None
            flag = dotted(self.scaler_enabled(v))  # type: ignore[attr-defined]
            if flag is None or not self._flag_in_root(flag, key, v, root):
                return None
            flags.add(flag)
        return flags.pop() if len(flags) == 1 else None

    def _flag_in_root(self, flag: str, key: str, built: cst.CSTNode, root: cst.CSTNode) -> bool:
        """The flag written at the construction `built` names the same value in `root`, and is
        bound once (a parameter or one assignment: not switched between the two)."""
        where = self.function_of(built)  # type: ignore[attr-defined]
        first = flag.partition(".")[0]
        scope = where if where is not None else self.module  # type: ignore[attr-defined]
        bindings = [s for _, _, s in self._by_key.get(flag, [])]  # type: ignore[attr-defined]
        if key.startswith("self."):  # one object's attributes, in `__init__` and the method alike
            return flag.startswith("self.") and len(bindings) <= 1
        if "." in key or len([s for s in bindings if s is scope]) + self._is_param(scope, first) > 1:
            return False
        if where is root:
            return True
        return where is None and isinstance(root, cst.FunctionDef) \
            and self.binding_scope(first, root) in (self.module, None)  # type: ignore[attr-defined]

    def per_step_name(self, func: cst.CSTNode) -> Optional[str]:
        """"step"/"epoch" when a function's name or parameters say one call is one training step
        (`optimize_parameters(self, current_iter)`, `train_step`, `training_step`) or one epoch
        (`train_one_epoch`); None otherwise (and for setup, test and entry-point names)."""
        if not isinstance(func, cst.FunctionDef):
            return None
        tokens = set(_tokens(func.name.value))
        if tokens & NOT_PER_STEP_TOKENS:
            return None
        params = {p.name.value for p in (*func.params.posonly_params, *func.params.params, *func.params.kwonly_params)}
        if "epoch" in tokens:
            return "epoch"
        if tokens & PER_STEP_TOKENS or params & (PER_STEP_PARAMS - {"epoch"}):
            return "step"
        return "epoch" if "epoch" in params else None

    def iterates_epochs(self, loop: cst.CSTNode) -> bool:
        """A loop over epochs: a `for` whose target, or the bounds of whose `range(...)`, a
        `while` whose test, names epochs (`for epoch in range(epoch + 1, max_epochs + 1)`,
        `for _ in range(start_epoch, num_epochs)`, `while self.epoch < self.n_epochs`). The
        function that runs it runs many epochs, whatever its parameters say (`per_step_name`)."""
        if isinstance(loop, cst.For):
            parts: List[cst.CSTNode] = [loop.target]
            it = loop.iter
            if isinstance(it, cst.Call) and dotted(it.func) == "range":
                parts.extend(a.value for a in it.args)
        elif isinstance(loop, cst.While):
            parts = [loop.test]
        else:
            return False
        # each Name under them: `self.n_epochs` holds "self" and "n_epochs"
        return any(EPOCH_TOKENS.intersection(_tokens(name.value))  # type: ignore[attr-defined]
                   for part in parts for name in nodes_under(part, cst.Name))

_OTHER = object()


def _fallthrough_links(domains: Dict[Group, List[Hashable]]) -> Dict[Group, Tuple[Group, bool]]:
    """For each `if` of `domains` whose one branch always returns and whose fall-through
    group (`Flow._fallthrough`, the statements after it) is in `domains` too: the `if`'s
    group -> (that fall-through group, the branch that falls through). A path takes the
    fall-through exactly when it takes that branch: the early return's branch never reaches
    the statements after the `if`."""
    out: Dict[Group, Tuple[Group, bool]] = {}
    for ft in domains:
        local = _local(ft)
        if not isinstance(local, tuple) or not isinstance(ft, tuple) or len(ft) != 2:
            continue
        if len(local) == 2 and local[0] == "fallthrough":  # this module's `if`
            node = local[1]
            body, orelse = ends_in_exit(node.body), ends_in_exit(node.orelse)
            test, through = (ft[0], ("if", node)), not body
            if body == orelse:
                continue
        elif len(local) == 7 and local[0] == "foreign" and local[3] == "fallthrough":  # a summary's (`_Groups`)
            test, through = (ft[0], ("foreign", local[1], local[2], "if", local[5])), local[6]
        else:
            continue
        if test in domains:
            out[test] = (ft, through)
    return out


_SPACE = re.compile(r"\s+")
_NEGATED = ((cst.IsNot, " is not ", " is "), (cst.NotEqual, " != ", " == "), (cst.NotIn, " not in ", " in "))


_AT = re.compile(r"@(\d+)")


@functools.lru_cache(maxsize=4096)
def _canon(text: str) -> str:
    """A trace's test text as Python: a caller-local name `args@123` becomes `args__at_123`."""
    return _AT.sub(r"__at_\1", text) if "@" in text else text


def _parse(text: str) -> Optional[cst.BaseExpression]:
    try:
        return parse_expression(_canon(text))
    except Exception:  # pragma: no cover - the text came from the file
        return None


def _cond_parts(group: Group):
    """((scope, frame), text) for a stable-test group, else ((), None)."""
    local = _local(group)
    if not (isinstance(local, tuple) and len(local) >= 4 and local[0] == "cond" and isinstance(local[2], str)):
        return (), None
    frame = group[0] if local is not group else None
    return (id(local[1]) if local[1] is not None else None, frame), _canon(local[2])


def _operands(expr: cst.BaseExpression, op: type) -> List[cst.BaseExpression]:
    """`a and b and c` -> [a, b, c] (for one operator kind)."""
    if isinstance(expr, cst.BooleanOperation) and isinstance(expr.operator, op) and not expr.lpar:
        return _operands(expr.left, op) + _operands(expr.right, op)
    return [expr]


def _normal(expr: cst.BaseExpression) -> Tuple[str, bool]:
    """A test's text as `flow._stable_test` keys it, and whether it is the positive form."""
    positive = True
    while isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not):
        expr, positive = expr.expression, not positive
    expr = expr.with_changes(lpar=[], rpar=[]) if hasattr(expr, "lpar") else expr
    text = _SPACE.sub(" ", cst.Module(body=[]).code_for_node(expr).strip())
    if isinstance(expr, cst.Comparison) and len(expr.comparisons) == 1:
        for kind, neg, pos in _NEGATED:
            if isinstance(expr.comparisons[0].operator, kind):
                positive, text = not positive, text.replace(neg, pos)
    return text, positive


def _evaluate(expr: cst.BaseExpression, lookup: Callable[[str], Optional[bool]]) -> Optional[bool]:
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not):
        inner = _evaluate(expr.expression, lookup)
        return None if inner is None else not inner
    if isinstance(expr, cst.BooleanOperation):
        left, right = _evaluate(expr.left, lookup), _evaluate(expr.right, lookup)
        if isinstance(expr.operator, cst.And):
            return False if False in (left, right) else (True if left and right else None)
        return True if True in (left, right) else (False if left is False and right is False else None)
    text, positive = _normal(expr)
    value = lookup(text)
    return None if value is None else (value if positive else not value)


class _Known(dict):
    """The tests known on a path (`Iterations._known_tests`), with the version each was decided
    under (`versions`: None, or absent, for a fact that holds whatever the assignments)."""

    def __init__(self) -> None:
        super().__init__()
        self.versions: Dict[Tuple, Optional[Tuple]] = {}


def _cond_version(group: Group) -> Optional[Tuple]:
    """The version of a stable-test group (the ids of its names' last assignments before the
    test); None where the group has none."""
    local = _local(group)
    if isinstance(local, tuple) and len(local) >= 4 and local[0] == "cond" and isinstance(local[3], tuple):
        return local[3]
    return None


def group_frame(group: Optional[Group]) -> Tuple[int, ...]:
    """The frame of a qualified trace group `(frame, local)`: the calls it was reached through
    (empty: the root's own code, or a group that is not qualified)."""
    if isinstance(group, tuple) and len(group) == 2 and isinstance(group[0], tuple):
        return group[0]
    return ()


def group_loop(group: Optional[Group]) -> object:
    """What a loop group `(frame, ("loop" | "comp", node))` holds for its loop: the loop's node
    (for a loop of another module's code, a key that is not a node of this file); None for any
    other group. Rules read a group's parts through this and `group_frame`, not by index."""
    local = _local(group) if group is not None else None
    if isinstance(local, tuple) and len(local) >= 2 and local[0] in ("loop", "comp"):
        return local[1]
    return None


def _local(group: Group):
    """The function-local part of a trace group (`(frame, local)`, or a stable test as is)."""
    if isinstance(group, tuple) and len(group) == 2 and isinstance(group[0], tuple) and isinstance(group[1], tuple):
        return group[1]
    return group


def _is_loop(group: Group) -> bool:
    local = _local(group)
    return isinstance(local, tuple) and bool(local) and local[0] == "loop"


def _is_binary(group: Group) -> bool:
    local = _local(group)
    return isinstance(local, tuple) and bool(local) and local[0] in ("if", "cond")


def _last_of_sized(expr: cst.CSTNode) -> bool:
    """`(i + 1) == len(loader)`, `i == len(loader) - 1`, `step + 1 >= len(batches)`: an index
    compared with the length of what the loop runs over (the last micro-batch of the loader)."""
    for node in _operands(expr, cst.Or) if isinstance(expr, cst.BooleanOperation) else [expr]:
        if not isinstance(node, cst.Comparison) or len(node.comparisons) != 1 \
                or not isinstance(node.comparisons[0].operator, (cst.Equal, cst.GreaterThanEqual, cst.LessThanEqual)):
            continue
        sides = (node.left, node.comparisons[0].comparator)
        if any(_calls_len(side) for side in sides) and any(not _calls_len(side) and _names(side) for side in sides):
            return True
    return False


def _calls_len(expr: cst.CSTNode) -> bool:
    stack = [expr]
    while stack:
        n = stack.pop()
        if isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value == "len":
            return True
        stack.extend(child_nodes(n))
    return False


def _names(expr: cst.CSTNode) -> bool:
    return isinstance(expr, (cst.Name, cst.Attribute)) or any(_names(c) for c in child_nodes(expr)
                                                               if isinstance(c, cst.BaseExpression))


def _resets_counter(node: cst.If) -> bool:
    """The `if` compares a counter and its body sets it back (`= 0`, `-= ...`): the counter
    counts the micro-batches (or tokens) of one accumulation window."""
    test = node.test
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1 or not isinstance(
            test.comparisons[0].operator, (cst.Equal, cst.GreaterThanEqual, cst.GreaterThan)):
        return False
    counter = dotted(test.left)
    if counter is None or not isinstance(node.body, cst.IndentedBlock):
        return False
    for stmt in node.body.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.Assign) and len(small.targets) == 1 \
                    and dotted(small.targets[0].target) == counter and isinstance(small.value, cst.Integer) \
                    and small.value.value == "0":
                return True
            if isinstance(small, cst.AugAssign) and isinstance(small.operator, cst.SubtractAssign) \
                    and dotted(small.target) == counter:
                return True
    return False


def _has_modulo(expr: cst.CSTNode) -> bool:
    stack = [expr]
    while stack:
        n = stack.pop()
        if isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Modulo) \
                and not isinstance(n.left, (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString)):
            return True
        stack.extend(child_nodes(n))
    return False


__all__ = ["Iterations", "Misplaced", "dotted"]
