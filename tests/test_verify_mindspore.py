"""`ampfix verify` on MindSpore scripts: `--python` runs them in the user's MindSpore interpreter.

The fast tests here need no MindSpore.  The tests that run MindSpore are marked `slow` and
`mindspore` and run only when AMPFIX_TEST_MINDSPORE=1 is set: they build the MindSpore
virtualenv once (`tests/mindspore_env.py`, cached in `.ampfix-envs/`, ~100 s and ~800 MB
downloaded from PyPI), then verify the article's fixtures:

    AMPFIX_TEST_MINDSPORE=1 python -m pytest -q tests/test_verify_mindspore.py
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap

import pytest

from ampfix.verify.command import detect_framework

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "fixtures", "train")
ORIGINAL = os.path.join(TRAIN, "ms_fixed_scale_no_opt_scale.py")
FIXED = os.path.join(TRAIN, "ms_fixed_scale_with_opt_scale.py")
BOOTSTRAP = os.path.join(ROOT, "ampfix", "verify", "ms_trace.py")


def run_verify(*args, timeout=600):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return subprocess.run([sys.executable, "-m", "ampfix.verify"] + [str(a) for a in args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------------------------------
# no MindSpore needed
# ---------------------------------------------------------------------------------------


def test_framework_detected_from_imports():
    assert detect_framework(open(ORIGINAL).read()) == "mindspore"
    assert detect_framework(open(os.path.join(TRAIN, "mlp.py")).read()) == "torch"
    assert detect_framework("from mindspore import nn\n") == "mindspore"
    assert detect_framework("import lightning as L\n") == "torch"
    assert detect_framework("import numpy\n") == "torch"  # neither: the torch bootstrap says why
    assert detect_framework("def broken(:\n") == "torch"
    assert detect_framework("import torch\nimport mindspore\n") is None


def test_script_importing_both_frameworks_needs_framework_option(tmp_path):
    script = tmp_path / "both.py"
    script.write_text("import torch\nimport mindspore\n")
    p = run_verify(script, "--fixed", script)
    assert p.returncode == 2
    assert "imports both torch and mindspore" in p.stderr and "--framework" in p.stderr
    assert "Traceback" not in p.stderr


def test_missing_interpreter_is_a_one_line_error(tmp_path):
    p = run_verify(ORIGINAL, "--fixed", FIXED, "--python", tmp_path / "nope" / "python")
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "ampfix verify: error: --python %s: no such interpreter (give the path of a Python "
        "executable, or a command on PATH)" % (tmp_path / "nope" / "python")]


def test_interpreter_without_mindspore_is_a_clear_error():
    if subprocess.run([sys.executable, "-c", "import mindspore"], capture_output=True).returncode == 0:
        pytest.skip("this interpreter has mindspore")
    p = run_verify(ORIGINAL, "--fixed", FIXED, "--python", sys.executable)
    assert p.returncode == 2
    (line,) = p.stderr.strip().splitlines()
    assert "cannot import mindspore" in line and "ModuleNotFoundError" in line
    assert "--python must be the Python of an environment with MindSpore" in line
    # without --python: the verifier's own interpreter is tried, and the message says what to do
    p = run_verify(ORIGINAL, "--fixed", FIXED)
    assert p.returncode == 2 and "pass the Python of your MindSpore environment with --python" in p.stderr
    assert "Traceback" not in p.stderr


def test_torch_script_with_python_lacking_torch_is_a_clear_error(tmp_path):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    p = run_verify(os.path.join(TRAIN, "mlp.py"), "--python", bare / "bin" / "python")
    assert p.returncode == 2
    (line,) = p.stderr.strip().splitlines()
    assert "cannot import torch (ModuleNotFoundError: No module named 'torch')" in line


def test_nproc_per_node_does_not_apply_to_mindspore():
    p = run_verify(ORIGINAL, "--fixed", FIXED, "--nproc-per-node", "2")
    assert p.returncode == 2 and "does not apply to MindSpore scripts" in p.stderr
    p = run_verify(ORIGINAL, "--fixed", FIXED, "--device", "cuda")
    assert p.returncode == 2 and "--device cuda applies to torch scripts" in p.stderr


def test_bootstrap_imports_only_stdlib_and_mindspore():
    tree = ast.parse(open(BOOTSTRAP).read())
    tops = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            tops.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative import in the bootstrap"
            tops.add(node.module.split(".")[0])
    assert tops - set(sys.stdlib_module_names) == {"mindspore", "numpy"}, tops


def test_bootstrap_without_mindspore_writes_an_error_result(tmp_path):
    # run by path in an isolated interpreter (-I: no PYTHONPATH, no user site): it needs
    # nothing of ampfix, and says in its result that mindspore is missing
    if subprocess.run([sys.executable, "-c", "import mindspore"], capture_output=True).returncode == 0:
        pytest.skip("this interpreter has mindspore")
    out = tmp_path / "r.json"
    p = subprocess.run([sys.executable, "-I", BOOTSTRAP, "--out", str(out), "--steps", "3", ORIGINAL],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 3
    assert "Traceback" not in p.stderr
    res = json.loads(out.read_text())
    assert res["error"].startswith("mindspore cannot be imported by ")


# ---------------------------------------------------------------------------------------
# real MindSpore runs (slow; AMPFIX_TEST_MINDSPORE=1)
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ms_python():
    if os.environ.get("AMPFIX_TEST_MINDSPORE") != "1":
        pytest.skip("MindSpore tests need AMPFIX_TEST_MINDSPORE=1 (they build a ~3 GB virtualenv "
                    "with mindspore 2.10.0 once, into .ampfix-envs/)")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        import mindspore_env
    finally:
        sys.path.pop(0)
    return mindspore_env.ensure()


@pytest.mark.slow
@pytest.mark.mindspore
def test_article_mistake_fails_and_its_fix_passes(ms_python):
    before = open(ORIGINAL).read(), open(FIXED).read()
    p = run_verify(ORIGINAL, "--json", "--fixed", FIXED, "--python", ms_python, "--steps", "60",
                   "--warmup", "5", "--reps", "1", "--threads", "1")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert (open(ORIGINAL).read(), open(FIXED).read()) == before  # scripts never edited
    doc = json.loads(p.stdout)
    assert doc["framework"] == "mindspore" and doc["python"] == ms_python
    checks = {c["name"]: c for c in doc["checks"]}
    # the fix (optimizer built with loss_scale=1024.0) trains like fp32 ...
    assert checks["loss-parity"]["status"] == "PASS"
    assert checks["loss-parity"]["metrics"]["max_gap"] < 0.05
    assert checks["amp-active"]["status"] == "PASS" and "amp_level O2" in checks["amp-active"]["detail"]
    # ... and, forced to fp32 (O0, no loss scale manager, loss_scale 1), is the original
    assert checks["fp32-equivalence"]["status"] == "PASS"
    assert checks["fp32-equivalence"]["metrics"]["identical"] is True
    # the original (no loss_scale on the optimizer) blows up: NaN/inf, LossMonitor stops it
    orig = doc["original_vs_fp32"]
    assert orig["status"] == "FAIL" and "non-finite loss" in orig["detail"]
    assert "loss is NAN or INF" in orig["detail"]
    assert any(v in ("nan", "inf", "-inf") for v in doc["losses"]["original"][:3])
    runs = {r["label"]: r for r in doc["runs"]}
    assert runs["fixed-amp"]["scale_min"] == runs["fixed-amp"]["scale_max"] == 1024.0
    assert runs["fixed-amp"]["amp_active"] and not runs["fp32"]["amp_active"]
    assert runs["fp32"]["scale_min"] is None and runs["fixed-amp"]["steps"] == 60
    assert any("the fp32 baseline forced Momentum(loss_scale=1.0), Model(amp_level='O0', "
               "loss_scale_manager=None)" in n for n in doc["notes"]), doc["notes"]
    assert any(n.startswith("the original: FixedLossScaleManager(1024.0, drop_overflow_update="
                            "False), but the optimizer Momentum has loss_scale=1") for n in doc["notes"])


@pytest.mark.slow
@pytest.mark.mindspore
def test_article_mistake_rewritten_by_amp251_passes(ms_python):
    # no --fixed: ampfix's own rewrite (AMP251 adds loss_scale=loss_scale to the optimizer) is
    # verified; it trains like fp32, while the original, as written, raises at the first NaN
    p = run_verify(ORIGINAL, "--json", "--python", ms_python, "--steps", "30", "--warmup", "3",
                   "--reps", "1", "--threads", "1")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    doc = json.loads(p.stdout)
    assert doc["rewritten"] and doc["fixed"] is None
    checks = {c["name"]: c for c in doc["checks"]}
    assert checks["loss-parity"]["status"] == "PASS" and checks["fp32-equivalence"]["status"] == "PASS"
    original = doc["original_vs_fp32"]
    assert original["status"] == "FAIL" and original["detail"].startswith("raised after 2 steps")
    assert original["metrics"]["all_finite"] is False


@pytest.mark.slow
@pytest.mark.mindspore
def test_hand_built_train_cell_and_script_error(ms_python, tmp_path):
    # a loop over a hand-built TrainOneStepCell (no Model) is traced too; a script that
    # raises is exit 2 with its own error
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent("""
        import mindspore as ms, numpy as np
        from mindspore import nn
        ms.set_device("CPU")
        ms.set_seed(0)
        rng = np.random.default_rng(0)
        x = ms.Tensor(rng.standard_normal((256, 16)).astype(np.float32))
        y = ms.Tensor(x.asnumpy().sum(1, keepdims=True))
        net = nn.Dense(16, 1)
        net.to_float(ms.float16)
        opt = nn.SGD(net.trainable_params(), learning_rate=0.02)
        step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), opt)
        for i in range(1000):
            step(x, y)
    """))
    p = run_verify(script, "--json", "--fixed", script, "--python", ms_python, "--steps", "30",
                   "--warmup", "3", "--reps", "1", "--threads", "1")
    doc = json.loads(p.stdout)
    checks = {c["name"]: c for c in doc["checks"]}
    assert checks["amp-active"]["status"] == "PASS" and "1 of 1 layers compute in float16" in \
        checks["amp-active"]["detail"]
    assert checks["loss-parity"]["status"] == "PASS", checks["loss-parity"]
    runs = {r["label"]: r for r in doc["runs"]}
    assert runs["fp32"]["graph_dtypes"] == ["float32"]  # to_float(float16) ignored for fp32
    bad = tmp_path / "bad.py"
    bad.write_text("import mindspore\nraise RuntimeError('bad config')\n")
    p = run_verify(bad, "--fixed", bad, "--python", ms_python, "--steps", "5", "--warmup", "1",
                   "--reps", "1")
    assert p.returncode == 2 and "RuntimeError: bad config" in p.stderr
