"""The training step: `amp.scale_loss` becomes `scaler.scale(loss).backward()` with the loss computed
in `torch.autocast`, each optimizer step goes through the scaler, one `scaler.update()` per
iteration, `amp.master_params` and clipping after `scaler.unscale_`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional

import libcst as cst

from ampfix.model import dotted, get_arg, reads_writes
from ampfix.model.readwrite import dotted_reads, mutations, overlaps
from ampfix.migrations.apex import conditions, scaler
from ampfix.migrations.apex.common import SCALE_KW, SAVE_NOTE, LOAD_NOTE, GUARD_NOTE, ApexUse, Blocked

if TYPE_CHECKING:
    from ampfix.migrations.apex.plan import ApexMigration


def migrate_use(m: "ApexMigration", use: ApexUse) -> None:
    if use.kind == "other":
        raise Blocked(f"`{dotted(use.call.func) or 'this call'}` has no native AMP equivalent")
    if use.kind == "scale_loss":
        scale_loss(m, use)
    elif use.kind in ("state_dict", "load_state_dict"):
        ref = scaler.scaler_ref(m, use.call)
        stmt = m.model.statement_of(use.call)
        call = use.call
        new_call = call.with_changes(func=cst.parse_expression(f"{ref}.{use.kind}"))
        note = SAVE_NOTE if use.kind == "state_dict" else LOAD_NOTE
        comment = cst.EmptyLine(comment=cst.Comment(note))
        m.rw.add(use, call, lambda cur, f=new_call.func: cur.with_changes(func=f))
        arg = call.args[0].value if len(call.args) == 1 and call.args[0].keyword is None else None
        if use.kind == "load_state_dict" and arg is not None and pure(arg) and \
                isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and \
                isinstance(stmt.body[0], cst.Expr) and stmt.body[0].value is call:
            # old checkpoints still load: the apex entry ({"loss_scaler0": ...}) is skipped
            test = cst.parse_expression(f"{m.q}scale{m.q} in {m.code(arg)}")
            guard = cst.EmptyLine(comment=cst.Comment(GUARD_NOTE))
            m.rw.add(use, stmt, lambda cur, t=test, g=guard: cst.If(
                test=t, body=cst.IndentedBlock(body=[cur.with_changes(leading_lines=())]),
                leading_lines=[*cur.leading_lines, g]))
        else:
            m.rw.add(use, stmt, lambda cur, c=comment: cur.with_changes(leading_lines=[*cur.leading_lines, c]))
        use.description = f"apex amp.{use.kind} -> scaler.{use.kind}"


def pure(node: cst.CSTNode) -> bool:
    """Names, attributes and subscripts by literals: evaluating it twice changes nothing."""
    if isinstance(node, cst.Name):
        return True
    if isinstance(node, cst.Attribute):
        return pure(node.value)
    if isinstance(node, cst.Subscript) and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
        key = node.slice[0].slice.value
        return isinstance(key, (cst.SimpleString, cst.Integer, cst.Name)) and pure(node.value)
    return False


def scale_loss(m: "ApexMigration", use: ApexUse) -> None:
    model, call = m.model, use.call
    item = model.parent(call)
    with_node = model.parent(item) if isinstance(item, cst.WithItem) else None
    if not isinstance(with_node, cst.With) or len(with_node.items) != 1 or with_node.asynchronous:
        raise Blocked("amp.scale_loss is not the only item of a `with` statement")
    as_name = item.asname.name if item.asname is not None else None
    body = with_node.body
    inner = body.body[0] if isinstance(body, cst.IndentedBlock) and len(body.body) == 1 else None
    bw = inner.body[0].value if isinstance(inner, cst.SimpleStatementLine) and len(inner.body) == 1 \
        and isinstance(inner.body[0], cst.Expr) else None
    if not (isinstance(as_name, cst.Name) and isinstance(bw, cst.Call) and isinstance(bw.func, cst.Attribute)
            and bw.func.attr.value == "backward" and isinstance(bw.func.value, cst.Name)
            and bw.func.value.value == as_name.value):
        raise Blocked("the scale_loss block does more than `scaled_loss.backward()`")
    if any(a.star for a in call.args):
        raise Blocked("amp.scale_loss(*args/**kwargs)")
    kws = [a.keyword.value for a in call.args if a.keyword is not None]
    bad_kw = [k for k in kws if k not in SCALE_KW | {"loss", "optimizers"}]
    if bad_kw:
        raise Blocked(f"amp.scale_loss option {bad_kw[0]}= is unknown")
    positional = [a.value for a in call.args if a.keyword is None]
    loss_arg = get_arg(call, None, "loss")
    loss = positional[0] if positional else loss_arg.value if loss_arg is not None else None
    opt = positional[1] if len(positional) > 1 else (get_arg(call, None, "optimizers").value
                                                     if get_arg(call, None, "optimizers") else None)
    if loss is None or opt is None:
        raise Blocked("amp.scale_loss without a loss and an optimizer")
    opts = [e.value for e in opt.elements] if isinstance(opt, (cst.List, cst.Tuple)) else [opt]
    opt_names = [dotted(o) for o in opts]
    if any(n is None for n in opt_names):
        raise Blocked("the optimizer of amp.scale_loss is not a name or attribute")
    # an input's gradient (`x.grad` read, no optimizer steps): autocast only, an unscaled backward
    # (scaled, the input's gradient would keep the scale; there is no step to unscale it)
    input_grad = model.training.input_gradient(call)
    loss_code = m.code(loss)
    bw_args = m.code(bw)[len(m.code(bw.func)):]
    scaled = m.stmt(f"{loss_code}.backward{bw_args}" if input_grad else
                    f"{scaler.scaler_ref(m, call)}.scale({loss_code}).backward{bw_args}")
    # `if args.fp16: <scale_loss> else: loss.backward()` -> one scaled backward
    target: cst.CSTNode = with_node
    flag = None
    guard = model.parent(model.parent(with_node))
    if isinstance(guard, cst.If) and guard.body is model.parent(with_node) and len(guard.body.body) == 1 \
            and isinstance(guard.orelse, cst.Else) and len(guard.orelse.body.body) == 1:
        other = guard.orelse.body.body[0]
        if isinstance(other, cst.SimpleStatementLine) and len(other.body) == 1 \
                and m.code(other.body[0]).replace(" ", "") == f"{loss_code}.backward{bw_args}".replace(" ", ""):
            value = conditions.simplify(m, guard.test)
            if value is False:
                raise Blocked("amp.scale_loss runs only when apex is missing")
            if value is not True:
                flag = m.code(value)
                if flag not in (m.flag, m.caller_flag):
                    raise Blocked(f"amp.scale_loss runs when `{flag}` but amp.initialize when "
                                   f"`{m.flag or 'always'}`: make them the same flag, then migrate")
            target = guard
    if flag is None and m.flag is not None:
        flag = m.flag if model.scope_of(call) is m.init_scope else f"{scaler.scaler_ref(m, call)}.is_enabled()"
    if m.autocast_off:
        flag = "False"
    m.rw.replace(use, target, [scaled])
    forward(m, use, target, loss, flag)
    if input_grad:
        use.description = (f"apex amp.scale_loss for the gradient of `{input_grad}` -> {loss_code}.backward{bw_args} "
                           "unscaled, forward in torch.autocast(\"cuda\") (no optimizer step, no scaler)")
        return
    scaled_steps(m, use, with_node, opt_names)
    m.backwards.append((with_node, opt_names))
    use.description = ("apex amp.scale_loss -> scaler.scale(loss).backward(), forward in torch.autocast(\"cuda\"), "
                       "optimizer.step() -> scaler.step + scaler.update")


def forward(m: "ApexMigration", use: ApexUse, stmt: cst.CSTNode, loss: cst.BaseExpression, flag: Optional[str]) -> None:
    """Wrap the statements the loss depends on (in the first enclosing block that computes it)."""
    model = m.model
    needed = set(reads_writes(loss)[0])
    cur = stmt
    while True:
        block = model.block_of(cur)
        if block is None:
            raise Blocked("the scale_loss block is not a statement of a block")
        stmts = list(block.body)
        idx = next(i for i, s in enumerate(stmts) if s is cur)
        deps: List[int] = []
        need = set(needed)
        need_keys = dotted_reads(loss)  # and the objects: `x.requires_grad = True` belongs to `model(x)`
        for i in range(idx - 1, -1, -1):
            if any(stmts[i] is w or model.is_ancestor(stmts[i], w) for w in m.with_nodes):
                break  # the forward of this loss starts after the previous scaled backward
            if isinstance(stmts[i], (cst.FunctionDef, cst.ClassDef)):
                continue
            reads, writes = reads_writes(stmts[i])
            if writes & need or (deps and overlaps(mutations(stmts[i]), need_keys)):
                deps.append(i)
                need |= reads
                need_keys |= dotted_reads(stmts[i])
        if deps:
            break
        holder = model.parent(block)
        if not isinstance(holder, (cst.If, cst.Else, cst.With, cst.Try)):
            raise Blocked("the loss is not computed in the block of the scale_loss `with` (it comes from another "
                           "function or an outer block): run that forward pass in torch.autocast(\"cuda\") by hand")
        cur = holder if isinstance(holder, (cst.If, cst.With, cst.Try)) else model.parent(holder)
        while isinstance(model.parent(cur), cst.If) and model.parent(cur).orelse is cur:  # elif
            cur = model.parent(cur)
    deps.sort()
    first, last = deps[0], deps[-1]
    if stmts[first] in m.regions:
        return  # another scale_loss of this loss wrapped it already
    if any(stmts[i] in m.regions for i in range(first, last + 1)):
        raise Blocked("the forward passes of two scaled losses overlap: wrap them in torch.autocast by hand")
    m.regions.update(stmts[first:last + 1])
    names = {i: reads_writes(stmts[i]) for i in range(first, last + 1)}
    # objects changed in place (`x.requires_grad = True`) against what reads them (`model(x)`)
    changed = {i: mutations(stmts[i]) for i in range(first, last + 1)}
    seen = {i: dotted_reads(stmts[i]) for i in range(first, last + 1)}
    before: List[cst.BaseStatement] = []
    after: List[cst.BaseStatement] = []
    for i in range(first, last + 1):
        if i in deps:
            continue
        r, w = names[i]
        earlier = [names[j] for j in deps if j < i]
        later = [names[j] for j in deps if j > i]
        if not any(r & ew or w & (er | ew) for er, ew in earlier) and not any(
                overlaps(changed[i], seen[j]) or overlaps(changed[j], seen[i]) for j in deps if j < i):
            before.append(stmts[i])
        elif not any(w & (lr | lw) or r & lw for lr, lw in later) and not any(
                overlaps(changed[i], seen[j]) or overlaps(changed[j], seen[i]) for j in deps if j > i):
            after.append(stmts[i])
        else:
            raise Blocked(f"line {m.line(stmts[i])} is interleaved with the forward pass: wrap the forward "
                           "in torch.autocast(\"cuda\") by hand")
    inside = stmts[first:last + 1]
    if any(model.is_ancestor(st, u.call) or st is model.statement_of(u.call) for st in inside for u in m.uses) \
            or any(isinstance(n, cst.Name) and n.value in m.avail | m.none_names
                   for st in inside for n in conditions.read_names(st)):
        raise Blocked("the forward pass of the scaled loss holds other apex code: migrate by hand")
    # every statement keeps its own comment lines (the first one's blank lines go to what
    # now comes first); the statements moved from later lines are dropped there, not removed
    # with their comments handed on (they come back here with them)
    body = [stmts[i] for i in deps]
    lead = stmts[first].leading_lines
    body[0] = body[0].with_changes(leading_lines=())
    enabled = f", enabled={flag}" if flag else ""
    region = cst.With(items=[cst.WithItem(item=cst.parse_expression(
        f"{m.torch}.autocast({m.q}cuda{m.q}{enabled})"))], body=cst.IndentedBlock(body=body))
    seq: List[cst.BaseStatement] = [*before, region, *after]
    own = [] if seq[0] is region else list(seq[0].leading_lines)
    while own and own[0].comment is None:
        own.pop(0)  # its blank lines: `lead` has the first statement's
    seq[0] = seq[0].with_changes(leading_lines=[*lead, *own])
    m.rw.add(use, stmts[first], lambda cur, seq=seq: seq)
    for i in range(first + 1, last + 1):
        m.rw.add(use, stmts[i], lambda cur: [])


def scaled_steps(m: "ApexMigration", use: ApexUse, with_node: cst.With, opt_names: List[str]) -> None:
    model = m.model
    loop = model.loop_of(with_node)
    scope = model.scope_of(with_node)
    for opt_name in opt_names:
        found = []
        for c in model.calls:
            if not (isinstance(c.func, cst.Attribute) and c.func.attr.value == "step"
                    and dotted(c.func.value) == opt_name and model.scope_of(c) is scope
                    and model.before(with_node, c)):
                continue
            if loop is not None and not model.is_ancestor(loop, c) or model.exclusive(with_node, c):
                continue  # another iteration's, or the step of the `else:` without apex
            found.append(c)
        key = (id(loop or scope), opt_name)
        if not found:  # a micro-batch of gradient accumulation, when another scale_loss steps it
            m.stepless.append((use, key))
        else:
            m.stepped.add(key)
        for c in found:
            stmt = model.statement_of(c)
            if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
                    and isinstance(stmt.body[0], cst.Expr) and stmt.body[0].value is c) or c.args:
                raise Blocked(f"`{opt_name}.step(...)` on line {m.line(c)} is not a plain statement")
            if stmt not in m.steps:
                m.steps[stmt] = opt_name
                ref = scaler.scaler_ref(m, c)
                m.rw.add(use, stmt, lambda cur, r=ref, o=opt_name: cur.with_changes(
                    body=[m.stmt(f"{r}.step({o})").body[0]]))


def updates(m: "ApexMigration") -> None:
    """One scaler.update() per iteration: after the last step of each block that steps."""
    by_loop: Dict[int, List[cst.CSTNode]] = {}
    model = m.model
    for stmt in m.steps:
        key = model.loop_of(stmt) or model.scope_of(stmt)
        by_loop.setdefault(id(key), []).append(stmt)
    for stmts in by_loop.values():
        blocks = {id(model.block_of(s)) for s in stmts}
        if len(blocks) > 1 and all(model.exclusive(a, b) for i, a in enumerate(stmts) for b in stmts[i + 1:]):
            # `if fp16: ...; opt.step()` / `else: ...; opt.step()`: one of them runs per iteration
            for stmt in stmts:
                use = next(o for o, _ in m.rw.edits[stmt])
                m.rw.insert_after(use, stmt, [m.stmt(f"{scaler.scaler_ref(m, stmt)}.update()")])
            continue
        if len(blocks) > 1:
            raise Blocked(f"the optimizer steps on lines {', '.join(str(m.line(s)) for s in stmts)} are in "
                           "different blocks: call scaler.update() once per iteration after the last, by hand")
        last = max(stmts, key=lambda s: model._index.order_of(s))
        use = next(u for u in m.uses if any(last in m.rw.edits and o is u for o, _ in m.rw.edits[last]))
        m.rw.insert_after(use, last, [m.stmt(f"{scaler.scaler_ref(m, last)}.update()")])


def master_params(m: "ApexMigration", use: ApexUse) -> None:
    model, call = m.model, use.call
    if len(call.args) != 1 or call.args[0].keyword is not None or call.args[0].star:
        raise Blocked("amp.master_params is not called with one optimizer")
    opt = m.code(call.args[0].value)
    params = cst.parse_expression(f"[p for group in {opt}.param_groups for p in group[{m.q}params{m.q}]]")
    stmt = model.statement_of(call)
    if stmt is None or model.block_of(stmt) is None:
        raise Blocked("amp.master_params is not in a statement of a block")
    if any(o is not use and o.kind == "master_params" and model.statement_of(o.call) is stmt for o in m.uses):
        raise Blocked("amp.master_params twice in one statement")
    m.rw.add(use, call, lambda cur, p=params: p)
    unscale_before(m, use, call, opt)
    use.description = "apex amp.master_params -> the optimizer's params after scaler.unscale_"


def unscale_before(m: "ApexMigration", use: ApexUse, node: cst.CSTNode, opt: str) -> None:
    """Gradients read between a scaled backward of `opt` and its step (clipping): apex had
    unscaled them when scale_loss exited; native AMP needs `scaler.unscale_(opt)` first, once
    per iteration, before the `if` whose branches both read them (`if fp16: ... else: ...`)."""
    model = m.model
    steps = [st for st, o in m.steps.items() if o == opt and model.before(node, st)]
    if not steps or not any(opt in names and model.before(w, node) for w, names in m.backwards):
        return
    stmt = model.statement_of(node)
    step_block = model.block_of(steps[0])
    cur = stmt
    for anc in model.ancestors(stmt):
        if anc is step_block or isinstance(anc, (cst.FunctionDef, cst.ClassDef, cst.For, cst.While)):
            break
        if isinstance(anc, cst.If) and anc.orelse is not None:
            cur = anc
    while isinstance(model.parent(cur), cst.If) and model.parent(cur).orelse is cur:  # an elif
        cur = model.parent(cur)
    key = (opt, id(model.loop_of(stmt) or model.scope_of(stmt)))
    done = getattr(m, "_unscaled", set())
    if key in done:
        return
    done.add(key)
    m._unscaled = done
    if model.block_of(cur) is None:
        raise Blocked(f"the gradients read on line {m.line(node)} need scaler.unscale_ first: add it by hand")
    m.rw.insert_before(use, cur, [m.stmt(f"{scaler.scaler_ref(m, node)}.unscale_({opt})")])


def clips(m: "ApexMigration") -> None:
    """Clipping the model's parameters after a scaled backward (apex unscaled them on exit)."""
    model = m.model
    for with_node, names in m.backwards:
        if len(names) != 1:
            continue
        for call in model.calls:
            if model.is_api(call, "clip_grad") and model.scope_of(call) is model.scope_of(with_node) \
                    and model.before(with_node, call):
                owner = next(u for u in m.uses if u.kind == "scale_loss"
                             and model.parent(model.parent(u.call)) is with_node)
                unscale_before(m, owner, call, names[0])
