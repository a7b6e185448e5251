"""Runtime evidence for the GradScaler life-cycle rules, with `ampfix verify` run as a user runs
it (see tests/test_verify.py). The scripts are in fixtures/train/; each test checks what the
mistake does on this CPU and that ampfix's own rewrite of the script removes it."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys

import pytest

from test_verify import ROOT, check, fx, run_json, run_verify

ONE = ["--warmup", "5", "--reps", "1", "--threads", "1"]


@pytest.fixture(scope="module")
def torch_available():
    pytest.importorskip("torch")


def _rewrite_copy(tmp_path, name, *flags):
    path = tmp_path / name
    shutil.copy(fx(name), path)
    p = subprocess.run([sys.executable, "-m", "ampfix", "rewrite", *flags, str(path)], cwd=ROOT,
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    assert p.returncode in (0, 1), p.stderr
    return path.read_text()


def _code_without_docstring(text):
    tree = ast.parse(text)
    if tree.body and isinstance(tree.body[0], ast.Expr) and isinstance(tree.body[0].value, ast.Constant):
        tree.body = tree.body[1:]
    return ast.dump(tree)


# ---------------------------------------------------------------------------------------- AMP006


def test_scaler_in_loop_rewrite_is_the_hand_fix(tmp_path):
    """AMP006's rewrite of buggy_scaler_in_loop.py is, statement for statement, the hand-fixed
    copy (they differ only in the docstring and a comment)."""
    fixed = _rewrite_copy(tmp_path, "buggy_scaler_in_loop.py")
    hand = open(fx("fixed_scaler_in_loop.py")).read()
    assert _code_without_docstring(fixed) == _code_without_docstring(hand)


def test_scaler_in_loop_rewritten_bug_invisible_on_cpu_bf16(torch_available):
    # bf16 gradients never overflow, so a scaler that restarts at 65536 every iteration never
    # skips a step: the original and ampfix's rewrite train bit-identically on this CPU.
    p, doc = run_json(fx("buggy_scaler_in_loop.py"), "--steps", "40", *ONE, "--", "--lr", "0.1", expect=0)
    assert doc["rewritten"] is True and not doc["same_source"]
    assert doc["losses"]["original"] == doc["losses"]["fixed-amp"]
    assert doc["original_vs_fp32"]["status"] == "PASS"
    assert check(doc, "loss-parity")["status"] == "PASS"
    assert check(doc, "fp32-equivalence")["metrics"]["identical"] is True
    (orig,) = [r for r in doc["runs"] if r["label"] == "original"]
    assert orig["scale_min"] == orig["scale_max"] == 65536.0  # restarted every step, never needed to move


def test_scaler_in_loop_fp16_rewritten_and_verified(torch_available):
    # fp16 on the CPU with a sum-reduced loss: the gradients overflow at 65536. Built once, the
    # scaler backs off to 4096 in the first 4 steps (inside the warm-up) and trains like fp32;
    # built every iteration it starts at 65536 each time, so every step is skipped.
    p, doc = run_json(fx("buggy_scaler_in_loop_fp16.py"), "--steps", "100", "--warmup", "10", "--reps", "1",
                      "--threads", "1", expect=0)
    assert doc["rewritten"] is True
    orig = doc["original_vs_fp32"]
    assert orig["status"] == "FAIL", orig
    assert orig["metrics"]["skipped_total"] == 100  # every step of the original is skipped
    assert orig["metrics"]["reduction_ratio"] < 0.1  # ... so it does not train at all
    parity = check(doc, "loss-parity")
    assert parity["status"] == "PASS", parity
    assert parity["metrics"]["skipped_after_warmup"] == 0 and parity["metrics"]["skipped_total"] == 4
    assert parity["metrics"]["reduction_ratio"] >= 0.9
    assert check(doc, "amp-active")["status"] == "PASS"
    assert check(doc, "fp32-equivalence")["metrics"]["identical"] is True
    runs = {r["label"]: r for r in doc["runs"]}
    assert runs["fixed-amp"]["autocast_dtypes"] == ["float16"]
    assert runs["fixed-amp"]["scale_min"] == 4096.0 and runs["original"]["scale_min"] == 65536.0


# ------------------------------------------------------------------------------ AMP009 / AMP010


def _verify_raises_then_rewrite_passes(tmp_path, script, error, extra=()):
    """The original raises at run time under `ampfix verify` (its verdict fails, naming the
    error); ampfix's rewrite of it trains like fp32. Returns the document of the first call
    (the original and its rewrite). AMP009 and AMP010 are preview rules (their measured precision,
    ampfix/knowledge/precision.py): their fixes are applied with `--preview`, as a user asks."""
    p, first = run_json(fx(script), "--preview", "--steps", "40", *ONE, "--", *extra)
    orig = first["original_vs_fp32"]
    assert orig["status"] == "FAIL" and error in orig["metrics"]["error"], orig
    assert orig["metrics"]["crashed_after"] < 40
    assert check(first, "loss-parity")["status"] == "PASS"  # the rewrite, run in the same call
    # the original's crash is what the fix removes: it fails nothing of the fix's own
    assert check(first, "fp32-equivalence")["status"] in ("PASS", "INFO")
    assert p.returncode == 0 and first["status"] == "PASS", p.stdout[-3000:] + p.stderr[-3000:]
    _rewrite_copy(tmp_path, script, "--preview")
    p, doc = run_json(tmp_path / script, "--preview", "--steps", "40", *ONE, "--", *extra, expect=0)
    assert doc["same_source"]  # the rewrite left nothing to fix
    assert check(doc, "loss-parity")["status"] == "PASS"
    assert check(doc, "amp-active")["status"] == "PASS"
    (amp,) = [r for r in doc["runs"] if r["label"] == "fixed-amp"]
    assert amp["scaler_enabled"] and amp["steps"] == 40
    return first


def test_missing_update_raises_and_rewrite_passes(torch_available, tmp_path):
    # AMP009: scaler.step() without scaler.update(): the second step raises.
    _verify_raises_then_rewrite_passes(tmp_path, "buggy_missing_update.py",
                                       "RuntimeError: step() has already been called since the last update()",
                                       ["--lr", "0.1"])


def test_accumulation_unscale_raises_and_rewrite_passes(torch_available, tmp_path):
    # AMP010: unscale_ on every micro-batch of a 4-micro-batch window: the second one raises.
    # --lr 0.5: the gradient norm reaches the clipping threshold early (the fp32 runs below part
    # at step 19 here; at the default 0.2, at step 32 of 40)
    first = _verify_raises_then_rewrite_passes(
        tmp_path, "buggy_accumulation_unscale.py",
        "RuntimeError: unscale_() has already been called on this optimizer since the last update()",
        ["--lr", "0.5"])
    # Forced to fp32 the scaler is off, so the original does not raise: it clips every
    # micro-batch's partial sum where the rewrite clips once per window, and their fp32 losses
    # differ. The script as written never trains that way: not comparable (INFO), not a FAIL.
    eq = check(first, "fp32-equivalence")
    assert eq["status"] == "INFO", eq
    assert eq["detail"].startswith("not comparable: the original raised with AMP on (after 0 steps: "
                                   "RuntimeError: unscale_() has already been called"), eq
    assert "its losses differ from the fixed script's" in eq["detail"]
    assert eq["metrics"]["comparable"] is False and eq["metrics"]["original_crashed_after"] == 0
    assert "RuntimeError: unscale_()" in eq["metrics"]["original_error"]
    assert eq["metrics"]["identical"] is False  # the forced-fp32 runs did differ


def test_accumulation_unscale_not_comparable_in_the_table(torch_available):
    # the same verdict in the text report: one INFO line saying why, and the result passes
    p = run_verify(fx("buggy_accumulation_unscale.py"), "--preview", "--steps", "40", *ONE, "--", "--lr", "0.5")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (line,) = [ln for ln in p.stdout.splitlines() if ln.startswith("fp32-equivalence")]
    assert line.split()[1] == "INFO" and "not comparable: the original raised with AMP on" in line, line
    assert "result: PASS" in p.stdout.splitlines()


def test_token_boundary_unscale_raises_and_rewrite_passes(torch_available, tmp_path):
    # AMP010 with the boundary decided by a token count the boundary resets, not a modulo test.
    _verify_raises_then_rewrite_passes(
        tmp_path, "buggy_token_boundary.py",
        "RuntimeError: unscale_() has already been called on this optimizer since the last update()")
