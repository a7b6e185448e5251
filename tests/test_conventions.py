"""ruff's conventions as a user of ruff expects them, each through the real CLI (a subprocess)
and, for the machine formats, read by a real consumer: json / json-lines parsed, SARIF by
sarif-tools, GitHub workflow commands by the Actions runner's own parsing rules
(tests/gh_commands.py)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import gh_commands
from conftest import ROOT, run_ampfix
from test_cli import BAD_CLIP, GOOD, out, write
from test_reporters import _sarif_tool

from ampfix import REPOSITORY, rule_url

# a file with a trigger (so it is parsed) and a syntax error on line 3, column 7
BROKEN = "import torch\nscaler = torch.cuda.amp.GradScaler()\ndef f(:\n    pass\n"


def _tree(tmp_path):
    write(tmp_path, "train.py", BAD_CLIP)
    write(tmp_path, "broken.py", BROKEN)
    return tmp_path


# ----------------------------------------------------------------------------- input errors in every format


def test_errors_in_json_and_json_lines(tmp_path):
    _tree(tmp_path)
    res = run_ampfix("check", "--preview", ".", "missing.py", "--output-format", "json", cwd=tmp_path)
    assert res.returncode == 2
    objects = json.loads(res.stdout)
    errors = [o for o in objects if o["type"] == "error"]
    findings = [o for o in objects if o["type"] == "finding"]
    assert [f["code"] for f in findings] == ["AMP003"]
    by_file = {e["filename"]: e for e in errors}
    # a syntax error in ruff's shape: code invalid-syntax, location row/column, no fix, no url
    syntax = by_file["broken.py"]
    assert syntax["code"] == "invalid-syntax" and syntax["location"] == {"row": 3, "column": 7}
    assert syntax["fix"] is None and syntax["url"] is None and syntax["message"].startswith("syntax error")
    assert (syntax["line"], syntax["column"]) == (3, 7)
    missing = by_file["missing.py"]
    assert missing["code"] == "io-error" and missing["location"] is None
    assert missing["message"] == "no such file or directory"
    # json-lines: the same objects, one per line
    res = run_ampfix("check", "--preview", ".", "missing.py", "--output-format", "json-lines", cwd=tmp_path)
    assert res.returncode == 2
    assert [json.loads(line) for line in res.stdout.decode().splitlines()] == objects
    # rewrite reports its errors the same way
    res = run_ampfix("rewrite", "--preview", ".", "--output-format", "json", cwd=tmp_path)
    assert res.returncode == 2
    assert [o["code"] for o in json.loads(res.stdout)] == ["invalid-syntax"]


def test_errors_in_sarif_as_tool_execution_notifications(tmp_path):
    sarif = _sarif_tool()
    _tree(tmp_path)
    report = tmp_path / "ampfix.sarif"
    res = run_ampfix("check", "--preview", ".", "--output-format", "sarif", "-o", report, cwd=tmp_path)
    assert res.returncode == 2
    log = json.loads(report.read_text())
    (invocation,) = log["runs"][0]["invocations"]
    assert invocation["executionSuccessful"] is False
    (note,) = invocation["toolExecutionNotifications"]
    assert note["level"] == "error" and note["descriptor"]["id"] == "invalid-syntax"
    loc = note["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"]["uri"] == "broken.py"
    assert (loc["region"]["startLine"], loc["region"]["startColumn"]) == (3, 7)
    assert note["message"]["text"] == "broken.py:3:7: error: syntax error: invalid syntax"
    # a real consumer still reads the log: the finding is a result, the error is not
    res = subprocess.run([sarif, "summary", str(report)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "error: 1" in res.stdout and "AMP003" in res.stdout
    # a clean run says its execution succeeded
    clean = tmp_path / "clean"
    write(clean, "ok.py", GOOD)
    res = run_ampfix("check", ".", "--output-format", "sarif", cwd=clean)
    assert res.returncode == 0
    assert json.loads(res.stdout)["runs"][0]["invocations"] == [
        {"executionSuccessful": True, "toolExecutionNotifications": []}]


def test_errors_in_github_annotations(tmp_path):
    _tree(tmp_path)
    write(tmp_path, "big.py", BAD_CLIP + "# " + "x" * 400 + "\n")
    res = run_ampfix("check", "--preview", ".", "--output-format", "github", "--max-file-size", "300", cwd=tmp_path)
    assert res.returncode == 2
    commands = [gh_commands.parse(line) for line in res.stdout.decode().splitlines()]
    assert None not in commands, res.stdout
    by_file = {c.properties["file"]: c for c in commands}
    error = by_file["broken.py"]
    assert error.name == "error" and error.properties["title"] == "ampfix (invalid-syntax)"
    assert (error.properties["line"], error.properties["col"]) == ("3", "7")
    assert error.data == "broken.py:3:7: error: syntax error: invalid syntax"
    skipped = by_file["big.py"]
    assert skipped.name == "warning" and "over max-file-size" in skipped.data
    finding = by_file["train.py"]
    assert finding.name == "error" and finding.properties["title"] == "ampfix (AMP003)"
    assert finding.properties["line"] == "6" and finding.data.startswith("train.py:6:5: AMP003 ")


def test_github_commands_escape_what_the_runner_unescapes(tmp_path):
    name = "odd, name: 100%.py"
    write(tmp_path, name, BROKEN)
    res = run_ampfix("check", name, "--output-format", "github", cwd=tmp_path)
    (command,) = [gh_commands.parse(line) for line in res.stdout.decode().splitlines()]
    assert command.properties["file"] == name
    assert command.data == f"{name}:3:7: error: syntax error: invalid syntax"


# ----------------------------------------------------------------------------- ruff's json: url and fix edits


def _apply(text, edits):
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(loc):
        return starts[loc["row"] - 1] + loc["column"] - 1

    for e in sorted(edits, key=lambda e: (e["location"]["row"], e["location"]["column"]), reverse=True):
        text = text[:offset(e["location"])] + e["content"] + text[offset(e["end_location"]):]
    return text


@pytest.mark.parametrize("fixture", ["AMP003/bad_clip.py", "AMP101/bad_qualified.py", "AMP006/bad_loop.py"])
def test_json_fix_edits_fix_the_finding(tmp_path, fixture):
    from ampfix.engine.registry import all_rules

    preview = ("--preview",) if all_rules()[fixture.split("/")[0]].in_preview() else ()  # AMP003 is one
    p = write(tmp_path, "t.py", (ROOT / "fixtures" / "rules" / fixture).read_text())
    (finding, *_) = [o for o in json.loads(run_ampfix("check", *preview, p, "--output-format", "json").stdout)
                     if o["fix"] and o["fix"]["applicability"] == "safe"]
    assert finding["fix"]["message"] and finding["fix"]["edits"]
    assert finding["url"] == rule_url(finding["code"])
    # the finding's own edits, applied alone, give a file that parses and no longer has that finding
    fixed_alone = _apply(p.read_text(), finding["fix"]["edits"])
    compile(fixed_alone, "t.py", "exec")
    q = write(tmp_path, "alone.py", fixed_alone)
    left = json.loads(run_ampfix("check", *preview, q, "--output-format", "json").stdout)
    assert (finding["code"], finding["line"]) not in {(o["code"], o["line"]) for o in left}


def test_every_rule_url_points_at_its_page_in_the_repository():
    from ampfix.engine.registry import all_rules

    res = run_ampfix("explain", "AMP003")
    for code in all_rules():
        url = rule_url(code)
        assert url.startswith(REPOSITORY + "/blob/main/")
        page = ROOT / url[len(REPOSITORY + "/blob/main/"):]
        assert page.is_file(), f"{url}: no {page.relative_to(ROOT)}"
        # the page is the rule's `ampfix explain` text (regenerate: ampfix explain CODE > rules/docs/CODE.md)
        text = run_ampfix("explain", code).stdout.decode() if code != "AMP003" else res.stdout.decode()
        assert page.read_text() == text, f"rules/docs/{code}.md is stale: ampfix explain {code} > rules/docs/{code}.md"
    assert sorted(p.stem for p in (ROOT / "rules" / "docs").glob("*.md")) == sorted(all_rules())


def test_sarif_rules_link_their_pages(tmp_path):
    write(tmp_path, "train.py", BAD_CLIP)
    log = json.loads(run_ampfix("check", "--preview", ".", "--output-format", "sarif", cwd=tmp_path).stdout)
    rules = log["runs"][0]["tool"]["driver"]["rules"]
    assert "AMP003" in [r["id"] for r in rules]
    assert all(r["helpUri"] == rule_url(r["id"]) for r in rules)


def test_statistics_as_json(tmp_path):
    write(tmp_path, "a.py", BAD_CLIP)
    write(tmp_path, "b.py", BAD_CLIP)
    write(tmp_path, "c.py", "import torch\nscaler = torch.cuda.amp.GradScaler()\n")
    res = run_ampfix("check", "--preview", ".", "--statistics", "--output-format", "json", cwd=tmp_path)
    assert res.returncode == 1
    stats = json.loads(res.stdout)
    assert stats[0] == {"code": "AMP003", "name": "clip-scaled-gradients", "count": 2, "fixable": True,
                        "fixable_count": 2}
    assert [s["code"] for s in stats] == ["AMP003", "AMP101"]
    lines = run_ampfix("check", "--preview", ".", "--statistics", "--output-format", "json-lines",
                       cwd=tmp_path).stdout
    assert [json.loads(x) for x in lines.decode().splitlines()] == stats
    text = out(run_ampfix("check", "--preview", ".", "--statistics", cwd=tmp_path))[0]
    assert text.splitlines()[0].split() == ["2", "AMP003", "[*]", "clip-scaled-gradients"]
    res = run_ampfix("check", ".", "--statistics", "--output-format", "sarif", cwd=tmp_path)
    assert res.returncode == 2 and b"--statistics" in res.stderr


# ----------------------------------------------------------------------------- ruff's spellings


# AMP011: a model cast with `.half()` under autocast and a GradScaler; the fix (remove the cast) is unsafe
UNSAFE_ONLY = (ROOT / "fixtures" / "rules" / "AMP011" / "bad_script.py").read_text()
UNSAFE_FIXED = (ROOT / "fixtures" / "rules" / "AMP011" / "bad_script.unsafe.py").read_text()


def test_check_fix_is_rewrite(tmp_path):
    a = write(tmp_path / "a", "train.py", BAD_CLIP)
    b = write(tmp_path / "b", "train.py", BAD_CLIP)
    res_check = run_ampfix("check", "--preview", "--fix", "train.py", cwd=a.parent)
    res_rewrite = run_ampfix("rewrite", "--preview", "train.py", cwd=b.parent)
    assert res_check.returncode == res_rewrite.returncode == 0
    assert a.read_text() == b.read_text() != BAD_CLIP
    assert res_check.stdout == res_rewrite.stdout
    assert "Fixed 1 finding in 1 file:" in out(res_check)[0]
    # --diff shows, writes nothing, exits 1 when something would change
    c = write(tmp_path / "c", "train.py", BAD_CLIP)
    res = run_ampfix("check", "--preview", "--diff", "train.py", cwd=c.parent)
    assert res.returncode == 1 and c.read_text() == BAD_CLIP and "+    scaler.unscale_(optimizer)" in out(res)[0]
    # findings left: exit 1 (0 with --exit-zero); --exit-non-zero-on-fix
    d = write(tmp_path / "d", "train.py", UNSAFE_ONLY)
    res = run_ampfix("check", "--fix", "train.py", cwd=d.parent)
    assert res.returncode == 1 and "AMP011" in out(res)[0] and "fixable with `--unsafe-fixes`" in out(res)[0]
    assert run_ampfix("check", "--fix", "--exit-zero", "train.py", cwd=d.parent).returncode == 0
    e = write(tmp_path / "e", "train.py", BAD_CLIP)
    assert run_ampfix("check", "--preview", "--fix", "--exit-non-zero-on-fix", "train.py",
                      cwd=e.parent).returncode == 1


def test_unsafe_fixes_one_name_for_check_rewrite_and_verify(tmp_path):
    a = write(tmp_path / "a", "train.py", UNSAFE_ONLY)
    b = write(tmp_path / "b", "train.py", UNSAFE_ONLY)
    res = run_ampfix("check", "train.py", "--unsafe-fixes", cwd=a.parent)
    assert "fixable with `ampfix check --fix --unsafe-fixes`" in out(res)[0]
    assert run_ampfix("check", "--fix", "--unsafe-fixes", "train.py", cwd=a.parent).returncode == 0
    assert run_ampfix("rewrite", "--unsafe-fixes", "train.py", cwd=b.parent).returncode == 0
    assert a.read_text() == b.read_text() == UNSAFE_FIXED
    for command in ("check", "rewrite", "verify"):
        help_text = run_ampfix(command, "--help").stdout.decode()
        assert "--unsafe-fixes" in help_text, command
    assert "--unsafe " not in run_ampfix("verify", "--help").stdout.decode()  # the old name is hidden


def test_extend_select_and_select_all(tmp_path):
    stale = BAD_CLIP.replace("scaler.update()", "scaler.update()  # noqa: AMP001")
    write(tmp_path, "train.py", stale)

    def codes(*args, cwd=tmp_path, preview=True):
        # AMP003, the example, is a preview rule: preview on, unless the assertion says otherwise
        res = run_ampfix("check", "train.py", "--output-format", "json", *(["--preview"] if preview else []), *args,
                         cwd=cwd)
        return sorted(o["code"] for o in json.loads(res.stdout))

    # without preview AMP003 runs under no selection, ALL and prefixes included
    assert codes(preview=False) == []
    assert codes("--extend-select", "AMP901", preview=False) == ["AMP901"]
    assert codes("--select", "ALL", preview=False) == ["AMP901"]
    assert codes("--select", "AMP", preview=False) == []
    assert codes() == ["AMP003"]  # AMP901 is off by default
    assert codes("--extend-select", "AMP901") == ["AMP003", "AMP901"]
    assert codes("--select", "ALL") == ["AMP003", "AMP901"]  # ALL is every rule, as ruff's
    assert codes("--select", "AMP") == ["AMP003"]  # a prefix: the rules on by default
    assert codes("--select", "AMP9") == []
    assert codes("--select", "AMP003,AMP001", "--extend-select", "AMP901") == ["AMP003", "AMP901"]
    # (AMP901 judges `# noqa: AMP001` only when AMP001, a default rule, runs)
    assert codes("--select", "AMP003", "--extend-select", "AMP901") == ["AMP003"]
    # in the configuration; --select replaces select and extend-select, --extend-select adds
    write(tmp_path, "pyproject.toml", '[tool.ampfix]\nextend-select = ["AMP901"]\n')
    assert codes() == ["AMP003", "AMP901"]
    assert codes("--select", "AMP003") == ["AMP003"]
    write(tmp_path, "pyproject.toml", '[tool.ampfix]\nselect = ["AMP1"]\n')
    assert codes("--extend-select", "AMP003") == ["AMP003"]
    res = run_ampfix("check", "train.py", "--extend-select", "XYZ", cwd=tmp_path)
    assert res.returncode == 2 and b"--extend-select: unknown rule code or prefix 'XYZ'" in res.stderr


def test_show_settings_prints_the_resolved_selection(tmp_path):
    write(tmp_path, "train.py", BAD_CLIP)
    write(tmp_path, "pyproject.toml", '[tool.ampfix]\nignore = ["AMP1"]\nextend-exclude = ["legacy"]\n'
                                      'min-torch-version = "2.1"\n')
    res = run_ampfix("check", "--show-settings", "--output-format", "json", "--extend-select", "AMP901", ".",
                     cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    settings = json.loads(res.stdout)
    from ampfix.engine.registry import all_rules

    assert settings["rules"] == [c for c, r in all_rules().items()
                                 if not c.startswith("AMP1") and not r.in_preview()]  # AMP901 included
    assert settings["config-file"] == str(tmp_path / "pyproject.toml")
    assert settings["exclude"] == ["legacy"] and settings["min-torch-version"] == "2.1"
    assert settings["files"] == 1
    text = out(run_ampfix("check", "--show-settings", ".", cwd=tmp_path))[0]
    assert '    "AMP001",  # backward-in-autocast' in text and '"AMP101"' not in text
    assert '"AMP003"' not in text  # a preview rule: only with preview on
    text = out(run_ampfix("check", "--show-settings", "--preview", ".", cwd=tmp_path))[0]
    assert '    "AMP003",  # clip-scaled-gradients' in text and '"AMP101"' not in text
    assert out(run_ampfix("check", "--show-files", ".", cwd=tmp_path))[0] == "train.py\n"


def test_select_all_is_documented_with_amp901():
    readme = (ROOT / "README.md").read_text()
    assert "--select ALL" in readme and "AMP901" in readme
    section = readme[readme.index("--select ALL"):][:600]
    assert "AMP901" in section


# ----------------------------------------------------------------------------- verify


@pytest.fixture
def torch_available():
    pytest.importorskip("torch")


def test_verify_lists_fixes_total_time_and_user_tracebacks(tmp_path, torch_available):
    src = (ROOT / "fixtures" / "train" / "buggy_clip_scaled.py").read_text().splitlines(keepends=True)
    clip = next(i for i, line in enumerate(src) if "torch.nn.utils.clip_grad_norm_(" in line)
    # a script that raises a few steps in, below the line the fix inserts a statement above
    # (a call that raises, not a `raise` statement: a path that leaves the loop without
    # `scaler.update()` makes AMP003's fix refuse itself)
    src.insert(clip + 1, "    if step == 3:\n        boom = {}['boom at step 3']\n")
    script = write(tmp_path, "boom.py", "".join(src))
    raise_line = clip + 3  # 1-based line of the raise in the user's file
    res = run_ampfix("verify", "--preview", script, "--steps", "10", "--warmup", "2", "--reps", "1", "--threads",
                     "1", "--yes", "--unsafe")
    stdout, stderr = out(res)
    assert res.returncode == 2
    assert "--unsafe is deprecated, use --unsafe-fixes" in stderr
    assert f'File "{script}", line {raise_line}, in <module>' in stderr, stderr
    assert "ampfix-verify-" not in stderr  # no temporary path
    # a run that completes lists the fixes and the total time
    res = run_ampfix("verify", "--preview", ROOT / "fixtures" / "train" / "buggy_clip_scaled.py", "--steps", "20",
                     "--warmup", "2", "--reps", "1", "--threads", "1", "--yes")
    stdout, stderr = out(res)
    assert res.returncode in (0, 1), stderr
    assert (f"fix: AMP003 clip-scaled-gradients (line {clip + 1}): scaler.unscale_(optimizer) inserted before "
            "clipping") in stdout
    assert re.search(r"^total time: \d+\.\d s \(4 runs\)$", stdout, re.MULTILINE), stdout


def test_verify_relabels_lines_the_fix_added():
    from ampfix.verify.command import line_map, relabeller

    original = "a = 1\nb = 2\nc = 3\n"
    fixed = "a = 1\nadded()\nb = 2\nc = 3\n"
    lines = line_map(original, fixed)
    assert lines == {1: 1, 2: ("added", 2), 3: 2, 4: 3}
    relabel = relabeller("/tmp/x/fixed/t.py", "/home/u/t.py", lines)
    text = ('  File "/tmp/x/fixed/t.py", line 4, in <module>\n  File "/tmp/x/fixed/t.py", line 2, in f\n'
            "/tmp/x/fixed/t.py:3: UserWarning: w\n")
    assert relabel(text) == ('  File "/home/u/t.py", line 3, in <module>\n'
                             '  File "/home/u/t.py", line 2, in f (a line ampfix\'s fix added before this one; '
                             'line 2 of the fixed copy)\n/home/u/t.py:2: UserWarning: w\n')


# ----------------------------------------------------------------------------- options and edges


def test_stdin_filename_without_dash_is_a_usage_error(tmp_path):
    write(tmp_path, "train.py", BAD_CLIP)
    res = run_ampfix("check", "--stdin-filename", "train.py", "train.py", cwd=tmp_path, input=BAD_CLIP.encode())
    assert res.returncode == 2 and b"add `-` to the paths" in res.stderr
    res = run_ampfix("check", "--stdin-filename", "train.py", cwd=tmp_path, input=BAD_CLIP.encode())
    assert res.returncode == 2
    res = run_ampfix("check", "--preview", "--stdin-filename", "train.py", "-", cwd=tmp_path,
                     input=BAD_CLIP.encode())
    assert res.returncode == 1 and out(res)[0].startswith("train.py:6:5: AMP003")


def test_force_exclude_applies_to_stdin_filename(tmp_path):
    write(tmp_path, "pyproject.toml", '[tool.ampfix]\nexclude = ["legacy"]\npreview = true\n')  # AMP003 runs
    args = ("--stdin-filename", "legacy/train.py", "-")
    res = run_ampfix("check", *args, cwd=tmp_path, input=BAD_CLIP.encode())
    assert res.returncode == 1  # named on the command line: checked unless --force-exclude
    res = run_ampfix("check", "--force-exclude", *args, cwd=tmp_path, input=BAD_CLIP.encode())
    assert res.returncode == 0 and "AMP003" not in out(res)[0] and "0 files checked" in out(res)[0]
    # rewrite passes the excluded code through unchanged (stdout carries the code)
    res = run_ampfix("rewrite", "--force-exclude", *args, cwd=tmp_path, input=BAD_CLIP.encode())
    assert res.returncode == 0 and res.stdout.decode() == BAD_CLIP
    res = run_ampfix("rewrite", *args, cwd=tmp_path, input=BAD_CLIP.encode())
    assert "scaler.unscale_(optimizer)" in res.stdout.decode()


def test_a_file_skipped_for_size_is_not_counted_as_checked(tmp_path):
    write(tmp_path, "ok.py", GOOD)
    write(tmp_path, "big.py", GOOD + "# " + "x" * 4000 + "\n")
    res = run_ampfix("check", ".", "--max-file-size", "1000", cwd=tmp_path)
    stdout, stderr = out(res)
    assert res.returncode == 0
    assert "All checks passed! (1 file checked)" in stdout
    assert "big.py: warning: skipped, not analysed" in stderr


def test_a_folder_with_no_python_file_gets_a_warning(tmp_path):
    write(tmp_path, "docs/index.md", "# docs\n")
    write(tmp_path, "src/ok.py", GOOD)
    res = run_ampfix("check", "docs", "src", cwd=tmp_path)
    stdout, stderr = out(res)
    assert res.returncode == 0 and "(1 file checked)" in stdout
    assert stderr.splitlines() == ["docs: warning: no Python files found under this folder (*.py, *.pyi, "
                                   "*.ipynb, after exclude and .gitignore)"]
    assert "src" not in stderr


@pytest.mark.parametrize("toml, expected", [
    ('[tool.ampfix]\nselect = ["AMP999"]\n', "pyproject.toml: select: unknown rule code or prefix 'AMP999'"),
    ('[tool.ampfix]\nextend-select = 3\n', "`extend-select` in [tool.ampfix] must be a list of strings"),
    ('[tool.ampfix]\nselcet = ["AMP003"]\n', "unknown key(s) in [tool.ampfix]: selcet"),
    ('[tool.ampfix]\nmin-torch-version = 2.1\n', "`min-torch-version` in [tool.ampfix] must be a string"),
    ('[tool.ampfix\n', "pyproject.toml: invalid TOML"),
])
def test_config_errors_are_one_line_naming_file_and_key(tmp_path, toml, expected):
    write(tmp_path, "pyproject.toml", toml)
    write(tmp_path, "train.py", BAD_CLIP)
    res = run_ampfix("check", ".", cwd=tmp_path)
    stderr = out(res)[1]
    assert res.returncode == 2
    (line,) = stderr.splitlines()
    assert line.startswith(f"error: {tmp_path / 'pyproject.toml'}") and expected in line, line
    assert "Usage:" not in stderr


def test_file_level_noqa_unknown_and_unused_codes(tmp_path):
    src = "# ampfix: noqa: AMP003, AMP101, AMP099\n" + BAD_CLIP
    p = write(tmp_path, "train.py", src)
    res = run_ampfix("check", "--preview", p, "--extend-select", "AMP901", "--output-format", "json")
    (finding,) = json.loads(res.stdout)
    assert (finding["code"], finding["line"]) == ("AMP901", 1)
    assert "`AMP101`" in finding["message"] and "`AMP099` names no ampfix rule" in finding["message"]
    assert "`AMP003`" not in finding["message"]  # it silences the clip
    res = run_ampfix("rewrite", "--preview", p, "--select", "ALL")
    assert res.returncode == 0
    assert p.read_text() == "# ampfix: noqa: AMP003\n" + BAD_CLIP
    # a code whose rule does not run is left alone (it may be needed by a run that selects it)
    p.write_text("# ampfix: noqa: AMP003, AMP101\n" + BAD_CLIP)
    res = run_ampfix("check", "--preview", p, "--select", "AMP0,AMP901")
    assert res.returncode == 0, out(res)


def test_broken_pipe_exits_quietly(tmp_path):
    for i in range(30):
        write(tmp_path, f"t{i}.py", BAD_CLIP)
    env = dict(os.environ, NO_COLOR="1")
    proc = subprocess.Popen([sys.executable, "-m", "ampfix", "check", "--preview", "--no-cache", "."], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.close()  # the reader went away before the report (`| head -0`)
    stderr = proc.stderr.read()
    assert proc.wait(timeout=300) == 1  # the run's own status: findings
    assert stderr == b"", stderr
    # as a shell runs it
    res = subprocess.run("set -o pipefail; python -m ampfix check --preview --no-cache . | head -1", shell=True,
                         executable="/bin/bash", cwd=tmp_path, capture_output=True, env=dict(
                             env, PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"), timeout=300)
    assert res.stderr == b"" and len(res.stdout.decode().splitlines()) == 1


# ----------------------------------------------------------------------------- notebooks


def test_ipython_only_cells_cost_only_themselves(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    from nbformat.v4 import new_code_cell, new_notebook

    cells = [
        new_code_cell("ls /content/checkpoints/"),
        new_code_cell("cat config.yaml"),
        new_code_cell("pip install torch==2.4"),
        new_code_cell("\n%%bash\nfor i in 1 2; do echo $i; done"),
        new_code_cell("%%javascript\nconsole.log('x');"),
        new_code_cell("import torch\nscaler = torch.amp.GradScaler('cuda')"),
        new_code_cell("scaler.scale(loss).backward()\ntorch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
                      "scaler.step(optimizer)\nscaler.update()"),
        new_code_cell("ls = 3"),  # Python, not the %ls magic
    ]
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    p = tmp_path / "tutorial.ipynb"
    p.write_text(nbformat.writes(nb) + "\n")
    for command in ("check", "rewrite"):
        q = tmp_path / f"{command}.ipynb"
        q.write_text(p.read_text())
        res = run_ampfix(command, "--preview", q)
        stdout, stderr = out(res)
        assert res.returncode != 2, stderr
        assert f"{q}:cell 1: note: skipped: `ls /content/checkpoints/` is an IPython command (automagic `%ls`)" \
            in stderr
        assert f"{q}:cell 3: note: skipped: `pip install torch==2.4`" in stderr
        assert f"{q}:cell 4: note: skipped: a `%%bash` cell" in stderr
        assert "cell 8" not in stderr
    assert run_ampfix("check", "--preview", tmp_path / "check.ipynb").returncode == 1  # the clip in cell 7 is found
    fixed = nbformat.read(tmp_path / "rewrite.ipynb", as_version=4)
    assert "scaler.unscale_(optimizer)" in fixed.cells[6].source
    assert [c.source for i, c in enumerate(fixed.cells) if i != 6] == [c.source for i, c in enumerate(cells) if i != 6]
    # a cell IPython rejects too is still an error
    nb.cells.append(new_code_cell("def broken(:\n    pass"))
    p.write_text(nbformat.writes(nb) + "\n")
    res = run_ampfix("check", p)
    assert res.returncode == 2 and re.search(rf"{re.escape(str(p))}:cell 9:1:\d+: error: syntax error", out(res)[1])


# ----------------------------------------------------------------------------- installing


def test_readme_installs_from_the_repository_and_the_tag():
    readme = (ROOT / "README.md").read_text()
    assert f'pip install "git+{REPOSITORY}"' in readme
    assert f'pip install "git+{REPOSITORY}@v0.2.0"' in readme
    assert f"  - repo: {REPOSITORY}\n    rev: v0.2.0\n" in readme
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in readme


def _readme_block(marker):
    readme = (ROOT / "README.md").read_text()
    start = readme.index(marker)
    return readme[start:readme.index("```", start)]


@pytest.fixture(scope="module")
def tagged(tmp_path_factory):
    """This repository's files as a git repository with the tag v0.2.0 (what the lead's
    release makes): (its folder, the git environment)."""
    import shutil

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    tmp_path = tmp_path_factory.mktemp("release")
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@e", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@e", PRE_COMMIT_HOME=str(tmp_path / "pre-commit-home"))
    upstream = tmp_path / "upstream"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.splitlines()
    for name in files:
        if (ROOT / name).is_file():
            (upstream / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, upstream / name)
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "release"],
                ["git", "tag", "v0.2.0"]):
        subprocess.run(cmd, cwd=upstream, env=env, check=True, capture_output=True)
    return upstream, env


def _offline(output: str) -> bool:
    return "Could not find a version" in output or "connection" in output.lower() or "No matching" in output


@pytest.mark.slow
def test_pip_install_from_the_tag(tagged, tmp_path):
    """`pip install "git+URL@v0.2.0"` as the README shows it, with the URL of a local copy."""
    upstream, env = tagged
    line = next(x for x in (ROOT / "README.md").read_text().splitlines() if "@v0.2.0" in x and "pip install" in x)
    spec = re.search(r'"(git\+[^"]+)"', line).group(1).replace(REPOSITORY, f"file://{upstream}")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    res = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", spec], capture_output=True,
                         text=True, env=env, timeout=900)
    if res.returncode != 0 and _offline(res.stderr):
        pytest.skip(f"no package index reachable: {res.stderr[-300:]}")
    assert res.returncode == 0, res.stderr
    p = write(tmp_path, "train.py", BAD_CLIP)
    res = subprocess.run([str(venv / "bin" / "ampfix"), "check", "--preview", str(p)], capture_output=True, text=True)
    assert res.returncode == 1 and "AMP003" in res.stdout, res.stderr


@pytest.mark.slow
def test_pre_commit_rev_from_a_tag(tagged, tmp_path):
    """The README's pre-commit configuration, with the repository as a local copy tagged
    v0.2.0: pre-commit installs the hook from the tag and runs it."""
    pytest.importorskip("pre_commit")
    upstream, env = tagged
    project = tmp_path / "project"
    project.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=project, env=env, check=True)
    config = _readme_block("# .pre-commit-config.yaml").replace(REPOSITORY, str(upstream))
    (project / ".pre-commit-config.yaml").write_text(config)
    (project / "train.py").write_text(BAD_CLIP)
    (project / "pyproject.toml").write_text("[tool.ampfix]\npreview = true\n")  # AMP003 is a preview rule
    subprocess.run(["git", "add", "-A"], cwd=project, env=env, check=True)
    res = subprocess.run([sys.executable, "-m", "pre_commit", "run", "ampfix", "--all-files"], cwd=project, env=env,
                         capture_output=True, text=True, timeout=900)
    if res.returncode != 1 and _offline(res.stdout):
        pytest.skip(f"no package index reachable: {res.stdout[-300:]}")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "train.py:6:5: AMP003" in res.stdout
