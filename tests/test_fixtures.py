"""Every rule fixture: findings exactly as marked (`# expect: AMP003@9`: code and 1-based column
on that line), rewrite equal to the golden file, the golden file clean (but for findings that have
no fix) and a fixed point. Every rule's docs examples: Bad finds it, Good finds nothing."""

import re
from collections import Counter
from pathlib import Path

import pytest

from ampfix.engine.analyze import Settings, check_text, fix_text
from ampfix.engine.registry import all_rules, doc_examples, select_rules

from conftest import FIXTURES

RULE_DIR = FIXTURES / "rules"
EXPECT_RE = re.compile(r"#.*?expect:\s*((?:AMP[0-9]{3}(?:@[0-9]+)?[ ,]*)+)")


def expected(text):
    out = Counter()
    for lineno, line in enumerate(text.splitlines(), 1):
        mt = EXPECT_RE.search(line)
        if mt:
            for code, col in re.findall(r"(AMP[0-9]{3})(?:@([0-9]+))?", mt.group(1)):
                assert col, f"line {lineno}: a marker names the column too: {code}@<column>"
                out[(lineno, int(col), code)] += 1
    return out


def inputs():
    return sorted(p for p in RULE_DIR.rglob("*.py") if not p.name.endswith((".fixed.py", ".unsafe.py")))


def _id(p):
    return str(p.relative_to(RULE_DIR))


def settings(unsafe=False, text=""):
    mt = re.search(r"# ampfix-test: min-torch-version=([0-9.]+)", text)
    version = tuple(int(x) for x in mt.group(1).split(".")) if mt else (2, 4)
    return Settings(min_torch_version=version, unsafe_fixes=unsafe)


ALL = list(all_rules().values())


def test_every_rule_has_fixtures():
    for code in all_rules():
        folder = RULE_DIR / code
        assert folder.is_dir(), f"{code} has no fixture folder"
        assert list(folder.glob("bad_*.py")), f"{code} has no bad fixture"
        assert list(folder.glob("good_*.py")), f"{code} has no correct-code fixture"


@pytest.mark.parametrize("path", inputs(), ids=_id)
def test_findings_match_markers(path: Path):
    text = path.read_text(encoding="utf-8")
    diags, _ = check_text(text, str(path), ALL, settings(text=text))
    got = Counter((d.line, d.column, d.code) for d in diags)
    want = expected(text)
    if path.name.startswith("good_"):
        assert not want, "good fixtures carry no markers"
    assert got == want, "\n".join(f"{d.line}:{d.column} {d.code} {d.message}" for d in diags)


def _golden_cases():
    for p in inputs():
        for suffix, unsafe in ((".fixed.py", False), (".unsafe.py", True)):
            g = p.with_name(p.name[:-3] + suffix)
            if g.exists():
                yield pytest.param(p, g, unsafe, id=_id(g))


@pytest.mark.parametrize("path,golden,unsafe", list(_golden_cases()))
def test_rewrite_matches_golden(path: Path, golden: Path, unsafe: bool):
    code = path.parent.name
    rules = select_rules([code], [], preview=True)  # a preview rule's fixtures run too
    text = path.read_text(encoding="utf-8")
    s = settings(unsafe, text)
    new, fixed, remaining = fix_text(text, str(path), rules, s)
    want = golden.read_text(encoding="utf-8")
    assert new == want
    assert fixed, "the golden file exists, so something must have been fixed"
    # the golden file is clean but for the findings that have no fix ...
    diags, _ = check_text(want, str(golden), rules, s)
    before, _ = check_text(text, str(path), rules, s)
    unfixable = [d for d in before if d.fix is None or (d.fix == "unsafe" and not unsafe)]
    assert len(diags) == len(unfixable), [f"{d.line} {d.code} {d.message}" for d in diags]
    assert all(d.fix is None or (d.fix == "unsafe" and not unsafe) for d in diags)
    # ... and a fixed point: a second rewrite changes nothing
    again, fixed2, _ = fix_text(want, str(golden), rules, s)
    assert again == want and not fixed2


@pytest.mark.parametrize("path", [p for p in inputs() if p.name.startswith("bad_")], ids=_id)
def test_fixes_have_golden_files(path: Path):
    text = path.read_text(encoding="utf-8")
    diags, _ = check_text(text, str(path), ALL, settings(text=text))
    has_safe = any(d.fix == "safe" for d in diags)
    has_unsafe = any(d.fix == "unsafe" for d in diags)
    if has_safe:
        assert path.with_name(path.name[:-3] + ".fixed.py").exists(), "safe fixes need a .fixed.py golden file"
    if has_unsafe:
        assert path.with_name(path.name[:-3] + ".unsafe.py").exists(), "unsafe fixes need a .unsafe.py golden file"


@pytest.mark.parametrize("rule", ALL, ids=lambda r: r.code)
def test_docs_examples(rule):
    """The docs are tests: the Bad example yields the rule's finding, the Good example none."""
    examples = doc_examples(rule)
    assert [k for k, _ in examples].count("Bad") >= 1 and [k for k, _ in examples].count("Good") >= 1
    for kind, code in examples:
        diags, _ = check_text(code, f"<{rule.code} docs>", [rule], Settings())
        if kind == "Bad":
            assert diags, f"{rule.code}'s Bad example produces no finding:\n{code}"
        else:
            assert not diags, f"{rule.code}'s Good example produces findings: {[d.message for d in diags]}"
