"""Property-based: random valid Python (hypothesmith) spliced around training loops with AMP
mistakes (bundled fixtures) and inside their functions, in any line-break style. `rewrite` output parses, a second
rewrite changes nothing, it never adds a finding, and every byte outside the fixed
statements is unchanged: the random code before and after the loop byte for byte, and the
loop's own lines except the ones the fixes name."""

import difflib
import os
from collections import Counter

import pytest

hypothesis = pytest.importorskip("hypothesis")
hypothesmith = pytest.importorskip("hypothesmith")

from hypothesis import HealthCheck, assume, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ampfix.engine.analyze import Settings, process_bytes  # noqa: E402
from ampfix.engine.registry import all_rules  # noqa: E402

from conftest import FIXTURES  # noqa: E402

# random code may be odd (`1()`): its compile warnings are not the test's business
pytestmark = pytest.mark.filterwarnings("ignore::SyntaxWarning")


def _compiles(text: str) -> bool:
    try:
        compile(text, "t.py", "exec", dont_inherit=True)
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False


TEMPLATES = [(FIXTURES / "rules" / name).read_text(encoding="utf-8") for name in (
    "AMP001/bad_basic.py",
    "AMP003/bad_clip.py",
    "AMP004/bad_update.py",
    "AMP009/bad_missing_update.py",
    "AMP101/bad_from_import.py",
    "AMP006/bad_loop.py",
)]
RULES = list(all_rules().values())


def _slots(template: str):
    """(line index, indentation) where a block of statements can go inside a function."""
    lines = template.split("\n")
    out = []
    for i, line in enumerate(lines):
        indent = len(line) - len(line.lstrip(" "))
        if indent < 4 or not line.strip():
            continue
        probe = "\n".join(lines[:i] + [" " * indent + "pass"] + lines[i:])
        if _compiles(probe):
            out.append((i, indent))
    return out


def _code(source: str) -> str:
    source = source if not source or source.endswith("\n") else source + "\n"
    return source


SLOTS = [_slots(t) for t in TEMPLATES]
PYTHON = hypothesmith.from_grammar().map(_code)  # built once: building it compiles the grammar


def _counts(result) -> Counter:
    return Counter(d.code for d in result.diagnostics)


# 30 fixed examples in the normal run (~25 s); AMPFIX_PROPERTY_EXAMPLES=N for a longer, random search
EXAMPLES = int(os.environ.get("AMPFIX_PROPERTY_EXAMPLES", "0")) or 30


@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize="AMPFIX_PROPERTY_EXAMPLES" not in os.environ,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
@given(data=st.data(), inside=st.booleans(), which=st.integers(min_value=0, max_value=len(TEMPLATES) - 1),
       newline=st.sampled_from(["\n", "\r\n", "\r"]), unsafe=st.booleans())
def test_rewrite_properties(data, inside, which, newline, unsafe):
    """Random code before and after a template, or (`inside`) in one of its functions, among
    the statements the fixes move or edit."""
    before = after = middle = ""
    if inside and SLOTS[which]:
        middle = data.draw(PYTHON.filter(lambda c: c.strip() != ""), "middle")
        where = data.draw(st.sampled_from(SLOTS[which]), "where")
    else:
        before, after = data.draw(PYTHON, "before"), data.draw(PYTHON, "after")
    random_code = before + after + middle
    assume("\r" not in random_code and "\f" not in random_code)  # their own line breaks: kept apart below
    assume("__future__" not in after + middle)
    template = TEMPLATES[which]
    inserted = []
    if middle:
        at, indent = where
        inserted = [" " * indent + line if line.strip() else line for line in middle.rstrip("\n").split("\n")]
        lines = template.split("\n")
        template = "\n".join(lines[:at] + inserted + lines[at:])
    text = before + "\n" + template + "\n" + after
    assume(_compiles(text))
    head = (before + "\n").replace("\n", newline).encode()
    tail = ("\n" + after).replace("\n", newline).encode()
    source = text.replace("\n", newline).encode()
    settings_ = Settings(unsafe_fixes=unsafe)
    checked = process_bytes(source, "t.py", RULES, settings_, fix=False)
    assume(checked.error is None)  # LibCST rejects a few valid programs; those are the check side's
    fixed = process_bytes(source, "t.py", RULES, settings_, fix=True)
    assert fixed.error is None
    event(f"code inside a function: {bool(inserted)}; fixes applied: {bool(fixed.fixed)}")
    new = fixed.new_source if fixed.new_source is not None else source
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
    old_lines = source[len(head): len(source) - len(tail)].decode().split(newline)
    new_lines = new[len(head): len(new) - len(tail)].decode().split(newline)
    matcher = difflib.SequenceMatcher(a=old_lines, b=new_lines, autojunk=False)
    same = sum(b.size for b in matcher.get_matching_blocks())
    assert same >= len(old_lines) - 4 * sum(fixed.fixed.values()) - 4
    # the code put inside a function: moved or re-indented with its statement at most
    new_stripped = Counter(line.strip() for line in new_text.replace("\r\n", "\n").replace("\r", "\n").split("\n"))
    assert not (Counter(line.strip() for line in inserted) - new_stripped)
