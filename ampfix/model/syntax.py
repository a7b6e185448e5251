"""Small pure helpers over LibCST nodes (no model needed)."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ampfix.model.tree import dotted

__all__ = ["call_name", "dotted", "get_arg", "literal_bool", "literal_string", "is_expression_statement_of",
           "receiver", "method_call"]


def call_name(call: cst.CSTNode) -> Optional[str]:
    """For `x.y.method(...)` the method name, for `f(...)` the function name."""
    if type(call) is cst.Call:  # (no `isinstance`: it goes through ABCMeta, and this is asked very often)
        func = call.func  # type: ignore[attr-defined]
        if type(func) is cst.Attribute:
            return func.attr.value
        if type(func) is cst.Name:
            return func.value
    return None


def receiver(call: cst.CSTNode) -> Optional[cst.BaseExpression]:
    """For `x.method(...)` the expression `x`."""
    if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute):
        return call.func.value
    return None


def method_call(node: cst.CSTNode, *methods: str) -> Optional[cst.BaseExpression]:
    """The receiver when `node` is `receiver.<one of methods>(...)`, else None."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in methods:
        return node.func.value
    return None


def get_arg(call: cst.Call, position: Optional[int], keyword: Optional[str]) -> Optional[cst.Arg]:
    """The argument passed at `position` or as `keyword=`; None when absent or when a `*args`
    before that position makes it unknowable."""
    pos = 0
    for arg in call.args:
        if arg.keyword is not None:
            if keyword is not None and arg.keyword.value == keyword:
                return arg
            continue
        if arg.star:
            if arg.star == "*" and position is not None and pos <= position:
                return None
            continue
        if position is not None and pos == position:
            return arg
        pos += 1
    return None


def literal_string(node: Optional[cst.CSTNode]) -> Optional[str]:
    if isinstance(node, cst.SimpleString):
        text = node.value
        # a plain quoted string (no prefix, no escape, one quote character each side): its
        # text, without LibCST's `ast.literal_eval` of it (most of the strings a model reads)
        if len(text) >= 2 and text[0] in "'\"" and text[-1] == text[0] and "\\" not in text \
                and not text.startswith(text[0] * 3):
            return text[1:-1]
        try:
            value = node.evaluated_value
        except Exception:  # pragma: no cover - defensive
            return None
        return value if isinstance(value, str) else None
    if isinstance(node, cst.ConcatenatedString):
        left, right = literal_string(node.left), literal_string(node.right)
        return None if left is None or right is None else left + right
    return None


def literal_bool(node: Optional[cst.CSTNode]) -> Optional[bool]:
    if isinstance(node, cst.Name) and node.value in ("True", "False"):
        return node.value == "True"
    return None


def is_expression_statement_of(stmt: cst.CSTNode, call: cst.Call) -> bool:
    """True when `stmt` is a one-statement line whose only statement is `call` (maybe assigned)."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return False
    small = stmt.body[0]
    if isinstance(small, cst.Expr):
        return small.value is call
    if isinstance(small, (cst.Assign, cst.AnnAssign)):
        return small.value is call
    return False
