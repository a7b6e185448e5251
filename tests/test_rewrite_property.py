"""Property-based: random valid Python (hypothesmith) spliced around training loops with AMP
mistakes (bundled fixtures), in any line-break style. `rewrite` output parses, a second
rewrite changes nothing, it never adds a finding, and every byte outside the fixed
statements is unchanged: the random code before and after the loop byte for byte, and the
loop's own lines except the ones the fixes name."""

import difflib
from collections import Counter

import pytest

hypothesis = pytest.importorskip("hypothesis")
hypothesmith = pytest.importorskip("hypothesmith")

from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ampfix.engine import Settings, process_bytes  # noqa: E402
from ampfix.registry import all_rules  # noqa: E402

from conftest import FIXTURES  # noqa: E402

TEMPLATES = [(FIXTURES / "rules" / name).read_text(encoding="utf-8") for name in (
    "AMP001/bad_basic.py",
    "AMP003/bad_clip.py",
    "AMP004/bad_update.py",
    "AMP009/bad_missing_update.py",
    "AMP101/bad_from_import.py",
    "AMP006/bad_loop.py",
)]
RULES = list(all_rules().values())


def _code(source: str) -> str:
    source = source if not source or source.endswith("\n") else source + "\n"
    return source


def _compiles(text: str) -> bool:
    try:
        compile(text, "t.py", "exec", dont_inherit=True)
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False


def _counts(result) -> Counter:
    return Counter(d.code for d in result.diagnostics)


@settings(max_examples=30, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
@given(before=hypothesmith.from_grammar().map(_code), after=hypothesmith.from_grammar().map(_code),
       template=st.sampled_from(TEMPLATES), newline=st.sampled_from(["\n", "\r\n", "\r"]),
       unsafe=st.booleans())
def test_rewrite_properties(before, after, template, newline, unsafe):
    assume("\r" not in before + after and "\f" not in before + after)  # their own line breaks: kept apart below
    assume("__future__" not in after)
    text = before + "\n" + template + "\n" + after
    assume(_compiles(text))
    head = (before + "\n").replace("\n", newline).encode()
    tail = ("\n" + after).replace("\n", newline).encode()
    data = text.replace("\n", newline).encode()
    settings_ = Settings(unsafe_fixes=unsafe)
    checked = process_bytes(data, "t.py", RULES, settings_, fix=False)
    assume(checked.error is None)  # LibCST rejects a few valid programs; those are the check side's
    fixed = process_bytes(data, "t.py", RULES, settings_, fix=True)
    assert fixed.error is None
    new = fixed.new_source if fixed.new_source is not None else data
    new_text = new.decode()
    # parses, and compiles (the input did)
    compile(new_text, "t.py", "exec", dont_inherit=True)
    # idempotent
    again = process_bytes(new, "t.py", RULES, settings_, fix=True)
    assert again.new_source is None and not again.fixed
    # never adds a finding (per rule)
    after_check = process_bytes(new, "t.py", RULES, settings_, fix=False)
    assert not (_counts(after_check) - _counts(checked)), (_counts(checked), _counts(after_check))
    # bytes outside the fixed statements: the random code exactly, line breaks included
    assert new.startswith(head) and new.endswith(tail)
    if fixed.new_source is None:
        assert not fixed.fixed
        return
    # the template's lines: only lines of statements the fixes name change
    old_lines = data[len(head): len(data) - len(tail)].decode().split(newline)
    new_lines = new[len(head): len(new) - len(tail)].decode().split(newline)
    matcher = difflib.SequenceMatcher(a=old_lines, b=new_lines, autojunk=False)
    same = sum(b.size for b in matcher.get_matching_blocks())
    assert same >= len(old_lines) - 4 * sum(fixed.fixed.values()) - 4
    assert set(new_text.replace("\r\n", "\n").replace("\r", "\n").split("\n")) >= set(
        (before + "\n" + after).split("\n"))
