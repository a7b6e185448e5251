"""`flake8 --select AMP` with the real flake8: ampfix's findings through the plugin entry point."""

import subprocess
import sys

import pytest

from test_cli import BAD_CLIP, GOOD, write

pytest.importorskip("flake8")

# AMP003, BAD_CLIP's finding, is a preview rule: the plugin runs it with `preview = true` in [tool.ampfix]
PREVIEW = "[tool.ampfix]\npreview = true\n"


def flake8(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "flake8", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def test_plugin_is_registered():
    res = flake8("--version")
    assert "ampfix:" in res.stdout, res.stdout


def test_select_amp_reports_findings(tmp_path):
    write(tmp_path, "pyproject.toml", PREVIEW)
    write(tmp_path, "train.py", BAD_CLIP)
    write(tmp_path, "ok.py", GOOD)
    res = flake8("--select", "AMP", ".", cwd=tmp_path)
    assert res.returncode == 1, res.stderr
    assert res.stdout.splitlines() == [
        "./train.py:6:5: AMP003 gradients are clipped while still scaled by the GradScaler; "
        "call `scaler.unscale_(optimizer)` first"]
    assert (tmp_path / "train.py").read_text() == BAD_CLIP  # lint only: nothing is rewritten


def test_flake8_noqa_and_ampfix_config(tmp_path):
    write(tmp_path, "pyproject.toml", PREVIEW)
    write(tmp_path, "train.py", BAD_CLIP.replace("1.0)\n", "1.0)  # noqa: AMP003\n", 1))
    assert flake8("--select", "AMP", "train.py", cwd=tmp_path).returncode == 0
    write(tmp_path, "train.py", BAD_CLIP)
    write(tmp_path, "pyproject.toml", PREVIEW + 'ignore = ["AMP003"]\n')
    assert flake8("--select", "AMP", "train.py", cwd=tmp_path).returncode == 0
    # other codes are flake8's own business; a syntax error is flake8's E999, not a crash
    write(tmp_path, "pyproject.toml", PREVIEW)
    write(tmp_path, "broken.py", "import torch\nscaler = torch.amp.GradScaler(\n")
    res = flake8("--select", "AMP,E999", ".", cwd=tmp_path)
    assert "E999" in res.stdout and "AMP003" in res.stdout and "Traceback" not in res.stderr


def test_flake8_reads_the_project_as_check_does(tmp_path):
    # a finding that another module shows (`engine.py`'s helper steps the GradScaler that
    # `main.py` passes in, after an unscaled backward) is reported through flake8 as by `check`;
    # its correct twin gives nothing
    import shutil
    from pathlib import Path

    projects = Path(__file__).resolve().parents[1] / "fixtures" / "projects"
    for name in ("bad_scaler_parameter", "good_scaler_parameter"):
        shutil.copytree(projects / name, tmp_path / name)
    res = flake8("--select", "AMP", "bad_scaler_parameter", "good_scaler_parameter", cwd=tmp_path)
    assert res.returncode == 1, res.stderr
    assert [line.split(" ")[:2] for line in res.stdout.splitlines()] == [
        ["bad_scaler_parameter/engine.py:8:9:", "AMP008"]], res.stdout
