"""Where a GradScaler's `update()` runs relative to the optimizer steps of its iteration.

AMP004 reports an update that runs once per optimizer (inside a loop over optimizers, between
two optimizers' steps of one iteration, or on the scaler that did not step), and AMP009
(step/update order) leaves those updates to it. `update_misplaced(trace, upd)` answers with an
`UpdateMisplaced` (which of the three shapes, and the events that show it) or None.

AMP009's facts: a step or unscale_ from which a path leaves its iteration without an update
(`missing_update`, a `MissingUpdate`), the statement after which that update goes
(`update_site`), an unscale_ or step that runs again on one optimizer before the update
(`raising_pairs`, with torch's error for each order in `RAISES`), and an update that runs
before the iteration's step (`step_after_update`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import libcst as cst

from ampfix.model.facet import Facet
from ampfix.model.events import BACKWARD, SCALER_STEP, UNSCALE, UPDATE, ZERO_GRAD, Trace, TraceEvent
from ampfix.model.iterations import Group, group_loop
from ampfix.model.summarize import touched_unlisted
from ampfix.model.syntax import is_expression_statement_of
from ampfix.model.tree import dotted, target_names

# what torch raises for a second scaler call on one optimizer before `update()`, by the two calls' kinds
RAISES = {
    (SCALER_STEP, SCALER_STEP): 'RuntimeError "step() has already been called since the last update()"',
    (UNSCALE, UNSCALE): 'RuntimeError "unscale_() has already been called on this optimizer since the last update()"',
    (SCALER_STEP, UNSCALE): 'RuntimeError "unscale_() is being called after step()"',
}

# builtins that look at an object without keeping or changing it, and the containers (what a
# container is handed to next is not followed: a scaler put in a dict for a method of the class,
# mmgen's `dict(..., loss_scaler=loss_scaler)`, stays seen)
_LOOKING_BUILTINS = frozenset({"isinstance", "print", "id", "type", "repr", "str", "hasattr", "getattr", "callable",
                               "bool", "len", "hash", "vars", "dir", "dict", "list", "tuple", "set"})


class UpdatePlace(str, Enum):
    OPTIMIZER_LOOP = "optimizer_loop"  # inside a loop over optimizers that runs no backward
    BETWEEN_STEPS = "between_steps"  # `step(o1); update(); step(o2)` in one iteration
    WRONG_SCALER = "wrong_scaler"  # the update of a scaler that did not step, after another's step


@dataclass(frozen=True)
class UpdateMisplaced:
    place: UpdatePlace
    update: TraceEvent
    shown: cst.CSTNode  # the node of the reported function that runs the update
    loop: Optional[cst.For] = None  # OPTIMIZER_LOOP: the loop; `steps`: its scaler steps
    steps: Tuple[TraceEvent, ...] = ()
    earlier: Optional[TraceEvent] = None  # BETWEEN_STEPS: the step before, the step after,
    later: Optional[TraceEvent] = None  # the iteration's last step of this scaler and the
    last: Optional[TraceEvent] = None  # update after it (if any)
    final: Optional[TraceEvent] = None
    other: Optional[TraceEvent] = None  # WRONG_SCALER: the other scaler's step


@dataclass(frozen=True)
class MissingUpdate:
    """A step or unscale_ (`event`) from which some path reaches `end` (the end of its iteration
    `group`, a `continue`, an early return) without the scaler's `update()`. `updates`: the
    iteration's updates after it, which run only on some paths; `later`: for a step with none,
    the update that runs only after the loop (a step on every batch, an update once per epoch)."""
    event: TraceEvent
    end: TraceEvent
    group: Optional[Group]
    updates: Tuple[TraceEvent, ...] = ()
    later: Optional[TraceEvent] = None


def _only_continue(block: cst.BaseSuite) -> bool:
    """`block` is `continue` alone (`if ...: continue`)."""
    if isinstance(block, cst.SimpleStatementSuite):
        return len(block.body) == 1 and isinstance(block.body[0], cst.Continue)
    stmts = block.body if isinstance(block, cst.IndentedBlock) else ()
    return len(stmts) == 1 and isinstance(stmts[0], cst.SimpleStatementLine) and len(stmts[0].body) == 1 \
        and isinstance(stmts[0].body[0], cst.Continue)


def _same(kind: str, scaler: Optional[str]) -> Callable[[TraceEvent], bool]:
    return lambda e: e.kind == kind and e.scaler == scaler


class Updates(Facet):
    """Where a `scaler.update()` is misplaced (`model.updates`)."""

    def scaler_built_here(self, ev: TraceEvent) -> bool:
        """The scaler of `ev` (a step, unscale_ or update) is a GradScaler built in this file (not one
        handed in by a caller)."""
        if ev.event.foreign:
            return False
        model = self.model
        receiver = ev.node.func.value  # type: ignore[attr-defined]
        return any(model.constructs_scaler(v) and not model.is_synthetic(v) for v in model.values_of(receiver))

    def never_updated(self, ev: TraceEvent) -> bool:
        """Nothing in the file updates the scaler of `ev` (by its name, or through a parameter)."""
        last = (ev.event.scaler or "").rpartition(".")[2]
        for scope in self.model._event_scopes:
            for e in self.model._events_in(scope):
                if e.kind != UPDATE or e.scaler is None:
                    continue
                root = e.scaler.split(".")[0]
                if e.scaler.rpartition(".")[2] == last or self.model._is_param(scope, root):
                    return False
        return True

    def handed_to_unknown(self, ev: TraceEvent) -> bool:
        """The scaler of `ev` is passed, itself, to a call the model cannot see into (a function
        of an unresolved or third-party import, a method of an unknown object, a class that
        keeps it): that code may update it, so its missing update is unknown, not shown.
        Builtins that only look at an object (`isinstance`, `print`, ...) do not count."""
        model = self.model
        last = (ev.event.scaler or "").rpartition(".")[2]
        if not last:
            return False
        for call in model.nodes_of(cst.Call):
            if not any(not a.star and (dotted(a.value) or "").rpartition(".")[2] == last for a in call.args):
                continue
            name = dotted(call.func)
            if name in _LOOKING_BUILTINS and model.binding_scope(name, call) is None:
                continue
            if model.callees(call) or model._foreign_definition(call.func) is not None:
                continue  # a function the trace reads: its updates are events there
            return True
        return False

    def touched_unseen(self, trace: Trace, scaler: Optional[str]) -> bool:
        """The scaler `scaler` (a key in the trace root's names) is handed, itself, by a function
        the trace runs (its root, or one whose call leads to an event) to a function of another
        module that may step, unscale or update that parameter in ways its summary does not list
        (`summarize.touched_unlisted`: it rebinds the parameter, `scaler = scaler or default`,
        before `scaler.update()`): whether that call steps or updates this scaler is unknown, so
        a path through it is not shown to miss an update or an unscale_."""
        last = (scaler or "").rpartition(".")[2]
        if not last:
            return False
        memo: Dict = self.__dict__.setdefault("_touched_unseen", {})
        key = (id(trace), last)
        hit = memo.get(key)
        if hit is not None and hit[0] is trace:
            return hit[1]
        model = self.model
        funcs = {id(trace.root): trace.root}
        for e in trace.events:
            for site in e.path[:-1]:
                f = model.function_of(site)
                if f is not None:
                    funcs.setdefault(id(f), f)
        found = any(self._hands_to_unlisted(call, last)
                    for f in funcs.values() for call in model._nodes_in_scope(f, cst.Call))
        memo[key] = (trace, found)
        return found

    def _hands_to_unlisted(self, call: cst.Call, last: str) -> bool:
        if not any(not a.star and (dotted(a.value) or "").rpartition(".")[2] == last for a in call.args):
            return False
        model = self.model
        ff = model._foreign_callee(call)
        if ff is None:
            return False
        touched = touched_unlisted(ff.summary)
        return bool(touched) and any(param in touched and (dotted(arg) or "").rpartition(".")[2] == last
                                     for param, arg in model._bind_foreign_arguments(call, ff).items())

    def misplaced_updates(self, trace: Trace) -> List[TraceEvent]:
        """The updates of `trace` that `update_misplaced` places (AMP004 reports them)."""
        return [u for u in trace.of(UPDATE) if self.update_misplaced(trace, u) is not None]

    def missing_update(self, trace: Trace, ev: TraceEvent, theirs: List[TraceEvent]) -> Optional[MissingUpdate]:
        """How a step or unscale_ `ev` leaves its iteration without the scaler's update, or None:
        when every path meets an update (for an unscale_, the step of its optimizer too), when it
        may reach one of `theirs` (misplaced updates, see `misplaced_updates`), in the iteration
        of another module's helper (reported there), or when no update of the iteration follows
        and the scaler may be updated elsewhere (something in the file updates it, or it is
        handed in to a step function by a caller)."""
        model = self.model
        scaler = ev.scaler
        if any(model.may_precede(trace, ev, u) for u in theirs):
            return None  # AMP004 reports where the updates stand (per optimizer, the other scaler's)
        group = model.iteration_of(trace, ev)

        def blocks(e: TraceEvent) -> bool:
            return e.scaler == scaler and (e.kind == UPDATE or (ev.kind == UNSCALE and e.kind == SCALER_STEP
                                                                and e.target == ev.target))

        end = model.leaves_iteration_without(trace, ev, group, blocks)
        if end is None or (ev.event.foreign and group is not None and not isinstance(group_loop(group), cst.CSTNode)):
            return None  # the iteration of a helper of another module: reported there
        if self.touched_unseen(trace, scaler):
            return None  # a wrapper of another module may update it (`scaler = scaler or default`)
        updates = [u for u in trace.of(UPDATE) if u.scaler == scaler and model.in_iteration(u, group)
                   and model.may_precede(trace, ev, u)]
        later = model._after_iteration(trace, ev, group, UPDATE) if not updates and ev.kind == SCALER_STEP else []
        if later and not ev.event.foreign:
            return MissingUpdate(ev, end, group, later=later[0])
        if not updates and not (self.never_updated(ev) and (group is not None or self.scaler_built_here(ev))
                                and not self.handed_to_unknown(ev)):
            return None  # updated elsewhere, or a step method whose caller (elsewhere) hands in the scaler
        return MissingUpdate(ev, end, group, tuple(updates))

    def update_site(self, trace: Trace, ev: TraceEvent, group: Optional[Group]) -> Optional[cst.BaseStatement]:
        """The statement after which the missing update of the step `ev` (in its iteration
        `group`) goes: the step's own statement, or the loop over optimizers inside the iteration
        that runs it. None when `ev` is not a step of this file's iteration code (an unscale_, in
        a helper or another module), when another step of the scaler in the iteration may come
        after it, or when it is not an expression statement of its own in a block."""
        model = self.model
        if ev.kind != SCALER_STEP or ev.event.foreign:
            return None
        frame = group[0] if group is not None else ()
        if ev.frame != frame:
            return None  # the step is in a helper
        steps = [s for s in trace.of(SCALER_STEP) if s.scaler == ev.scaler and model.in_iteration(s, group)]
        if any(s is not ev and not model.may_precede(trace, s, ev) for s in steps):
            return None
        stmt = model.statement_of(ev.node)
        if not is_expression_statement_of(stmt, ev.node):
            return None
        stop = group_loop(group)
        while True:  # out of loops over optimizers inside the iteration
            loop = model.loop_of(stmt, stop)
            if loop is None:
                break
            stmt = loop
        return stmt if model.block_of(stmt) is not None else None

    def raising_pairs(self, trace: Trace, skip) -> Iterator[Tuple[TraceEvent, TraceEvent]]:
        """(first, second): an unscale_ or step `second` that runs on the optimizer of `first`
        after it with no update of their scaler in between on some path, in an order `RAISES`
        names (the nearest such `first` for each `second`). Events whose id is in `skip`, an
        unscale_ under a stage test, a scaler always disabled and two events of one call of
        another module's function are left out."""
        model = self.model
        events = [e for e in trace.of(SCALER_STEP, UNSCALE) if e.target is not None and id(e) not in skip]
        for j, second in enumerate(events):
            # an update() on every path to `second`: pairs with an earlier `first` are cut by it
            barrier = model._barrier_before(trace, second, lambda e: e.kind == UPDATE and e.scaler == second.scaler)
            cut_all = barrier is not None and model._beyond_barrier(trace, barrier, second)
            for first in reversed(events[:j]):
                kinds = (first.kind, second.kind)
                if first.scaler != second.scaler or first.target != second.target or kinds not in RAISES:
                    continue
                if barrier is not None and first.order < barrier.order:
                    if cut_all:
                        break
                    if not model.exclusive(first, second) and not model.exclusive(first, barrier):
                        continue
                if second.kind == UNSCALE and not second.event.foreign and model.guards.in_stage_test(second.node):
                    break  # it unscales only an optimizer not unscaled yet
                if model.scaler_always_disabled(second.event.scaler, trace.root) or self.touched_unseen(
                        trace, first.scaler) or model.within_one_call(
                        first, second) or not model.path_avoiding(
                        trace, first, second, lambda e: e.kind == UPDATE and e.scaler == first.scaler):
                    continue
                yield first, second
                break

    def step_after_update(self, trace: Trace, upd: TraceEvent) -> Optional[TraceEvent]:
        """The step of the iteration that comes after the update `upd` when `upd` may run before
        any step or unscale_ of its scaler in the iteration (torch asserts on that); None when it
        does not, and for `update(new_scale)` (which sets the scale: no step needed)."""
        model = self.model
        if upd.node.args:  # type: ignore[attr-defined]
            return None  # update(new_scale) sets the scale: no step needed
        group = model.iteration_of(trace, upd)
        outer = model._loop_context(trace, group) if group is not None else {}
        own = {g: br for g, br in upd.ctx.items() if g not in outer and g != group}
        later = [s for s in trace.after(upd, SCALER_STEP) if s.scaler == upd.scaler
                 and model.in_iteration(s, group) and model.may_precede(trace, upd, s)
                 and all(s.ctx.get(g) == br for g, br in own.items())]
        if not later or model.within_one_call(upd, later[0]):
            return None
        if not model.path_avoiding(trace, None, upd, lambda e: e.kind in (SCALER_STEP, UNSCALE)
                                   and e.scaler == upd.scaler and model.in_iteration(e, group)):
            return None
        return later[0]

    def update_misplaced(self, trace: Trace, upd: TraceEvent) -> Optional[UpdateMisplaced]:
        memo: Dict = self.__dict__.setdefault("_update_misplaced", {})
        key = (id(trace), id(upd))
        if key not in memo:
            memo[key] = (trace, self._in_optimizer_loop(trace, upd) or self._between_steps(trace, upd)
                         or self._wrong_scaler(trace, upd))
        return memo[key][1]

    def _in_optimizer_loop(self, trace: Trace, upd: TraceEvent) -> Optional[UpdateMisplaced]:
        """An update inside a loop over optimizers (its variable is what the steps step, and it
        runs no backward), so it updates once per optimizer."""
        backwards = trace.of(BACKWARD)
        for group in upd.loops():
            frame, (_, loop) = group  # the loop's frame, and the loop
            if not isinstance(loop, cst.For):
                continue
            names = set(target_names(loop.target))
            memo = self.__dict__.setdefault("_loop_steps_memo", {})  # the same for every update of the loop
            key = (id(trace), group, upd.scaler)
            if key not in memo:
                memo[key] = [e for e in trace.members(group) if e.kind == SCALER_STEP and e.scaler == upd.scaler
                             and names & self.model._reads_of(e.path[len(frame)])]
            steps = memo[key]
            if not steps or any(group in b.ctx for b in backwards):
                continue
            site = upd.path[len(frame)]
            if self._one_optimizer_selected(loop, names, site):
                continue
            return UpdateMisplaced(UpdatePlace.OPTIMIZER_LOOP, upd, site, loop=loop, steps=tuple(steps))
        return None

    def _one_optimizer_selected(self, loop: cst.For, names: set, site: cst.CSTNode) -> bool:
        """The loop's body reaches `site` only for the optimizer a test picks by the loop's
        variable: after `if i != idx: continue` (also `if idx is not None and i != idx:
        continue`, which lets every optimizer through only when `idx` is None: not known here),
        or inside `if i == idx:`. Then it may update once per iteration (espnet's GAN trainers
        step the generator and the discriminator on alternate turns)."""
        m = self.model
        body = loop.body.body if isinstance(loop.body, cst.IndentedBlock) else ()
        for node in m.ancestors(site):
            if node is loop:
                break
            parent = m.parent(node)
            if isinstance(parent, cst.If) and node is parent.body and self._picks(parent.test, names, "=="):
                return True
        for stmt in body:
            if stmt is site or m.is_ancestor(stmt, site):
                break
            if isinstance(stmt, cst.If) and stmt.orelse is None and _only_continue(stmt.body) \
                    and self._picks(stmt.test, names, "!="):
                return True
        return False

    def _picks(self, test: cst.BaseExpression, names: set, op: str) -> bool:
        """`test` compares the loop's variable with something else by `op` (`!=` may be one
        conjunct of an `and`)."""
        if isinstance(test, cst.BooleanOperation) and op == "!=" and isinstance(test.operator, cst.And):
            return self._picks(test.left, names, op) or self._picks(test.right, names, op)
        if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1):
            return False
        target = test.comparisons[0]
        kind = cst.NotEqual if op == "!=" else cst.Equal
        if not isinstance(target.operator, kind):
            return False
        sides = (bool(names & self.model._reads_of(test.left)), bool(names & self.model._reads_of(target.comparator)))
        return sides in ((True, False), (False, True))

    def _between_steps(self, trace: Trace, upd: TraceEvent) -> Optional[UpdateMisplaced]:
        loops = set(upd.loops())
        same_step = _same(SCALER_STEP, upd.scaler)
        earlier = self.model._last_before(trace, upd, lambda e: same_step(e) and loops <= set(e.loops()),
                                   stop=_same(UPDATE, upd.scaler))
        later = self.model.first_after(trace, upd, lambda e: same_step(e) and loops <= set(e.loops()))
        if earlier is None or later is None or self.model.within_one_call(earlier, upd, later) \
                or self._next_iteration(trace, earlier, upd, later):
            return None
        shown = self.model.anchor(earlier, upd, later)[1]
        last = self._chain_end(trace, later, (upd.scaler, frozenset(loops)),
                               lambda e: same_step(e) and loops <= set(e.loops()))
        final = self.model.first_after(trace, last, _same(UPDATE, upd.scaler))
        return UpdateMisplaced(UpdatePlace.BETWEEN_STEPS, upd, shown, earlier=earlier, later=later, last=last,
                               final=final)

    def _next_iteration(self, trace: Trace, earlier: TraceEvent, upd: TraceEvent, later: TraceEvent) -> bool:
        """`later` steps gradients made entirely after `upd`: a backward runs on every path between
        them, and `later` steps the optimizer `earlier` stepped (two whole iterations, e.g. a
        step-and-update helper called twice) or that optimizer's gradients were zeroed after
        `earlier`'s backward. Its gradients were then scaled with the scale `upd` set: this is
        the next iteration, not a second optimizer of this one."""
        backwards = [b for b in trace.between(upd, later, BACKWARD) if self.model.mandatory_between(b, upd, later)]
        if not backwards:
            return False
        if later.target is not None and later.target == earlier.target:
            return True
        first = backwards[0]
        start = max([earlier, *(b for b in trace.between(earlier, upd, BACKWARD))], key=lambda e: e.order)
        return any(z.target == later.target and self.model.mandatory_between(z, start, first)
                   for z in trace.between(start, first, ZERO_GRAD))

    def _chain_end(self, trace: Trace, start: TraceEvent, key, match) -> TraceEvent:
        """The last step of this scaler in the iteration: `first_after` from step to step, each
        chain walked once per file (memoized; the walk from every update is linear in all)."""
        memo = self.__dict__.setdefault("_step_chain_memo", {})
        walked = []
        cur = start
        while True:
            k = (id(trace), key, id(cur))
            if k in memo:
                end = memo[k]
                break
            walked.append(k)
            nxt = self.model.first_after(trace, cur, match)
            if nxt is None:
                end = cur
                break
            cur = nxt
        for k in walked:
            memo[k] = end
        return end

    def _wrong_scaler(self, trace: Trace, upd: TraceEvent) -> Optional[UpdateMisplaced]:
        """An update of a scaler that has not stepped since its last update, right after the
        step of another scaler that is never updated afterwards."""
        if self.model._last_before(trace, upd, _same(SCALER_STEP, upd.scaler), stop=_same(UPDATE, upd.scaler)):
            return None
        prev = self.model._last_before(trace, upd, lambda e: e.kind == SCALER_STEP and e.scaler != upd.scaler)
        if prev is None or self.model.first_after(trace, prev, _same(UPDATE, prev.scaler)) is not None:
            return None
        same_update = _same(UPDATE, upd.scaler)
        if self.model._last_before(trace, upd, same_update) is None and self.model.first_after(trace, upd, same_update) is None:
            return None  # this scaler is updated once: only the other one is missing its update
        if self.model.within_one_call(prev, upd):
            return None
        return UpdateMisplaced(UpdatePlace.WRONG_SCALER, upd, self.model.anchor(prev, upd)[1], other=prev)


__all__ = ["RAISES", "MissingUpdate", "UpdatePlace", "UpdateMisplaced", "Updates"]
