"""Programmatic entry points (used by the verifier, editors and tests).

`check_source` / `fix_source` work on a string; `check_paths` runs what `ampfix check` runs
(configuration, discovery, rules) and returns the results instead of printing them.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from ampfix.engine import runner
from ampfix.knowledge.torch_versions import DEFAULT_MIN_TORCH
from ampfix.engine.analyze import Diagnostic, InputError, Settings, check_text, fix_text
from ampfix.engine.results import decode_source
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


def fix_file_report(path: str, unsafe: bool = False, preview: bool = False
                    ) -> Tuple[str, List[Diagnostic], Dict[str, int]]:
    """`fix_source_report` of the file at `path` as `ampfix rewrite PATH --diff` fixes it: with
    its project's configuration (`[tool.ampfix]`: the rules, `min-torch-version`, `preview`
    unless `preview`) and the facts of the project's other modules, which `fix_source_report`
    (a string, no project) does not read; nothing is written, no cache is kept. Raises
    AmpfixError for a file or a configuration that cannot be read."""
    def one(fix: bool):
        try:
            plan = runner.make_plan(runner.Options(paths=[path], fix=fix, unsafe_fixes=unsafe, no_cache=True,
                                                   preview=True if preview else None))
        except runner.OptionsError as exc:
            raise AmpfixError(str(exc)) from None
        (result,) = runner.run(plan).results
        problem = result.error or next((n for n in result.notes if result.skipped), None)
        if problem is not None:
            raise AmpfixError(str(problem))
        return result

    before = one(False)
    after = one(True)
    text = decode_source(after.new_source, path).text if after.new_source is not None else None
    if text is None:
        with open(path, "rb") as fh:
            text = decode_source(fh.read(), path).text
    return text, before.diagnostics, after.fixed


def check_paths(paths: Sequence[str], **options) -> runner.Run:
    """Check files and folders as `ampfix check PATHS` does (options: those of
    `runner.Options`); raises `runner.OptionsError` for bad options or configuration."""
    return runner.run(runner.make_plan(runner.Options(paths=paths, **options)))
