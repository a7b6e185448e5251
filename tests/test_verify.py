"""Tests of `ampfix verify`, run as a user runs it: `python -m ampfix verify ...` in a subprocess.

The tests that run training scripts need torch (skipped without it) and use small step
counts so the whole file stays well under three minutes on a 2-core CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from ampfix.verify import checks as C

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "fixtures", "train")


def _verify_argv():
    """`python -m ampfix verify` once the command is registered, else the module shim."""
    try:
        from ampfix.frontends.cli import main

        if "verify" in getattr(main, "commands", {}):
            return [sys.executable, "-m", "ampfix", "verify"]
    except Exception:  # noqa: BLE001 - the CLI may be mid-construction
        pass
    return [sys.executable, "-m", "ampfix.verify"]


def run_verify(*args, timeout=240):
    """`ampfix verify ARGS` on the CPU unless ARGS name a `--device`: the tests state what verify
    does on the CPU (bfloat16, the speed reported, not enforced), and stay true on a machine
    with CUDA, where the fixtures train float16 and a speed-up is required (bench/gpu_verify.sh
    measures that; bench/RESULTS.md, "On CUDA")."""
    if "--device" not in args:
        args = (args[0], "--device", "cpu", *args[1:])
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return subprocess.run(_verify_argv() + [str(a) for a in args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def run_json(*args, expect=None, **kw):
    p = run_verify(args[0], "--json", *args[1:], **kw)  # before any `--` for the script
    if expect is not None:
        assert p.returncode == expect, p.stdout[-3000:] + p.stderr[-3000:]
    return p, json.loads(p.stdout)


def check(doc, name):
    (c,) = [c for c in doc["checks"] if c["name"] == name]
    return c


def fx(name):
    return os.path.join(TRAIN, name)


# One thread per run: on a loaded 2-core CI machine, two OpenMP threads per run spin against
# the other processes and run ~3x slower.
FAST = ["--steps", "40", "--warmup", "5", "--reps", "1", "--threads", "1"]


# ---------------------------------------------------------------------------------------
# no torch needed
# ---------------------------------------------------------------------------------------


def test_import_does_not_import_torch():
    code = "import sys, ampfix.verify.command, ampfix.verify.checks, ampfix.verify.report; " \
           "print('torch' in sys.modules)"
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "False"


def test_parity_metrics_on_synthetic_curves():
    base = [2.0 * 0.98 ** i for i in range(100)]
    close = [x * 1.01 for x in base]
    th = C.Thresholds()
    ok = C.judge_parity(C.parity_metrics(close, base), th)
    assert ok.status == C.PASS
    assert ok.metrics["max_gap"] == pytest.approx(0.01, rel=1e-6)
    stalled = [2.0 - 0.001 * i for i in range(100)]
    bad = C.judge_parity(C.parity_metrics(stalled, base), th)
    assert bad.status == C.FAIL and "reduction" in bad.detail
    nan = C.judge_parity(C.parity_metrics(base[:50] + ["nan"] + base[51:], base), th)
    assert nan.status == C.FAIL and "non-finite" in nan.detail
    flat = C.judge_parity(C.parity_metrics([1.0] * 50, [1.0] * 50), th)
    assert flat.status == C.INCONCLUSIVE and "does not reduce the loss" in flat.detail
    skipped = C.parity_metrics(base, base, warmup=10, skipped=[False] * 10 + [True] * 20 + [False] * 70)
    assert C.judge_parity(skipped, th).status == C.FAIL and skipped["skipped_after_warmup"] == 20


def test_equivalence_and_speed_verdicts():
    th = C.Thresholds()
    assert C.check_equivalence([1.0, 0.5], [1.0, 0.5], th, False).status == C.PASS
    diff = C.check_equivalence([1.0, 0.5], [1.0, 0.50001], th, False)
    assert diff.status == C.FAIL and "step 1" in diff.detail
    # an original that raised with AMP on: its forced-fp32 run is no behaviour of the script's
    crashed = C.check_equivalence([1.0, 0.5], [1.0, 0.50001], th, False, "RuntimeError: boom", 0)
    assert crashed.status == C.INFO and crashed.detail.startswith("not comparable: the original raised")
    assert "RuntimeError: boom" in crashed.detail and "step 1" in crashed.detail
    assert crashed.metrics["comparable"] is False
    shorter = C.check_equivalence([1.0], [1.0, 0.5], th, False, "RuntimeError: boom", 0)
    assert shorter.status == C.INFO and "it ran 1 step, the fixed script 2" in shorter.detail
    # ... but identical fp32 losses still show the rewrite is precision handling only
    assert C.check_equivalence([1.0, 0.5], [1.0, 0.5], th, False, "RuntimeError: boom", 0).status == C.PASS
    assert C.check_speed([150, 152], [100, 101], th, True, 1.1).status == C.PASS
    assert C.check_speed([100, 101], [100, 101], th, True, 1.1).status == C.FAIL
    # the reps disagree about the verdict: inconclusive rather than a guess
    assert C.check_speed([150, 90], [100, 100], th, True, 1.1).status == C.INCONCLUSIVE
    assert C.check_speed([150], [100], th, True, 1.1).status == C.INCONCLUSIVE
    assert C.check_speed([150], [100], th, False, 1.1).status == C.INFO


def test_missing_script_is_a_clean_usage_error(tmp_path):
    p = run_verify(tmp_path / "nope.py")
    assert p.returncode == 2
    assert "does not exist" in p.stderr
    assert "Traceback" not in p.stderr


def test_bad_warmup_is_a_clean_error():
    p = run_verify(fx("mlp.py"), "--steps", "10", "--warmup", "10")
    assert p.returncode == 2
    assert "--warmup (10) must be smaller than --steps (10)" in p.stderr
    assert "Traceback" not in p.stderr


def test_plot_without_matplotlib_is_a_clear_error(tmp_path):
    fake = tmp_path / "nompl" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake.parent), ROOT]))
    p = subprocess.run(_verify_argv() + [fx("mlp.py"), "--plot", str(tmp_path / "x.png")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert "--plot needs matplotlib" in p.stderr and "pip install" in p.stderr
    assert "Traceback" not in p.stderr


# ---------------------------------------------------------------------------------------
# running scripts: needs torch
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def torch_available():
    pytest.importorskip("torch")


@pytest.mark.parametrize("script,extra", [
    ("mlp.py", ["--calibrate", "--", "--width", "256"]),
    ("cnn.py", []),
    ("transformer.py", []),
])
def test_correct_fixtures_pass(torch_available, script, extra):
    p, doc = run_json(fx(script), *FAST, *extra, expect=0)
    assert doc["status"] == "PASS"
    assert check(doc, "loss-parity")["status"] == "PASS"
    assert check(doc, "loss-parity")["metrics"]["max_gap"] < 0.05
    assert check(doc, "amp-active")["status"] == "PASS"
    assert check(doc, "speed")["status"] == "INFO"  # CPU: reported, not enforced
    (amp,) = [r for r in doc["runs"] if r["label"] == "fixed-amp"]
    (fp32,) = [r for r in doc["runs"] if r["label"] == "fp32"]
    assert amp["amp_active"] and amp["autocast_dtypes"] == ["bfloat16"]
    assert not fp32["amp_active"] and "bfloat16" not in fp32["graph_dtypes"]
    assert amp["param_dtypes"] == {"float32": amp["param_dtypes"]["float32"]}
    assert amp["steps"] == 40 and amp["steps_per_s_median"] > 0
    assert doc["same_source"]  # ampfix finds nothing to fix in a correct script
    if "--calibrate" in extra:  # a second fp32 run with shifted seeds measures the noise
        cal = doc["calibration"]
        assert cal["fp32_seed_noise"]["max_gap"] > 0  # the seed shift really changed the run
        assert cal["thresholds"]["max_gap"] >= 0.05
        assert doc["losses"]["fp32-seed2"] != doc["losses"]["fp32"]
    n = len(doc["runs"])  # the progress bar goes to stderr, one line per run off a terminal
    assert "] 1/%d fixed (AMP)" % n in p.stderr and "] %d/%d " % (n, n) in p.stderr


def test_without_preview_the_notes_name_the_fixes_of_preview_rules(tmp_path):
    """AMP003 and AMP004 are preview rules: without `--preview` verify rewrites nothing of these
    scripts, and its notes say which fixes it left out and how to verify them (no run needed to
    see it: `_preview_hint` is what `_verify_in` adds to its notes)."""
    from ampfix.api import fix_file_report
    from ampfix.verify.command import _preview_hint

    for name, said in (("buggy_clip_scaled.py", "the fix of AMP003 clip-scaled-gradients (line 49)"),
                       ("buggy_update_per_optimizer.py", "the fix of AMP004 update-per-optimizer (line 54)")):
        _, found, applied = fix_file_report(fx(name))
        assert applied == {}
        assert _preview_hint(fx(name), False, found, applied) == (
            "not applied, from preview rules: %s; `--preview` applies and verifies it" % said)
    # a default rule's fix applied, nothing more from the preview rules: no note
    _, found, applied = fix_file_report(fx("buggy_scaler_in_loop.py"))
    assert applied and _preview_hint(fx("buggy_scaler_in_loop.py"), False, found, applied) is None
    # preview on by the project's configuration: the default rewrite already holds the fix
    project = tmp_path / "proj"
    project.mkdir()
    (project / "pyproject.toml").write_text("[tool.ampfix]\npreview = true\n")
    script = project / "train.py"
    script.write_text(open(fx("buggy_clip_scaled.py")).read())
    _, found, applied = fix_file_report(str(script))
    assert list(applied) and _preview_hint(str(script), False, found, applied) is None


def test_clip_scaled_gradients_rewritten_and_verified(torch_available, tmp_path):
    script = fx("buggy_clip_scaled.py")
    before = open(script).read()
    plot = tmp_path / "curves.png"
    try:
        import matplotlib  # noqa: F401

        plot_args = ["--plot", str(plot)]
    except ImportError:
        plot_args = []
    p, doc = run_json(script, *FAST, *plot_args, "--preview", expect=0)  # AMP003's fix: a preview rule
    assert open(script).read() == before  # the user's script is never modified
    assert doc["rewritten"] is True
    # the original, as written, does not train like fp32 ...
    orig = doc["original_vs_fp32"]
    assert orig["status"] == "FAIL", orig
    assert orig["metrics"]["reduction_ratio"] < 0.5
    # ... ampfix's rewrite (scaler.unscale_ before clipping) does
    assert check(doc, "loss-parity")["status"] == "PASS"
    eq = check(doc, "fp32-equivalence")
    assert eq["status"] == "PASS" and eq["metrics"]["identical"] is True
    assert doc["losses"]["original-fp32"] == doc["losses"]["fp32"]
    (amp,) = [r for r in doc["runs"] if r["label"] == "fixed-amp"]
    assert amp["scaler_enabled"] and amp["scale_min"] == 65536.0
    if plot_args:
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_fix_that_only_the_project_shows_is_rewritten_and_run(torch_available, tmp_path, device):
    """verify rewrites the script as `ampfix rewrite` does, reading its project: here the
    autocast region is entered through a helper of another module (`amp_ctx.py`), so AMP001 is
    found, and fixed, only with the project; the fixed copy runs with the script's own folder on
    its path (the helper imported).  On CUDA (skipped elsewhere; bench/gpu_verify.sh runs it)
    the fixed copy trains float16 with the scaler enabled."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA on this machine")
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "amp_ctx.py").write_text(textwrap.dedent("""\
        import torch


        def amp_autocast(device, dtype):
            return torch.autocast(device_type=device, dtype=dtype)
        """))
    source = open(fx("buggy_backward_in_autocast.py")).read()
    source = source.replace("import torch.nn.functional as F\n", "import torch.nn.functional as F\n\nfrom amp_ctx import amp_autocast\n")
    source = source.replace("with torch.autocast(device_type=device, dtype=amp_dtype):", "with amp_autocast(device, amp_dtype):")
    script = tmp_path / "train.py"
    script.write_text(source)
    line = source.splitlines().index("        scaler.scale(loss).backward()") + 1
    p, doc = run_json(script, *FAST, "--device", device)
    # 40 steps may leave parity inconclusive; on CUDA the fixture's small model gains no speed
    assert p.returncode in (0, 1), p.stdout[-3000:] + p.stderr[-3000:]
    assert script.read_text() == source  # the user's script is never modified
    assert doc["rewritten"] is True
    assert [(f["code"], f["lines"], f["count"]) for f in doc["fixes"]] == [("AMP001", [line], 1)]
    (amp,) = [r for r in doc["runs"] if r["label"] == "fixed-amp"]
    dtype = "float16" if device == "cuda" else "bfloat16"
    assert amp["steps"] == 40 and amp["amp_active"] and amp["autocast_dtypes"] == [dtype]
    assert amp["scaler_enabled"] is (device == "cuda")
    assert check(doc, "fp32-equivalence")["status"] == "PASS"


def test_unscaled_backward_hand_fixed(torch_available):
    p, doc = run_json(fx("buggy_unscaled_backward.py"), "--fixed", fx("fixed_unscaled_backward.py"),
                      *FAST, "--", "--lr", "0.1", expect=0)  # a faster start for 40 steps
    assert doc["original_vs_fp32"]["status"] == "FAIL"
    assert check(doc, "loss-parity")["status"] == "PASS"
    assert check(doc, "fp32-equivalence")["metrics"]["identical"] is True
    (orig,) = [r for r in doc["runs"] if r["label"] == "original"]
    assert orig["unscaled_backwards"] == 40  # seen: backward on the unscaled loss


def test_update_per_optimizer_rewritten_bug_invisible_on_cpu_bf16(torch_available):
    # AMP004 is fixed by ampfix, but on the CPU with bf16 no gradient overflows, so the scale
    # never backs off and both versions train identically: the bug does not change training.
    p, doc = run_json(fx("buggy_update_per_optimizer.py"), *FAST, "--preview", "--", "--lr", "0.1", expect=0)
    assert doc["rewritten"] is True
    assert check(doc, "loss-parity")["status"] == "PASS"
    assert check(doc, "fp32-equivalence")["metrics"]["identical"] is True
    assert doc["original_vs_fp32"]["status"] == "PASS"
    assert doc["losses"]["original"] == doc["losses"]["fixed-amp"]
    (fixed,) = [r for r in doc["runs"] if r["label"] == "fixed-amp"]
    assert fixed["optimizers"] == ["SGD"] and fixed["steps"] == 40  # 2 optimizers, 1 step each



def test_scaler_in_loop_bug_invisible_on_cpu_bf16(torch_available):
    # a fresh scaler every iteration restarts at 65536; with bf16 nothing overflows, so the
    # restart never matters: the bug does not change training on the CPU.
    p, doc = run_json(fx("buggy_scaler_in_loop.py"), "--fixed", fx("fixed_scaler_in_loop.py"),
                      *FAST, "--", "--lr", "0.1", expect=0)
    assert doc["original_vs_fp32"]["status"] == "PASS"
    assert doc["losses"]["original"] == doc["losses"]["fixed-amp"]
    assert check(doc, "fp32-equivalence")["metrics"]["identical"] is True


def _write(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def test_script_that_raises_exits_2_with_its_error(torch_available, tmp_path):
    script = _write(tmp_path, "boom.py", """
        import torch
        model = torch.nn.Linear(4, 1)
        raise ValueError("boom: bad config value")
    """)
    p = run_verify(script, "--fixed", script, *FAST)
    assert p.returncode == 2
    assert "ampfix verify: error:" in p.stderr
    assert "ValueError: boom: bad config value" in p.stderr
    assert "ampfix/verify" not in p.stderr  # the script's traceback, not ours


def test_hanging_script_is_killed_with_its_process_group(torch_available, tmp_path):
    pidfile = tmp_path / "child.pid"
    script = _write(tmp_path, "hang.py", """
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        open(%r, "w").write(str(child.pid))
        time.sleep(300)
    """ % str(pidfile))
    t0 = time.monotonic()
    p = run_verify(script, "--fixed", script, *FAST, "--timeout", "5")
    took = time.monotonic() - t0
    assert p.returncode == 2
    assert "killed after" in p.stderr and "time limit" in p.stderr
    assert took < 60
    pid = int(pidfile.read_text())
    for _ in range(50):  # the grandchild was in the killed process group
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, 9)
        pytest.fail("the script's child process survived the time-limit kill")


@pytest.mark.parametrize("script", ["mlp.py", "transformer.py"])
def test_correct_fixtures_on_cuda_train_float16(torch_available, script):
    """On a machine with CUDA (skipped elsewhere; bench/gpu_verify.sh runs it): autocast is
    float16, the scaler enabled, and `amp-active` finds float16 in the loss's graph (it did not
    before the graph walk kept its visited nodes alive: CUDA's node wrappers are made per access).
    The speed is not asserted: the fixtures at their own sizes are launch-bound on a big GPU."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA on this machine")
    p, doc = run_json(fx(script), *FAST, "--device", "cuda")
    assert check(doc, "amp-active")["status"] == "PASS", p.stdout[-3000:]
    assert check(doc, "loss-parity")["status"] == "PASS", p.stdout[-3000:]
    (amp,) = [r for r in doc["runs"] if r["label"] == "fixed-amp"]
    (fp32,) = [r for r in doc["runs"] if r["label"] == "fp32"]
    assert amp["autocast_dtypes"] == ["float16"] and "float16" in amp["graph_dtypes"]
    assert not fp32["amp_active"] and "float16" not in fp32["graph_dtypes"]
    assert amp["param_dtypes"] == {"float32": amp["param_dtypes"]["float32"]}


def test_device_cuda_without_cuda_is_an_error(torch_available):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    p = run_verify(fx("mlp.py"), "--fixed", fx("mlp.py"), "--device", "cuda", *FAST)
    assert p.returncode == 2
    assert "CUDA is not available" in p.stderr


def test_cublas_determinism_is_set_for_the_fp32_runs_only(monkeypatch):
    """The fp32 runs' losses are compared bit for bit, so they get cuBLAS's deterministic
    workspace; the AMP runs do not (on an H100 it cost the float16 step a third of its speed:
    bench/RESULTS.md, "On CUDA, fourth run"). A value the user set is kept in every run."""
    from ampfix.verify import runner

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert runner.child_env(1, "cuda", "torch", "fp32")["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert "CUBLAS_WORKSPACE_CONFIG" not in runner.child_env(1, "cuda", "torch", "asis")
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    for mode in ("fp32", "asis"):
        assert runner.child_env(1, "cuda", "torch", mode)["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


def test_a_script_asking_for_determinism_gets_the_cublas_setting_in_an_amp_run(torch_available, tmp_path):
    """torch refuses cuBLAS calls under `use_deterministic_algorithms(True)` without the setting,
    which the runner no longer gives the AMP runs: the tracer sets it when the script asks."""
    script = _write(tmp_path, "det.py", """
        import os
        import torch

        print("before", os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
        torch.use_deterministic_algorithms(True)
        print("after", os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(torch.ones(2, 4)).float().sum()
            loss.backward()
            opt.step()
    """)
    env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    out = tmp_path / "run.json"
    p = subprocess.run([sys.executable, "-m", "ampfix.verify.trace", "--out", str(out), "--steps", "3",
                        "--warmup", "0", "--mode", "asis", "--device", "cpu", script],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "before None" in p.stdout and "after :4096:8" in p.stdout
    assert json.loads(out.read_text())["iterations"] == 3


def test_script_without_optimizer_says_so(torch_available, tmp_path):
    script = _write(tmp_path, "noopt.py", """
        import torch
        model = torch.nn.Linear(4, 1)
        for _ in range(5):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(torch.randn(8, 4)).square().mean()
            loss.backward()
    """)
    p = run_verify(script, "--fixed", script, *FAST)
    assert p.returncode == 2
    assert "no optimizer step observed" in p.stderr


def test_script_without_autocast_is_not_verified_table_output(torch_available, tmp_path):
    script = _write(tmp_path, "fp32only.py", """
        import torch
        torch.manual_seed(0)
        model = torch.nn.Linear(16, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        x = torch.randn(256, 16); y = x.sum(1, keepdim=True)
        for _ in range(1000):
            opt.zero_grad()
            loss = (model(x) - y).square().mean()
            loss.backward()
            opt.step()
    """)
    p = run_verify(script, "--fixed", script, "--steps", "20", "--warmup", "2", "--reps", "1", "--threads", "1")
    assert p.returncode == 1, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert any(l.startswith("amp-active") and " FAIL " in l and "never entered" in l
               for l in lines), p.stdout
    assert any(l.startswith("loss-parity") and " PASS " in l for l in lines), p.stdout
    assert any(l.startswith("speed") and " INFO " in l for l in lines), p.stdout
    assert "result: FAIL" in p.stdout
    assert "steps/s" in p.stdout and "loss first" in p.stdout  # the table


def test_gradient_accumulation_and_script_args(torch_available, tmp_path):
    # 3 backwards per optimizer step: one iteration, loss summed; the script ends after
    # --iters (passed after `--`) iterations, before verify's --steps: said in a note.
    script = _write(tmp_path, "accum.py", """
        import sys, torch
        iters = int(sys.argv[sys.argv.index("--iters") + 1])
        torch.manual_seed(0)
        model = torch.nn.Linear(16, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        x = torch.randn(96, 16); y = x.sum(1, keepdim=True)
        for _ in range(iters):
            opt.zero_grad()
            for k in range(3):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = (model(x[32 * k:32 * k + 32]) - y[32 * k:32 * k + 32]).square().mean() / 3
                loss.backward()
            opt.step()
    """)
    p, doc = run_json(script, "--fixed", script, "--steps", "40", "--warmup", "2", "--reps", "1", "--threads", "1",
                      "--", "--iters", "25")
    (amp,) = [r for r in doc["runs"] if r["label"] == "fixed-amp"]
    assert amp["steps"] == 25
    assert any("ran only 25 of the 40 steps" in n for n in doc["notes"])
    assert check(doc, "loss-parity")["status"] == "PASS"
    assert p.returncode == 0


def test_distributed_rank0(torch_available):
    script = fx("ddp_mlp.py")
    p, doc = run_json(script, "--fixed", script, "--nproc-per-node", "2", "--steps", "20",
                      "--warmup", "2", "--reps", "1", "--threads", "1", expect=0)
    assert doc["nproc_per_node"] == 2
    assert check(doc, "loss-parity")["status"] == "PASS"
    assert check(doc, "amp-active")["status"] == "PASS"


def test_graph_walk_survives_short_lived_node_wrappers():
    """On CUDA the autograd nodes' Python objects are made on each access and freed when
    dropped (measured on an H200, bench/RESULTS.md "On CUDA"): a walk that remembered bare ids
    took a new wrapper at a freed address for a node already seen and stopped after three
    nodes, so `amp-active` saw only float32. Here every `next_functions` access makes fresh
    wrappers; the float16 tensor saved at the bottom must still be found."""
    torch = pytest.importorskip("torch")
    from ampfix.verify.trace import _Recorder

    class Node:  # the graph itself, alive for the whole walk
        def __init__(self, name, saved=None, children=()):
            self.name, self.saved, self.children = name, saved, list(children)

    class Wrapper:  # what Python sees: a fresh object per access
        def __init__(self, node):
            self._node = node

        def __dir__(self):
            return ["_saved_self"] if self._node.saved is not None else []

        def __getattr__(self, attr):
            if attr == "_saved_self" and self._node.saved is not None:
                return self._node.saved
            raise AttributeError(attr)

        @property
        def next_functions(self):
            return tuple((Wrapper(c), 0) for c in self._node.children)

    half = torch.zeros(2, dtype=torch.float16)
    chain = Node("AddmmBackward0", half)
    for i in range(6):
        chain = Node("Step%d" % i, torch.zeros(1), [chain])

    class Root:
        grad_fn = Wrapper(chain)

    rec = _Recorder.__new__(_Recorder)
    rec.torch, rec.graph_dtypes, rec.graph_opaque_nodes = torch, {}, 0
    rec._walk_graph(Root())
    assert rec.graph_dtypes == {"float32": 6, "float16": 1}
