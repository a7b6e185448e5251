"""A source checkout that was not `pip install`ed, put on PYTHONPATH, runs like an install: the
top-level rules/ folder is `ampfix.rules` there too (ampfix/__init__.py maps it; an install maps
it through pyproject's package-dir). Run in a bare virtualenv (no ampfix in it) whose only
packages are ampfix's dependencies, from a folder outside the checkout."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import venv

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "fixtures", "train")


def _folder_of(module: str) -> str:
    """The sys.path entry that `module` is imported from here."""
    mod = __import__(module)
    return os.path.dirname(os.path.dirname(os.path.abspath(mod.__file__)))


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory):
    """A virtualenv without ampfix: its dependencies reach it through a .pth naming their folders
    (a .pth line adds a folder; the .pth files inside it, an editable install's, are not run)."""
    env = tmp_path_factory.mktemp("bare") / "venv"
    venv.EnvBuilder(with_pip=False).create(env)
    python = env / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    deps = ["libcst", "click"] + (["tomli"] if sys.version_info < (3, 11) else [])
    if importlib.util.find_spec("torch") is not None:
        deps.append("torch")
    folders = sorted({_folder_of(m) for m in deps})
    with open(os.path.join(site, "deps.pth"), "w") as f:
        f.write("\n".join(folders) + "\n")
    probe = subprocess.run([str(python), "-c", "import ampfix"], capture_output=True, text=True, cwd=str(env))
    assert probe.returncode != 0 and "No module named 'ampfix'" in probe.stderr, "ampfix must not be installed there"
    return str(python)


def _run(python, *args, cwd, timeout=300):
    env = dict(os.environ, PYTHONPATH=ROOT, NO_COLOR="1")
    return subprocess.run([python, "-m", "ampfix", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_rules_are_ampfix_rules_in_a_checkout(bare_python, tmp_path):
    code = "import ampfix, ampfix.rules as r; print(ampfix.__file__); print(r.__file__)"
    p = subprocess.run([bare_python, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [os.path.join(ROOT, "ampfix", "__init__.py"), os.path.join(ROOT, "rules", "__init__.py")]


def test_check_from_a_checkout(bare_python, tmp_path):
    p = _run(bare_python, "check", "--no-cache", "--preview", "--output-format", "json",  # AMP010: a preview rule
             os.path.join(TRAIN, "buggy_accumulation_unscale.py"), cwd=tmp_path)
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode == 1, p.stderr
    assert [d["code"] for d in json.loads(p.stdout)] == ["AMP010"]


def test_verify_from_a_checkout(bare_python, tmp_path):
    pytest.importorskip("torch")
    # --preview: the script's fix is AMP003's, a preview rule
    p = _run(bare_python, "verify", "--json", "-y", "--preview", "--device", "cpu", "--steps", "20", "--warmup", "2",
             "--reps", "1", "--threads", "1", os.path.join(TRAIN, "buggy_clip_scaled.py"), cwd=tmp_path)
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    doc = json.loads(p.stdout)
    assert doc["rewritten"] and [f["code"] for f in doc["fixes"]] == ["AMP003"]  # the rules ran
    assert doc["python"] == bare_python
    assert {c["name"]: c["status"] for c in doc["checks"]}["amp-active"] == "PASS"
