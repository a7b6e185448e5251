"""flake8 plugin: `flake8 --select AMP` reports ampfix's findings (lint only; fixes stay with
`ampfix rewrite`). Registered as the `AMP` entry point of `flake8.extension`.

The rules, `min-torch-version` and `per-file-ignores` come from `[tool.ampfix]` in the nearest
pyproject.toml, as for `ampfix check`; flake8's own `--select/--ignore/--per-file-ignores` and
`# noqa` apply on top.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Iterator, List, Tuple, Type

from ampfix import __version__


@lru_cache(maxsize=256)
def _plan(path: str):
    """What `ampfix check PATH` would use (a file: discovery is one stat)."""
    from ampfix.engine import runner

    try:
        return runner.make_plan(runner.Options(paths=[path]))
    except runner.OptionsError:
        return None


class AmpfixChecker:
    name = "ampfix"
    version = __version__

    def __init__(self, tree, filename: str, lines: List[str]):
        self.filename = filename
        self.lines = lines

    def _rules(self) -> Tuple[list, object]:
        from ampfix.engine import runner
        from ampfix.engine.analyze import Settings
        from ampfix.engine.registry import all_rules, select_rules

        real = self.filename not in ("stdin", "-", "") and os.path.exists(self.filename)
        plan = _plan(os.path.abspath(self.filename) if real else os.path.join(os.getcwd(), "stdin.py"))
        if plan is None:  # a broken [tool.ampfix]: the defaults
            return select_rules(None, []), Settings()
        rules = all_rules()
        codes = runner.codes_for(self.filename, plan) if real else plan.codes
        # a file on disk is read with its project, as `ampfix check` reads it (the other modules
        # it takes part in a training step with); standard input alone
        settings = plan.settings if real else Settings(min_torch_version=plan.settings.min_torch_version)
        return [rules[c] for c in codes], settings

    def run(self) -> Iterator[Tuple[int, int, str, Type["AmpfixChecker"]]]:
        from ampfix.engine.analyze import InputError, check_text

        rules, settings = self._rules()
        try:
            diags, _ = check_text("".join(self.lines), self.filename, rules, settings)  # type: ignore[arg-type]
        except (InputError, RecursionError):
            return  # flake8 reports syntax errors itself (E999)
        for d in diags:
            yield d.line, d.column - 1, f"{d.code} {d.message}", type(self)


