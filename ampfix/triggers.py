"""A rule's default trigger test, shared by `ampfix.rule.Rule.triggered_by` and the runs that
test triggers without importing the rules (`ampfix.engine.rulemeta`): this module imports
nothing, so a file with no AMP code costs no more than reading it."""

from __future__ import annotations

from typing import Sequence


def trigger_test(text: str, lowered: str, triggers: Sequence[str], triggers_lower: Sequence[str],
                 requires: Sequence[Sequence[str]]) -> bool:
    """A rule's default trigger test (`Rule.triggered_by`): one trigger in the text (or one
    lower-case trigger in the lowered text), and one string of every `requires` group."""
    if not (any(t in text for t in triggers) or any(t in lowered for t in triggers_lower)):
        return False
    return all(any(t in text for t in group) for group in requires)
