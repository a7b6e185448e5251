"""`ampfix verify` on scripts trained through Lightning Fabric and Hugging Face Accelerate.

Real runs on the CPU (bf16), as a user runs them.  The frameworks come from the test extra
`pip install -e ".[frameworks]"`; without them these tests are skipped.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "fixtures", "train")
# on the CPU also where CUDA is present: the tests state what verify does with the CPU's bf16
FAST = ["--steps", "40", "--warmup", "5", "--reps", "1", "--threads", "1", "--device", "cpu"]


def run_json(*args, timeout=300):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    p = subprocess.run([sys.executable, "-m", "ampfix.verify", str(args[0]), "--json"]
                       + [str(a) for a in args[1:]], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=timeout)
    try:
        doc = json.loads(p.stdout)
    except ValueError:
        pytest.fail("no JSON (exit %d):\n%s\n%s" % (p.returncode, p.stdout[-3000:], p.stderr[-3000:]))
    return p, doc


def check(doc, name):
    (c,) = [c for c in doc["checks"] if c["name"] == name]
    return c


def row(doc, label):
    (r,) = [r for r in doc["runs"] if r["label"] == label]
    return r


def needs(module):
    return pytest.mark.skipif(importlib.util.find_spec("torch") is None
                              or importlib.util.find_spec(module) is None,
                              reason="needs torch and %s (pip install -e '.[frameworks]')" % module)


@needs("lightning")
def test_fabric_bf16_mixed_passes_and_baseline_is_fabric_fp32():
    # Fabric's bf16-mixed plugin casts the module's inputs to bf16: forcing only autocast off
    # made the fp32 run fail ("mat1 and mat2 must have the same dtype"); the baseline now runs
    # Fabric(precision="32-true").
    p, doc = run_json(os.path.join(TRAIN, "fabric_mlp.py"), *FAST)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert doc["status"] == "PASS"
    parity = check(doc, "loss-parity")
    assert parity["status"] == "PASS" and parity["metrics"]["max_gap"] < 0.05
    assert check(doc, "amp-active")["status"] == "PASS"
    amp, fp32 = row(doc, "fixed-amp"), row(doc, "fp32")
    assert amp["autocast_dtypes"] == ["bfloat16"] and "bfloat16" in amp["graph_dtypes"]
    assert not fp32["amp_active"] and "bfloat16" not in fp32["graph_dtypes"]
    assert amp["param_dtypes"].keys() == {"float32"} and amp["steps"] == 40
    (asked,) = amp["frameworks"]
    assert (asked["framework"], asked["requested"], asked["forced"]) == ("fabric", "bf16-mixed", None)
    (forced,) = fp32["frameworks"]
    assert (forced["requested"], forced["forced"]) == ("bf16-mixed", "32-true")
    assert "Lightning Fabric: the fp32 baseline forced Fabric(precision='32-true')" in doc["notes"]


@needs("accelerate")
def test_accelerate_bf16_passes_and_baseline_is_mixed_precision_no():
    p, doc = run_json(os.path.join(TRAIN, "accelerate_mlp.py"), *FAST)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert check(doc, "loss-parity")["status"] == "PASS"
    assert check(doc, "loss-parity")["metrics"]["max_gap"] < 0.05
    assert check(doc, "amp-active")["status"] == "PASS"
    amp, fp32 = row(doc, "fixed-amp"), row(doc, "fp32")
    assert amp["autocast_dtypes"] == ["bfloat16"] and not fp32["amp_active"]
    assert [(e["requested"], e["forced"]) for e in fp32["frameworks"]] == [("bf16", "no")]


@needs("accelerate")
def test_accelerate_fp16_on_cpu_silently_trains_fp32():
    # Accelerator(cpu=True, mixed_precision="fp16") raises nothing, but enables AMP only off
    # the CPU: the script trains in fp32, and verify says so.
    p, doc = run_json(os.path.join(TRAIN, "accelerate_mlp.py"), *FAST, "--", "--mixed-precision", "fp16")
    assert p.returncode == 1
    amp_active = check(doc, "amp-active")
    assert amp_active["status"] == "FAIL" and "never entered" in amp_active["detail"]
    assert check(doc, "loss-parity")["metrics"]["max_gap"] == 0.0  # it *is* the fp32 run
    assert row(doc, "fixed-amp")["frameworks"][0]["requested"] == "fp16"


@needs("lightning")
def test_fabric_launched_ranks_are_traced_and_forced_too(tmp_path):
    # Fabric(devices=2, strategy="ddp") on the CPU starts rank 1 by re-running the script
    # (subprocess.Popen([sys.executable, script, ...])): the bootstrap starts it under itself,
    # so the fp32 baseline has no rank left in bf16-mixed.
    env_tmp = dict(os.environ, TMPDIR=str(tmp_path))
    p = subprocess.run([sys.executable, "-m", "ampfix.verify", os.path.join(TRAIN, "fabric_mlp.py"),
                        "--json", "--keep", "--steps", "12", "--warmup", "2", "--reps", "1",
                        "--threads", "1", "--", "--devices", "2"],
                       cwd=ROOT, env=dict(env_tmp, PYTHONPATH=ROOT), capture_output=True, text=True,
                       timeout=300)
    doc = json.loads(p.stdout)
    assert check(doc, "amp-active")["status"] == "PASS"
    (kept,) = [d for d in os.listdir(tmp_path) if d.startswith("ampfix-verify-")]
    children = {}
    for name in os.listdir(tmp_path / kept):
        if ".json.child" in name:
            children[name.split(".json")[0]] = json.loads((tmp_path / kept / name).read_text())
    assert set(children) == {"fixed-amp-0", "fp32-0"}, os.listdir(tmp_path / kept)
    amp_child, fp32_child = children["fixed-amp-0"], children["fp32-0"]
    assert amp_child["iterations"] == fp32_child["iterations"] == 12
    assert amp_child["autocast_entries"] == {"cpu/bfloat16/on": 12}
    assert fp32_child["autocast_entries"] == {} and fp32_child["mode"] == "fp32"
    assert fp32_child["frameworks"][0]["forced"] == "32-true"
