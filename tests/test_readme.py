"""The README's rule table is generated from the rules: it fails here when it is stale."""

import re
from pathlib import Path

from ampfix.frontends.cli import rules_table
from ampfix.engine.registry import all_rules

README = Path(__file__).resolve().parent.parent / "README.md"


def test_rule_table_is_generated_from_the_rules():
    text = README.read_text(encoding="utf-8")
    mt = re.search(r"<!-- rules-table:[^\n]*-->\n(.*?)<!-- /rules-table -->", text, re.DOTALL)
    assert mt, "the README lost its rule table markers"
    assert mt.group(1) == rules_table(all_rules().values()), (
        "README rule table is stale: regenerate it with `ampfix rules --output-format markdown`")


def test_readme_names_every_rule_once_in_the_table():
    table = rules_table(all_rules().values())
    assert [ln.split("|")[1].strip() for ln in table.splitlines()[2:]] == list(all_rules())
