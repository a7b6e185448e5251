"""Report formats as a user gets them (`--output-format`, `-o`), and the SARIF read by a real
consumer (sarif-tools' `sarif` command)."""

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_ampfix
from test_cli import BAD_CLIP, GOOD, out, write

# AMP003 (BAD_CLIP's finding) is a preview rule: every run here turns preview on


def test_text_is_concise(tmp_path):
    p = write(tmp_path, "train.py", BAD_CLIP)
    a, b = run_ampfix("check", "--preview", p), run_ampfix("check", "--preview", p, "--output-format", "concise")
    assert a.stdout == b.stdout and a.returncode == b.returncode == 1
    assert out(a)[0].splitlines()[0] == (f"{p}:6:5: AMP003 [*] gradients are clipped while still scaled by the "
                                         "GradScaler; call `scaler.unscale_(optimizer)` first")


def test_full_shows_source_caret_and_fix_diff(tmp_path):
    p = write(tmp_path, "train.py", BAD_CLIP)
    res = run_ampfix("check", "--preview", p, "--output-format", "full")
    stdout = out(res)[0]
    assert res.returncode == 1
    assert "6 |     torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n" in stdout
    caret = next(line for line in stdout.splitlines() if "^" in line)
    assert caret.index("^") == stdout.splitlines()[2].index("torch") and caret.endswith("^ AMP003")
    assert "= safe fix: scaler.unscale_(optimizer) inserted before clipping" in stdout
    assert "    +    scaler.unscale_(optimizer)\n" in stdout
    assert f"--- a/{p}" in stdout or f"--- {p}" in stdout
    # the diff shown is the one `rewrite --diff` prints
    diff = out(run_ampfix("rewrite", "--preview", "--diff", p))[0]
    shown = [line[4:] for line in stdout.splitlines() if line.startswith("    ") and line[4:5] in "+-@ "]
    assert [line for line in shown if line.startswith(("+", "-"))] == \
        [line for line in diff.splitlines() if line.startswith(("+", "-"))]


def test_json_lines(tmp_path):
    p = write(tmp_path, "train.py", BAD_CLIP)
    write(tmp_path, "b.py", BAD_CLIP.replace("def step", "def step2"))
    res = run_ampfix("check", "--preview", tmp_path, "--output-format", "json-lines")
    rows = [json.loads(line) for line in out(res)[0].splitlines()]
    assert len(rows) == 2 and {r["code"] for r in rows} == {"AMP003"}
    assert rows == json.loads(run_ampfix("check", "--preview", tmp_path, "--output-format", "json").stdout)
    assert str(p) in {r["path"] for r in rows}


def test_github_annotations(tmp_path):
    write(tmp_path, "train.py", BAD_CLIP)
    res = run_ampfix("check", "--preview", "train.py", "--output-format", "github", cwd=tmp_path)
    (line,) = out(res)[0].splitlines()
    assert line.startswith("::error title=ampfix (AMP003),file=train.py,line=6,col=5,endLine=6,endColumn=60::")
    assert line.endswith("train.py:6:5: AMP003 gradients are clipped while still scaled by the GradScaler; "
                         "call `scaler.unscale_(optimizer)` first")
    assert res.returncode == 1


def test_output_file(tmp_path):
    p = write(tmp_path, "train.py", BAD_CLIP)
    report = tmp_path / "report.json"
    res = run_ampfix("check", "--preview", p, "--output-format", "json", "-o", report)
    assert res.returncode == 1 and res.stdout == b""
    assert json.loads(report.read_text())[0]["code"] == "AMP003"
    res = run_ampfix("check", "--preview", p, "--output-file", tmp_path / "report.txt")
    assert "Found 1 finding" in (tmp_path / "report.txt").read_text() and res.stdout == b""
    # the report's folder is made (as ruff does)
    res = run_ampfix("check", "--preview", p, "-o", tmp_path / "no" / "such" / "dir.txt")
    assert res.returncode == 1 and "Found 1 finding" in (tmp_path / "no" / "such" / "dir.txt").read_text()
    # a report that cannot be written is one line
    (tmp_path / "file").write_text("")
    res = run_ampfix("check", "--preview", p, "-o", tmp_path / "file" / "dir.txt")
    assert res.returncode == 2 and b"--output-file: cannot write" in res.stderr and b"Traceback" not in res.stderr


def test_rewrite_shares_the_formats(tmp_path):
    unsafe = BAD_CLIP.replace("def step", "import torch.nn as nn\n\n\ndef step")
    p = write(tmp_path, "train.py", BAD_CLIP)
    res = run_ampfix("rewrite", "--preview", p, "--output-format", "json", "-o", tmp_path / "left.json")
    assert res.returncode == 0 and json.loads((tmp_path / "left.json").read_text()) == []
    assert "Fixed 1 finding" in out(res)[1]  # the summary goes to stderr when the report is not text
    assert p.read_text() != BAD_CLIP
    res = run_ampfix("rewrite", "--preview", "--diff", p, "--output-format", "sarif")
    assert res.returncode == 2 and b"--diff prints a unified diff" in res.stderr
    p.write_text(unsafe)
    res = run_ampfix("rewrite", "--preview", "--diff", p, "--output-format", "full", "-o", tmp_path / "d.diff")
    assert res.returncode == 1 and "+    scaler.unscale_(optimizer)" in (tmp_path / "d.diff").read_text()


def _sarif(tmp_path, *paths):
    report = tmp_path / "ampfix.sarif"
    res = run_ampfix("check", "--preview", *paths, "--output-format", "sarif", "-o", report, cwd=tmp_path)
    assert res.returncode in (0, 1), res.stderr
    return report, json.loads(report.read_text())


def test_sarif_structure(tmp_path):
    write(tmp_path, "train.py", BAD_CLIP)
    write(tmp_path, "ok.py", GOOD)
    _, log = _sarif(tmp_path, ".")
    assert log["version"] == "2.1.0" and log["$schema"].endswith("sarif-2.1.0.json")
    (run,) = log["runs"]
    driver = run["tool"]["driver"]
    from ampfix.engine.registry import all_rules, select_rules

    assert [r["id"] for r in driver["rules"]] == [r.code for r in select_rules(None, [], preview=True)]
    amp003 = next(r for r in driver["rules"] if r["id"] == "AMP003")
    assert amp003["help"]["text"] == all_rules()["AMP003"].docs.strip("\n")
    assert "Bad:" in amp003["help"]["markdown"] and amp003["shortDescription"]["text"] == all_rules()["AMP003"].message
    (result,) = run["results"]
    assert result["ruleId"] == "AMP003" and driver["rules"][result["ruleIndex"]]["id"] == "AMP003"
    loc = result["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"]["uri"] == "train.py"
    assert (loc["region"]["startLine"], loc["region"]["startColumn"]) == (6, 5)
    (fix,) = result["fixes"]
    (change,) = fix["artifactChanges"]
    (rep,) = change["replacements"]
    assert rep["deletedRegion"] == {"startLine": 6, "startColumn": 1, "endLine": 6, "endColumn": 1}
    assert rep["insertedContent"]["text"] == "    scaler.unscale_(optimizer)\n"
    # applying the SARIF fix gives what `ampfix rewrite` writes
    lines = (tmp_path / "train.py").read_text().splitlines(keepends=True)
    lines.insert(5, rep["insertedContent"]["text"])
    run_ampfix("rewrite", "--preview", "train.py", cwd=tmp_path)
    assert "".join(lines) == (tmp_path / "train.py").read_text()


def _sarif_tool():
    exe = shutil.which("sarif") or str(Path(sys.executable).parent / "sarif")
    if not Path(exe).exists():
        pytest.skip("sarif-tools is not installed (pip install -e '.[test]')")
    return exe


def test_sarif_read_by_sarif_tools(tmp_path):
    sarif = _sarif_tool()
    write(tmp_path, "train.py", BAD_CLIP)
    write(tmp_path, "pkg/other.py", BAD_CLIP)
    report, _ = _sarif(tmp_path, ".")
    res = subprocess.run([sarif, "summary", str(report)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "error: 2" in res.stdout and "AMP003" in res.stdout
    res = subprocess.run([sarif, "csv", str(report), "-o", str(tmp_path / "out.csv")], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    rows = list(csv.DictReader((tmp_path / "out.csv").open()))
    assert sorted((r["Code"], r["Location"], r["Line"], r["Severity"]) for r in rows) == [
        ("AMP003", "pkg/other.py", "6", "error"), ("AMP003", "train.py", "6", "error")]
    # the CI gate: sarif-tools fails the build on errors
    res = subprocess.run([sarif, "--check", "error", "summary", str(report)], capture_output=True, timeout=120)
    assert res.returncode != 0
    clean = tmp_path / "clean"
    clean.mkdir()
    write(clean, "ok.py", GOOD)
    report, log = _sarif(clean, ".")
    assert log["runs"][0]["results"] == []
    res = subprocess.run([sarif, "--check", "error", "summary", str(report)], capture_output=True, timeout=120)
    assert res.returncode == 0
