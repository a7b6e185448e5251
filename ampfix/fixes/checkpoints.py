"""Edits of a resume: a GradScaler's state restored from the checkpoint an optimizer's is
restored from (AMP013's load-side fix)."""

from __future__ import annotations

from typing import Optional, Tuple

import libcst as cst

from ampfix.fixes.edits import Replacements, guard_test, in_block, insert_where_bound


def scaler_restore(model, call: cst.Call, scaler: str, key: str) -> Tuple[Optional[Replacements], Optional[str]]:
    """`if "<key>" in ckpt: <scaler>.load_state_dict(ckpt["<key>"])` after the optimizer's
    restore `call` (`optimizer.load_state_dict(ckpt[...])`, a statement of its own), so a
    checkpoint saved without the scaler still loads; or, where `scaler` is not assigned yet
    there, after it is assigned later in the same function, under the tests the restore runs
    under; never where the scaler may be unassigned or None. Returns (edit, None) or (None,
    why not)."""
    arg = call.args[0].value
    stmt = model.statement_of(call)
    if not isinstance(arg, cst.Subscript) or not isinstance(stmt, cst.SimpleStatementLine) \
            or not in_block(model, stmt):
        return None, "the optimizer is not restored from `checkpoint[key]` in a statement of its own"
    ckpt = model.code(arg.value)
    q = model.quote()
    has = f"{q}{key}{q} in {ckpt}"
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
