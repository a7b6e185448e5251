"""Multi-module fixture projects (`fixtures/projects/*/`): each folder is a small project (its
own `pyproject.toml`) whose mistake, or whose correctness, is only visible across modules.
`bad_*` projects mark every expected finding with `# expect: CODE@column` in the module it is
reported in; `good_*` projects are their correct twins and must produce nothing. Every project
is checked whole (every rule, preview rules included), and every module of a `bad_*` project is also checked alone (as pre-commit
passes only changed files): the findings of a module do not depend on which other files were
named on the command line."""

from collections import Counter
from pathlib import Path

import pytest

from ampfix import api
from conftest import FIXTURES, run_ampfix
from test_fixtures import expected

PROJECTS = FIXTURES / "projects"


def projects():
    return sorted(p for p in PROJECTS.iterdir() if p.is_dir())


def markers(project: Path) -> Counter:
    out = Counter()
    for f in sorted(project.rglob("*.py")):
        for (line, col, code), n in expected(f.read_text(encoding="utf-8")).items():
            out[(str(f.relative_to(project)), line, col, code)] += n
    return out


def found(project: Path, paths=None) -> Counter:
    run = api.check_paths([str(p) for p in (paths or [project])], select=["ALL"], preview=True, no_cache=True)
    assert not run.errors, run.errors
    return Counter((str(Path(d.path).resolve().relative_to(project.resolve())), d.line, d.column, d.code)
                   for d in run.diagnostics)


def test_every_bad_project_has_a_good_twin():
    names = {p.name for p in projects()}
    for name in names:
        if name.startswith("bad_"):
            assert "good_" + name[4:] in names, f"{name} has no correct twin"
        else:
            assert name.startswith("good_"), f"{name}: project fixtures are bad_* or good_*"


@pytest.mark.parametrize("project", projects(), ids=lambda p: p.name)
def test_project_findings_match_markers(project: Path):
    want = markers(project)
    if project.name.startswith("good_"):
        assert not want, "a good_ project marks no finding"
    assert found(project) == want


@pytest.mark.parametrize("project", [p for p in projects() if p.name.startswith("bad_")], ids=lambda p: p.name)
def test_one_module_at_a_time_finds_the_same(project: Path):
    want = markers(project)
    for module in sorted(project.rglob("*.py")):
        rel = str(module.relative_to(project))
        assert found(project, [module]) == Counter({k: n for k, n in want.items() if k[0] == rel}), rel


def test_related_location_in_the_full_output():
    project = PROJECTS / "bad_helper_clip"
    res = run_ampfix("check", "--preview", "--no-cache", "--output-format", "full", str(project / "train.py"))
    assert res.returncode == 1, res.stderr
    out = res.stdout.decode()
    assert "AMP003" in out and "utils.py:6" in out, out


def test_checkpoint_reasons_say_what_blocks_the_fix():
    # AMP013's "not fixed" reason where the fix cannot name the GradScaler: nnsvs's shape (the
    # loop receives it as a parameter and a helper of another module that takes none writes the
    # checkpoint), cn-clip's (the loop that receives it saves the checkpoint itself), and a
    # helper handed no GradScaler where one is reachable; not "no GradScaler is reachable here"
    helper = ("the checkpoint is written by `save_checkpoint` in another module and this call hands it no GradScaler: "
              "pass it `{}` and save its state there")
    want = {
        ("bad_checkpoint_helper_scaler_parameter/mypkg/bin/train.py", 29): helper.format("grad_scaler"),
        ("bad_checkpoint_helper_scaler_parameter/mypkg/bin/train.py", 30): helper.format("grad_scaler"),
        ("bad_checkpoint_helper_scaler_parameter/mypkg/bin/train_inline.py", 20):
            "the GradScaler here is the parameter `scaler`, which a caller may pass as None (`scaler.state_dict()` "
            "would raise); save its state by hand, where it is not None",
        ("bad_checkpoint_helper/train.py", 16): helper.format("scaler"),
    }
    for name in ("bad_checkpoint_helper_scaler_parameter", "bad_checkpoint_helper"):
        run = api.check_paths([str(PROJECTS / name)], select=["AMP013"], preview=True, no_cache=True)
        for d in run.diagnostics:
            where = (str(Path(d.path).resolve().relative_to(PROJECTS.resolve())), d.line)
            assert d.message.endswith(f" (not fixed: {want.pop(where)})"), d.message
    assert not want
