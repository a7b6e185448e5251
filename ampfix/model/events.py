"""AMP events and traces: the training step in the order it runs, through helpers.

Each function (and the module body) has a summary: its own AMP events in evaluation order
(`_events_in`): backward calls, scaler scale/unscale_/step/update, gradient clipping and
`.grad` reads, direct optimizer steps, zero_grad, GradScaler construction, CUDA
initialisation, `autograd.grad`, exits (continue/break/return/raise), and calls to functions of
this file.

A *trace* is one function's events with every call to a function of this file replaced by the
callee's events, recursively (`trace(root)`). Each trace event knows its call path from the
root, its conditional contexts along that path (so `flow` queries work across helpers), the
autocast region it runs in (a call made inside a region runs the callee in it), and its keys
(scaler, optimizer) translated into the root's names: in `apply_step(self.scaler, opt_g)` the
helper's `scaler.step(opt)` is `self.scaler.step(opt_g)`.

The *roots* are the module and the functions no call of this file reaches (entry points,
methods called from other files, callbacks); everything else is seen inside them, once per
call site, so a helper called twice in one iteration shows its events twice.
"""

from __future__ import annotations

import bisect
import math
import os
import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Callable, Dict, Hashable, List, Optional, Tuple

import libcst as cst

from ampfix.model.parsing import parse_expression
from ampfix.model.regions import Region
from ampfix.model.syntax import call_name, get_arg
from ampfix.model.tree import child_nodes, dotted

class EventKind(StrEnum):
    """What an event does (a `str`: equal to, and hashed like, its value; summaries store the value)."""
    BACKWARD = "backward"  # detail: "tensor" | "scaled" | "autograd"; scaler; target: loss text
    SCALE = "scale"  # scaler.scale(x) whose result is not `.backward()`-ed on the spot
    UNSCALE = "unscale"  # scaler; target: optimizer
    GRAD_READ = "grad_read"  # detail: "clip" | "read"
    GRAD_SANITIZE = "grad_sanitize"  # the non-finite values of a `.grad` replaced in place (`nan_to_num_`)
    SCALER_STEP = "scaler_step"  # scaler; target: optimizer
    OPT_STEP = "opt_step"  # target: optimizer (a direct optimizer.step())
    UPDATE = "update"  # scaler
    ZERO_GRAD = "zero_grad"  # target
    SCALER_NEW = "scaler_new"  # GradScaler(...) constructed
    OPT_NEW = "opt_new"  # an optimizer constructed (torch.optim.X(...), or `opt = build_optimizer(...)`)
    CUDA_INIT = "cuda_init"  # detail: reason
    AUTOGRAD_GRAD = "autograd_grad"
    EXIT = "exit"  # detail: "continue" | "break" | "return" | "raise" | "exit"
    DP_FORWARD = "dp_forward"  # a module run by nn.DataParallel / parallel_apply / data_parallel (worker threads)
    THREAD_RUN = "thread_run"  # a function handed to a thread (Thread(target=f), pool.submit/map(f, ...))
    CALL = "call"  # a call to functions of this file (expanded in traces)
    # a call that may run a function of another module of the project (a project is known): traces
    # inline the callee's summary (`foreign.py`); a module's own summary keeps it as a CALL effect
    EXTERNAL = "external"


# the kinds by their names, as the rules import them
BACKWARD = EventKind.BACKWARD
SCALE = EventKind.SCALE
UNSCALE = EventKind.UNSCALE
GRAD_READ = EventKind.GRAD_READ
GRAD_SANITIZE = EventKind.GRAD_SANITIZE
SCALER_STEP = EventKind.SCALER_STEP
OPT_STEP = EventKind.OPT_STEP
UPDATE = EventKind.UPDATE
ZERO_GRAD = EventKind.ZERO_GRAD
SCALER_NEW = EventKind.SCALER_NEW
OPT_NEW = EventKind.OPT_NEW
CUDA_INIT = EventKind.CUDA_INIT
AUTOGRAD_GRAD = EventKind.AUTOGRAD_GRAD
EXIT = EventKind.EXIT
DP_FORWARD = EventKind.DP_FORWARD
THREAD_RUN = EventKind.THREAD_RUN
CALL = EventKind.CALL
EXTERNAL = EventKind.EXTERNAL

MAX_INLINE_DEPTH = 6
MAX_TRACE_EVENTS = 20000
NORM_FUNCS = {"torch.norm", "torch.linalg.norm", "torch.linalg.vector_norm", "torch.abs", "torch.max", "torch.sum",
              "torch.mean", "torch.nn.utils.get_total_norm", "torch._foreach_norm", "torch.isfinite", "torch.isnan",
              "torch.isinf"}
# methods whose result depends on the magnitude of `.grad`; scaling by a constant (mul_, div_) does not
VALUE_METHODS = {"norm", "abs", "max", "min", "mean", "sum", "std", "var", "pow", "square", "item", "tolist",
                 "amax", "amin", "clamp", "clamp_", "isfinite", "isnan", "isinf"}


@dataclass(frozen=True)
class Event:
    """An AMP event in a function's own body."""

    kind: EventKind
    node: cst.CSTNode  # the call, or the exiting statement
    scaler: Optional[str] = None  # scaler key, in the function's own names
    target: Optional[str] = None  # optimizer key (step/unscale_/zero_grad), loss text (backward)
    detail: Optional[str] = None
    callees: Tuple[cst.FunctionDef, ...] = ()
    loop: Optional[Hashable] = None  # for continue/break: the loop they leave (a foreign exit: its loop group)
    # an event of another module, inlined at the call `node` that runs it: where it is written
    origin: Optional["Origin"] = field(default=None, compare=False)
    scale_source: Optional[str] = None  # a foreign BACKWARD: "scaled", "unscaled" or "unknown"
    # a foreign event that runs in a function the call site chose (a callback it passes): the
    # mistake is made where the two are put together, not in either module alone
    chosen_here: bool = field(default=False, compare=False)

    @property
    def foreign(self) -> bool:
        return self.origin is not None


@dataclass(frozen=True)
class Origin:
    """Where an inlined event of another module is written (a related location)."""

    path: str
    line: int
    col: int
    text: str
    function: str  # the function of that module it runs in (`Trainer.backward_step`)


@dataclass
class TraceEvent:
    """An event as it runs in one root's trace."""

    event: Event
    path: Tuple[cst.CSTNode, ...]  # call sites from the root, then the event's node
    order: int
    ctx: Dict[Hashable, Hashable]
    region: Optional[Region]
    scaler: Optional[str] = None  # keys in the root's names
    target: Optional[str] = None
    frame: Tuple[int, ...] = ()  # identity of the function instance that runs it
    subst: Dict[str, str] = field(default_factory=dict, repr=False)  # its function's names -> the root's

    @property
    def kind(self) -> str:
        return self.event.kind

    @property
    def node(self) -> cst.CSTNode:
        return self.event.node

    @property
    def via(self) -> Tuple[cst.CSTNode, ...]:
        """The call sites that lead to it (empty: in the root's own body)."""
        return self.path[:-1]

    def loops(self) -> List[Hashable]:
        """The loop bodies it runs in (qualified groups `(frame, ("loop", node))`)."""
        return [g for g in self.ctx if _loop_group(g) and g[1][0] == "loop"]


@dataclass
class Trace:
    root: cst.CSTNode
    events: List[TraceEvent] = field(default_factory=list)
    truncated: List[cst.FunctionDef] = field(default_factory=list)  # callees left out (too deep / too big)
    _exits: Optional[List[int]] = field(default=None, repr=False)
    # indexes built on first use, rebuilt when events were added since (linear-time queries)
    _index: Optional[Tuple[int, Dict[str, List[TraceEvent]], Dict[str, set]]] = field(default=None, repr=False)
    _members: Optional[Tuple[int, Dict[Hashable, Tuple[List[TraceEvent], int]]]] = field(default=None, repr=False)

    def _kinds(self) -> Tuple[Dict[str, List[TraceEvent]], Dict[str, set]]:
        if self._index is None or self._index[0] != len(self.events):
            by_kind: Dict[str, List[TraceEvent]] = {}
            groups: Dict[str, set] = {}
            for e in self.events:
                by_kind.setdefault(e.kind, []).append(e)
                groups.setdefault(e.kind, set()).update(e.ctx)
            self._index = (len(self.events), by_kind, groups)
        return self._index[1], self._index[2]

    def of(self, *kinds: str) -> List[TraceEvent]:
        by_kind = self._kinds()[0]
        if len(kinds) == 1:
            return list(by_kind.get(kinds[0], ()))
        return [e for e in self.events if e.kind in kinds]

    def groups_of(self, kind: str) -> set:
        """The context groups (loops, decisions) that some event of `kind` runs in."""
        return self._kinds()[1].get(kind, set())

    def members(self, group: Hashable) -> List[TraceEvent]:
        """The events that run in `group` (a loop body or a decision arm), in order."""
        return self._group_facts(group)[0]

    def single_branch(self, group: Hashable) -> bool:
        """Every event that runs in `group` takes the same branch of it: no two events of the
        trace are exclusive on it."""
        return self._group_facts(group)[1] <= 1

    def _group_facts(self, group: Hashable) -> Tuple[List[TraceEvent], int]:
        """The events that run in `group` and how many branches of it they take: found per
        group asked (rules ask a few of a trace's thousands), all of them in one pass once more
        than `_FEW_GROUPS` were asked (linear in all); memoised until events are added."""
        if self._members is None or self._members[0] != len(self.events):
            self._members = (len(self.events), {})
        memo = self._members[1]
        hit = memo.get(group)
        if hit is not None:
            return hit
        if len(memo) < _FEW_GROUPS:
            hit = memo[group] = _facts_of_group([e for e in self.events if group in e.ctx], group)
            return hit
        index: Dict[Hashable, List[TraceEvent]] = {}
        for e in self.events:
            for g in e.ctx:
                index.setdefault(g, []).append(e)
        for g, members in index.items():
            if g not in memo:
                memo[g] = _facts_of_group(members, g)
        return memo.setdefault(group, ([], 0))

    def span(self, a: Optional[TraceEvent], b: Optional[TraceEvent]) -> List[TraceEvent]:
        """The events strictly between `a` and `b` (None: the start / the end)."""
        lo = 0 if a is None else math.floor(a.order) + 1
        hi = len(self.events) if b is None else math.ceil(b.order)
        return self.events[lo:hi]

    def between(self, a: TraceEvent, b: TraceEvent, *kinds: str) -> List[TraceEvent]:
        return [e for e in self.span(a, b) if e.kind in kinds]

    def exits_between(self, a: TraceEvent, b: TraceEvent) -> List[TraceEvent]:
        if self._exits is None:
            self._exits = [e.order for e in self.events if e.kind == EXIT]
        lo = bisect.bisect_right(self._exits, a.order)
        hi = bisect.bisect_left(self._exits, b.order)
        return [self.events[i] for i in self._exits[lo:hi]]

    def after(self, a: TraceEvent, *kinds: str) -> List[TraceEvent]:
        return [e for e in self.span(a, None) if e.kind in kinds]

    def before(self, a: TraceEvent, *kinds: str) -> List[TraceEvent]:
        return [e for e in self.span(None, a) if e.kind in kinds]


def anchor(*events: TraceEvent) -> List[cst.CSTNode]:
    """For events of one trace: where each of them shows in the deepest function that runs all
    of them (the event's own node, or the call that leads to it)."""
    paths = [e.path for e in events]
    common = 0
    while all(len(p) > common + 1 for p in paths) and len({id(p[common]) for p in paths}) == 1:
        common += 1
    return [p[common] for p in paths]


_FEW_GROUPS = 32  # groups of one trace asked one by one (`Trace._group_facts`)


def _facts_of_group(members: List[TraceEvent], group: Hashable) -> Tuple[List[TraceEvent], int]:
    branches: set = set()
    for e in members:
        try:
            branches.add(e.ctx[group])
        except TypeError:  # an unhashable branch value: count it as another branch
            branches.add(object())
    return members, len(branches)


_KIND_OF: Dict[str, EventKind] = {k.value: k for k in EventKind}
_FOREIGN_FRAMES: Dict[Tuple[int, ...], Tuple[int, ...]] = {}


def _foreign_frame(frame: Tuple[int, ...]) -> Tuple[int, ...]:
    """A summary effect's frame (the calls of its module's helpers it runs in, numbered) as the
    tail of a trace event's frame: negative numbers, never an `id()` of this file's nodes."""
    hit = _FOREIGN_FRAMES.get(frame)
    if hit is None:
        if len(_FOREIGN_FRAMES) > 4096:
            _FOREIGN_FRAMES.clear()
        hit = _FOREIGN_FRAMES[frame] = tuple(-(i + 1) for i in frame)
    return hit


def _renamed(text: str, name: str, key: str) -> str:
    """`text` (a test's code) with the name `name` written `key` wherever it is that name (not
    an attribute, nor part of a longer name or of a run's `x@<id>`); the scan is skipped where
    the text does not hold it."""
    if name not in text:
        return text
    return re.sub(rf"(?<![\w.@]){re.escape(name)}\b", lambda _m: key, text)


def _loop_group(group: Hashable) -> bool:
    """A qualified loop-body or comprehension group `(frame, ("loop" | "comp", node))`."""
    return isinstance(group, tuple) and len(group) == 2 and isinstance(group[1], tuple) and bool(group[1]) \
        and group[1][0] in ("loop", "comp")


def _cond_of(group: Hashable) -> Optional[Tuple[str, Tuple[int, ...], Optional[cst.CSTNode]]]:
    """For a trace's decision on a stable test (see `flow.py`): (the test's text in its positive
    form, the frame of a decision on a call's locals (empty: on the root's names), the function
    of a local decision); None for other groups."""
    if isinstance(group, tuple) and len(group) == 4 and group[0] == "cond" and group[1] is None:
        return group[2], (), None  # a test on parameters, `self` or globals: in the root's names
    if isinstance(group, tuple) and len(group) == 2 and isinstance(group[1], tuple) and len(group[1]) == 5 \
            and group[1][0] == "cond":
        return group[1][2], group[0], group[1][1]
    return None


_NONFINITE_TEST = re.compile(r"\bis(?:nan|inf|finite)\b")


def _grad_expr(expr: cst.CSTNode) -> bool:
    """`p.grad`, `p.grad.data`, `p.grad.detach()`."""
    while True:
        if isinstance(expr, cst.Attribute) and expr.attr.value == "grad":
            return True
        if isinstance(expr, cst.Attribute) and expr.attr.value == "data":
            expr = expr.value
            continue
        if isinstance(expr, cst.Call) and call_name(expr) == "detach" and isinstance(expr.func, cst.Attribute):
            expr = expr.func.value
            continue
        return False


class Events:
    """Per-function AMP event summaries and traces (a part of `AmpModel`)."""

    def _init_events(self) -> None:
        self._local_events: Dict[cst.CSTNode, List[Event]] = {}
        self._traces: Dict[cst.CSTNode, Trace] = {}
        self._local_traces: Dict[cst.CSTNode, Trace] = {}
        self._roots_memo: Optional[List[cst.CSTNode]] = None
        self._alias: Dict[Tuple[int, str], str] = {}

    # ---------------------------------------------------------------- classification
    def key(self, expr: Optional[cst.CSTNode]) -> Optional[str]:
        """The identity key of an expression in its function: its dotted text, through a local
        alias assigned once (`scaler = self.scaler` -> "self.scaler"); other text as written."""
        if expr is None:
            return None
        text = dotted(expr)
        if text is None:
            return self.code(expr)
        scope = self.scope_of(expr)
        cache = (id(scope), text)
        if cache in self._alias:
            return self._alias[cache]
        result = text
        if "." not in text:
            entries = [(n, v) for n, v, s in self._by_key.get(text, []) if s is scope]
            if len(entries) == 1 and isinstance(entries[0][1], (cst.Name, cst.Attribute)) \
                    and dotted(entries[0][1]) not in (None, text):
                result = self.key(entries[0][1]) or text
        self._alias[cache] = result
        return result

    def _classify(self, call: cst.Call) -> Optional[Event]:
        """The AMP event a call is, if any (see the module docstring)."""
        bw = self._backward_call(call)
        if bw is not None:
            loss = call.func.value if isinstance(call.func, cst.Attribute) else None
            scaler = bw.scaler
            if bw.kind == "scaled" and isinstance(loss, cst.Call) and isinstance(loss.func, cst.Attribute):
                # keyed as the scaler's own calls are (through a local alias: `scaler = self.scaler`)
                scaler = self.key(loss.func.value)
            if bw.kind == "scaled" and isinstance(loss, cst.Call) and loss.args:
                loss = loss.args[0].value
            return Event(BACKWARD, call, scaler=scaler, detail=bw.kind,
                         target=self.code(loss) if loss is not None else None)
        dp = self.parallel.forward_kind(call)  # type: ignore[attr-defined]
        if dp is not None:
            return Event(DP_FORWARD, call, detail=dp)
        worker = self.parallel.thread_target(call)  # type: ignore[attr-defined]
        if worker is not None:
            return Event(THREAD_RUN, call, target=self.code(worker))
        callees = self.callees(call)
        if callees and not self._scaler_method_call(call):  # a scaler class's own methods are scaler calls
            return Event(CALL, call, callees=tuple(callees))
        func = call.func
        if isinstance(func, cst.Attribute):
            method = func.attr.value
            scaler = self.scaler_key(func.value)
            if scaler is not None:
                arg = self.key(call.args[0].value) if call.args and not call.args[0].star else None
                if method == "scale":
                    parent = self.parent(call)
                    if not (isinstance(parent, cst.Attribute) and parent.attr.value == "backward"):
                        return Event(SCALE, call, scaler=self.key(func.value))
                    return None
                kinds = {"unscale_": UNSCALE, "step": SCALER_STEP, "update": UPDATE}
                if method in kinds:
                    return Event(kinds[method], call, scaler=self.key(func.value), target=arg)
                return None
            if method == "step" and not any(a.keyword is None for a in call.args[1:]) \
                    and self.is_optimizer(func.value):
                return Event(OPT_STEP, call, target=self.key(func.value))
            if method == "zero_grad":
                return Event(ZERO_GRAD, call, target=self.key(func.value))
        api = self.api_of(call)
        if (api is not None and api.kind == "clip_grad") or self._calls_a_clipper(call):
            return Event(GRAD_READ, call, detail="clip", target=self.code(call.args[0].value) if call.args else None)
        if api is not None:
            if api.kind == "GradScaler":
                return Event(SCALER_NEW, call)
            if api.kind == "autograd.grad":
                return Event(AUTOGRAD_GRAD, call)
        if self._sanitizes_grad(call):
            return Event(GRAD_SANITIZE, call)
        if self._reads_grad(call):
            return Event(GRAD_READ, call, detail="read")
        reason = self._cuda_init_reason(call)
        if reason is not None:
            return Event(CUDA_INIT, call, detail=reason)
        if self.builds_optimizer(call):  # type: ignore[attr-defined]
            return Event(OPT_NEW, call)
        if self.foreign is not None and self._may_leave_module(call):  # type: ignore[attr-defined]
            return Event(EXTERNAL, call)
        return None

    def _calls_a_clipper(self, call: cst.Call) -> bool:
        """`call` calls a gradient clipper held by a name (joeynmt's `self.clip_grad_fun =
        build_gradient_clipper(cfg)`, `functools.partial(nn.utils.clip_grad_norm_, max_norm=...)`
        or None): every value the callee may hold is a clipping function of torch, a partial of
        one, or None, and one is not None. Asked only of a callee whose name says `clip`."""
        func = call.func
        if not isinstance(func, (cst.Name, cst.Attribute)) or "clip" not in (dotted(func) or "").rpartition(".")[2].lower():
            return False
        values = [v for v in self.possible_values(func) if v is not func]
        clippers = 0
        for v in values:
            if isinstance(v, cst.Name) and v.value == "None":
                continue
            parts = self._partial_parts(v)
            target = parts[0] if parts is not None else v
            api = self.api_of(target) if isinstance(target, (cst.Name, cst.Attribute)) else None
            if api is None or api.kind != "clip_grad":
                return False
            clippers += 1
        return clippers > 0

    def _may_leave_module(self, call: cst.Call) -> bool:
        """The call may run a function of another module of the project: an imported name (not
        a library's), a method on `self` or `super()` this file does not define, or a call on
        a parameter, `self.` attribute or name whose value may come from another module."""
        func = call.func
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Call):
            return isinstance(func.value.func, cst.Name) and func.value.func.value == "super"
        text = dotted(func)
        if text is None:
            return False
        root = text.split(".")[0]
        if root in ("self", "cls"):
            return True
        if any(not (q == "torch" or q.startswith(("torch.", "builtins."))) for q in self.qualnames(func)):
            return True
        scope = self.scope_of(call)
        bscope = self.binding_scope(root, scope)
        if isinstance(bscope, cst.FunctionDef) and self._is_param(bscope, root):
            return True
        return any(self.is_synthetic(v) for v in self.possible_values(func if "." not in text else func.value))

    def _sanitizes_grad(self, call: cst.Call) -> bool:
        """The call replaces the non-finite values of a `.grad` in place: `p.grad.nan_to_num_()`,
        `torch.nan_to_num(p.grad, out=p.grad)`, `p.grad = torch.nan_to_num(p.grad)`,
        `p.grad.masked_fill_(torch.isnan(p.grad), 0)`, or the test that indexes an assignment to
        the gradient (`p.grad[torch.isnan(p.grad)] = 0`, `p.grad[~p.grad.isfinite()] = 0`). Only
        a call on a gradient, or with one as its first argument, asks for its qualified names."""
        func = call.func
        if isinstance(func, cst.Attribute) and _grad_expr(func.value):
            method = func.attr.value
            if method == "masked_fill_":
                return bool(call.args) and _NONFINITE_TEST.search(self.code(call.args[0])) is not None
            return method == "nan_to_num_" or (method in ("isnan", "isinf", "isfinite") and self._indexes_grad_write(call))
        if not call.args or not _grad_expr(call.args[0].value):
            return False
        names = self.qualnames(call)
        if "torch.nan_to_num" in names:
            out = get_arg(call, 99, "out")
            if out is not None:
                return _grad_expr(out.value)
            parent = self.parent(call)
            return isinstance(parent, cst.Assign) and any(_grad_expr(t.target) for t in parent.targets)
        return bool(names & {"torch.isnan", "torch.isinf", "torch.isfinite"}) and self._indexes_grad_write(call)

    def _indexes_grad_write(self, test: cst.Call) -> bool:
        """`test` (through `~` or `not`) is the index of an assignment to a gradient:
        `p.grad[torch.isnan(p.grad)] = 0`."""
        parent = self.parent(test)
        while isinstance(parent, cst.UnaryOperation):
            parent = self.parent(parent)
        if not isinstance(parent, cst.Index):
            return False
        sub = self.parent(self.parent(parent))
        if not (isinstance(sub, cst.Subscript) and _grad_expr(sub.value)):
            return False
        target = self.parent(sub)
        return isinstance(target, (cst.AssignTarget, cst.AugAssign)) and target.target is sub

    def _reads_grad(self, call: cst.Call) -> bool:
        """The call's result depends on the magnitude of some `.grad` (`p.grad.norm()`,
        `torch.norm(p.grad)`)."""
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in VALUE_METHODS \
                and _grad_expr(call.func.value):
            return True
        return any(_grad_expr(a.value) for a in call.args) and bool(self.qualnames(call) & NORM_FUNCS)

    def _events_in(self, scope: cst.CSTNode) -> List[Event]:
        """The events of `scope`'s own body (not of nested functions), in evaluation order."""
        cached = self._local_events.get(scope)
        if cached is not None:
            return cached
        post = self._index.post_of
        found: List[Tuple[int, Event]] = []
        for call in self.calls_in_scope(scope):
            ev = self._classify(call)
            if ev is not None:
                found.append((post(call), ev))
        for stmt in self._nodes_in_scope(scope, cst.SimpleStatementLine):
            kind = self._exit_kind(stmt)
            if kind is not None:
                loop = self.loop_of(stmt) if kind in ("continue", "break") else None
                found.append((post(stmt), Event(EXIT, stmt, detail=kind, loop=loop)))
        found.sort(key=lambda p: p[0])
        events = [ev for _, ev in found]
        self._local_events[scope] = events
        return events

    def calls_in_scope(self, scope: cst.CSTNode) -> List[cst.Call]:
        """Calls that run as part of `scope` itself (not inside nested defs, lambdas, classes)."""
        by_scope = getattr(self, "_calls_by_scope", None)
        if by_scope is None:
            by_scope = {}
            for c in self.calls:
                by_scope.setdefault(self.scope_of(c), []).append(c)
            self._calls_by_scope = by_scope
        return by_scope.get(scope, [])

    @property
    def _event_scopes(self) -> List[cst.CSTNode]:
        """Every scope that contains a call."""
        self.calls_in_scope(self.module)
        return list(self._calls_by_scope)

    # ---------------------------------------------------------------- traces
    @property
    def _roots(self) -> List[cst.CSTNode]:
        """The module and every function that no call of this file reaches."""
        if self._roots_memo is None:
            roots: List[cst.CSTNode] = [self.module]
            for f in self.nodes_of(cst.FunctionDef):
                if not self.callers(f):  # type: ignore[arg-type]
                    roots.append(f)
            self._roots_memo = roots
        return self._roots_memo

    def _roots_reaching(self, node: cst.CSTNode) -> List[cst.CSTNode]:
        """The roots whose traces run `node` (its function, through the callers of this file)."""
        start: cst.CSTNode = self.function_of(node) or self.module
        seen, todo, out = {start}, [start], []
        while todo:
            func = todo.pop()
            if func in self._roots:
                out.append(func)
            if isinstance(func, cst.FunctionDef):
                for call in self.callers(func):
                    caller = self.function_of(call) or self.module
                    if caller not in seen:
                        seen.add(caller)
                        todo.append(caller)
        return out

    def runs_with_scaler(self, node: cst.CSTNode) -> bool:
        """Some run of the file that reaches `node` also steps a GradScaler (one that may be
        enabled: a scaler built disabled, `scaler_always_disabled`, keeps no state)."""
        return any(not self.scaler_always_disabled(e.event.scaler, root)  # type: ignore[attr-defined]
                   for root in self._roots_reaching(node) for e in self.trace(root).of(SCALER_STEP))

    def traces(self) -> List[Trace]:
        """One trace per root (plus the functions a trace had to leave out)."""
        out: List[Trace] = []
        pending = list(self._roots)
        seen = set()
        while pending:
            root = pending.pop(0)
            if root in seen:
                continue
            seen.add(root)
            t = self.trace(root)
            out.append(t)
            pending.extend(f for f in t.truncated if f not in seen)
        return out

    def trace(self, root: cst.CSTNode) -> Trace:
        """The events `root` runs, through the functions of this file and (with a project) the
        functions of other modules it calls."""
        cached = self._traces.get(root)
        if cached is not None:
            return cached
        trace = Trace(root)
        self._traces[root] = trace
        self._expand(trace, root, (), {}, {}, None, 0, (root,))
        return trace

    def _local_trace(self, root: cst.CSTNode) -> Trace:
        """The events `root` runs through the functions of this file only, with the calls that
        may leave the module kept as EXTERNAL events (what the module's summary records)."""
        cached = self._local_traces.get(root)
        if cached is not None:
            return cached
        trace = Trace(root)
        self._local_traces[root] = trace
        self._expand(trace, root, (), {}, {}, None, 0, (root,), external=False)
        return trace

    def point(self, trace: Trace, node: cst.CSTNode) -> TraceEvent:
        """A statement or expression of the root's own body as a place in its trace (for
        questions such as "does CUDA initialise before this assignment?")."""
        post = self._index.post_of
        keys = [post(e.path[0]) for e in trace.events]
        i = bisect.bisect_left(keys, post(node))
        ctx = {self._qualify(g, ()): br for g, br in self._contexts(node)}
        order = i - 0.5 + 0.4 * post(node) / (len(self._index.nodes) + 1)  # two points between the same events keep their order
        return TraceEvent(Event("point", node), (node,), order, ctx, self.region_of(node))

    def related_at(self, node: cst.CSTNode) -> List[Origin]:
        """The code of other modules that runs at the call `node` (as the traces inlined it)."""
        out: List[Origin] = []
        for o in self.__dict__.get("_site_origins", {}).get(node, ()):
            if all((o.path, o.line) != (p.path, p.line) for p in out):
                out.append(o)
        return out

    @staticmethod
    def foreign_among(*events: Optional[TraceEvent]) -> bool:
        """Some of these events are written in another module (a fix here cannot reach them:
        rules offer none)."""
        return any(e is not None and e.event.foreign for e in events)

    @staticmethod
    def within_one_call(*events: TraceEvent) -> bool:
        """Every event runs inside one call to a function of another module: the mistake they
        make is written there, and is reported in that module, not at each call."""
        return bool(events) and all(e.event.foreign and not e.event.chosen_here for e in events) \
            and len({e.path for e in events}) == 1

    @staticmethod
    def anchor(*events: TraceEvent) -> List[cst.CSTNode]:
        """Where each event shows in the deepest function that runs all of them."""
        return anchor(*events)

    def shown_in_region(self, ev: TraceEvent) -> cst.CSTNode:
        """Where an event that runs in an autocast region shows in the function that opens the
        region: the event itself, or the call inside the region that leads to it."""
        region_node = ev.region.node if ev.region is not None else None
        for node in ev.path:
            if node is region_node or (region_node is not None and self.is_ancestor(region_node, node)):
                return node
        return ev.path[0]

    def where(self, ev: TraceEvent, shown: cst.CSTNode) -> str:
        """How an event reported at `shown` (a call that leads to it) is reached: "" when it is
        the event itself, else " (through this call: `model.forward(...)` on line 12)"."""
        origin = ev.event.origin
        if origin is not None:
            rel = os.path.relpath(origin.path, os.path.dirname(os.path.abspath(self.path))) if self.path else origin.path
            return f" (in `{origin.function}`, {rel}:{origin.line}: `{origin.text}`)"
        if shown is ev.node:
            return ""
        node = ev.node
        what = f"{self.code(node.func)}({'...' if node.args else ''})" if isinstance(node, cst.Call) else self.code(node)
        return f" (through this call: `{what}` on line {self.line(node)})"

    def _expand(self, trace: Trace, func: cst.CSTNode, prefix: Tuple[cst.CSTNode, ...],
                ctx: Dict[Hashable, Hashable], subst: Dict[str, str], region: Optional[Region], depth: int,
                stack: Tuple[Hashable, ...], external: bool = True) -> None:
        frame = tuple(id(p) for p in prefix)
        for ev in self._events_in(func):
            ev_ctx = dict(ctx)
            for group, branch in self._contexts(ev.node):
                ev_ctx[self._qualify(group, frame, subst)] = branch
            ev_region = self.region_of(ev.node)
            if ev_region is None and not self._masked_by_disabled_region(ev.node):
                ev_region = region
            path = prefix + (ev.node,)
            if ev.kind == CALL:
                callee = ev.callees[0] if len(ev.callees) == 1 else None
                if callee is None or callee in stack:
                    continue
                if depth >= MAX_INLINE_DEPTH or len(trace.events) >= MAX_TRACE_EVENTS:
                    trace.truncated.append(callee)
                    continue
                self._expand(trace, callee, path, ev_ctx, self._callee_subst(ev.node, callee, subst, frame),
                             ev_region, depth + 1, stack + (callee,), external)
                continue
            if ev.kind == EXTERNAL and external:
                ff = self._foreign_callee(ev.node)  # type: ignore[attr-defined]
                if ff is not None and not self.foreign.relevant_to_traces(ff):  # type: ignore[attr-defined]
                    continue  # only checkpoint or configuration code: no event of a trace
                if ff is not None and ff.key not in stack and depth < MAX_INLINE_DEPTH \
                        and len(trace.events) < MAX_TRACE_EVENTS:
                    self._expand_foreign(trace, ff, ev.node, path, ev_ctx, subst, frame, ev_region, depth + 1,
                                         stack + (ff.key,))
                continue
            trace.events.append(TraceEvent(ev, path, len(trace.events), ev_ctx, ev_region,
                                           scaler=self._subst(ev.scaler, subst, frame, ev.node),
                                           target=self._subst(ev.target, subst, frame, ev.node), frame=frame,
                                           subst=subst))

    # ---------------------------------------------------------------- events of other modules
    def _expand_foreign(self, trace: Trace, ff, call: cst.Call, path: Tuple[cst.CSTNode, ...],
                        ctx: Dict[Hashable, Hashable], subst: Dict[str, str], frame: Tuple[int, ...],
                        region: Optional[Region], depth: int, stack: Tuple[Hashable, ...]) -> None:
        """Inline the effects of `ff` (a function of another module, `foreign.py`) run by
        `call`: each becomes an event of this trace at `call`, its scaler and optimizer keys in
        the root's names through the arguments `call` passes."""
        keys: Dict[str, str] = {}
        bindings = self._bind_foreign_arguments(call, ff)  # type: ignore[attr-defined]
        for param, arg in bindings.items():
            k = self._subst(self.key(arg), subst, frame, call)
            if k is not None:
                keys[param] = k
        owner_key = None
        if ff.summary.is_method and ff.summary.params:
            func = call.func
            owner = func.value if isinstance(func, cst.Attribute) else func
            owner_key = "self" if isinstance(owner, cst.Call) else self.key(owner)
            if isinstance(func, cst.Attribute) and func.attr.value == "__init__" or ff.qual.endswith(".__init__") \
                    and not isinstance(owner, cst.Call) and not isinstance(func, cst.Attribute):
                owner_key = None  # a constructor: the instance is new
            if owner_key is not None:
                keys[ff.summary.params[0].name] = self._subst(owner_key, subst, frame, call) or owner_key
        self_cls = self.self_class(call) if owner_key == "self" else None  # type: ignore[attr-defined]
        self._inline_effects(trace, ff, keys, call, path, ctx, frame + (id(call),), region, depth, stack,
                             self_cls or ff.owner, bindings)

    def _inline_effects(self, trace: Trace, ff, keys: Dict[str, str], call: cst.Call,
                        path: Tuple[cst.CSTNode, ...], ctx: Dict[Hashable, Hashable], fframe: Tuple[int, ...],
                        region: Optional[Region], depth: int, stack: Tuple[Hashable, ...], self_cls,
                        bindings: Optional[Dict[str, cst.BaseExpression]] = None, chosen: bool = False) -> None:
        module = ff.module.summary
        constants, imports, functions = module.constants, module.imports, module.functions

        def tr(key: Optional[str]) -> Optional[str]:
            if key is None:
                return None
            root, dot, rest = key.partition(".")
            if root in keys:
                return keys[root] + dot + rest
            if root in constants or root in imports or root in functions:
                return f"{ff.path}:{key}"  # a global of that module: one object for every call
            return f"{key}@{ff.path}:{ff.qual}@{fframe[-1]}"  # a local of this run of it

        # the groups of this run of `ff`, each qualified once (effects share their decisions and loops)
        qualified: Dict[Hashable, Hashable] = {}

        def group(g: Hashable) -> Hashable:
            q = qualified.get(g)
            if q is None:
                q = qualified[g] = self._foreign_group(g, ff, fframe, keys)
            return q

        def context(e) -> Dict[Hashable, Hashable]:
            ev_ctx = dict(ctx)
            for g, br in e.ctx:
                ev_ctx[group(g)] = br
            return ev_ctx

        for e in ff.summary.effects:
            if e.kind == EXTERNAL:  # (its context is made only where it is inlined)
                if depth >= MAX_INLINE_DEPTH or len(trace.events) >= MAX_TRACE_EVENTS:
                    continue
                target = self._effect_callee(e, ff, self_cls, bindings)
                if target is not None and not isinstance(target, cst.FunctionDef) \
                        and not self.foreign.relevant_to_traces(target):  # type: ignore[attr-defined]
                    continue  # no AMP code in it, or only checkpoint or configuration code
                slots = dict(e.args)
                if target is None:
                    method = self._method_on_bound_object(e, tr(slots.get("owner")))
                    if method is not None:
                        ev_ctx = context(e)
                        kind, owner = method
                        arg = tr(slots.get("0"))
                        origin = Origin(ff.path, e.line, e.col, e.text, ff.qual)
                        scaler = owner if kind in (UNSCALE, SCALER_STEP, UPDATE) else None
                        target = owner if kind in (OPT_STEP, ZERO_GRAD) else arg
                        event = Event(kind, call, scaler=scaler, target=target, origin=origin)
                        trace.events.append(TraceEvent(event, path, len(trace.events), ev_ctx, region, scaler=scaler,
                                                       target=target, frame=fframe + _foreign_frame(e.frame)))
                    continue
                if isinstance(target, cst.FunctionDef):  # a method of this file overriding it
                    if target in stack:
                        continue
                    ev_ctx = context(e)
                    sub: Dict[str, str] = {}
                    params = [*target.params.posonly_params, *target.params.params]
                    if self._is_method(target) and params:
                        sub[params[0].name.value] = tr(slots.get("owner", "self")) or "self"
                        params = params[1:]
                    for i, prm in enumerate(params):
                        k = tr(slots.get(str(i)) or slots.get(f"kw:{prm.name.value}"))
                        if k is not None and not k.startswith("__unknown__"):
                            sub[prm.name.value] = k
                    self._expand(trace, target, path, ev_ctx, sub, region, depth + 1, stack + (target,))
                    continue
                if target.key in stack:
                    continue
                ev_ctx = context(e)
                sub_keys: Dict[str, str] = {}
                params = [p for p in target.summary.params if p.kind in ("posonly", "pos")]
                if target.summary.is_method and params:
                    owner = tr(slots.get("owner"))
                    if owner is not None:
                        sub_keys[params[0].name] = owner
                    params = params[1:]
                for i, prm in enumerate(params):
                    k = tr(slots.get(str(i)) or slots.get(f"kw:{prm.name}"))
                    if k is not None and not k.startswith("__unknown__"):
                        sub_keys[prm.name] = k
                for prm in target.summary.params:
                    if prm.kind == "kwonly" and f"kw:{prm.name}" in slots:
                        sub_keys[prm.name] = tr(slots[f"kw:{prm.name}"]) or prm.name
                inner = fframe + (-(len(trace.events) + 1),)
                by_argument = chosen or ((e.callee or "").startswith("value:__param__") and bool(bindings))
                self._inline_effects(trace, target, sub_keys, call, path, ev_ctx, inner, region, depth + 1,
                                     stack + (target.key,), self_cls if target.summary.is_method else None,
                                     None, by_argument)
                continue
            ev_ctx = context(e)
            loop = None
            if e.loop is not None:
                loop = group(("loop", e.loop))
            origin = Origin(ff.path, e.line, e.col, e.text, ff.qual)
            self.__dict__.setdefault("_site_origins", {}).setdefault(call, []).append(origin)
            scaler, target, detail = e.scaler, e.target, e.detail
            key_scaler, key_target = tr(e.scaler), tr(e.target)
            if e.kind == BACKWARD and detail == "tensor":  # (`scaler`: the parameter `p` of `p.scale(loss).backward()`)
                bound = self._scaled_by_bound_scaler(e, tr)
                scaler = key_scaler = None
                if bound is not None:  # the caller's GradScaler scales it: keyed as `_method_on_bound_object`'s events
                    detail = "scaled"
                    scaler = key_scaler = bound[0]
                    target = key_target = bound[1]
            event = Event(_KIND_OF.get(e.kind) or EventKind(e.kind), call, scaler=scaler, target=target,
                          detail=detail, loop=loop, origin=origin, scale_source=self._foreign_scale_source(e, call, ff),
                          chosen_here=chosen)
            frame = fframe + _foreign_frame(e.frame)
            trace.events.append(TraceEvent(event, path, len(trace.events), ev_ctx, region, scaler=key_scaler,
                                           target=key_target, frame=frame))

    def _scaled_by_bound_scaler(self, e, tr: Callable[[Optional[str]], Optional[str]]) -> Optional[Tuple[str, str]]:
        """A summary's backward of `p.scale(loss)` where `p` is a parameter its function never
        rebinds (the summary names it as the effect's scaler: `grad_scaler.scale(loss).backward()`
        in a model's `backward_step(self, loss, grad_scaler)` of another module, where nothing
        told that module `p` is a GradScaler): a scaled backward here when the call binds `p` to
        a GradScaler of this file (`tr`: the summary's keys in the root's names). (the scaler's
        key, the loss's), else None: a value this file does not know to be a scaler, an
        explicit gradient (`x.backward(g)`, whose scale source the summary leaves unknown)."""
        if e.detail != "tensor" or e.scale_source != "scaled" or not e.scaler or not e.target:
            return None
        try:
            expr = parse_expression(e.target)
        except Exception:
            return None
        if not (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "scale"
                and len(expr.args) == 1 and not expr.args[0].star and expr.args[0].keyword is None):
            return None
        if dotted(expr.func.value) != e.scaler:
            return None
        key = tr(e.scaler)
        if key is None or "@" in key or ":" in key or key not in self.scalers:  # type: ignore[attr-defined]
            return None
        return key, tr(cst.Module([]).code_for_node(expr.args[0].value)) or ""

    def _method_on_bound_object(self, e, owner: Optional[str]) -> Optional[Tuple[str, str]]:
        """A summary's call of a method on an object it received (`scaler.unscale_(opt)` in a
        helper of another module, where nothing told that module `scaler` is a GradScaler): the
        event it is here, where the object is known (the scaler or optimizer the caller passed).
        None where the summary does not name the parameter it is called on as one the function
        never rebinds (`Effect.owner_param`: after `scaler = Wrapper(scaler)` the object is not
        the caller's: unknown)."""
        callee = e.callee or ""
        if owner is None or not callee.startswith("value:") or "@" in owner or not e.owner_param:
            return None
        method = callee.rpartition(".")[2]
        if owner in self.scalers:  # type: ignore[attr-defined]
            kinds = {"unscale_": UNSCALE, "step": SCALER_STEP, "update": UPDATE}
            return (kinds[method], owner) if method in kinds else None
        if method in ("step", "zero_grad") and self._is_optimizer_key(owner):
            return (OPT_STEP if method == "step" else ZERO_GRAD), owner
        return None

    def _is_optimizer_key(self, key: str) -> bool:
        try:
            expr = parse_expression(key)
        except Exception:
            return False
        return dotted(expr) is not None and self.is_optimizer(expr)  # type: ignore[attr-defined]

    @staticmethod
    def _foreign_group(g, ff, fframe: Tuple[int, ...], keys: Dict[str, str]) -> Hashable:
        """A context group of a summary as a group of this trace (see `_qualify`)."""
        kind = g[0]
        if kind == "cond":
            text = g[1]
            for root, key in keys.items():
                text = _renamed(text, root, key)
            return ("cond", None, text, ())
        if kind in ("loop", "comp"):
            return (fframe, (kind, (ff.path, ff.qual, g[1])))
        return (fframe, ("foreign", ff.path, ff.qual, kind, *g[1:]))

    def _effect_callee(self, e, ff, self_cls, bindings=None):
        """What a CALL effect of a summary runs: a function of another module, or a method of
        this file (a subclass here overriding what the base class calls on `self`)."""
        callee = e.callee or ""
        kind, _, rest = callee.partition(":")
        if kind in ("self", "super"):
            if isinstance(self_cls, cst.ClassDef):
                if kind == "self":
                    local = self.lookup_method(self_cls, rest)  # type: ignore[attr-defined]
                    if local is not None:
                        return local
                return self._inherited_method(self_cls, rest)  # type: ignore[attr-defined]
            if self_cls is not None:
                mro = self.foreign_mro(self_cls)  # type: ignore[attr-defined]
                if kind == "super":
                    mro = [c for c in mro if c.key != ff.owner.key] if ff.owner is not None else mro
                for c in mro:
                    if rest in c.summary.methods:
                        from ampfix.model.foreign import ForeignFunction

                        return ForeignFunction(c.module, f"{c.qual}.{rest}", c)
            return None
        if kind == "value":
            # what a value callee names depends on its module, its class and, for a parameter
            # (`__param__`), the call's bindings (one dict per call and callee: `bind_foreign_arguments`)
            memo = self.__dict__.setdefault("_value_callees", {})
            mkey = (id(ff.module), getattr(ff.owner, "key", None), rest,
                    id(bindings) if bindings and "__param__" in rest else 0)
            if mkey not in memo:
                memo[mkey] = (bindings, self._value_callee(rest, ff, bindings))  # keeps `bindings` alive
            return memo[mkey][1]
        return None

    def _value_callee(self, rest: str, ff, bindings):
        """A `value:` callee of a summary: the function of another module it names, or a method of
        the objects it holds."""
        from ampfix.model.foreign import Synthetic
        from ampfix.model.summary import Value

        expr = self._materialize(Value(rest), Synthetic(ff.module, ff.owner, bindings or None))  # type: ignore[attr-defined]
        if expr is None:
            return None
        d = self._foreign_definition(expr)  # type: ignore[attr-defined]
        if d is not None and type(d).__name__ == "ForeignFunction":
            return d
        if d is not None and type(d).__name__ == "ForeignClass":
            return self._foreign_method(d, "__init__")  # type: ignore[attr-defined]
        if isinstance(expr, cst.Attribute):
            return self._method_on_values(expr.value, expr.attr.value)  # type: ignore[attr-defined]
        return self._method_on_values(expr, "__call__")  # type: ignore[attr-defined]

    def _foreign_scale_source(self, e, call: cst.Call, ff) -> Optional[str]:
        source = e.scale_source
        if source is None or not source.startswith("param:"):
            return source
        arg = self._bind_foreign_arguments(call, ff).get(source[len("param:"):])  # type: ignore[attr-defined]
        if arg is None:
            return "unknown"
        return "scaled" if self.scale_sources(arg) else "unscaled"  # type: ignore[attr-defined]

    def _key_expression(self, text: str, at: cst.CSTNode) -> Optional[cst.BaseExpression]:
        """`text` (a key of the trace's root, such as `self.scaler`) as an expression read where
        `at` is: not part of the file (never reported nor edited), its names resolved in `at`'s
        scope. Cached per text and scope."""
        scope = self.scope_of(at)
        cache = self.__dict__.setdefault("_key_exprs", {})
        hit = cache.get((text, id(scope)))
        if hit is not None:
            return hit
        try:
            expr = parse_expression(text)
        except Exception:
            return None
        stack = [(expr, None)]
        while stack:
            node, parent = stack.pop()
            if parent is not None:
                self._index.set_parent(node, parent)  # type: ignore[attr-defined]
            self._index.set_scope(node, scope)  # type: ignore[attr-defined]
            stack.extend((c, node) for c in child_nodes(node))
        cache[(text, id(scope))] = expr
        return expr

    def backward_tensor(self, call: cst.Call) -> Optional[cst.BaseExpression]:
        """The tensor a backward call runs on: `x` in `x.backward()`, the first argument of
        `torch.autograd.backward(x)`."""
        if self.is_api(call, "autograd.backward"):
            arg = get_arg(call, 0, "tensors")
            return arg.value if arg is not None else None
        if isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward":
            return call.func.value
        return None

    def backward_scale_sources(self, ev: TraceEvent) -> List[cst.Call]:
        """For a BACKWARD: the `scaler.scale(...)` calls (or calls that may scale unseen, see
        `scale_sources`) whose result it runs on. `scaler.scale(loss).backward()`,
        `scaled.backward()` after `scaled = scaler.scale(loss)`, `torch.autograd.backward(
        scaler.scale(loss))`, a helper's `loss.backward()` called with `scaler.scale(loss)`.
        Empty: a backward of an unscaled tensor."""
        if ev.event.foreign:  # what the other module's backward runs on, as its summary says
            if ev.event.scale_source == "unscaled":
                return []
            if ev.event.detail == "scaled" and ev.scaler is not None and "@" not in ev.scaler:
                scale = self._key_expression(f"{ev.scaler}.scale(__foreign__)", ev.path[0])
                if isinstance(scale, cst.Call):
                    return [scale]
            return [ev.node]
        return self.scale_sources(self.argument_at(ev, self.backward_tensor(ev.node)))  # type: ignore[attr-defined]

    def disabled_scale(self, ev: TraceEvent) -> Optional[cst.Call]:
        """For a BACKWARD: the `scaler.scale(loss)` it runs on when every scaling of it
        (`backward_scale_sources`) is by a GradScaler that is never enabled (`scaler_disabled`:
        `enabled=False`, an `enabled=` test that can never be true), so that it returns the loss
        unchanged; None when nothing scales it, or something may."""
        scales = self.backward_scale_sources(ev)
        if scales and all(isinstance(c.func, cst.Attribute) and c.args and self.scaler_disabled(c.func.value)  # type: ignore[attr-defined]
                          for c in scales):
            return scales[0]
        return None

    def enabled_scaler_in(self, trace: Trace) -> bool:
        """A GradScaler that may be enabled (or what may be one) takes part in the trace: a
        `scale`/`unscale_`/`step`/`update` of a scaler not always disabled
        (`scaler_always_disabled`), or a backward of a value that something other than a
        never-enabled GradScaler may have scaled (`backward_scale_sources`, no `disabled_scale`)."""
        return any(not self.scaler_always_disabled(e.event.scaler, trace.root)  # type: ignore[attr-defined]
                   for e in trace.of(SCALE, UNSCALE, SCALER_STEP, UPDATE)) or any(
            self.backward_scale_sources(e) and self.disabled_scale(e) is None for e in trace.of(BACKWARD))

    def scales_unseen(self, ev: TraceEvent) -> bool:
        """A function on the event's call path calls something named like a loss scaler
        (`loss_scaler(loss, optimizer)`, `amp.scale_loss(...)`): it may scale what it is given
        (not a GradScaler that is never enabled, nor its `scale()`)."""
        scopes = {self.scope_of(n) for n in ev.path}  # type: ignore[attr-defined]
        return any("scale" in (call_name(c) or "").lower() and not (call_name(c) or "").startswith("unscale")
                   and not (self.is_api(c, "GradScaler") and self.built_disabled(c))  # type: ignore[attr-defined]
                   and not (isinstance(c.func, cst.Attribute) and self.scaler_disabled(c.func.value))  # type: ignore[attr-defined]
                   for scope in scopes for c in self.calls_in_scope(scope))  # type: ignore[attr-defined]

    def unscaled_loss(self, ev: TraceEvent) -> Optional[cst.BaseExpression]:
        """For a BACKWARD that runs on a loss no GradScaler scaled (`loss.backward()`,
        `torch.autograd.backward(loss)`, a function of another module whose `loss.backward()`
        runs on what the call passes): that loss, as the trace's root reads it. None when the
        backward is scaled or may be (`backward_scale_sources`), is a wrapper's
        (`optimizer.backward(loss)`, `engine.backward(loss)`), takes explicit gradients, or
        runs on a value of the other module's own."""
        if ev.kind != BACKWARD or ev.event.detail == "scaled" or self.backward_scale_sources(ev):
            return None
        if ev.event.foreign:
            key = ev.target
            if key is None or any(mark in key for mark in ("@", ":", "__")):
                return None
            return self._key_expression(key, ev.path[0])
        call = ev.node
        if ev.event.detail == "tensor" and any(a.keyword is None for a in call.args):  # type: ignore[attr-defined]
            return None
        if ev.event.detail == "autograd" and get_arg(call, 1, "grad_tensors") is not None:  # type: ignore[arg-type]
            return None
        return self.argument_at(ev, self.backward_tensor(call))  # type: ignore[arg-type]

    def argument_at(self, ev: TraceEvent, expr: Optional[cst.BaseExpression]) -> Optional[cst.BaseExpression]:
        """`expr` as it is bound in this trace: a parameter of the event's function (or of its
        callers, up the call path) is replaced by the argument the call on the path passes;
        anything else is returned as is."""
        level = len(ev.via)
        while isinstance(expr, cst.Name) and level > 0:
            func = self.function_of(expr)
            if func is None or not self._is_param(func, expr.value) \
                    or self.binding_scope(expr.value, self.scope_of(expr)) is not func:
                break
            call = ev.via[level - 1]
            if not isinstance(call, cst.Call):
                break
            arg = self.bind_arguments(call, func).get(expr.value)
            if arg is None:
                break
            expr, level = arg, level - 1
        return expr

    def scaler_of_scale(self, ev: TraceEvent, scale: cst.Call) -> Optional[str]:
        """The key, in the names of `ev`'s trace root, of the scaler whose `scale()` call
        `scale` is, when `scale` runs in `ev`'s own function (else its key as written)."""
        if not isinstance(scale.func, cst.Attribute):
            return None
        key = self.key(scale.func.value)
        if self.scope_of(scale) is self.scope_of(ev.node):
            return self.root_key(ev, key)
        return key

    def root_key(self, ev: TraceEvent, key: Optional[str]) -> Optional[str]:
        """A key written in the names of `ev`'s function, in the names of the trace's root."""
        if ev.event.foreign:
            return key  # an inlined event of another module: its keys are the root's already
        return self._subst(key, ev.subst, ev.frame, ev.node)

    @staticmethod
    def _qualify(group: Hashable, frame: Tuple[int, ...], subst: Optional[Dict[str, str]] = None) -> Hashable:
        """A function's context group as one decision of the trace: per call (frame), except a
        stable test on parameters, `self` and globals, which is the same decision wherever its
        names mean the same objects (`if args.amp == "pytorch":` in a helper and its caller)."""
        if isinstance(group, tuple) and group and group[0] == "cond" and group[1] is None:
            _, _, text, version, roots = group
            if subst:
                for root in roots:
                    if root in subst:
                        text = _renamed(text, root, subst[root])
            return ("cond", None, text, version)
        return (frame, group)

    def _subst(self, key: Optional[str], subst: Dict[str, str], frame: Tuple[int, ...],
               at: cst.CSTNode) -> Optional[str]:
        """A key of the callee's names in the root's names."""
        if key is None or not frame:
            return key
        root, dot, rest = key.partition(".")
        if root in subst:
            return subst[root] + dot + rest
        scope = self.function_of(at)
        if scope is not None and self.binding_scope(root, scope) is scope:
            return f"{key}@{frame[-1]}"  # a local of this call: not the caller's namesake
        return key

    def _callee_subst(self, call: cst.Call, callee: cst.FunctionDef, subst: Dict[str, str],
                      frame: Tuple[int, ...]) -> Dict[str, str]:
        out: Dict[str, str] = {}
        for param, arg in self.bind_arguments(call, callee).items():
            k = self._subst(self.key(arg), subst, frame, call)
            if k is not None:
                out[param] = k
        if self._is_method(callee):
            first = [*callee.params.posonly_params, *callee.params.params][0].name.value
            owner = call.func.value if isinstance(call.func, cst.Attribute) else call.func
            if isinstance(owner, cst.Call):  # super().method()
                owner_key = "self"
            else:
                owner_key = self.key(owner)
            if owner_key is not None and self._class_named(owner) is None:
                out[first] = self._subst(owner_key, subst, frame, call) or owner_key
        return out

    # ---------------------------------------------------------------- path queries on traces
    def runs_only_without(self, ev: TraceEvent, key: Optional[str]) -> bool:
        """`ev` runs only where the object `key` (in the names of `ev`'s trace root) is None:
        under `if key is None:` / `if not key:`, or in the `else` of `if key is not None:` /
        `if key:`. After `key.scale(loss)` ran, `key` is not None (else that call raised), so
        such an event is not reached from it: `if self.scaler is None: optimizer.step()`."""
        if key is None:
            return False
        return any(self._none_branch(ev, group, key) is branch for group, branch in ev.ctx.items())

    def _none_branch(self, ev: TraceEvent, group: Hashable, key: str) -> Optional[bool]:
        """When `group` (a decision `ev` runs in) tests whether `key` is None (`key is None`,
        `key is not None`, `key`, `not key`): the branch value on which `key` is None; else None."""
        cond = _cond_of(group)
        if cond is None:
            return None
        text, frame, func = cond
        for suffix, none_when in ((" is None", True), (" == None", True), ("", False)):
            if text.endswith(suffix) and self._names_key(ev, text[: len(text) - len(suffix)], frame, func, key):
                return none_when
        return None

    def _flag_branch(self, ev: TraceEvent, group: Hashable, flag: str) -> Optional[bool]:
        """When `group` (a decision `ev` runs in) is a truth test of `flag` (`if use_amp:`, `if
        not use_amp:`, an operand of `if clip > 0 and use_amp:`): the branch value on which
        `flag` is true; else None."""
        cond = _cond_of(group)
        if cond is None:
            return None
        text, frame, func = cond
        return True if self._names_key(ev, text, frame, func, flag) else None

    def _names_key(self, ev: TraceEvent, name: str, frame: Tuple[int, ...], func: Optional[cst.CSTNode],
                   key: str) -> bool:
        """`name`, written in a decision of `ev`'s trace, is the object `key` of the root's names."""
        if name == key:
            return True
        if frame and f"{name}@{frame[-1]}" == key:  # a local of that call, as `_subst` writes it
            return True
        alias = self._local_alias(func, name)  # `scaler = self.scaler` in that function
        if alias is None:
            return False
        if not frame:
            return alias == key
        return func is self.function_of(ev.node) and self._subst(alias, ev.subst, ev.frame, ev.node) == key

    def _local_alias(self, func: Optional[cst.CSTNode], name: str) -> Optional[str]:
        """`self.scaler` for `scaler` when `func` assigns `scaler = self.scaler` once."""
        if func is None or "." in name:
            return None
        entries = [v for _, v, s in self._by_key.get(name, []) if s is func]
        if len(entries) == 1 and isinstance(entries[0], (cst.Name, cst.Attribute)):
            return dotted(entries[0])
        return None

    def exclusive(self, a, b) -> bool:
        """`a` and `b` (trace events, or two nodes of one function) never run in the same pass."""
        ca = a.ctx if isinstance(a, TraceEvent) else dict(self._contexts(a))
        cb = b.ctx if isinstance(b, TraceEvent) else dict(self._contexts(b))
        small, big = (ca, cb) if len(ca) <= len(cb) else (cb, ca)
        for g, br in small.items():
            other = big.get(g, br)
            if other != br:
                return True
        return False

    def mandatory_between(self, c: TraceEvent, a: Optional[TraceEvent], b: TraceEvent,
                          not_none: Optional[str] = None, flag: Optional[str] = None) -> bool:
        """Every path that runs `a` (None: the start of the trace) and then `b` runs `c` between.
        A loop body is taken to run at least once: a loop over the optimizers or parameters that
        runs zero times is not a training step anyone writes on purpose. `not_none`: an object
        known not to be None on these paths (a scaler whose `scale()` ran): a decision on it
        (`if scaler:`, `if scaler is not None:`) takes its not-None branch. `flag`: a name known
        to be true on the paths that matter (the flag a scaler is enabled by, where only an
        acting scaler matters): a decision on it takes its true branch."""
        if (a is not None and c.order <= a.order) or c.order >= b.order:
            return False
        for g, br in c.ctx.items():
            if b.ctx.get(g) != br and (a is None or a.ctx.get(g) != br) and not _loop_group(g):
                if not_none is not None and self._none_branch(c, g, not_none) is (not br):
                    continue  # `if scaler:` after `scaler.scale(loss)`: taken
                if flag is not None and self._flag_branch(c, g, flag) is br:
                    continue  # `if use_amp:` for a scaler built `enabled=use_amp`: taken where it acts
                return False
        return not self.exclusive(c, b) and (a is None or not self.exclusive(c, a))

    def _barrier_before(self, trace: Trace, b: TraceEvent, is_barrier: Callable[[TraceEvent], bool],
                       limit: int = 8) -> Optional[TraceEvent]:
        """The latest event before `b` that `is_barrier` accepts and that runs on every path to
        `b` (`mandatory_between(u, None, b)`), looking back at most `limit` accepted events;
        None when there is none. For any `a` before it that is exclusive with neither it nor
        `b`, `path_avoiding(trace, a, b, blocks)` is False when `blocks` accepts it: a rule can
        skip those pairs (linear instead of quadratic pair loops)."""
        seen = 0
        events = trace.events
        for i in range(min(math.ceil(b.order), len(events)) - 1, -1, -1):
            e = events[i]
            if e.order >= b.order or not is_barrier(e):
                continue
            if self.mandatory_between(e, None, b):
                return e
            seen += 1
            if seen >= limit:
                return None
        return None

    def _beyond_barrier(self, trace: Trace, barrier: TraceEvent, b: TraceEvent) -> bool:
        """No event of the trace can be exclusive with `barrier` or `b` (every decision they run
        in has one branch taken in the trace): every pair (a before `barrier`, `b`) is cut."""
        return all(trace.single_branch(g) for g in (*b.ctx, *barrier.ctx))

    def may_precede(self, trace: Trace, a: TraceEvent, b: TraceEvent) -> bool:
        """Some path runs `a` and later `b`, in one pass of the root (no loop back-edge)."""
        if a.order >= b.order or self.exclusive(a, b):
            return False
        return not any(self._cuts(e, a, b) for e in trace.exits_between(a, b))

    def _cuts(self, e: TraceEvent, a: TraceEvent, b: TraceEvent) -> bool:
        """The exit `e` runs on every path from `a` to `b` and leaves before `b`."""
        if not self.mandatory_between(e, a, b):
            return False
        kind = e.event.detail
        if kind in ("raise", "exit"):
            return True
        if kind == "return":  # leaves its function: `b` is cut when it runs in that call
            if e.event.foreign:
                return b.frame[:len(e.frame)] == e.frame
            return b.path[:len(e.frame)] == e.path[:-1] and len(b.path) > len(e.frame)
        loop = e.event.loop  # continue/break leave this iteration of their loop
        if e.event.foreign:
            return loop is not None and loop in b.ctx
        return loop is not None and (e.frame, ("loop", loop)) in b.ctx

    def path_without(self, trace: Trace, a: Optional[TraceEvent], b: TraceEvent,
                     blocks: Callable[[TraceEvent], bool], acting: Optional[str] = None) -> bool:
        """Some path runs `a` (None: from the start) then `b` with no event `blocks` accepts
        in between. `acting`: a scaler that only matters where it acts (its `scale()` ran): the
        paths where it is None or switched off by the flag it is built with
        (`scaler_enabled_flag`) do not count (see `mandatory_between`)."""
        if a is not None and not self.may_precede(trace, a, b):
            return False
        flag = self.scaler_enabled_flag(acting, trace.root) if acting is not None else None  # type: ignore[attr-defined]
        return not any(blocks(e) and self.mandatory_between(e, a, b, acting, flag) for e in trace.span(a, b))

    def scaled_backward_before(self, trace: Trace, ev: TraceEvent) -> Optional[TraceEvent]:
        """The scaled backward whose gradients `ev` sees: the nearest `scaler.scale(loss).backward()`
        that may precede it; None when there is none, or when its scaler is built with `enabled=False`
        in every assignment the trace sees (it scales nothing)."""
        bw = self._last_before(trace, ev, lambda e: e.kind == BACKWARD and e.event.detail == "scaled")
        if bw is None or self.scaler_always_disabled(bw.event.scaler, trace.root):  # type: ignore[attr-defined]
            return None
        return bw

    def first_after(self, trace: Trace, a: TraceEvent, match: Callable[[TraceEvent], bool]) -> Optional[TraceEvent]:
        """The nearest event after `a` that `match` accepts and that `a` may precede."""
        events = trace.events  # walked by index: no copy of the rest of the trace per call
        for i in range(math.floor(a.order) + 1, len(events)):
            e = events[i]
            if match(e) and self.may_precede(trace, a, e):
                return e
        return None

    def _last_before(self, trace: Trace, b: TraceEvent, match: Callable[[TraceEvent], bool],
                    stop: Optional[Callable[[TraceEvent], bool]] = None) -> Optional[TraceEvent]:
        """The nearest event before `b` that `match` accepts and that may precede `b`; the search
        ends at an event `stop` accepts that runs on every path to `b`."""
        events = trace.events
        for i in range(min(math.ceil(b.order), len(events)) - 1, -1, -1):
            e = events[i]
            if match(e) and self.may_precede(trace, e, b):
                return e
            if stop is not None and stop(e) and self.mandatory_between(e, None, b):
                return None
        return None


__all__ = ["Event", "Events", "Trace", "TraceEvent", "anchor", "BACKWARD", "SCALE", "UNSCALE", "GRAD_READ", "GRAD_SANITIZE",
           "SCALER_STEP", "OPT_STEP", "UPDATE", "ZERO_GRAD", "SCALER_NEW", "OPT_NEW", "CUDA_INIT", "AUTOGRAD_GRAD", "EXIT",
           "CALL", "DP_FORWARD", "THREAD_RUN"]
