"""Benchmark for `ampfix verify`: fp32 vs AMP steps/s of the training fixtures on this machine,
and which fixture bugs really change training here.

    python bench/bench_verify.py [--steps 200] [--reps 3] [--threads N] [--skip-bugs]

Runs `python -m ampfix verify ... --json` (interleaved repetitions, pinned threads, fixed
seeds) and prints Markdown tables; the raw JSON documents go to bench/.cache/verify/.
Nothing is hard-coded: every figure printed is measured by this run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "fixtures", "train")
CACHE = os.path.join(ROOT, "bench", ".cache", "verify")

CORRECT = ["mlp.py", "cnn.py", "transformer.py"]
# (buggy script, fixed copy or None for ampfix's own rewrite)
BUGS = [
    ("buggy_clip_scaled.py", None),
    ("buggy_update_per_optimizer.py", None),
    ("buggy_backward_in_autocast.py", None),
    ("buggy_unscaled_backward.py", "fixed_unscaled_backward.py"),
    ("buggy_scaler_in_loop.py", "fixed_scaler_in_loop.py"),
]


def verify(args, name):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "ampfix.verify"] + args + ["--json"], cwd=ROOT,
                       env=env, capture_output=True, text=True)
    took = time.monotonic() - t0
    try:
        doc = json.loads(p.stdout)
    except ValueError:
        sys.exit("bench: %s failed (exit %d):\n%s" % (name, p.returncode, p.stderr[-3000:]))
    os.makedirs(CACHE, exist_ok=True)
    with open(os.path.join(CACHE, name + ".json"), "w") as f:
        json.dump(doc, f, indent=1)
    return doc, took


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--skip-bugs", action="store_true", help="only the speed table")
    ap.add_argument("--only-bugs", action="store_true", help="only the buggy-fixture table")
    a = ap.parse_args()

    import torch  # only for the header

    common = ["--steps", str(a.steps), "--warmup", str(a.warmup), "--threads", str(a.threads)]
    print("# ampfix verify benchmark")
    print()
    print("- CPU: %s, %d cores, %d threads per run; torch %s; CUDA available: %s"
          % (cpu_model(), os.cpu_count(), a.threads, torch.__version__, torch.cuda.is_available()))
    print("- %d steps (%d warm-up excluded from timing), %d interleaved repetitions; "
          "load average at start: %s" % (a.steps, a.warmup, a.reps,
                                        " ".join("%.2f" % x for x in os.getloadavg())))
    print()
    if not a.only_bugs:
        print("| fixture | fp32 steps/s (median, spread) | AMP bf16 steps/s (median, spread) | "
              "AMP/fp32 | per-rep ratios | loss parity (max gap / final gap) | wall |")
        print("|---|---|---|---|---|---|---|")
    for name in [] if a.only_bugs else CORRECT:
        path = os.path.join(TRAIN, name)
        doc, took = verify([path, "--fixed", path, "--reps", str(a.reps)] + common, name)
        rows = {r["label"]: r for r in doc["runs"]}
        sp = [c for c in doc["checks"] if c["name"] == "speed"][0]["metrics"]
        par = [c for c in doc["checks"] if c["name"] == "loss-parity"][0]
        f, m = rows["fp32"], rows["fixed-amp"]
        print("| %s | %.1f (±%.0f%%) | %.1f (±%.0f%%) | %.2fx | %s | %s %.2f%% / %.2f%% | %.0fs |" % (
            name, f["steps_per_s_median"], 50 * f["steps_per_s_spread"],
            m["steps_per_s_median"], 50 * m["steps_per_s_spread"], sp["ratio"],
            ", ".join("%.2f" % r for r in sp["ratios_per_rep"]), par["status"],
            100 * par["metrics"]["max_gap"], 100 * par["metrics"]["final_gap"], took))
    print()
    if a.skip_bugs:
        return
    print("| buggy fixture | fixed by | original vs fp32 | fixed vs fp32 | fp32: original == fixed "
          "| AMP: original == fixed |")
    print("|---|---|---|---|---|---|")
    for bug, fixed in BUGS:
        args = [os.path.join(TRAIN, bug), "--reps", "1"] + common
        if fixed:
            args += ["--fixed", os.path.join(TRAIN, fixed)]
        doc, took = verify(args, bug)
        orig = doc["original_vs_fp32"]
        par = [c for c in doc["checks"] if c["name"] == "loss-parity"][0]
        eq = [c for c in doc["checks"] if c["name"] == "fp32-equivalence"][0]

        def fmt(c):
            if c is None:
                return "n/a"
            mm = c["metrics"]
            return "%s (max gap %.1f%%, reduction %s)" % (
                c["status"], 100 * mm.get("max_gap", float("nan")),
                "%.0f%% of fp32's" % (100 * mm["reduction_ratio"]) if mm.get("reduction_ratio") is not None else "n/a")

        by = ("hand-fixed copy `%s`" % fixed) if fixed else (
            "ampfix rewrite" if doc["rewritten"] else "nothing (no change)")
        same_amp = doc["losses"].get("original") == doc["losses"]["fixed-amp"]
        print("| %s | %s | %s | %s | %s | %s |" % (
            bug, by, fmt(orig), fmt(par),
            "identical" if eq["metrics"].get("max_rel_diff") == 0.0 else eq["detail"],
            "identical" if same_amp else "differ"))
    print()
    print("load average at end: %s" % " ".join("%.2f" % x for x in os.getloadavg()))


if __name__ == "__main__":
    main()
