"""`amp.initialize` becomes one `torch.amp.GradScaler`, created where it ran: as a local, a `self.`
attribute, a module-level name, or one more value returned to the one caller; and how the other
uses name that scaler (`scaler_ref`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional

import libcst as cst

from ampfix.model import get_arg, literal_bool, literal_string, reads_writes
from ampfix.migrations.apex import conditions
from ampfix.migrations.apex.common import INIT_KW, ApexUse, Blocked

if TYPE_CHECKING:
    from ampfix.migrations.apex.plan import ApexMigration


def initialize(m: "ApexMigration", use: ApexUse) -> None:
    model, call = m.model, use.call
    stmt = model.statement_of(call)
    small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
    if isinstance(small, cst.Assign) and small.value is call and len(small.targets) == 1:
        targets: Optional[str] = m.code(small.targets[0].target)
    elif isinstance(small, cst.Expr) and small.value is call:
        targets = None
    else:
        raise Blocked("amp.initialize is not a plain `model, optimizer = amp.initialize(...)` statement")
    if model.loop_of(stmt) is not None:
        raise Blocked("amp.initialize runs in a loop")
    if any(a.star for a in call.args):
        raise Blocked("amp.initialize(*args/**kwargs)")
    unknown = [a.keyword.value for a in call.args if a.keyword is not None and a.keyword.value not in INIT_KW]
    if unknown:
        raise Blocked(f"amp.initialize option {unknown[0]}= is unknown")
    kw = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    positional = [a.value for a in call.args if a.keyword is None]
    sources = positional[:2] + [kw[k] for k in ("models", "optimizers") if k in kw]
    if len(sources) < 2:
        raise Blocked("amp.initialize without an optimizer (inference): run the forward pass in "
                       "torch.autocast by hand")
    level_node = kw.get("opt_level")
    level = "O1" if level_node is None else literal_string(level_node)
    notes = []
    if level is None and level_node is not None and not isinstance(level_node, cst.Attribute):
        values = {literal_string(v) for v in model.possible_values(level_node)}
        func = model.function_of(call)
        params = func.params if func is not None else None
        for p in [*params.params, *params.kwonly_params] if params is not None else []:
            if isinstance(level_node, cst.Name) and p.name.value == level_node.value and p.default is not None:
                values.add(literal_string(p.default))  # the default, for the calls that leave it out
        if values and values <= {"O1", "O2"}:  # every value it gets in this file
            level = max(values)
            notes.append(f"opt_level `{m.code(level_node)}` is {' or '.join(sorted(values))} in this file")
    if level is None and level_node is not None:
        level = argparse_default(m, level_node)
        if level in ("O1", "O2"):
            notes.append(f"opt_level `{m.code(level_node)}` taken as its argparse default {level}; "
                         "native AMP has no O3")
        else:
            level = None
    if level is None:
        raise Blocked(f"opt_level is `{m.code(level_node)}`, not a literal: O1/O2 migrate to autocast + "
                       "GradScaler, O0 to plain fp32, O3 (pure fp16) has no native equivalent; write the level")
    if level == "O3":
        raise Blocked("opt_level O3 is pure fp16 training (fp16 model, no fp32 master weights); native AMP keeps "
                       "an fp32 model and autocasts: remove the .half() casts, then use torch.autocast + "
                       "GradScaler by hand")
    if level not in ("O0", "O1", "O2"):
        raise Blocked(f"opt_level {level!r} is not one of apex's O0-O3")
    if literal_bool(kw.get("master_weights")) is False and level == "O2":
        raise Blocked("O2 with master_weights=False steps fp16 weights without an fp32 copy (like O3): no "
                       "native equivalent")
    cast = kw.get("cast_model_type")
    if cast is not None and literal_bool(cast) is not False and not model.is_api(cast, "dtype.float32"):
        if not model.is_api(cast, "dtype.float16") or level == "O0":
            raise Blocked(f"cast_model_type={m.code(cast)} has no native equivalent here")
        if level == "O1" and literal_bool(kw.get("master_weights")) is not True:
            raise Blocked("O1 with cast_model_type=torch.float16 and no master weights trains pure fp16 "
                           "weights (like O3): no native equivalent")
        notes.append("cast_model_type (fp16 model) dropped: parameters stay fp32")
    for name in ("min_loss_scale", "max_loss_scale", "cast_model_outputs"):
        if name in kw and m.code(kw[name]) != "None":
            raise Blocked(f"amp.initialize {name}= has no GradScaler equivalent")
    if "patch_torch_functions" in kw and literal_bool(kw["patch_torch_functions"]) is False and level == "O1":
        raise Blocked("O1 with patch_torch_functions=False has no native equivalent")
    keep_bn = kw.get("keep_batchnorm_fp32")
    if literal_bool(keep_bn) is False or literal_string(keep_bn) == "False":
        notes.append("keep_batchnorm_fp32=False dropped: BatchNorm parameters stay fp32")
    scaler_args = [f"{m.q}cuda{m.q}"]
    scale = kw.get("loss_scale")
    if scale is not None and literal_string(scale) != "dynamic" and level != "O0":
        init = m.code(scale)
        if isinstance(scale, cst.IfExp) and "dynamic" in (literal_string(scale.body), literal_string(scale.orelse)):
            # `"dynamic" if args.loss_scale == 0 else args.loss_scale`: apex's dynamic scale starts at 2**16
            other = scale.orelse if literal_string(scale.body) == "dynamic" else scale.body
            if isinstance(other, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)):
                raise Blocked(f"loss_scale is `{init}`, neither \"dynamic\" nor a number")
            init = m.code(scale.with_changes(
                body=cst.Float("65536.0") if literal_string(scale.body) == "dynamic" else scale.body,
                orelse=cst.Float("65536.0") if literal_string(scale.orelse) == "dynamic" else scale.orelse))
        elif not isinstance(scale, (cst.Integer, cst.Float)):
            raise Blocked(f"loss_scale is `{init}`, neither \"dynamic\" nor a number")
        scaler_args.append(f"init_scale={init}")
        notes.append(f"static loss_scale {m.code(scale)} -> init_scale (native scaling is dynamic)")
    # the condition amp.initialize runs under becomes enabled=
    conds: List[cst.BaseExpression] = []
    anchor: cst.CSTNode = stmt
    child: cst.CSTNode = stmt
    for anc in model.ancestors(stmt):
        if isinstance(anc, (cst.FunctionDef, cst.ClassDef, cst.Module)):
            break
        if isinstance(anc, cst.If) and m.code(anc.test).replace("'", '"') == '__name__ == "__main__"':
            break  # the script's main block: the scaler is created in it
        if isinstance(anc, cst.If):
            if child is not anc.body:
                raise Blocked("amp.initialize is in an `else`/`elif` branch (native AMP chosen by another "
                               "branch?): migrate by hand")
            value = conditions.simplify(m, anc.test)
            if value is False:
                raise Blocked("amp.initialize is in an `if` that native AMP never runs")
            if value is not True:
                conds.insert(0, value)
            anchor = anc
        elif isinstance(anc, (cst.Try, cst.With)):
            anchor = anc
        elif not isinstance(anc, (cst.IndentedBlock, cst.SimpleStatementLine)):
            break
        child = anc
    if anchor is not stmt:
        written = reads_writes(anchor)[1]
        needed = set().union(*(reads_writes(c)[0] for c in conds)) if conds else set()
        if written & needed:
            raise Blocked(f"the condition amp.initialize runs under reads `{sorted(written & needed)[0]}`, set in "
                           f"the `if` that holds it (line {m.line(anchor)}): migrate by hand")
    texts = [m.code(c) for c in conds]
    if len(texts) > 1:
        texts = [f"({t})" if isinstance(c, cst.BooleanOperation) else t for c, t in zip(conds, texts)]
    conds = texts  # type: ignore[assignment]
    if level == "O0":
        conds = ["False"]
        notes.insert(0, "O0 is fp32: autocast and GradScaler disabled")
    enabled = kw.get("enabled")
    if enabled is not None and literal_bool(enabled) is not True:
        conds.append(m.code(enabled) if literal_bool(enabled) is None else "False")
    m.flag = " and ".join(conds) if conds else None
    if m.flag:
        scaler_args.append(f"enabled={m.flag}")
    # where the scaler lives
    m.init_scope = model.scope_of(call)
    m.anchor = anchor
    others = [u for u in m.uses if u is not use]
    func = model.function_of(call)
    cls = model.class_of(func) if func is not None else None
    name = model.free_name(("scaler", "grad_scaler", "amp_scaler", "native_scaler"))
    if name is None:
        raise Blocked("no free name for the scaler")
    m.scaler_name = name
    m.self_name: Optional[str] = None
    if func is None:
        m.placement = "module"
    elif all(model.function_of(u.call) is func for u in others):
        m.placement = "local"
    elif cls is not None and func.params.params and all(
            method_self(m, u.call, cls) is not None for u in others):
        m.placement = "m"
        m.self_name = func.params.params[0].name.value
    elif returned(m, func, others):
        m.placement = "returned"
    else:
        # no `global` is injected: a module global set inside one function and read in
        # another is unassigned wherever that function has not run yet
        where = func.name.value
        raise Blocked(f"the scaler would have to be a module global assigned inside `{where}` and used in other "
                       f"functions: create it where all of them can reach it (at module level, or return it from "
                       f"`{where}`), then migrate")
    ref = scaler_ref(m, call)
    create = m.stmt(f"{ref} = {m.torch}.amp.GradScaler({', '.join(scaler_args)})")
    new = [create]
    keep = None
    if targets is not None and not isinstance(small.targets[0].target, (cst.Tuple, cst.List)):
        raise Blocked("the result of amp.initialize is kept whole (apex returns the model alone when the "
                       "optimizer is None): unpack it as `model, optimizer = ...`, then migrate")
    if targets is not None and sources:
        src = ", ".join(m.code(s) for s in sources)
        if targets.replace(" ", "") != src.replace(" ", ""):
            keep = m.stmt(f"{targets} = {src}")
    if anchor is stmt:
        m.rw.replace(use, stmt, [*([keep] if keep else []), *new])
    else:
        if keep is not None:
            m.rw.replace(use, stmt, [keep])
        else:
            m.rw.remove(use, stmt)
        m.rw.insert_before(use, anchor, new)
        for anc in model.ancestors(stmt):
            if anc is anchor:
                break
            if isinstance(anc, cst.If):
                m.rw.add(use, anc, conditions.prune_if(m, anc))
        if isinstance(anchor, cst.If):
            m.rw.add(use, anchor, conditions.prune_if(m, anchor))
            # the edit above runs after insert_before's: keep the order prune -> insert
            m.rw.edits[anchor].reverse()
    what = {"O0": "apex amp.initialize O0 (fp32) -> a disabled torch.amp.GradScaler",
            "O1": f'apex amp.initialize -> torch.amp.GradScaler({m.q}cuda{m.q}), created once',
            "O2": f'apex amp.initialize O2 -> torch.amp.GradScaler({m.q}cuda{m.q}) and autocast, '
                  "with fp32 parameters (no fp16 model copy)"}[level]
    use.description = what + (f" ({'; '.join(notes)})" if notes else "")
    m.autocast_off = level == "O0"


def argparse_default(m: "ApexMigration", node: cst.CSTNode) -> Optional[str]:
    """`args.opt_level` -> the literal default of its `add_argument` (one in the file), if any."""
    if not isinstance(node, cst.Attribute):
        return None
    dest = node.attr.value
    found = []
    for call in m.model.calls:
        if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "add_argument"):
            continue
        flags = [literal_string(a.value) for a in call.args if a.keyword is None]
        dest_arg = get_arg(call, None, "dest")
        names = {literal_string(dest_arg.value)} if dest_arg is not None else \
            {f.lstrip("-").replace("-", "_") for f in flags if f and f.startswith("--")}
        if dest in names:
            default = get_arg(call, None, "default")
            found.append(literal_string(default.value) if default is not None else None)
    return found[0] if len(found) == 1 else None


def returned(m: "ApexMigration", func: cst.FunctionDef, others: List[ApexUse]) -> bool:
    """The function that calls amp.initialize returns the model/optimizer to one caller,
    `a, b = setup(...)`, which holds every other use: it returns the scaler too."""
    model = m.model
    if model.class_of(func) is not None or not isinstance(func.body, cst.IndentedBlock):
        return False
    last = func.body.body[-1]
    ret = last.body[0] if isinstance(last, cst.SimpleStatementLine) and len(last.body) == 1 else None
    if not isinstance(ret, cst.Return) or ret.value is None:
        return False
    returns = [n for n in model.nodes_of(cst.Return) if model.function_of(n) is func]
    calls = [c for c in model.calls if func in model.callees(c)]
    if returns != [ret] or len(calls) != 1:
        return False
    caller = calls[0]
    line = model.statement_of(caller)
    assign = line.body[0] if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else None
    if not (isinstance(assign, cst.Assign) and assign.value is caller and len(assign.targets) == 1):
        return False
    target = assign.targets[0].target
    value = ret.value
    if isinstance(value, cst.Tuple) != isinstance(target, (cst.Tuple, cst.List)):
        return False
    if not all(model.scope_of(u.call) is model.scope_of(caller) and model.before(caller, u.call) for u in others):
        return False

    def extend(node):
        items = [m.code(e.value) for e in node.elements] if isinstance(node, (cst.Tuple, cst.List)) \
            else [m.code(node)]
        return ", ".join([*items, m.scaler_name])
    m.rw.add(m.init, ret, lambda cur: cur.with_changes(value=cst.parse_expression(extend(value))))
    m.rw.add(m.init, assign, lambda cur: cur.with_changes(
        targets=[cst.AssignTarget(target=cst.parse_expression(extend(target)))]))
    m.caller_scope, m.caller = model.scope_of(caller), caller
    bound = model.bind_arguments(caller, func)
    if m.flag in bound:  # `if use_fp16:` in the helper is `args.fp16` at its caller
        m.caller_flag = m.code(bound[m.flag])
    return True


def method_self(m: "ApexMigration", node: cst.CSTNode, cls: cst.ClassDef) -> Optional[str]:
    func = m.model.function_of(node)
    while func is not None and m.model.class_of(func) is None:
        func = m.model.function_of(func)
    if func is None or m.model.class_of(func) is not cls or not func.params.params:
        return None
    return func.params.params[0].name.value


def scaler_ref(m: "ApexMigration", node: cst.CSTNode) -> str:
    """How code at `node` reaches the scaler (raises when it cannot)."""
    model = m.model
    if m.placement == "m":
        owner = method_self(m, node, model.class_of(model.function_of(m.init.call)))
        if owner is None:
            raise Blocked("the scaler (a `m.` attribute of the class that calls amp.initialize) is not "
                           "visible here")
        return f"{owner}.{m.scaler_name}"
    scope = model.scope_of(node)
    if scope is m.init_scope:
        if node is not m.init.call and not model.before(m.anchor, node):
            raise Blocked("this runs before amp.initialize")
        return m.scaler_name
    if m.placement == "module" and model.function_of(node) is not None:
        return m.scaler_name
    if m.placement == "returned" and scope is m.caller_scope and model.before(m.caller, node):
        return m.scaler_name
    raise Blocked(f"the scaler created in place of amp.initialize (line {m.line(m.init.call)}) is not "
                   "visible here")
