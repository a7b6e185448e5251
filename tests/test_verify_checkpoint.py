"""AMP013 by running it: a resume checkpoint without the GradScaler's state costs skipped steps
after the resume (float16 autocast on the CPU), and ampfix's rewrite of it trains like fp32."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "fixtures", "train", "buggy_checkpoint_no_scaler.py")


@pytest.fixture(scope="module")
def torch_available():
    pytest.importorskip("torch")


def test_resume_without_scaler_state_fails_and_rewrite_passes(torch_available):
    before = open(SCRIPT).read()
    p = subprocess.run([sys.executable, "-m", "ampfix", "verify", SCRIPT, "--json", "--unsafe-fixes", "--preview", "--steps", "100",
                        "--warmup", "10", "--reps", "1", "--threads", "1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    doc = json.loads(p.stdout)
    assert open(SCRIPT).read() == before and doc["rewritten"] is True
    runs = {r["label"]: r for r in doc["runs"]}
    # as written: the scaler restarts at 65536 after the resume and backs off to 512 again,
    # skipping the steps in between
    orig = doc["original_vs_fp32"]
    assert orig["status"] == "FAIL", orig
    assert orig["metrics"]["skipped_after_warmup"] >= 6
    assert runs["original"]["scale_max"] == 65536.0
    # the rewrite saves and restores the scaler: no step skipped after the warm-up
    (parity,) = [c for c in doc["checks"] if c["name"] == "loss-parity"]
    assert parity["status"] == "PASS", parity
    assert parity["metrics"]["skipped_after_warmup"] == 0
