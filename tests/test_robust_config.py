"""Issue 22, configuration: a configuration that checks nothing says so (an error when no rule
is left, a warning when `exclude` leaves no file), instead of "All checks passed!"."""

from __future__ import annotations

import pytest

from tests.conftest import run_ampfix
from tests.test_robust_check import TRAINER


@pytest.mark.parametrize("table", ['select = []', 'select = [""]', 'select = ["", " "]', 'select = ""'])
@pytest.mark.parametrize("command", ["check", "rewrite"])
def test_an_empty_select_in_the_configuration_is_an_error(tmp_path, table, command):
    (tmp_path / "pyproject.toml").write_text(f"[tool.ampfix]\n{table}\n")
    (tmp_path / "train.py").write_text(TRAINER)
    res = run_ampfix(command, ".", cwd=tmp_path)
    err = res.stderr.decode()
    assert res.returncode == 2, err
    assert f"{tmp_path / 'pyproject.toml'}: `select` in [tool.ampfix] names no rule: it would check nothing" in err
    assert "All checks passed" not in res.stdout.decode() and "Traceback" not in err
    assert (tmp_path / "train.py").read_text() == TRAINER


@pytest.mark.parametrize("table, args, says", [
    ('ignore = ["ALL"]', [], "ignore = ['ALL'] in "),
    ('select = ["AMP001"]\nignore = ["AMP0"]', [], "select = ['AMP001'] in "),
    ("", ["--ignore", "ALL"], "ignore = ['ALL'] (--ignore)"),
    ("", ["--select", "AMP003", "--ignore", "AMP00"], "--select AMP003; ignore = ['AMP00'] (--ignore)"),
])
def test_a_selection_that_leaves_no_rule_is_an_error(tmp_path, table, args, says):
    (tmp_path / "pyproject.toml").write_text(f"[tool.ampfix]\n{table}\n")
    (tmp_path / "train.py").write_text(TRAINER)
    res = run_ampfix("check", ".", *args, cwd=tmp_path)
    err = res.stderr.decode()
    assert res.returncode == 2, err
    assert "no rule is left to check (" in err and says in err and "nothing would be checked" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("command", ["check", "rewrite"])
@pytest.mark.parametrize("exclude", ['["*"]', '["**"]', '["*.py", "*.ipynb"]'])
def test_an_exclude_that_leaves_no_file_is_a_warning(tmp_path, command, exclude):
    (tmp_path / "pyproject.toml").write_text(f"[tool.ampfix]\nexclude = {exclude}\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text(TRAINER)
    (tmp_path / "other.py").write_text(TRAINER)
    res = run_ampfix(command, ".", cwd=tmp_path)
    err = res.stderr.decode().splitlines()
    assert res.returncode == 0
    assert err == [f"{tmp_path / 'pyproject.toml'}: warning: `exclude` in [tool.ampfix] excludes every file under . "
                   "(2 Python files); nothing was checked"]


def test_pre_commit_passing_an_excluded_file_is_quiet(tmp_path):
    """--force-exclude with file names (pre-commit): an excluded file is the configuration
    working, not a configuration that checks nothing."""
    (tmp_path / "pyproject.toml").write_text('[tool.ampfix]\nexclude = ["legacy.py"]\n')
    (tmp_path / "legacy.py").write_text(TRAINER)
    res = run_ampfix("check", "--force-exclude", "legacy.py", cwd=tmp_path)
    assert res.returncode == 0 and res.stderr == b""


def test_an_exclude_that_leaves_some_files_is_quiet(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.ampfix]\nexclude = ["legacy"]\n')
    (tmp_path / "legacy").mkdir()
    (tmp_path / "legacy" / "old.py").write_text(TRAINER)
    (tmp_path / "new.py").write_text("import torch\n")
    res = run_ampfix("check", ".", cwd=tmp_path)
    assert res.returncode == 0 and res.stderr == b""
