"""Programmatic entry points (used by the verifier and by tests)."""

from __future__ import annotations

from typing import List, Optional, Sequence

from ampfix.config import DEFAULT_MIN_TORCH
from ampfix.engine import Diagnostic, InputError, Settings, check_text, fix_text
from ampfix.registry import select_rules


class AmpfixError(Exception):
    """The source could not be analysed (syntax error, ...)."""


def _rules(select: Optional[Sequence[str]], ignore: Sequence[str]):
    return select_rules(list(select) if select is not None else None, list(ignore))


def check_source(
    source: str,
    path: str = "<string>",
    select: Optional[Sequence[str]] = None,
    ignore: Sequence[str] = (),
    min_torch_version=DEFAULT_MIN_TORCH,
) -> List[Diagnostic]:
    try:
        diags, _ = check_text(source, path, _rules(select, ignore), Settings(min_torch_version=min_torch_version))
    except InputError as exc:
        raise AmpfixError(str(exc.error)) from None
    return diags


def fix_source(
    source: str,
    path: str = "<string>",
    unsafe: bool = False,
    select: Optional[Sequence[str]] = None,
    ignore: Sequence[str] = (),
    min_torch_version=DEFAULT_MIN_TORCH,
) -> str:
    """`source` with ampfix's fixes applied (safe ones; unsafe ones too when `unsafe`)."""
    settings = Settings(min_torch_version=min_torch_version, unsafe_fixes=unsafe)
    try:
        text, _, _ = fix_text(source, path, _rules(select, ignore), settings)
    except InputError as exc:
        raise AmpfixError(str(exc.error)) from None
    return text
