"""Where an object built by a call lives, and where one built too often can be built once.

AMP006's facts about a GradScaler built in the training loop, or in a method that runs once per
step: the target its construction is assigned to (`assigned_target`), whether its arguments
call anything (`calls_in_args`), the loop before which it can be built instead (`hoist_site`)
and, for a per-step method, the `__init__` of its class and the `self.` attribute it can be
built in (`init_home`). Functions of the model (`model` first), asked by the rule directly.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import libcst as cst

from ampfix.model.events import Trace, TraceEvent
from ampfix.model.iterations import group_frame, group_loop
from ampfix.model.readwrite import names_bound, reads_writes
from ampfix.model.tree import dotted


def assigned_target(stmt: Optional[cst.CSTNode], call: cst.Call) -> Optional[cst.BaseExpression]:
    """The target of `x = GradScaler(...)` (also `x = GradScaler(...) if c else None`, and an
    annotated assignment): the statement `stmt` assigns `call` alone to one target."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    small = stmt.body[0]
    if isinstance(small, cst.Assign) and len(small.targets) == 1:
        target, value = small.targets[0].target, small.value
    elif isinstance(small, cst.AnnAssign) and small.value is not None:
        target, value = small.target, small.value
    else:
        return None
    if value is call or (isinstance(value, cst.IfExp) and call in (value.body, value.orelse)):
        return target
    return None


def calls_in_args(call: cst.Call) -> bool:
    """Some argument of `call` calls something (building it elsewhere may change what it gets)."""
    found = []

    class V(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            found.append(node)

    for a in call.args:
        a.visit(V())
    return bool(found)


def hoist_site(model, new: TraceEvent, stmt: cst.CSTNode, flagged: List) -> Optional[cst.BaseStatement]:
    """The loop before which the construction `new` (its statement `stmt`, one assignment) can
    go: the outermost of the loop groups `flagged` that is in the construction's own function,
    when only loop bodies lie between it and `stmt` (and `stmt`'s block keeps another
    statement), the loop is in a block, the construction's arguments read nothing the loop
    binds, and nothing in the loop touches the assigned name before `stmt`. None otherwise."""
    loops = [group_loop(g) for g in flagged if len(group_frame(g)) == len(new.frame)]
    if not loops or not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    outer = loops[0]
    cur = stmt  # only loop bodies between the statement and the outer loop
    while cur is not outer:
        block = model.block_of(cur)
        loop = model.parent(block) if block is not None else None
        if not isinstance(loop, (cst.For, cst.While)) or loop.body is not block \
                or (cur is stmt and len(block.body) < 2):
            return None
        cur = loop
    if model.block_of(outer) is None:
        return None
    bound = names_bound([outer])
    reads, _ = reads_writes(new.node)
    name = (dotted(assigned_target(stmt, new.node)) or "").split(".")[0]
    if reads & bound or model.bound.touched_before(outer, stmt, name):
        return None
    return outer


def init_home(model, trace: Trace, new: TraceEvent, stmt: cst.CSTNode, target: Optional[cst.BaseExpression]
              ) -> Optional[Tuple[cst.FunctionDef, str, str]]:
    """Where the scaler a per-step method builds (`new`, assigned to `target` by `stmt`, a
    statement of the method's own body) can be built once: (the `__init__` of the method's
    class, the name it is assigned to, the `self.` attribute to build it in: that name if it is
    one, else `self.<name>`). None when the class has no `__init__` with a block, the
    construction is reached through a call or reads the method's locals or parameters, or the
    attribute is assigned already (maybe by a base class in another module)."""
    root = trace.root
    cls = model.class_of(root) if isinstance(root, cst.FunctionDef) else None
    init = model.method(cls, "__init__") if cls is not None else None
    if init is None or new.via or not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1 \
            or model.block_of(stmt) is not root.body or not isinstance(init.body, cst.IndentedBlock):
        return None
    reads, _ = reads_writes(new.node)
    if any(model.binding_scope(n, root) not in (model.module, None) for n in reads):
        return None  # reads the method's locals or parameters
    text = dotted(target) or ""
    attr = text if text.startswith("self.") else f"self.{text}"
    if "." in attr[5:] or (attr != text and (model.attribute_values(cls, attr[5:]) or model._has_unseen_bases(cls))):
        return None  # assigned already, or maybe by a base class in another module
    return init, text, attr


__all__ = ["assigned_target", "calls_in_args", "hoist_site", "init_home"]
