"""The wheel ships every rule as ampfix.rules (no top-level `rules` package) and a fresh
virtualenv with only the wheel and its dependencies (libcst, click; no torch) runs every rule.
Also: the pre-commit hooks as pre-commit itself runs them."""

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from conftest import FIXTURES, ROOT

pytestmark = pytest.mark.slow


def _run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    res = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)])
    assert res.returncode == 0, res.stderr
    (whl,) = out.glob("ampfix-*.whl")
    return whl


def test_wheel_layout(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    from ampfix.engine.registry import all_rules

    rule_modules = sorted(p.name for p in (ROOT / "rules").glob("amp*.py"))
    assert rule_modules and len(rule_modules) == len(all_rules())
    for m in rule_modules:
        assert f"ampfix/rules/{m}" in names
    assert not [n for n in names if n.startswith("rules/")], "no generic top-level `rules` package"
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    requires = [line for line in meta.splitlines() if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert sorted(r.split()[1].split(">")[0].split(";")[0] for r in requires) == ["click", "libcst", "tomli"]
    assert "python_version < \"3.11\"" in next(r for r in requires if "tomli" in r)


def test_wheel_in_fresh_venv_runs_all_rules(wheel, tmp_path):
    venv = tmp_path / "venv"
    assert _run([sys.executable, "-m", "venv", str(venv)]).returncode == 0
    py = venv / "bin" / "python"
    res = _run([str(py), "-m", "pip", "install", "-q", str(wheel)])
    if res.returncode != 0 and ("Could not find a version" in res.stderr or "connection" in res.stderr.lower()):
        pytest.skip(f"no package index reachable: {res.stderr[-300:]}")
    assert res.returncode == 0, res.stderr
    assert _run([str(py), "-c", "import torch"], cwd=tmp_path).returncode != 0, "torch must not be pulled in"
    assert _run([str(py), "-c", "import rules"], cwd=tmp_path).returncode != 0, "no top-level rules package"
    from ampfix.engine.registry import all_rules

    res = _run([str(venv / "bin" / "ampfix"), "rules"])
    assert res.returncode == 0, res.stderr
    assert [line.split()[0] for line in res.stdout.splitlines()] == list(all_rules())
    res = _run([str(venv / "bin" / "ampfix"), "check", "--output-format", "json", "--preview", "--select", ",".join(all_rules()),
                str(FIXTURES / "rules")])
    assert res.returncode == 1, res.stderr
    import json

    assert {d["code"] for d in json.loads(res.stdout)} == set(all_rules())


@pytest.fixture
def git_repo(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "project"
    repo.mkdir()
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@e", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@e", PRE_COMMIT_HOME=str(tmp_path / "pre-commit-home"))
    _run(["git", "init", "-q"], cwd=repo, env=env)
    return repo, env


def test_pre_commit_hooks(git_repo):
    pytest.importorskip("pre_commit")
    repo, env = git_repo
    pc = [sys.executable, "-m", "pre_commit", "try-repo", str(ROOT)]
    # nothing staged: the hooks have no files and pass quietly
    res = _run([*pc, "ampfix"], cwd=repo, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "no files to check" in res.stdout
    bad = (FIXTURES / "rules" / "AMP003" / "bad_clip.py").read_text()
    (repo / "train.py").write_text(bad)
    (repo / "ok.py").write_text("import torch\n")
    (repo / "pyproject.toml").write_text("[tool.ampfix]\npreview = true\n")  # AMP003 is a preview rule
    # a notebook: the hooks take jupyter files too (the hook's environment has nbformat)
    nbformat = pytest.importorskip("nbformat")
    from nbformat.v4 import new_code_cell, new_notebook

    nb = new_notebook(cells=[new_code_cell("import torch\nscaler = torch.amp.GradScaler()"),
                             new_code_cell("scaler.scale(loss).backward()\n"
                                           "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
                                           "scaler.step(optimizer)\nscaler.update()")])
    (repo / "explore.ipynb").write_text(nbformat.writes(nb) + "\n")
    _run(["git", "add", "train.py", "ok.py", "explore.ipynb", "pyproject.toml"], cwd=repo, env=env)
    res = _run([*pc, "ampfix"], cwd=repo, env=env)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "train.py:19:9: AMP003" in res.stdout
    assert "explore.ipynb:cell 2:2:1: AMP003" in res.stdout
    # the rewrite hook fixes the file; pre-commit reports the modification
    res = _run([*pc, "ampfix-rewrite"], cwd=repo, env=env)
    assert res.returncode == 1
    assert "files were modified by this hook" in res.stdout
    fixed = (FIXTURES / "rules" / "AMP003" / "bad_clip.fixed.py").read_text()
    assert (repo / "train.py").read_text() == fixed
    assert "scaler.unscale_(optimizer)\n" in nbformat.read(repo / "explore.ipynb", as_version=4).cells[1].source
    _run(["git", "add", "train.py", "explore.ipynb"], cwd=repo, env=env)
    res = _run([*pc, "ampfix-rewrite"], cwd=repo, env=env)
    assert "files were modified" not in res.stdout
