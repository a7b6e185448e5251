"""bench/bench_corpus.py runs (its --help, and a tiny dry run of ampfix and the bare parse on a fixture
folder); nothing here times anything or downloads anything."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "bench_corpus.py"


def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


def test_help():
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, env=_env())
    assert out.returncode == 0, out.stderr
    assert "--peer-timeout" in out.stdout and "--trees" in out.stdout


def test_dry_run_on_a_fixture_folder(tmp_path):
    fixture = ROOT / "fixtures" / "rules" / "AMP007"
    md, js = tmp_path / "r.md", tmp_path / "r.json"
    out = subprocess.run([sys.executable, str(SCRIPT), "--tree-dir", f"fx={fixture}", "--tools", "ampfix-cold",
                          "bare-parse", "--repeat", "1", "--md-out", str(md), "--json-out", str(js)],
                         capture_output=True, text=True, env=_env(), timeout=300)
    assert out.returncode == 0, out.stderr
    data = json.loads(js.read_text())
    (tree,) = data["trees"]
    files = sorted(fixture.rglob("*.py"))
    assert tree["files"] == len(files)
    assert tree["lines"] == sum(f.read_bytes().count(b"\n") for f in files)
    assert set(tree["tools"]) == {"ampfix-cold", "bare-parse"}
    for rec in tree["tools"].values():
        assert rec["rc"] == 0 and not rec["timed_out"] and rec["maxrss_kib"] > 0
    assert "| fx |" in md.read_text()
