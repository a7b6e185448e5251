"""`ampfix explain` texts are about the rule and torch: nothing about the machine they were
written on ("on this CPU", "measured here") and no paths of this repository's fixtures, tests or
benchmarks, which a user of the installed package does not have."""

import re

import pytest

from ampfix.engine.registry import all_rules

from conftest import run_ampfix

LOCAL = re.compile(r"fixtures/|tests/|bench/|\bthis (?:CPU|GPU|machine|box)\b|measured here|[Mm]easured on\b|"
                   r"\bon our\b|\bhere: no GPU\b")


@pytest.mark.parametrize("rule", list(all_rules().values()), ids=lambda r: r.code)
def test_docs_and_messages_name_nothing_local(rule):
    for text in (rule.docs, rule.message, rule.fix_note):
        hit = LOCAL.search(text or "")
        assert hit is None, f"{rule.code}: {hit.group(0)!r} in {text[max(0, hit.start() - 60): hit.end() + 60]!r}"


def test_explain_prints_the_docs():
    res = run_ampfix("explain", "AMP007")
    out = res.stdout.decode()
    assert res.returncode == 0 and out.startswith("# AMP007 step-bypasses-scaler") and "Bad:" in out
    assert LOCAL.search(out) is None
