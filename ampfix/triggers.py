"""A rule's default trigger test, shared by `ampfix.rule.Rule.triggered_by` and the runs that
test triggers without importing the rules (`ampfix.engine.rulemeta`): this module imports
nothing, so a file with no AMP code costs no more than reading it."""

from __future__ import annotations

from typing import Container, Dict, Sequence


def trigger_test(text: Container[str], lowered: Container[str], triggers: Sequence[str],
                 triggers_lower: Sequence[str], requires: Sequence[Sequence[str]]) -> bool:
    """A rule's default trigger test (`Rule.triggered_by`): one trigger in the text (or one
    lower-case trigger in the lowered text), and one string of every `requires` group. The
    text may also be the set of strings a text holds (the project triggers' words)."""
    if not (any(t in text for t in triggers) or any(t in lowered for t in triggers_lower)):
        return False
    return all(any(t in text for t in group) for group in requires)


def project_candidate_test(text: Container[str], lowered: Container[str], triggers: Sequence[str],
                           triggers_lower: Sequence[str], requires: Sequence[Sequence[str]], project_requires) -> bool:
    """A file a rule may fire on through the modules related to it (`Rule.project_candidate`):
    it holds every `project_requires` group, and at least one string of the rule's own
    vocabulary (a trigger, or a string of a `requires` group): the other modules supply the
    rest of a training step this file takes part in. A file with none of it (a model
    definition importing a package whose other modules train) is not one."""
    if project_requires is None or not all(any(t in text for t in g) for g in project_requires):
        return False
    return any(t in text for t in triggers) or any(t in lowered for t in triggers_lower) \
        or any(t in text for group in requires for t in group)


class Scan:
    """`string in text`, each string looked for in the text once (a `Container` for the tests
    above: the rules share most of their strings). With `lower`, the lower-cased text, made on
    the first question (for the lower-case triggers, which most texts are never asked for)."""

    __slots__ = ("text", "found", "to_lower")

    def __init__(self, text: str, lower: bool = False) -> None:
        self.text, self.to_lower = text, lower
        self.found: Dict[str, bool] = {}

    def __contains__(self, string: object) -> bool:
        hit = self.found.get(string)  # type: ignore[call-overload]
        if hit is None:
            if self.to_lower:
                self.text, self.to_lower = self.text.lower(), False
            hit = self.found[string] = string in self.text  # type: ignore[operator]
        return hit
