"""`ampfix verify` on the training fixtures of AMP007 (step-bypasses-scaler), AMP008
(unscaled-backward) and AMP012 (gradient-penalty-unscaled): the original, as written, does not
train like fp32 on this CPU (bf16 autocast with an enabled GradScaler); ampfix's rewrite does
(AMP012, report only: the hand-fixed copy with the documented recipe does)."""

from __future__ import annotations

import pytest

from ampfix.api import check_source
from test_verify import FAST, check, fx, run_json


@pytest.mark.parametrize("script,codes", [
    ("buggy_step_bypasses_scaler.py", ["AMP007"]),
    ("buggy_unscaled_backward.py", ["AMP008"]),
    ("fixed_unscaled_backward.py", []),
    ("buggy_gradient_penalty.py", ["AMP012"]),
    ("fixed_gradient_penalty.py", []),
])
def test_training_fixtures_findings(script, codes):
    # preview on: AMP007 is a preview rule (and no other preview rule fires on these fixtures)
    with open(fx(script), encoding="utf-8") as f:
        assert [d.code for d in check_source(f.read(), script, preview=True)] == codes


@pytest.fixture(scope="module")
def torch_available():
    pytest.importorskip("torch")


def _fp32_identical(doc):
    eq = check(doc, "fp32-equivalence")
    assert eq["status"] == "PASS" and eq["metrics"]["identical"] is True
    assert doc["losses"]["original-fp32"] == doc["losses"]["fp32"]


def test_step_bypassing_scaler_diverges_and_unsafe_rewrite_trains(torch_available):
    # opt.step() after scaler.scale(loss).backward(): SGD applies 65536x gradients -> NaN.
    # AMP007 is a preview rule: its fix is applied with --preview
    p, doc = run_json(fx("buggy_step_bypasses_scaler.py"), *FAST, "--preview", "--unsafe-fixes", "--", "--lr", "0.1",
                      expect=0)
    assert doc["rewritten"] is True
    orig = doc["original_vs_fp32"]
    assert orig["status"] == "FAIL" and "non-finite" in orig["detail"], orig
    assert check(doc, "loss-parity")["status"] == "PASS"
    assert check(doc, "loss-parity")["metrics"]["max_gap"] < 0.05
    _fp32_identical(doc)
    (fixed,) = [r for r in doc["runs"] if r["label"] == "fixed-amp"]
    assert fixed["scaler_enabled"] and fixed["steps"] == 40


def test_unscaled_backward_stalls_and_rewrite_trains(torch_available):
    # loss.backward() with scaler.step(opt): updates 65536x too small, the loss stalls.
    p, doc = run_json(fx("buggy_unscaled_backward.py"), *FAST, "--", "--lr", "0.1", expect=0)
    assert doc["rewritten"] is True  # a safe fix: no --unsafe-fixes needed
    # the fixes applied, and the time it all took
    assert [(f["code"], f["count"]) for f in doc["fixes"]] == [("AMP008", 1)] and doc["fixes"][0]["lines"]
    assert doc["total_seconds"] > 0
    orig = doc["original_vs_fp32"]
    assert orig["status"] == "FAIL" and orig["metrics"]["reduction_ratio"] < 0.5, orig
    assert check(doc, "loss-parity")["status"] == "PASS"
    _fp32_identical(doc)
    (orig_run,) = [r for r in doc["runs"] if r["label"] == "original"]
    (fixed,) = [r for r in doc["runs"] if r["label"] == "fixed-amp"]
    assert orig_run["unscaled_backwards"] == 40 and not fixed.get("unscaled_backwards")


def test_gradient_penalty_not_unscaled_blows_up_and_recipe_trains(torch_available):
    # AMP012 has no automatic fix: the hand-fixed copy applies the documented recipe.
    p, doc = run_json(fx("buggy_gradient_penalty.py"), "--fixed", fx("fixed_gradient_penalty.py"), *FAST,
                      "--", "--lr", "0.1", expect=0)
    orig = doc["original_vs_fp32"]
    assert orig["status"] == "FAIL" and "non-finite" in orig["detail"], orig
    assert doc["losses"]["original"][0] > 50 * doc["losses"]["fixed-amp"][0]  # the penalty swamps the loss
    assert check(doc, "loss-parity")["status"] == "PASS"
    _fp32_identical(doc)
