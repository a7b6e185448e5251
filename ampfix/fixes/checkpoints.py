"""Edits of a resume: a GradScaler's state restored from the checkpoint an optimizer's is
restored from (AMP013's load-side fix); and why a checkpoint or resume cannot name the
GradScaler a fix would save or restore."""

from __future__ import annotations

from typing import List, Optional, Tuple

import libcst as cst

from ampfix.fixes.edits import Replacements, guard_test, in_block, insert_where_bound


def scaler_restore(model, call: cst.Call, scaler: str, key: str) -> Tuple[Optional[Replacements], Optional[str]]:
    """`if "<key>" in ckpt and ckpt["<key>"]: <scaler>.load_state_dict(ckpt["<key>"])` after
    the optimizer's restore `call` (`optimizer.load_state_dict(ckpt[...])`, a statement of its
    own), so a checkpoint saved without the scaler, or by a disabled one (`{}`), still loads; or,
    where `scaler` is not assigned yet there, after it is assigned later in the same function,
    under the tests the restore runs under; never where the scaler may be unassigned or None.
    Returns (edit, None) or (None, why not)."""
    arg = call.args[0].value
    stmt = model.statement_of(call)
    if not isinstance(arg, cst.Subscript) or not isinstance(stmt, cst.SimpleStatementLine) \
            or not in_block(model, stmt):
        return None, "the optimizer is not restored from `checkpoint[key]` in a statement of its own"
    ckpt = model.code(arg.value)
    q = model.quote()
    # a checkpoint a disabled scaler saved holds `{}`, which an enabled one refuses (RuntimeError
    # "The source state dict is empty"): restored only when the entry is there and not empty
    has = f"{q}{key}{q} in {ckpt} and {ckpt}[{q}{key}{q}]"
    restore = f"{scaler}.load_state_dict({ckpt}[{q}{key}{q}])"
    indent = model.module.default_indent
    code = f"if {has}:\n{indent}{restore}"
    edit, problem, _ = insert_where_bound(model, stmt, code, after=True)
    if edit is not None:
        return edit, None
    # after the scaler is created, later in the same function, under the resume's own test
    for place in model.bound.later_assignments(scaler, stmt):
        tests = model.bound.branch_tests(stmt, place)
        if tests is None:
            continue
        moved = f"if {guard_test(model, tests)} and {has}:\n{indent}{restore}" if tests else code
        edit, _, _ = insert_where_bound(model, place, moved, after=True)
        if edit is not None:
            return edit, None
    return None, f"{problem}, so restoring the scaler there would raise"


def scaler_parameter(model, node: cst.CSTNode) -> Optional[str]:
    """The one parameter of the function around `node` that the file takes for a GradScaler
    (`model.scalers`: a caller of the file passes one, it is annotated as one, or used as one),
    if there is exactly one."""
    func = model.function_of(node)
    if not isinstance(func, cst.FunctionDef):
        return None
    p = func.params
    names = [x.name.value for x in (*p.posonly_params, *p.params, *p.kwonly_params) if x.name.value in model.scalers]
    return names[0] if len(names) == 1 else None


def unnamed_scaler(model, node: cst.CSTNode, scalers: List[str], restore: bool = False) -> str:
    """Why no GradScaler is named for the fix at `node` (a checkpoint, or with `restore` a resume)
    when `scalers` (those reachable there that may be enabled, `checkpoints.scalers_at`) is not
    one: several; a parameter, whose value its callers choose (`scaler_parameter`: the fix does
    not save a parameter's state, which may be None on a run without AMP); or none."""
    if scalers:
        return "several GradScalers are reachable here"
    param = scaler_parameter(model, node)
    if param is None:
        return "no GradScaler is reachable here"
    call, verb = ("load_state_dict(...)", "restore it") if restore else ("state_dict()", "save its state")
    return (f"the GradScaler here is the parameter `{param}`, which a caller may pass as None (`{param}.{call}` "
            f"would raise); {verb} by hand, where it is not None")


def helper_writes_checkpoint(model, save: cst.Call, qual: str, scalers: List[str]) -> str:
    """Why a checkpoint written by `qual`, a function of another module that `save` calls, is
    not fixed here: the call hands it no GradScaler (the fix would change its signature and
    every caller), or it is handed one (or `*args`) and leaves it out."""
    if any(a.star or model.is_scaler(a.value) for a in save.args):
        return f"the checkpoint is written by `{qual}` in another module; save the scaler there"
    name = scalers[0] if len(scalers) == 1 else scaler_parameter(model, save)
    scaler = f"`{name}`" if name else "the GradScaler"
    return (f"the checkpoint is written by `{qual}` in another module and this call hands it no GradScaler: pass it "
            f"{scaler} and save its state there")
