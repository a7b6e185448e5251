"""Programmatic entry points (used by the verifier, editors and tests).

`check_source` / `fix_source` work on a string; `check_paths` runs what `ampfix check` runs
(configuration, discovery, rules) and returns the results instead of printing them.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from ampfix.engine import runner
from ampfix.knowledge.torch_versions import DEFAULT_MIN_TORCH
from ampfix.engine.analyze import Diagnostic, InputError, Settings, check_text, fix_text
from ampfix.engine.registry import select_rules


class AmpfixError(Exception):
    """The source could not be analysed (syntax error, ...)."""


def _rules(select: Optional[Sequence[str]], ignore: Sequence[str], preview: bool = False):
    return select_rules(list(select) if select is not None else None, list(ignore), preview)


def check_source(
    source: str,
    path: str = "<string>",
    select: Optional[Sequence[str]] = None,
    ignore: Sequence[str] = (),
    min_torch_version=DEFAULT_MIN_TORCH,
    preview: bool = False,
) -> List[Diagnostic]:
    try:
        diags, _ = check_text(source, path, _rules(select, ignore, preview), Settings(min_torch_version=min_torch_version))
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
    preview: bool = False,
) -> str:
    """`source` with ampfix's fixes applied (safe ones; unsafe ones too when `unsafe`)."""
    settings = Settings(min_torch_version=min_torch_version, unsafe_fixes=unsafe)
    try:
        text, _, _ = fix_text(source, path, _rules(select, ignore, preview), settings)
    except InputError as exc:
        raise AmpfixError(str(exc.error)) from None
    return text


def fix_source_report(
    source: str,
    path: str = "<string>",
    unsafe: bool = False,
    select: Optional[Sequence[str]] = None,
    ignore: Sequence[str] = (),
    min_torch_version=DEFAULT_MIN_TORCH,
    preview: bool = False,
) -> Tuple[str, List[Diagnostic], Dict[str, int]]:
    """`fix_source`, with what was fixed: (fixed source, the findings of `source` as `check`
    reports them, {"CODE: what the fix did": times applied}); `preview`: the preview rules too."""
    rules = _rules(select, ignore, preview)
    settings = Settings(min_torch_version=min_torch_version, unsafe_fixes=unsafe)
    try:
        before, _ = check_text(source, path, rules, settings)
        text, fixed, _ = fix_text(source, path, rules, settings)
    except InputError as exc:
        raise AmpfixError(str(exc.error)) from None
    return text, before, fixed


def check_paths(paths: Sequence[str], **options) -> runner.Run:
    """Check files and folders as `ampfix check PATHS` does (options: those of
    `runner.Options`); raises `runner.OptionsError` for bad options or configuration."""
    return runner.run(runner.make_plan(runner.Options(paths=paths, **options)))
