"""Issue 11, the check side: hostile and unusual inputs cost only themselves.

Every input is generated in a temporary folder and checked by the real CLI (a subprocess).
"""

from __future__ import annotations

import textwrap

import pytest

from tests.conftest import run_ampfix

TRAINER = textwrap.dedent("""\
    import torch

    def train(model, optimizer, loader):
        scaler = torch.amp.GradScaler("cuda")
        for x, y in loader:
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(x).sum()
            scaler.scale(loss).backward()
            optimizer.step()
            optimizer.zero_grad()
    """)  # AMP007 on `optimizer.step()` (line 9): a preview rule, so the runs pass --preview (preview=True)


def _tree(tmp_path, n_good=3, pad=0):
    """n_good files with one AMP007 finding each (padded with comment lines to `pad` bytes, so
    that the run is large enough for the process pool)."""
    for k in range(n_good):
        text = TRAINER + "".join(f"# padding line {i}\n" for i in range(pad // 20))
        (tmp_path / f"train_{k}.py").write_text(text)
    return tmp_path


def _deep_parens(n=2000):
    return TRAINER + "x = " + "(" * n + "1" + ")" * n + "\n"


def _lines(res):
    return res.stdout.decode().splitlines(), res.stderr.decode().splitlines()


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_native_parser_crash_costs_only_that_file(tmp_path, jobs):
    """The real segfault: 2000 nested parentheses crash LibCST's native parser. Run unguarded
    (AMPFIX_UNGUARDED=1: no large stack, no CPython pre-check) so that the crash happens, in a
    child process in a sequential run and in a pool worker with several workers."""
    _tree(tmp_path, n_good=6, pad=16_000)  # ~100 kB in all: the pool is used with -j2
    (tmp_path / "deep.py").write_text(_deep_parens())
    res = run_ampfix("check", "--preview", ".", "--jobs", jobs, cwd=tmp_path, env={"AMPFIX_UNGUARDED": "1"})
    out, err = _lines(res)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr.decode()
    assert err == ["deep.py: error: not analysed: the parser crashed on this file (SIGSEGV); "
                   "code nested very deeply is the usual cause"]
    assert sorted(line.split(":")[0] for line in out if "AMP007" in line) == [f"train_{k}.py" for k in range(6)]


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_deep_parentheses_are_a_syntax_error_not_a_crash(tmp_path, jobs):
    """Guarded (the default): CPython rejects > 200 nested brackets, and so does ampfix, with
    CPython's message, before LibCST's parser sees the file."""
    _tree(tmp_path, n_good=6, pad=16_000)
    (tmp_path / "deep.py").write_text(_deep_parens())
    res = run_ampfix("check", "--preview", ".", "-j", jobs, cwd=tmp_path)
    out, err = _lines(res)
    assert res.returncode == 2
    assert len(err) == 1 and err[0].startswith("deep.py:11:") and "too many nested parentheses" in err[0]
    assert sum("AMP007" in line for line in out) == 6


def test_valid_python_libcst_cannot_read_is_named_as_such(tmp_path):
    """funasr 1.4.16's `fsmn_kws/model.py`: a method body indented with two tabs and four spaces
    under a `def` indented with four spaces. CPython accepts it (tabs to 8 columns and to 1 agree
    on the nesting); LibCST's tokenizer does not, and put its error on line 1. It is not a
    syntax error: the message says so and names the mixed line; the other files are checked, in
    every output format."""
    _tree(tmp_path, n_good=2)
    mixed = TRAINER + "class Net:\n    def f(self):\n\t\t    return 1\n\n    def g(self):\n\t\t    return 2\n"
    compile(mixed, "mixed.py", "exec")  # (Python reads it)
    (tmp_path / "mixed.py").write_text(mixed)
    res = run_ampfix("check", "--preview", ".", "-j", "1", cwd=tmp_path)
    out, err = _lines(res)
    assert res.returncode == 2 and "Traceback" not in res.stderr.decode()
    assert err == ["mixed.py:13:1: error: not analysed: Python accepts this file, but LibCST, the parser ampfix reads "
                   "code with, does not (tokenizer error: no matching outer block for dedent; this line indents "
                   "with tabs and spaces mixed: indent it with spaces only)"]
    assert sorted(line.split(":")[0] for line in out if "AMP007" in line) == ["train_0.py", "train_1.py"]
    res = run_ampfix("check", "--preview", ".", "-j", "1", "--output-format", "json", cwd=tmp_path)
    import json
    errors = [e for e in json.loads(res.stdout) if e["type"] == "error"]
    assert [(e["filename"], e["code"], e["location"]["row"]) for e in errors] == [("mixed.py", "invalid-input", 13)]


def test_mixed_indentation_names_the_first_mixed_line():
    from ampfix.engine.analyze import mixed_indentation

    assert mixed_indentation("def f():\n    return 1\n") is None
    assert mixed_indentation("def f():\n\treturn 1\n") is None
    assert mixed_indentation("def f():\n\t    return 1\n") == 2  # both in one line
    assert mixed_indentation("def f():\n    x = 1\n\n\tif x:\n\t\treturn 1\n") == 4  # tabs after spaces
    assert mixed_indentation("def f():\n\tx = 1\n        return x\n") == 3  # spaces after tabs
    assert mixed_indentation("x = 1\n   \t\n") is None  # a blank line's whitespace


NESTED_320 = {
    "unary": lambda n: "x = " + "-" * n + "y",
    "not": lambda n: "x = " + "not " * n + "y",
    "binop": lambda n: "x = " + " + ".join(["y"] * n),
    "power": lambda n: "x = " + "**".join(["y"] * n),
    "attribute": lambda n: "x = y" + ".a" * n,
    "call": lambda n: "x = f" + "()" * n,
    "ifexp": lambda n: "x = " + "y if c else " * n + "z",
    "lambda": lambda n: "x = " + "lambda: " * n + "1",
    "brackets": lambda n: "x = " + "[(" * (n // 4) + "1" + ")]" * (n // 4),  # CPython allows < 200
}


def test_valid_code_nested_320_deep_is_analysed(tmp_path):
    for name, make in NESTED_320.items():
        (tmp_path / f"{name}.py").write_text(TRAINER + make(320) + "\n")
    res = run_ampfix("check", "--preview", ".", "-j", "1", "--select", "AMP007", cwd=tmp_path)
    out, err = _lines(res)
    assert err == []
    assert sorted(line.split(":")[0] for line in out if "AMP007" in line) == sorted(f"{n}.py" for n in NESTED_320)
    assert res.returncode == 1


def test_absurd_nesting_is_not_analysed_with_the_reason(tmp_path):
    """Nesting CPython itself cannot parse (20000 unary minus): "not analysed", quickly, and never
    called a syntax error."""
    _tree(tmp_path, n_good=2)
    (tmp_path / "absurd.py").write_text(TRAINER + "x = " + "-" * 20000 + "y\n")
    res = run_ampfix("check", "--preview", ".", cwd=tmp_path)
    out, err = _lines(res)
    assert res.returncode == 2
    assert len(err) == 1 and err[0].startswith("absurd.py: error: not analysed:") and "syntax" not in err[0]
    assert sum("AMP007" in line for line in out) == 2


# ----------------------------------------------------------------------------- configuration

DEEP_TOML = "[tool.ampfix]\nselect = " + "[" * 2000 + "]" * 2000 + "\n"


@pytest.mark.parametrize("toml, expected", [
    ('tool = "ampfix"\n', "`tool` must be a table"),
    ("[tool]\nampfix = 3\n", "[tool.ampfix] must be a table of settings, got an integer"),
    ("[tool.ampfix]\ncolour = 1\n", "unknown key(s) in [tool.ampfix]: colour"),
    ("[tool.ampfix]\nselect = 3\n", "`select` in [tool.ampfix] must be a list of strings, got an integer"),
    ("[tool.ampfix]\nper-file-ignores = 3\n", "`per-file-ignores` in [tool.ampfix] must be a table"),
    ("[tool.ampfix]\nmin-torch-version = 2.10\n", 'quote it, e.g. min-torch-version = "2.10"'),
    ("[tool.ampfix]\nmax-file-size = true\n", "`max-file-size` must be a positive number of bytes"),
    (DEEP_TOML, "invalid TOML: nested too deeply"),
])
def test_configuration_errors_name_file_key_and_expectation(tmp_path, toml, expected):
    (tmp_path / "pyproject.toml").write_text(toml)
    (tmp_path / "train.py").write_text(TRAINER)
    res = run_ampfix("check", "train.py", cwd=tmp_path)
    err = res.stderr.decode()
    assert res.returncode == 2
    assert "Traceback" not in err
    assert str(tmp_path / "pyproject.toml") in err and expected in err, err


def test_empty_select_is_an_error(tmp_path):
    (tmp_path / "train.py").write_text(TRAINER)
    res = run_ampfix("check", "train.py", "--select", "", cwd=tmp_path)
    assert res.returncode == 2 and "--select: no rule code given" in res.stderr.decode()


def test_quoted_version_and_size_are_accepted(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.ampfix]\nmin-torch-version = "2.10"\nmax-file-size = "1MB"\n')
    (tmp_path / "train.py").write_text(TRAINER)
    res = run_ampfix("check", "--preview", "train.py", cwd=tmp_path)
    assert res.returncode == 1 and "AMP007" in res.stdout.decode()


# ----------------------------------------------------------------------------- size limit, --jobs


def test_files_over_max_file_size_are_skipped_with_the_reason(tmp_path):
    _tree(tmp_path, n_good=2)
    (tmp_path / "huge.py").write_text(TRAINER + "# filler\n" * 2000)
    res = run_ampfix("check", "--preview", ".", "--max-file-size", "10KB", cwd=tmp_path)
    out, err = _lines(res)
    assert err == ["huge.py: warning: skipped, not analysed: 17.9 KiB is over max-file-size (9.8 KiB; set "
                   "`max-file-size` in [tool.ampfix] or --max-file-size to check it)"]
    assert sum("AMP007" in line for line in out) == 2 and res.returncode == 1
    (tmp_path / "pyproject.toml").write_text('[tool.ampfix]\nmax-file-size = 100000\n')
    res = run_ampfix("check", "--preview", ".", cwd=tmp_path)
    assert sum("AMP007" in line for line in res.stdout.decode().splitlines()) == 3


def test_jobs_option_is_documented_with_its_default():
    res = run_ampfix("check", "--help")
    text = " ".join(res.stdout.decode().split())
    assert "-j, --jobs N" in text and "default: the AMPFIX_WORKERS environment variable, else one per CPU" in text


# ----------------------------------------------------------------------------- unreadable paths


def test_symlink_loops_are_reported_and_the_rest_checked(tmp_path):
    _tree(tmp_path, n_good=2)
    (tmp_path / "loop_a.py").symlink_to(tmp_path / "loop_b.py")
    (tmp_path / "loop_b.py").symlink_to(tmp_path / "loop_a.py")
    (tmp_path / "dangling.py").symlink_to(tmp_path / "gone.py")
    res = run_ampfix("check", "--preview", ".", "loop_a.py", "dangling.py", cwd=tmp_path)
    out, err = _lines(res)
    assert res.returncode == 2 and "Traceback" not in res.stderr.decode()
    assert "loop_a.py: error: cannot read: Too many levels of symbolic links" in err
    assert "loop_b.py: error: cannot read: Too many levels of symbolic links" in err
    assert "dangling.py: error: cannot read: the symbolic link points to nothing" in err
    assert sum("AMP007" in line for line in out) == 2


def test_unreadable_folder_in_the_virtualenv_probe(tmp_path, monkeypatch):
    """A folder that cannot be looked into. Tests run as root here, where chmod 000 does not stop
    reading, so the PermissionError of the virtualenv probe is simulated (in process)."""
    from ampfix import api
    from ampfix.engine import discovery

    _tree(tmp_path, n_good=2)
    (tmp_path / "private").mkdir()
    (tmp_path / "private" / "train.py").write_text(TRAINER)
    real = discovery.is_virtualenv

    def probe(folder):
        if folder.name == "private":
            raise PermissionError(13, "Permission denied", str(folder / "pyvenv.cfg"))
        return real(folder)

    monkeypatch.setattr(discovery, "is_virtualenv", probe)
    run = api.check_paths([str(tmp_path)], no_cache=True, preview=True)
    assert run.errors == [f"{tmp_path / 'private'}: error: cannot read the folder: Permission denied"]
    assert len(run.diagnostics) == 2


def test_unreadable_folder_and_file(tmp_path, monkeypatch):
    """os.scandir and reading a file fail (simulated: root reads anything)."""
    import os

    from ampfix import api

    from ampfix.engine import discovery

    _tree(tmp_path, n_good=2)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "x.py").write_text(TRAINER)
    real_scandir = os.scandir

    def scandir(path):
        if str(path).endswith("sub"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(discovery.os, "scandir", scandir)
    plan_run = api.check_paths([str(tmp_path)], no_cache=True, preview=True)
    assert plan_run.errors == [f"{tmp_path / 'sub'}: error: cannot read the folder: Permission denied"]
    assert len(plan_run.diagnostics) == 2


def test_a_file_deleted_during_the_run(tmp_path):
    from ampfix.engine import runner

    _tree(tmp_path, n_good=3)
    plan = runner.make_plan(runner.Options(paths=[str(tmp_path)], no_cache=True, preview=True))
    (tmp_path / "train_1.py").unlink()  # after discovery, before reading
    run = runner.run(plan)
    assert run.errors == [f"{tmp_path / 'train_1.py'}: error: cannot read: No such file or directory"]
    assert len(run.diagnostics) == 2


def test_dev_full_as_stdout(tmp_path):
    import subprocess
    import sys

    _tree(tmp_path, n_good=1)
    for args in (["check", "--preview", "."], ["check", "--preview", ".", "--output-format", "json"], ["rules"]):
        with open("/dev/full", "w") as full:
            res = subprocess.run([sys.executable, "-m", "ampfix", *args], cwd=tmp_path, stdout=full,
                                 stderr=subprocess.PIPE, timeout=120)
        assert res.returncode == 2
        assert res.stderr.decode() == "error: cannot write the report to stdout: No space left on device\n"


# ----------------------------------------------------------------------------- cache


def _count_parses(monkeypatch):
    from ampfix.engine import analyze as engine

    calls = []
    real = engine.parse

    def counting(text, path):
        calls.append(path)
        return real(text, path)

    monkeypatch.setattr(engine, "parse", counting)
    return calls


def test_warm_rerun_parses_nothing(tmp_path, monkeypatch):
    from ampfix import api

    monkeypatch.setenv("AMPFIX_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "src").mkdir()
    _tree(tmp_path / "src", n_good=3)
    (tmp_path / "src" / "broken.py").write_text(TRAINER + "def (:\n")
    parses = _count_parses(monkeypatch)
    cold = api.check_paths([str(tmp_path / "src")], jobs=1, preview=True)
    assert len(parses) == 4
    warm = api.check_paths([str(tmp_path / "src")], jobs=1, preview=True)
    assert len(parses) == 4  # nothing parsed again
    assert warm.diagnostics == cold.diagnostics and warm.errors == cold.errors and len(warm.errors) == 1
    assert (tmp_path / "cache" / ".gitignore").read_text().splitlines()[-1] == "*"
    # an edited file is analysed again, the others come from the cache
    (tmp_path / "src" / "train_0.py").write_text(TRAINER.replace("optimizer.step()", "scaler.step(optimizer)"))
    edited = api.check_paths([str(tmp_path / "src")], jobs=1, preview=True)
    assert len(parses) == 5
    assert [d for d in edited.diagnostics if "train_0" not in d.path] == [
        d for d in cold.diagnostics if "train_0" not in d.path]
    assert [d.message for d in edited.diagnostics if "train_0" in d.path] != [
        d.message for d in cold.diagnostics if "train_0" in d.path]
    # other settings are another key; --no-cache neither reads nor writes
    api.check_paths([str(tmp_path / "src")], jobs=1, preview=True, min_torch_version="2.6")
    assert len(parses) == 9
    api.check_paths([str(tmp_path / "src")], jobs=1, preview=True, no_cache=True)
    assert len(parses) == 13


def test_malformed_cache_entries_are_misses(tmp_path, monkeypatch):
    from ampfix import api

    monkeypatch.setenv("AMPFIX_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "src").mkdir()
    _tree(tmp_path / "src", n_good=2)
    cold = api.check_paths([str(tmp_path / "src")], jobs=1, preview=True)
    entries = [p for p in (tmp_path / "cache").rglob("*")
               if p.is_file() and len(p.name) == 64 and "graphs" not in p.parts]  # the results' entries
    assert len(entries) == 2
    entries[0].write_text('{"diagnostics": [{"nonsense": 1}]}')
    entries[1].write_text("not json")
    parses = _count_parses(monkeypatch)
    again = api.check_paths([str(tmp_path / "src")], jobs=1, preview=True)
    assert len(parses) == 2 and again.diagnostics == cold.diagnostics


def test_concurrent_runs_share_the_cache(tmp_path):
    """Runs started together write the same entries (atomic renames): every run reports the
    same, and no temporary file is left."""
    import subprocess
    import sys

    (tmp_path / "src").mkdir()
    _tree(tmp_path / "src", n_good=8)
    env = {"AMPFIX_CACHE_DIR": str(tmp_path / "cache")}
    import os

    full_env = dict(os.environ, **env)
    procs = [subprocess.Popen([sys.executable, "-m", "ampfix", "check", "--preview", "src", "-j", "1"],
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=full_env) for _ in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 1 for p in procs)
    assert len({o for o, _ in outs}) == 1 and all(e == b"" for _, e in outs)
    assert not [p for p in (tmp_path / "cache").rglob(".tmp-*")]
