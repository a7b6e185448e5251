"""The CLI as a user runs it: a subprocess per call, real files in a temporary folder."""

import json
import os
import re
import stat
import textwrap

import pytest

from conftest import FIXTURES, run_ampfix

# AMP003 (clip-scaled-gradients), the example finding of these tests, is a preview rule (its measured
# precision is below the threshold, ampfix/knowledge/precision.py): the runs that expect it pass --preview
BAD_CLIP = textwrap.dedent(
    """\
    import torch


    def step(model, optimizer, scaler, loss):
        scaler.scale(loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
    """
)
FIXED_CLIP = BAD_CLIP.replace(
    "    torch.nn.utils.clip_grad_norm_", "    scaler.unscale_(optimizer)\n    torch.nn.utils.clip_grad_norm_"
)
GOOD = "import torch\n\nx = torch.ones(2)\n"
LINE_RE = re.compile(r"^(?P<path>.+?):(?P<line>\d+):(?P<col>\d+): (?P<code>AMP\d{3}) (?:\[\*\] |\[-\] )?.+$")


def write(tmp_path, name, text, mode="w", **kw):
    p = tmp_path / name
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text, encoding="utf-8", newline="")
    return p


def out(res):
    return res.stdout.decode(), res.stderr.decode()


# --------------------------------------------------------------------------- check


def test_check_reports_findings_with_location_and_fix_mark(tmp_path):
    p = write(tmp_path, "train.py", BAD_CLIP)
    res = run_ampfix("check", "--preview", p)
    stdout, stderr = out(res)
    assert res.returncode == 1, stderr
    lines = [line for line in stdout.splitlines() if LINE_RE.match(line)]
    assert len(lines) == 1
    m = LINE_RE.match(lines[0])
    assert (m["line"], m["col"], m["code"]) == ("6", "5", "AMP003")
    assert "[*]" in lines[0]
    assert "Found 1 finding in 1 file" in stdout
    assert "1 fixable with `ampfix check --fix`" in stdout


STEP_BYPASSES = BAD_CLIP.replace("    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n", "").replace(
    "    scaler.step(optimizer)", "    optimizer.step()")


@pytest.mark.parametrize("code,source", [
    ("AMP003", BAD_CLIP),  # measured 7 right, 2 wrong on unseen code
    ("AMP007", STEP_BYPASSES),  # measured 0 right, 1 wrong (unimol-tools' own loss scaler)
])
def test_a_rule_measured_below_the_bar_runs_only_with_preview(tmp_path, code, source):
    """Below the precision threshold, a preview rule: off by default; selected by its code without
    preview it warns and checks nothing (as ruff)."""
    p = write(tmp_path, "train.py", source)
    res = run_ampfix("check", p)
    stdout, stderr = out(res)
    assert res.returncode == 0, stdout + stderr
    assert code not in stdout + stderr and "All checks passed!" in stdout
    res = run_ampfix("check", "--preview", p)
    stdout, stderr = out(res)
    assert res.returncode == 1, stdout + stderr
    assert [LINE_RE.match(ln)["code"] for ln in stdout.splitlines() if LINE_RE.match(ln)] == [code]
    res = run_ampfix("check", "--select", code, p)
    stdout, stderr = out(res)
    assert res.returncode == 0 and "All checks passed!" in stdout, stdout + stderr
    assert stderr.strip() == (f"warning: selection `{code}` has no effect because preview is not enabled ({code} is "
                              "a preview rule: add --preview, or `preview = true` in [tool.ampfix])")


def test_check_clean_exits_zero(tmp_path):
    p = write(tmp_path, "ok.py", GOOD)
    res = run_ampfix("check", p)
    assert res.returncode == 0
    assert "All checks passed!" in out(res)[0]


def test_check_bundled_fixtures_finds_every_rule():
    from ampfix.engine.registry import all_rules

    # every rule, the ones off by default (AMP901) too, selected by its code
    res = run_ampfix("check", FIXTURES, "--output-format", "json", "--preview", "--select", ",".join(all_rules()))
    assert res.returncode == 1
    codes = {d["code"] for d in json.loads(res.stdout)}
    assert codes >= set(all_rules()), set(all_rules()) - codes


def test_json_schema(tmp_path):
    p = write(tmp_path, "train.py", BAD_CLIP)
    res = run_ampfix("check", "--preview", p, "--output-format", "json")
    assert res.returncode == 1
    data = json.loads(res.stdout)
    assert isinstance(data, list) and len(data) == 1
    d = data[0]
    # ruff's keys, and ampfix's own beside them (`fix` is ruff's object: what was `"safe"` is
    # `fix.applicability`)
    assert set(d) == {"cell", "code", "end_location", "filename", "fix", "location", "message", "noqa_row", "url",
                      "type", "path", "line", "column", "end_line", "end_column", "name", "related"}
    assert d["cell"] is None and d["type"] == "finding"
    assert d["code"] == "AMP003" and d["name"] == "clip-scaled-gradients"
    assert (d["line"], d["column"], d["end_line"]) == (6, 5, 6)
    assert d["location"] == {"row": 6, "column": 5} and d["end_location"] == {"row": 6, "column": d["end_column"]}
    assert d["end_column"] > d["column"]
    assert d["fix"]["applicability"] == "safe"
    assert d["path"] == d["filename"] == str(p)


def test_json_clean_is_empty_list(tmp_path):
    p = write(tmp_path, "ok.py", GOOD)
    res = run_ampfix("check", p, "--output-format", "json")
    assert res.returncode == 0 and json.loads(res.stdout) == []


def test_select_and_ignore(tmp_path):
    p = write(tmp_path, "train.py", BAD_CLIP)
    assert run_ampfix("check", "--preview", p, "--select", "AMP001").returncode == 0
    assert run_ampfix("check", "--preview", p, "--select", "AMP00").returncode == 1
    assert run_ampfix("check", "--preview", p, "--ignore", "AMP003").returncode == 0
    assert run_ampfix("check", "--preview", p, "--select", "AMP001,AMP003").returncode == 1


def test_unknown_select_code_is_a_clear_usage_error(tmp_path):
    p = write(tmp_path, "train.py", BAD_CLIP)
    res = run_ampfix("check", p, "--select", "AMP999")
    stdout, stderr = out(res)
    assert res.returncode == 2
    assert "unknown rule code or prefix 'AMP999'" in stderr
    assert "Traceback" not in stderr


def test_statistics(tmp_path):
    write(tmp_path, "a.py", BAD_CLIP)
    write(tmp_path, "b.py", BAD_CLIP)
    res = run_ampfix("check", "--preview", tmp_path, "--statistics")
    assert res.returncode == 1
    assert re.search(r"^\s*2\tAMP003\t\[\*\] clip-scaled-gradients$", out(res)[0], re.M)


def test_stdin(tmp_path):
    res = run_ampfix("check", "--preview", "-", "--stdin-filename", "train.py", input=BAD_CLIP.encode())
    assert res.returncode == 1
    assert out(res)[0].startswith("train.py:6:5: AMP003")
    res = run_ampfix("rewrite", "--preview", "-", input=BAD_CLIP.encode())
    assert res.returncode == 0
    assert res.stdout.decode() == FIXED_CLIP


def test_noqa(tmp_path):
    line = "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)"
    for comment, expected in (("  # noqa: AMP003", 0), ("  # noqa", 0), ("  # noqa: AMP001", 1),
                              ("  # NOQA:AMP003,AMP001", 0), ("  # noqa: AMP0", 0)):
        p = write(tmp_path, "train.py", BAD_CLIP.replace(line, line + comment))
        res = run_ampfix("check", "--preview", p)
        assert res.returncode == expected, (comment, out(res))
    # a noqa'd finding is not fixed either
    p = write(tmp_path, "train.py", BAD_CLIP.replace(line, line + "  # noqa: AMP003"))
    before = p.read_bytes()
    assert run_ampfix("rewrite", "--preview", p).returncode == 0
    assert p.read_bytes() == before


def test_syntax_error_among_good_files(tmp_path):
    write(tmp_path, "a_bad.py", BAD_CLIP)
    write(tmp_path, "b_broken.py", "import torch\nwith torch.autocast('cuda'):\n    x = (1,\n    x.backward()\n")
    write(tmp_path, "c_ok.py", GOOD)
    res = run_ampfix("check", "--preview", tmp_path)
    stdout, stderr = out(res)
    assert res.returncode == 2
    assert "Traceback" not in stderr
    assert re.search(r"b_broken\.py:\d+:\d+: error: syntax error", stderr), stderr
    assert "a_bad.py:6:5: AMP003" in stdout  # the other files were still checked


def test_undecodable_file(tmp_path):
    write(tmp_path, "latin.py", b"import torch\nx = 'caf\xe9'\nwith torch.autocast('cuda'):\n    pass\n")
    res = run_ampfix("check", tmp_path / "latin.py")
    stdout, stderr = out(res)
    assert res.returncode == 2
    assert "latin.py:2: error: cannot decode as utf-8" in stderr
    assert "Traceback" not in stderr


def test_missing_path(tmp_path):
    res = run_ampfix("check", tmp_path / "nope.py")
    assert res.returncode == 2
    assert "nope.py: error: no such file or directory" in out(res)[1]


def test_discovery_skips_venv_build_and_gitignored(tmp_path):
    write(tmp_path, "pkg/train.py", BAD_CLIP)
    write(tmp_path, "build/lib/train.py", BAD_CLIP)
    write(tmp_path, ".venv/lib/train.py", BAD_CLIP)
    write(tmp_path, "env/pyvenv.cfg", "home = /usr\n")
    write(tmp_path, "env/lib/train.py", BAD_CLIP)
    write(tmp_path, "lib/site-packages/x/train.py", BAD_CLIP)
    write(tmp_path, "generated/train.py", BAD_CLIP)
    write(tmp_path, "scratch_train.py", BAD_CLIP)
    write(tmp_path, "keep/scratch_keep.py", BAD_CLIP)
    write(tmp_path, ".gitignore", "generated/\nscratch_*.py\n!scratch_keep.py\n")
    (tmp_path / ".git").mkdir()
    res = run_ampfix("check", "--preview", tmp_path, "--output-format", "json")
    paths = sorted(os.path.relpath(d["path"], tmp_path) for d in json.loads(res.stdout))
    assert paths == ["keep/scratch_keep.py", "pkg/train.py"]
    # a file named explicitly is checked even if ignored (as ruff does) ...
    assert run_ampfix("check", "--preview", tmp_path / "scratch_train.py").returncode == 1


def test_config_in_pyproject(tmp_path):
    write(tmp_path, "pyproject.toml", textwrap.dedent(
        """\
        [tool.ampfix]
        ignore = ["AMP004"]
        exclude = ["legacy"]
        per-file-ignores = { "tests/*" = ["AMP003"] }
        min-torch-version = "2.1"
        preview = true
        """))
    write(tmp_path, "src/train.py", BAD_CLIP)
    write(tmp_path, "tests/test_train.py", BAD_CLIP)
    write(tmp_path, "legacy/old.py", BAD_CLIP)
    res = run_ampfix("check", tmp_path, "--output-format", "json")
    paths = [os.path.relpath(d["path"], tmp_path) for d in json.loads(res.stdout)]
    assert paths == ["src/train.py"]
    # run from a subfolder: the nearest pyproject.toml still applies
    res = run_ampfix("check", ".", cwd=tmp_path / "tests")
    assert res.returncode == 0, out(res)
    # --force-exclude (pre-commit passes file names) applies `exclude` to named files
    assert run_ampfix("check", tmp_path / "legacy" / "old.py").returncode == 1
    assert run_ampfix("check", "--force-exclude", tmp_path / "legacy" / "old.py").returncode == 0


@pytest.mark.parametrize("body,message", [
    ("[tool.ampfix]\nselect = [\"AMP777\"]\n", "unknown rule code or prefix 'AMP777'"),
    ("[tool.ampfix]\nselekt = [\"AMP001\"]\n", "unknown key(s) in [tool.ampfix]: selekt"),
    ("[tool.ampfix\n", "invalid TOML"),
    ("[tool.ampfix]\nmin-torch-version = \"two\"\n", "min-torch-version must look like"),
])
def test_bad_config_is_a_clear_error(tmp_path, body, message):
    write(tmp_path, "pyproject.toml", body)
    write(tmp_path, "train.py", BAD_CLIP)
    res = run_ampfix("check", tmp_path)
    assert res.returncode == 2
    assert message in out(res)[1]
    assert "Traceback" not in out(res)[1]


# --------------------------------------------------------------------------- rewrite


def test_rewrite_diff_writes_nothing(tmp_path):
    p = write(tmp_path, "train.py", BAD_CLIP)
    res = run_ampfix("rewrite", "--preview", "--diff", p)
    stdout, _ = out(res)
    assert res.returncode == 1
    assert "+    scaler.unscale_(optimizer)" in stdout
    assert stdout.count("\n+") == 2  # the +++ header and one added line
    assert p.read_text() == BAD_CLIP
    clean = write(tmp_path, "ok.py", GOOD)
    assert run_ampfix("rewrite", "--diff", clean).returncode == 0


def test_rewrite_in_place_and_idempotent(tmp_path):
    p = write(tmp_path, "train.py", BAD_CLIP)
    os.chmod(p, 0o754)
    res = run_ampfix("rewrite", "--preview", p)
    stdout, stderr = out(res)
    assert res.returncode == 0, stdout + stderr
    assert "Fixed 1 finding in 1 file" in stdout
    assert "     1  AMP003  clip-scaled-gradients" in stdout  # per rule, then what was done
    assert "Found 1 finding (1 fixed, 0 remaining)." in stdout
    assert p.read_text() == FIXED_CLIP
    assert stat.S_IMODE(p.stat().st_mode) == 0o754
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
    res = run_ampfix("rewrite", "--preview", p)
    assert res.returncode == 0 and "Nothing to fix." in out(res)[0]
    assert p.read_text() == FIXED_CLIP
    assert run_ampfix("check", "--preview", p).returncode == 0


def test_rewrite_exit_non_zero_on_fix(tmp_path):
    p = write(tmp_path, "train.py", BAD_CLIP)
    assert run_ampfix("rewrite", "--preview", "--exit-non-zero-on-fix", p).returncode == 1
    assert run_ampfix("rewrite", "--preview", "--exit-non-zero-on-fix", p).returncode == 0


def test_rewrite_reports_remaining_unfixable(tmp_path):
    src = FIXTURES / "rules" / "AMP003" / "bad_ambiguous.py"
    p = write(tmp_path, "amb.py", src.read_text())
    res = run_ampfix("rewrite", "--preview", p)
    stdout, _ = out(res)
    assert res.returncode == 1
    assert "2 findings remaining" in stdout
    assert "Nothing to fix." in stdout and "Found 2 findings (0 fixed, 2 remaining)." in stdout
    assert p.read_text() == src.read_text()


def test_unsafe_fixes_only_on_request(tmp_path):
    src = (FIXTURES / "rules" / "AMP001" / "bad_unsafe.py").read_text()
    p = write(tmp_path, "t.py", src)
    # AMP001's golden: the file also trains float16 unscaled (AMP017, whose fix adds a GradScaler)
    res = run_ampfix("rewrite", p, "--select", "AMP001")
    assert res.returncode == 1
    assert p.read_text() == src
    assert "fixable with `--unsafe-fixes`" in out(res)[0]
    run_ampfix("rewrite", "--unsafe-fixes", "--select", "AMP001", p)
    assert p.read_text() == (FIXTURES / "rules" / "AMP001" / "bad_unsafe.unsafe.py").read_text()


def test_rewrite_keeps_crlf(tmp_path):
    p = write(tmp_path, "crlf.py", BAD_CLIP.replace("\n", "\r\n"))
    assert run_ampfix("rewrite", "--preview", p).returncode == 0
    assert p.read_bytes() == FIXED_CLIP.replace("\n", "\r\n").encode()


def test_rewrite_keeps_encoding_cookie_and_bom(tmp_path):
    latin = ("# -*- coding: latin-1 -*-\n# caf\u00e9\n" + BAD_CLIP).encode("latin-1")
    p = write(tmp_path, "latin.py", latin)
    assert run_ampfix("rewrite", "--preview", p).returncode == 0
    assert p.read_bytes() == ("# -*- coding: latin-1 -*-\n# caf\u00e9\n" + FIXED_CLIP).encode("latin-1")
    bom = b"\xef\xbb\xbf" + ("# \u00fcber\n" + BAD_CLIP).encode()
    q = write(tmp_path, "bom.py", bom)
    assert run_ampfix("rewrite", "--preview", q).returncode == 0
    assert q.read_bytes() == b"\xef\xbb\xbf" + ("# \u00fcber\n" + FIXED_CLIP).encode()


def test_rewrite_changes_only_fixed_statements(tmp_path):
    """Odd formatting elsewhere in the file survives byte for byte."""
    messy = "import torch   # keep  this\n\n\nx = [1,\n     2]  ;  y = (3 , 4)\n" + BAD_CLIP.split("\n", 1)[1]
    p = write(tmp_path, "messy.py", messy)
    assert run_ampfix("rewrite", "--preview", p).returncode == 0
    new = p.read_text()
    assert new == messy.replace("    torch.nn.utils.clip_grad_norm_",
                                "    scaler.unscale_(optimizer)\n    torch.nn.utils.clip_grad_norm_")


def test_rewrite_syntax_error_leaves_file_and_continues(tmp_path):
    broken = write(tmp_path, "broken.py", "import torch\ndef f(:\n    torch.autocast('cuda').backward()\n")
    p = write(tmp_path, "train.py", BAD_CLIP)
    res = run_ampfix("rewrite", "--preview", tmp_path)
    assert res.returncode == 2
    assert "broken.py:2" in out(res)[1]
    assert p.read_text() == FIXED_CLIP
    assert broken.read_text().startswith("import torch\ndef f(:")


def test_files_without_triggers_are_not_parsed(tmp_path):
    """By design a file that cannot contain any finding is not parsed (speed): its syntax
    errors are left to the Python tooling that owns them."""
    write(tmp_path, "plain.py", "def f(:\n    pass\n")
    res = run_ampfix("check", tmp_path / "plain.py")
    assert res.returncode == 0, out(res)


# --------------------------------------------------------------------------- rules / explain


def test_rules_and_explain():
    from ampfix.engine.registry import all_rules

    res = run_ampfix("rules")
    assert res.returncode == 0
    listed = re.findall(r"^(AMP\d{3})\s", out(res)[0], re.M)
    assert listed == list(all_rules())
    for code, rule in all_rules().items():
        res = run_ampfix("explain", code)
        text = out(res)[0]
        assert res.returncode == 0
        assert text.startswith(f"# {code} {rule.name}")
        assert "Bad:" in text and "Good:" in text and "```python" in text
    res = run_ampfix("explain", "AMP999")
    assert res.returncode == 2 and "unknown rule" in out(res)[1]


def test_version_and_help():
    res = run_ampfix("--version")
    assert res.returncode == 0 and "ampfix" in out(res)[0]
    res = run_ampfix("check", "--help")
    assert res.returncode == 0 and "--output-format" in out(res)[0]


def test_check_does_not_import_torch(tmp_path):
    """`ampfix check` works without torch: run it with torch made unimportable."""
    blocker = write(tmp_path, "blocker/torch/__init__.py", "raise ImportError('torch is blocked for this test')\n")
    p = write(tmp_path, "train.py", BAD_CLIP)
    res = run_ampfix("check", "--preview", p, env={"PYTHONPATH": str(blocker.parent.parent)})
    assert res.returncode == 1, out(res)
    assert "AMP003" in out(res)[0]
    res = run_ampfix("rewrite", "--preview", p, env={"PYTHONPATH": str(blocker.parent.parent)})
    assert res.returncode == 0, out(res)
