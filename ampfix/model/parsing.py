"""LibCST's parser, without checking again what it builds.

Every LibCST node checks its own invariants when it is made: `CSTNode.__post_init__` calls
`_validate` (a name is not empty, whitespace holds no line break, brackets pair up, ...). For
the nodes the parser makes that check finds nothing, since the grammar they come from already
holds those invariants, yet it costs about a tenth of a parse (bench/SPEED.md, sixth session;
LibCST's own comment on `__post_init__` says as much). `parse_module` here makes the parser's
nodes without it: while it parses, on its thread, `__post_init__` leaves `_validate` out. A node
made anywhere else (a fix's new code, a parse on another thread, LibCST's own `parse_module`) is
checked as before. `parse_expression` and `parse_statement` alike (the model parses the values
that other modules' summaries hold, a few thousand on a large project).

Installed only where LibCST's `__post_init__` does nothing but call `_validate` and no node
class has its own; otherwise `parse_module` is LibCST's. `tests/test_parsing.py` holds the
trees to be the same as LibCST's, and the errors too.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional, Set, TypeVar

import libcst as cst
from libcst._nodes.base import CSTNode

T = TypeVar("T")
_LIBCST_POST_INIT = CSTNode.__post_init__
_PARSING: Set[int] = set()  # the threads inside one of the parse functions below now


def _post_init(self: CSTNode, _parsing: Set[int] = _PARSING, _thread: "object" = threading.get_ident) -> None:
    if _thread() not in _parsing:  # type: ignore[operator]
        self._validate()


def _can_install() -> bool:
    """LibCST's `__post_init__` only validates, and no node class overrides it."""
    code = getattr(_LIBCST_POST_INIT, "__code__", None)
    if code is None or code.co_names != ("_validate",):
        return False
    todo = [CSTNode]
    while todo:
        for sub in todo.pop().__subclasses__():
            if "__post_init__" in sub.__dict__:
                return False
            todo.append(sub)
    return True


INSTALLED = _can_install()
if INSTALLED:
    CSTNode.__post_init__ = _post_init  # type: ignore[method-assign]


def parse_module(text: str, config: Optional[cst.PartialParserConfig] = None) -> cst.Module:
    """`libcst.parse_module(text, config)`: the same tree, or the same error."""
    return _unchecked(cst.parse_module, text, config)


def parse_expression(text: str) -> cst.BaseExpression:
    """`libcst.parse_expression(text)`: the same tree, or the same error."""
    return _unchecked(cst.parse_expression, text, None)


def parse_statement(text: str, config: Optional[cst.PartialParserConfig] = None) -> cst.BaseStatement:
    """`libcst.parse_statement(text, config)`: the same tree, or the same error."""
    return _unchecked(cst.parse_statement, text, config)


def _unchecked(parse: Callable[..., T], text: str, config: Optional[cst.PartialParserConfig]) -> T:
    me = threading.get_ident()
    if not INSTALLED or me in _PARSING:
        return parse(text) if config is None else parse(text, config)
    _PARSING.add(me)
    try:
        return parse(text) if config is None else parse(text, config)
    finally:
        _PARSING.discard(me)
