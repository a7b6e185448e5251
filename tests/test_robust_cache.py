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

FINDING = "train.py:9:9: AMP007"  # a preview rule: the runs pass --preview


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "train.py").write_text(TRAINER)
    (tmp_path / "clean.py").write_text("import torch\nx = torch.autocast('cpu')\n")
    return tmp_path


def _check(tree, *extra):
    return run_ampfix("check", "--preview", "train.py", "clean.py", *extra, cwd=tree,
                      env={"AMPFIX_CACHE_DIR": str(tree / "cache")})


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


def _first(d, **changes):
    """The entry's data with its first finding changed (every other field as written)."""
    return {**d, "diagnostics": [{**d["diagnostics"][0], **changes}]}


def _without(d, key):
    return {**d, "diagnostics": [{k: v for k, v in d["diagnostics"][0].items() if k != key}]}


RELATED = {"path": "helpers.py", "line": 3, "column": 5, "message": "`scaler.step(opt)` in `step`"}
SHA = "a" * 64

BAD_SHAPES = {
    "diagnostics a string": lambda d: {**d, "diagnostics": "xx"},
    "diagnostics ints": lambda d: {**d, "diagnostics": [1, 2]},
    "no error field": lambda d: {k: v for k, v in d.items() if k != "error"},
    "extra field": lambda d: {**d, "more": 1},
    "line a string": lambda d: _first(d, line="x"),
    "line zero": lambda d: _first(d, line=0),
    "line a boolean": lambda d: _first(d, line=True),
    "end before start": lambda d: _first(d, end_line=1),
    "made-up rule": lambda d: _first(d, code="AMP999"),
    "rule not selected": lambda d: _first(d, code="AMP901"),
    "another file": lambda d: _first(d, path="other.py"),
    "unknown fix": lambda d: _first(d, fix="maybe"),
    "missing field": lambda d: _without(d, "message"),
    "noqa lines strings": lambda d: _first(d, noqa_lines=["9"]),
    "an error never kept": lambda d: {**d, "diagnostics": [], "error": {
        "path": "train.py", "line": None, "column": None, "message": "cannot read: Permission denied", "cell": None,
        "level": "error"}},
    "error of the wrong shape": lambda d: {**d, "diagnostics": [], "error": "boom"},
    "data a list": lambda d: [d],
    # the fields the project layer and the detailed formats added
    "related a string": lambda d: _first(d, related="helpers.py:3"),
    "related without a line": lambda d: _first(d, related=[{k: v for k, v in RELATED.items() if k != "line"}]),
    "related line a string": lambda d: _first(d, related=[{**RELATED, "line": "3"}]),
    "related with more": lambda d: _first(d, related=[{**RELATED, "url": "x"}]),
    "cell region of three": lambda d: _first(d, cell_region=[1, 2, 3]),
    "source lines ints": lambda d: _first(d, source_lines=[1]),
    "fix edit a string": lambda d: _first(d, fix_edit="insert"),
    "fix edit of four values": lambda d: _first(d, fix_edit={"description": "x", "applicability": "safe",
                                                             "edits": [[1, 1, 1, 1]], "diff": ""}),
    "fix edit unknown applicability": lambda d: _first(d, fix_edit={"description": "x", "applicability": "sure",
                                                                    "edits": None, "diff": ""}),
    "notes a string": lambda d: {**d, "notes": "skipped"},
    "a note of another file": lambda d: {**d, "notes": [{"path": "other.py", "line": None, "column": None,
                                                         "message": "x", "cell": None, "level": "warning"}]},
    "deps a list": lambda d: {**d, "deps": ["helpers.py"]},
    "deps digest not a hash": lambda d: {**d, "deps": {"helpers.py": "abc"}},
    "deps digest a number": lambda d: {**d, "deps": {"helpers.py": 1}},
    "deps of a file that is not there": lambda d: {**d, "deps": {"no-such-module.py": SHA}},
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


# the CLI as a checkout where the shipped table of rule facts does not match the rules (a rule
# edited): the facts then come from the cache folder, keyed by the rules' source digest
STALE_TABLE = """
import sys, runpy
import ampfix.engine.rulemeta as rulemeta
rulemeta.shipped_facts = lambda: None
sys.argv = ["ampfix"] + sys.argv[1:]
runpy.run_module("ampfix", run_name="__main__", alter_sys=True)
"""


def _check_stale_table(tree):
    import subprocess
    import sys

    env = dict(os.environ, NO_COLOR="1", AMPFIX_CACHE_DIR=str(tree / "cache"))
    return subprocess.run([sys.executable, "-c", STALE_TABLE, "check", "--preview", "train.py", "clean.py"], cwd=tree,
                          capture_output=True, env=env, timeout=300)


def test_the_shipped_table_answers_and_is_validated(tree, monkeypatch):
    """With the shipped table matching the rules, no facts are kept in the folder; a table whose
    rows fail the facts' validator (emptied triggers) is not used."""
    _assert_reported_as_analysed(_check(tree))
    assert not list((tree / "cache").glob("v*/rules-*.json"))
    from ampfix.engine import registry, rule_facts_table

    assert rulemeta.shipped_facts() == registry.rule_facts()
    monkeypatch.setattr(rule_facts_table, "RULES", [(r[0], r[1], r[2], (), (), *r[5:]) for r in rule_facts_table.RULES])
    assert rulemeta.shipped_facts() is None
    monkeypatch.setattr(rule_facts_table, "RULES", rule_facts_table.RULES[:0])
    assert rulemeta.shipped_facts() is None


@pytest.mark.parametrize("edit", ["emptied triggers", "triggers of another rule", "codes dropped", "not json",
                                  "unsealed edit"])
def test_rule_facts_that_disagree_are_read_from_the_rules_again(tree, edit):
    """Emptied triggers in the rule facts would make every file look clean without parsing it
    (the warm path trusts them): an entry that fails its checks is read from the rules again."""
    _check_stale_table(tree)
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
    again = _check_stale_table(tree)
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


# ----------------------------------------------------------------------------- the project layer's entries


@pytest.fixture
def project(tmp_path):
    import shutil

    from tests.conftest import FIXTURES

    shutil.copytree(FIXTURES / "projects" / "bad_helper_clip", tmp_path / "p")
    return tmp_path / "p"


def _check_project(project, *extra):
    # the project's finding is AMP003's, a preview rule
    return run_ampfix("check", "--preview", "train.py", *extra, cwd=project,
                      env={"AMPFIX_CACHE_DIR": str(project / "cache"), "AMPFIX_STATS": "1"})


def _stats(res):
    err = res.stderr.decode()
    assert "Traceback" not in err, err
    (line,) = [x for x in err.splitlines() if x.startswith("ampfix stats:")]
    return line


def _result_entries(project):
    return [p for p in _entries(project) if "summaries" not in p.parts and "graphs" not in p.parts]


def test_a_result_with_related_locations_and_deps_is_kept_and_believed(project):
    first = _check_project(project)
    assert first.returncode == 1 and b"AMP003" in first.stdout, first.stderr
    (entry,) = [p for p in _result_entries(project) if json.loads(p.read_bytes())["data"]["diagnostics"]]
    data = json.loads(entry.read_bytes())["data"]
    assert data["deps"] and all(len(v) == 64 for v in data["deps"].values())
    again = _check_project(project)
    assert again.stdout == first.stdout and "parsed 0," in _stats(again)  # a hit
    # a related location of the right shape, written by ampfix: still believed
    _reseal(entry, _first(data, related=[RELATED]))
    assert "parsed 0," in _stats(_check_project(project))
    # a module it depends on changed: a miss, analysed again
    (project / "utils.py").write_text((project / "utils.py").read_text() + "\n# edited\n")
    third = _check_project(project)
    assert third.stdout == first.stdout and "parsed 0," not in _stats(third)


@pytest.mark.parametrize("case", ["not a summary", "a field of the wrong type", "another module", "a list",
                                  "not json", "unsealed edit"])
def test_a_module_summary_of_the_wrong_shape_is_a_miss(project, case):
    first = _check_project(project)
    summaries = [p for p in _entries(project) if "summaries" in p.parts]
    assert summaries
    for p in summaries:
        env = json.loads(p.read_bytes())
        data = env["data"]
        if case == "not a summary":
            _reseal(p, {"unreadable": False})
        elif case == "a field of the wrong type":
            _reseal(p, {**data, "functions": "step"} if "functions" in data else {**data, "unreadable": 1})
        elif case == "another module":
            _reseal(p, {**data, "path": "/elsewhere/utils.py"} if "path" in data else {"path": 1})
        elif case == "a list":
            _reseal(p, [data])
        elif case == "not json":
            p.write_text("{")
        else:
            env["data"] = {**data, "functions": {}} if "functions" in data else {"x": 1}
            p.write_text(json.dumps(env))
    for p in _result_entries(project):  # the results analysed again: they read the summaries
        p.unlink()
    again = _check_project(project)
    assert again.stdout == first.stdout and again.returncode == 1
    assert "summaries from the cache 0" in _stats(again)
