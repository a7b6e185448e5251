"""AMP011 by running it: a model cast with `.half()` before float16 autocast + GradScaler
training raises at the first `scaler.step` (float16 gradients); ampfix's unsafe rewrite removes
the cast and trains like fp32. Run as a user runs it (see tests/test_verify.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from test_verify import ROOT, check, fx, run_json

SCRIPT = "buggy_half_with_scaler.py"


def test_half_model_raises_and_unsafe_rewrite_passes():
    pytest.importorskip("torch")
    p, doc = run_json(fx(SCRIPT), "--unsafe-fixes", "--steps", "40", "--warmup", "5", "--reps", "1", "--threads", "1")
    assert doc["rewritten"] is True and not doc["same_source"]
    orig = doc["original_vs_fp32"]
    assert orig["status"] == "FAIL", orig
    assert "ValueError: Attempting to unscale FP16 gradients." in orig["metrics"]["error"]
    assert orig["metrics"]["crashed_after"] == 0
    # the rewrite (cast removed), run in the same call: float32 master weights, float16 autocast
    parity = check(doc, "loss-parity")
    assert parity["status"] == "PASS", parity
    assert parity["metrics"]["skipped_after_warmup"] == 0 and parity["metrics"]["reduction_ratio"] >= 0.9
    assert check(doc, "amp-active")["status"] == "PASS"
    runs = {r["label"]: r for r in doc["runs"]}
    assert runs["fixed-amp"]["param_dtypes"].keys() == {"float32"} and runs["fixed-amp"]["steps"] == 40
    # forced to fp32 the original still trains float16 weights (the cast is not AMP's), so the
    # fp32 runs of the original and the rewrite differ: the fix changes the model's dtype (unsafe).
    # But with AMP on the original raises at its first step: it has no such training to keep, so
    # the difference is reported, not comparable (INFO), rather than failed.
    assert runs["original-fp32"]["param_dtypes"].keys() == {"float16"}
    eq = check(doc, "fp32-equivalence")
    assert eq["status"] == "INFO" and eq["detail"].startswith("not comparable: the original raised"), eq
    assert eq["metrics"]["identical"] is False


def test_unsafe_rewrite_only_removes_the_cast(tmp_path):
    path = tmp_path / SCRIPT
    shutil.copy(fx(SCRIPT), path)
    before = path.read_text()
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, "-m", "ampfix", "rewrite", "--unsafe-fixes", str(path)], cwd=ROOT,
                       capture_output=True, text=True, env=env)
    assert p.returncode in (0, 1), p.stderr
    after = path.read_text()
    removed = [ln for ln in before.splitlines() if ln not in after.splitlines()]
    assert removed == ["model.half()  # the mistake: float16 master weights"]
    assert "# the mistake: float16 master weights" in after  # the comment stays
    p = subprocess.run([sys.executable, "-m", "ampfix", "check", str(path)], cwd=ROOT, capture_output=True,
                       text=True, env=env)
    assert p.returncode == 0, p.stdout
