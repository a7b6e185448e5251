"""Issue 11: a warm re-run of `ampfix check` (every file a cache hit) imports neither LibCST nor
the rules, and reports exactly what the cold run did (no timing here: bench/ measures it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ampfix.engine import registry, rulemeta
from ampfix.engine.registry import all_rules

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "rules"

# runs `ampfix` in-process, then prints (on stderr, last line) whether LibCST or a rule was imported
WRAPPER = """
import sys, runpy
sys.argv = ["ampfix"] + sys.argv[1:]
try:
    runpy.run_module("ampfix", run_name="__main__", alter_sys=True)
    code = 0
except SystemExit as exc:
    code = exc.code
heavy = sorted(m for m in sys.modules if m == "libcst" or m.startswith(("libcst.", "ampfix.rules.", "ampfix.engine.analyze")))
sys.stderr.write("\\nHEAVY=" + ",".join(heavy) + "\\n")
sys.exit(code)
"""


def _run(args, cache, cwd):
    env = dict(os.environ, AMPFIX_CACHE_DIR=str(cache), NO_COLOR="1")  # as tests/conftest.py:run_ampfix
    p = subprocess.run([sys.executable, "-c", WRAPPER, *args], capture_output=True, text=True, env=env, cwd=cwd)
    err, _, heavy = p.stderr.rpartition("\nHEAVY=")
    return p.returncode, p.stdout, err, [m for m in heavy.strip().split(",") if m]


@pytest.fixture
def tree(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(FIXTURES / "AMP007" / "bad_trainer.py", src / "trainer.py")
    shutil.copy(FIXTURES / "AMP005" / "bad_misspelled.py", src / "env.py")
    shutil.copy(FIXTURES / "AMP005" / "good_select_device.py", src / "device.py")
    (src / "plain.py").write_text("def f(x):\n    return x + 1\n")
    (src / "broken.py").write_text((src / "trainer.py").read_text() + "\nx = (\n")
    (src / "latin.py").write_bytes(b"x = '\xe9'\n")
    cells = [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [],
              "source": text} for i, text in enumerate([(src / "trainer.py").read_text(), "x = 1\n"])]
    nb = {"cells": cells, "metadata": {"kernelspec": {"language": "python", "name": "python3", "display_name": "P"},
                                       "language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}
    (src / "train.ipynb").write_text(json.dumps(nb, indent=1) + "\n", encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize("extra", [[], ["--select", "AMP0"], ["--statistics"], ["--output-format", "json"],
                                   ["--output-format", "github"], ["--output-format", "full"]])
def test_warm_check_imports_no_libcst_and_reports_the_same(tree, extra):
    cache = tree / "cache"
    cold = _run(["check", "--preview", "src", *extra], cache, tree)  # AMP007, the finding, is a preview rule
    assert "libcst" in cold[3]  # the first run analysed the files
    assert cold[0] == 2  # findings, and a syntax error and an undecodable file: errors
    assert "AMP007" in cold[1] and "broken.py" in cold[2] and "latin.py" in cold[2]
    assert "train.ipynb" in cold[1] or "--statistics" in extra
    for _ in range(2):
        warm = _run(["check", "--preview", "src", *extra], cache, tree)
        assert warm[3] == [], f"a warm run imported {warm[3]}"
        assert warm[:3] == cold[:3]


def test_warm_check_still_validates_select(tree):
    cache = tree / "cache"
    _run(["check", "src"], cache, tree)
    code, out, err, heavy = _run(["check", "src", "--select", "AMP999"], cache, tree)
    assert code == 2 and "unknown rule code or prefix 'AMP999'" in err
    assert heavy == []
    code, out, err, _ = _run(["check", "src", "--no-cache", "--select", "AMP999"], cache, tree)
    assert code == 2 and "unknown rule code or prefix 'AMP999'" in err


def test_rule_facts_kept_in_the_cache_folder_match_the_registry(tmp_path, monkeypatch):
    rulemeta._INFO.clear()
    # the shipped table matches the rules: it answers, and nothing is kept in the folder
    assert rulemeta.rule_info(registry.rule_facts, tmp_path) == registry.rule_facts()
    assert not list(tmp_path.glob("v*/rules-*.json"))
    # a table that does not match (a rule edited in a checkout): the facts are kept in the folder
    monkeypatch.setattr(rulemeta, "shipped_facts", lambda: None)
    rulemeta._INFO.clear()
    first = rulemeta.rule_info(registry.rule_facts, tmp_path)
    assert [p.name for p in tmp_path.glob("v*/rules-*.json")] == [f"rules-{rulemeta.source_digest()}.json"]
    rulemeta._INFO.clear()
    again = rulemeta.rule_info(lambda: pytest.fail("read from the rules again"), tmp_path)  # read back from the JSON
    rulemeta._INFO.clear()
    assert first == again == registry.rule_facts()
    assert list(again) == list(all_rules())


def test_overridden_triggers_only_narrow_the_default_test():
    """RuleInfo.maybe_triggered must say yes wherever a rule's own `triggered_by` does."""
    info = registry.rule_facts()
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in FIXTURES.rglob("*.py")]
    for code, rule in all_rules().items():
        for text in texts:
            if rule.triggered_by(text, text.lower()):
                assert info[code].maybe_triggered(text, text.lower()), (code, text[:200])


def test_warm_json_report_is_the_cold_one(tree):
    cache = tree / "cache"
    cold = _run(["check", "src", "--output-format", "json"], cache, tree)
    warm = _run(["check", "src", "--output-format", "json"], cache, tree)
    assert json.loads(cold[1]) == json.loads(warm[1]) and json.loads(warm[1])


def test_every_module_imports_first():
    """Each module of the package imports in a fresh interpreter before any other of ampfix's:
    no import cycle that only an import order hides (`ampfix.fixes.edits` and
    `ampfix.knowledge.apex_api` failed so, each before the model). One interpreter per module,
    two at a time."""
    from concurrent.futures import ThreadPoolExecutor

    names = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                   for p in (ROOT / "ampfix").rglob("*.py") if p.name != "__main__.py")

    def imports(name: str):
        res = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True,
                             cwd=ROOT, timeout=120)
        return name, res.returncode, res.stderr.strip().splitlines()[-1:] if res.returncode else []

    with ThreadPoolExecutor(2) as pool:
        failed = [r for r in pool.map(imports, names) if r[1]]
    assert len(names) > 60 and not failed, failed
