"""Preview rules, as ruff has them: a rule marked `preview = True`, or measured below the
precision threshold on the ecosystem check (`ampfix/knowledge/precision.py`), runs only with
`--preview` / `preview = true` in [tool.ampfix], under any selection (ALL and prefixes too);
selecting one by its exact code without preview warns and does nothing. The CLI runs in a real
subprocess; a wrapper fills the precision table (or marks a rule) first, as the lead's numbers
from `bench/ecosystem.py` will."""

import json
import subprocess
import sys

import pytest

from ampfix.engine import rulemeta
from ampfix.knowledge.precision import Measured, note, short

from conftest import FIXTURES

BAD = FIXTURES / "rules" / "AMP011" / "bad_script.py"

# AMP011 measured at 1 right, 9 wrong: below 0.95, so a preview rule; AMP014 marked preview by its class
WRAPPER = """
import sys
import ampfix.knowledge.precision as p
p.MEASURED.clear()  # the test's numbers only, not the shipped ones
p.MEASURED["AMP011"] = p.Measured(true=1, false=9, debatable=2, source="a test's numbers")
p.MEASURED["AMP013"] = p.Measured(true=19, false=1, source="a test's numbers")
from ampfix.engine.registry import all_rules
all_rules()["AMP014"].preview = True
import ampfix.engine.rulemeta as rulemeta
rulemeta.shipped_facts = lambda: None  # the shipped table holds the real numbers: read the patched rules
from ampfix.frontends.cli import main
sys.argv = ["ampfix"] + sys.argv[1:]
main()
"""


def run(*args, cwd=None):
    p = subprocess.run([sys.executable, "-c", WRAPPER, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                       timeout=300)
    return p.returncode, p.stdout, p.stderr


@pytest.fixture
def src(tmp_path):
    (tmp_path / ".git").mkdir()
    target = tmp_path / "train.py"
    target.write_text(BAD.read_text())
    return target


def codes(stdout):
    return sorted({d["code"] for d in json.loads(stdout)})


def test_preview_rule_runs_only_with_preview(src):
    for selection in ([], ["--select", "ALL"], ["--select", "AMP0"], ["--select", "AMP011,AMP013"]):
        code, out, err = run("check", "--no-cache", "--output-format", "json", *selection, src)
        assert "AMP011" not in codes(out), (selection, out)
        assert code == 0 or codes(out), (selection, out, err)
    code, out, _ = run("check", "--no-cache", "--output-format", "json", "--preview", src)
    assert codes(out) == ["AMP011"] and code == 1


def test_exact_code_without_preview_warns_as_ruff_does(src):
    code, out, err = run("check", "--no-cache", "--select", "AMP011", src)
    assert code == 0 and "All checks passed!" in out
    assert err.strip() == ("warning: selection `AMP011` has no effect because preview is not enabled (AMP011 is a "
                           "preview rule: add --preview, or `preview = true` in [tool.ampfix])")
    code, out, err = run("check", "--no-cache", "--select", "AMP0", src)  # a prefix: silently without it
    assert "warning" not in err
    code, out, err = run("check", "--no-cache", "--select", "AMP011", "--preview", src)
    assert code == 1 and "AMP011" in out and "warning" not in err


def test_preview_from_the_configuration(src, tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.ampfix]\npreview = true\n")
    code, out, _ = run("check", "--no-cache", "--output-format", "json", src)
    assert codes(out) == ["AMP011"]
    code, out, _ = run("check", "--no-cache", "--output-format", "json", "--no-preview", src)
    assert codes(out) == []
    (tmp_path / "pyproject.toml").write_text('[tool.ampfix]\npreview = "yes"\n')
    code, out, err = run("check", "--no-cache", src)
    line = [ln for ln in err.splitlines() if "preview" in ln]
    assert code == 2 and len(line) == 1 and "Traceback" not in err
    assert line[0].endswith(f"{tmp_path / 'pyproject.toml'}: `preview` in [tool.ampfix] must be a boolean "
                            "(true or false), got a string")


def test_rewrite_applies_preview_fixes_only_with_preview(src):
    before = src.read_text()
    run("rewrite", "--unsafe-fixes", src)
    assert src.read_text() == before
    code, out, err = run("rewrite", "--unsafe-fixes", "--preview", src)
    assert src.read_text() == (FIXTURES / "rules" / "AMP011" / "bad_script.unsafe.py").read_text(), out + err


def test_rules_and_explain_show_precision_and_preview():
    code, out, _ = run("rules", "--output-format", "json")
    by_code = {r["code"]: r for r in json.loads(out)}
    assert by_code["AMP011"]["preview"] is True and by_code["AMP014"]["preview"] is True
    assert by_code["AMP013"]["preview"] is False and by_code["AMP001"]["preview"] is False
    assert by_code["AMP011"]["precision"] == {"value": 0.1, "true": 1, "false": 9, "debatable": 2,
                                              "source": "a test's numbers"}
    assert by_code["AMP001"]["precision"] is None
    _, table, _ = run("rules", "--output-format", "markdown")
    (row,) = [ln for ln in table.splitlines() if ln.startswith("| AMP011 | half-with-autocast | unsafe (the cast removed")]
    assert row.endswith("| 0.10 (10), preview |"), row
    assert "| AMP013 | checkpoint-without-scaler |" in table and "| 0.95 (20) |" in table
    _, text, _ = run("rules")
    assert "(preview)" in [ln for ln in text.splitlines() if ln.startswith("AMP011")][0]
    _, doc, _ = run("explain", "AMP011")
    assert "Measured: precision 0.10 on 10 judged findings (1 right, 9 wrong, 2 debatable; a test's numbers)" in doc
    assert "Preview: runs only with `--preview`" in doc
    _, doc, _ = run("explain", "AMP013")
    assert "Measured: precision 0.95 on 20 judged findings" in doc and "Preview:" not in doc


def test_selection_logic():
    info = {c: rulemeta.RuleInfo(c, c.lower(), default, (), (), (), preview=preview)
            for c, default, preview in [("AMP001", True, False), ("AMP103", True, True), ("AMP901", False, False)]}
    assert rulemeta.select_codes(None, [], info) == ["AMP001"]
    assert rulemeta.select_codes(None, [], info, preview=True) == ["AMP001", "AMP103"]
    assert rulemeta.select_codes(["ALL"], [], info) == ["AMP001", "AMP901"]  # ALL is every rule but preview ones
    assert rulemeta.select_codes(["AMP1"], [], info, preview=True) == ["AMP103"]
    assert rulemeta.select_codes(["AMP103"], [], info) == []
    assert rulemeta.preview_warnings(["AMP103", "AMP1"], info, False)[0].startswith("warning: selection `AMP103`")
    assert len(rulemeta.preview_warnings(["AMP103", "AMP1"], info, False)) == 1
    assert rulemeta.preview_warnings(["AMP103"], info, True) == []


def test_measured_numbers():
    m = Measured(true=30, false=1, debatable=2)
    assert m.judged == 31 and m.findings == 33 and round(m.precision, 3) == 0.968
    assert note("AMP012") == "precision not measured yet (no finding in the ecosystem check)"
    assert short("AMP012") == "not measured"
