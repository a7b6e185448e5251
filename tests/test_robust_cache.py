"""Issue 22, the cache: an entry is believed only when it is exactly what ampfix wrote for this
file, these rules and this code; anything else is a miss (the file is analysed), never a
traceback and never a printed finding.

Every run is the real CLI in a subprocess, with the cache in a temporary folder."""

from __future__ import annotations

import json
import os
import time

import pytest

from ampfix.engine import entries as E
from ampfix.engine import rulemeta
from tests.conftest import run_ampfix
from tests.test_robust_check import TRAINER

FINDING = "train.py:9:9: AMP007"


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "train.py").write_text(TRAINER)
    (tmp_path / "clean.py").write_text("import torch\nx = torch.autocast('cpu')\n")
    return tmp_path


def _check(tree, *extra):
    return run_ampfix("check", "train.py", "clean.py", *extra, cwd=tree, env={"AMPFIX_CACHE_DIR": str(tree / "cache")})


def _entries(tree):
    return sorted(p for p in (tree / "cache").rglob("*") if p.is_file() and len(p.name) == 64)


def _reseal(path, data):
    """Write `data` into the entry at `path` with a correct envelope and checksum, as a
    careless tool (or a cache from elsewhere) would: only the validator can refuse it."""
    env = json.loads(path.read_bytes())
    path.write_text(json.dumps(E.seal(env["kind"], env["key"], data)))


def _assert_reported_as_analysed(res):
    out, err = res.stdout.decode(), res.stderr.decode()
    assert res.returncode == 1, err
    assert "Traceback" not in err and err == ""
    assert [line for line in out.splitlines() if "AMP" in line and line.startswith("train.py")][0].startswith(FINDING)
    assert "Found 1 finding in 1 file (2 files checked)." in out


def _the_entry_of_train(tree):
    for p in _entries(tree):
        data = json.loads(p.read_bytes())["data"]
        if data["diagnostics"]:
            return p, data
    raise AssertionError("no entry with the finding")


BAD_SHAPES = {
    "diagnostics a string": lambda d: {"diagnostics": "xx", "error": None},
    "diagnostics ints": lambda d: {"diagnostics": [1, 2], "error": None},
    "no error field": lambda d: {"diagnostics": d["diagnostics"]},
    "extra field": lambda d: {**d, "more": 1},
    "line a string": lambda d: {"diagnostics": [{**d["diagnostics"][0], "line": "x"}], "error": None},
    "line zero": lambda d: {"diagnostics": [{**d["diagnostics"][0], "line": 0}], "error": None},
    "line a boolean": lambda d: {"diagnostics": [{**d["diagnostics"][0], "line": True}], "error": None},
    "end before start": lambda d: {"diagnostics": [{**d["diagnostics"][0], "end_line": 1}], "error": None},
    "made-up rule": lambda d: {"diagnostics": [{**d["diagnostics"][0], "code": "AMP999"}], "error": None},
    "rule not selected": lambda d: {"diagnostics": [{**d["diagnostics"][0], "code": "AMP901"}], "error": None},
    "another file": lambda d: {"diagnostics": [{**d["diagnostics"][0], "path": "other.py"}], "error": None},
    "unknown fix": lambda d: {"diagnostics": [{**d["diagnostics"][0], "fix": "maybe"}], "error": None},
    "missing field": lambda d: {"diagnostics": [{k: v for k, v in d["diagnostics"][0].items() if k != "message"}],
                                "error": None},
    "noqa lines strings": lambda d: {"diagnostics": [{**d["diagnostics"][0], "noqa_lines": ["9"]}], "error": None},
    "an error never kept": lambda d: {"diagnostics": [], "error": {"path": "train.py", "line": None, "column": None,
                                                                   "message": "cannot read: Permission denied"}},
    "error of the wrong shape": lambda d: {"diagnostics": [], "error": "boom"},
    "data a list": lambda d: [d],
}


@pytest.mark.parametrize("case", sorted(BAD_SHAPES))
def test_an_entry_of_the_wrong_shape_is_a_miss(tree, case):
    first = _check(tree)
    _assert_reported_as_analysed(first)
    path, data = _the_entry_of_train(tree)
    _reseal(path, BAD_SHAPES[case](data))
    again = _check(tree)
    _assert_reported_as_analysed(again)
    assert again.stdout == first.stdout
    # the miss was analysed and its entry written again, valid
    assert json.loads(path.read_bytes())["data"] == data


@pytest.mark.parametrize("edit", ["not json", "truncated", "a changed byte", "another key", "NaN", "huge int"])
def test_a_damaged_or_misplaced_entry_is_a_miss(tree, edit):
    first = _check(tree)
    path, data = _the_entry_of_train(tree)
    raw = path.read_text()
    other = [p for p in _entries(tree) if p != path][0]
    if edit == "not json":
        path.write_text("not json")
    elif edit == "truncated":
        path.write_text(raw[: len(raw) // 2])
    elif edit == "a changed byte":  # a valid shape, but not what was written (the checksum)
        path.write_text(raw.replace('"line": 9', '"line": 8'))
    elif edit == "another key":  # a valid entry of another file, under this key
        path.write_bytes(other.read_bytes())
    elif edit == "NaN":
        path.write_text(raw.replace('"line": 9', '"line": NaN'))
    else:
        path.write_text(raw.replace('"line": 9', '"line": 9' + "0" * 5000))
    again = _check(tree)
    _assert_reported_as_analysed(again)
    assert again.stdout == first.stdout


def _rules_entry(tree):
    (entry,) = (tree / "cache").glob("v*/rules-*.json")
    return entry


@pytest.mark.parametrize("edit", ["emptied triggers", "triggers of another rule", "codes dropped", "not json",
                                  "unsealed edit"])
def test_rule_facts_that_disagree_are_read_from_the_rules_again(tree, edit):
    """Emptied triggers in the rule facts would make every file look clean without parsing it
    (the warm path trusts them): an entry that fails its checks is read from the rules again."""
    _check(tree)
    for p in _entries(tree):  # no results kept: the triggers decide what is analysed
        p.unlink()
    entry = _rules_entry(tree)
    env = json.loads(entry.read_bytes())
    rules = env["data"]["rules"]
    if edit == "emptied triggers":
        _reseal(entry, {"rules": [{**r, "triggers": [], "triggers_lower": []} for r in rules]})
    elif edit == "triggers of another rule":
        _reseal(entry, {"rules": [{**r, "triggers": [""]} for r in rules]})
    elif edit == "codes dropped":  # with the checksum left as it was
        env["data"]["rules"] = [r for r in rules if not r["code"].startswith("AMP00")]
        entry.write_text(json.dumps(env))
    elif edit == "not json":
        entry.write_text("{")
    else:
        env["data"]["rules"] = [{**r, "triggers": ["zzz-never"], "triggers_lower": []} for r in rules]
        entry.write_text(json.dumps(env))
    again = _check(tree)
    _assert_reported_as_analysed(again)
    # read from the rules and kept again, as the registry says
    rulemeta._INFO.clear()
    from ampfix.engine import registry

    assert rulemeta._decode_rules(E.unseal(entry.read_bytes(), "rules", env["key"])) == registry.rule_facts()


def test_the_code_fingerprint_follows_the_content_not_the_timestamps(tmp_path, monkeypatch):
    """A module edited with its size and mtime put back (a CI cache restored on another branch
    looks like that) gives another fingerprint, with the memo of the last one in place."""
    mod = tmp_path / "rule.py"
    mod.write_text("triggers = ('autocast',)\n")
    monkeypatch.setattr(rulemeta, "_code_files", lambda: [("rules:rule.py", str(mod))])
    monkeypatch.setattr(rulemeta, "_FINGERPRINT", None)
    memo = tmp_path / "cache"
    first = rulemeta.fingerprint(memo)
    assert list(memo.glob("v*/code-*.json"))
    monkeypatch.setattr(rulemeta, "_FINGERPRINT", None)
    assert rulemeta.fingerprint(memo) == first  # from the memo
    st = os.stat(mod)
    time.sleep(0.01)
    mod.write_text("triggers = ('zzzzzzzz',)\n")  # the same size
    os.utime(mod, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the same mtime
    assert os.stat(mod).st_size == st.st_size and os.stat(mod).st_mtime_ns == st.st_mtime_ns
    monkeypatch.setattr(rulemeta, "_FINGERPRINT", None)
    assert rulemeta.fingerprint(memo) != first
    # the same content elsewhere (another checkout, another machine) is the same code
    other = tmp_path / "copy" / "rule.py"
    other.parent.mkdir()
    other.write_text("triggers = ('autocast',)\n")
    monkeypatch.setattr(rulemeta, "_code_files", lambda: [("rules:rule.py", str(other))])
    monkeypatch.setattr(rulemeta, "_FINGERPRINT", None)
    assert rulemeta.fingerprint(None) == first
    monkeypatch.setattr(rulemeta, "_FINGERPRINT", None)


def test_a_forged_memo_of_the_fingerprint_is_not_believed(tmp_path, monkeypatch):
    mod = tmp_path / "rule.py"
    mod.write_text("x = 1\n")
    monkeypatch.setattr(rulemeta, "_code_files", lambda: [("rules:rule.py", str(mod))])
    monkeypatch.setattr(rulemeta, "_FINGERPRINT", None)
    memo = tmp_path / "cache"
    real = rulemeta.fingerprint(memo)
    (memo_file,) = memo.glob("v*/code-*.json")
    memo_file.write_text(json.dumps({"sig": "0" * 64, "content": "1" * 64}))
    monkeypatch.setattr(rulemeta, "_FINGERPRINT", None)
    assert rulemeta.fingerprint(memo) == real
    monkeypatch.setattr(rulemeta, "_FINGERPRINT", None)
