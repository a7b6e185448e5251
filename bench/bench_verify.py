"""Benchmark for `ampfix verify`: fp32 vs AMP steps/s of the training fixtures on this machine,
and which fixture bugs really change training here.

    python bench/bench_verify.py [--steps 200] [--reps 3] [--threads N] [--skip-bugs]
                                 [--large] [--all-bugs] [--jobs N] [--out DIR]
                                 [--fixtures NAME...] [--bugs NAME...]

On CUDA the fixtures train float16 with an enabled GradScaler, on the CPU bfloat16; the tables
name the dtype each run used.  `--large` adds the fixtures at sizes where tensor cores pay
(the seed's stack of Linear 4096 layers); `--all-bugs` verifies every buggy fixture (unsafe fixes
applied where the fixture's rule has only an unsafe fix); `--jobs` runs the buggy fixtures'
verifications side by side (they are not timed; the speed table always runs one at a time);
`--fixtures` and `--bugs` keep only the correct and the buggy fixtures of those names.

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
# (fixture, its arguments): the same scripts at sizes where float16 tensor cores pay off
LARGE = [
    # lr 0.02: at the fixture's 0.1 this width trains chaotically (fp32 against itself with
    # shifted seeds differed by 66% on an H200), so loss parity could not be read
    ("mlp.py", ["--width", "4096", "--depth", "4", "--batch", "1024", "--lr", "0.02"]),
    ("cnn.py", ["--batch", "512"]),
    ("transformer.py", ["--dim", "512", "--seq", "128", "--batch", "64"]),
]
# (buggy script, fixed copy or None for ampfix's own rewrite, options for verify)
BUGS = [
    ("buggy_clip_scaled.py", None, ["--preview"]),  # AMP003 is a preview rule
    ("buggy_update_per_optimizer.py", None, ["--preview"]),  # AMP004 is a preview rule
    ("buggy_backward_in_autocast.py", None, []),
    ("buggy_unscaled_backward.py", "fixed_unscaled_backward.py", []),
    ("buggy_scaler_in_loop.py", "fixed_scaler_in_loop.py", []),
]
# with --all-bugs: (buggy script, fixed copy or None, options for verify)
MORE_BUGS = [
    ("buggy_scaler_in_loop_fp16.py", None, []),
    ("buggy_missing_update.py", None, ["--preview"]),  # AMP009 is a preview rule
    ("buggy_accumulation_unscale.py", None, ["--preview"]),  # AMP010 is a preview rule
    ("buggy_token_boundary.py", None, ["--preview"]),  # AMP010 is a preview rule
    ("buggy_step_bypasses_scaler.py", None, ["--unsafe-fixes", "--preview"]),  # AMP007 is a preview rule
    ("buggy_gradient_penalty.py", "fixed_gradient_penalty.py", []),
    ("buggy_checkpoint_no_scaler.py", None, ["--unsafe-fixes", "--preview"]),
    ("buggy_half_with_scaler.py", None, ["--unsafe-fixes"]),
    ("buggy_fp16_no_scaler.py", None, ["--unsafe-fixes"]),
    ("scaler_with_bf16.py", None, ["--unsafe-fixes"]),
]


def verify(args, name, out=CACHE):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "ampfix.verify", "--json"] + args, cwd=ROOT,
                       env=env, capture_output=True, text=True)
    took = time.monotonic() - t0
    try:
        doc = json.loads(p.stdout)
    except ValueError:
        sys.exit("bench: %s failed (exit %d):\n%s" % (name, p.returncode, p.stderr[-3000:]))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, name + ".json"), "w") as f:
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


def check(doc, name):
    """The verify document's check called `name`."""
    (c,) = [c for c in doc["checks"] if c["name"] == name]
    return c


def dtype_of(run):
    return "/".join(run.get("autocast_dtypes") or ["none"])


def speed_row(name, doc, took):
    rows = {r["label"]: r for r in doc["runs"]}
    sp = check(doc, "speed")
    par = check(doc, "loss-parity")
    f, m = rows["fp32"], rows["fixed-amp"]
    mm = sp["metrics"]
    return "| %s | %s | %.1f (±%.0f%%) | %.1f (±%.0f%%) | %.2fx | %s | %s | %s %.2f%% / %.2f%% | %d | %.0fs |" % (
        name, dtype_of(m), f["steps_per_s_median"], 50 * f["steps_per_s_spread"],
        m["steps_per_s_median"], 50 * m["steps_per_s_spread"], mm["ratio"],
        ", ".join("%.2f" % r for r in mm["ratios_per_rep"]), sp["status"], par["status"],
        100 * par["metrics"]["max_gap"], 100 * par["metrics"]["final_gap"],
        m.get("skipped_after_warmup") or 0, took)


def fmt_check(c):
    if c is None:
        return "n/a"
    mm = c["metrics"]
    return "%s (max gap %.1f%%, reduction %s)" % (
        c["status"], 100 * mm.get("max_gap", float("nan")),
        "%.0f%% of fp32's" % (100 * mm["reduction_ratio"]) if mm.get("reduction_ratio") is not None else "n/a")


def bug_row(bug, fixed, doc):
    orig = doc["original_vs_fp32"]
    par = check(doc, "loss-parity")
    eq = check(doc, "fp32-equivalence")
    rows = {r["label"]: r for r in doc["runs"]}
    by = ("hand-fixed copy `%s`" % fixed) if fixed else (
        "ampfix rewrite (%s)" % ", ".join(sorted({f["code"] for f in doc.get("fixes") or [] if f.get("code")}) or "?")
        if doc["rewritten"] else "nothing (no change)")
    same_amp = doc["losses"].get("original") == doc["losses"]["fixed-amp"]
    skipped = "%s / %s" % ((rows.get("original") or {}).get("skipped_after_warmup", "n/a"),
                           rows["fixed-amp"].get("skipped_after_warmup", "n/a"))
    return "| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
        bug, dtype_of(rows["fixed-amp"]), by, fmt_check(orig), fmt_check(par), skipped,
        "identical" if eq["metrics"].get("max_rel_diff") == 0.0 else eq["status"],
        "identical" if same_amp else "differ", doc["status"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--skip-bugs", action="store_true", help="only the speed table")
    ap.add_argument("--only-bugs", action="store_true", help="only the buggy-fixture table")
    ap.add_argument("--large", action="store_true", help="also the correct fixtures at large sizes")
    ap.add_argument("--only-large", action="store_true", help="with --large: not the fixtures' own sizes")
    ap.add_argument("--all-bugs", action="store_true", help="every buggy fixture, not only the scaler ones")
    ap.add_argument("--jobs", type=int, default=1, help="buggy fixtures verified side by side")
    ap.add_argument("--out", default=CACHE, help="folder for the raw JSON documents")
    ap.add_argument("--fixtures", nargs="*", help="only the correct fixtures of these names")
    ap.add_argument("--bugs", nargs="*", help="only the buggy fixtures of these names")
    a = ap.parse_args()

    import torch  # only for the header

    common = ["--steps", str(a.steps), "--warmup", str(a.warmup), "--threads", str(a.threads)]
    print("# ampfix verify benchmark")
    print()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    print("- CPU: %s, %d cores, %d threads per run; torch %s; GPU: %s"
          % (cpu_model(), os.cpu_count(), a.threads, torch.__version__, gpu))
    print("- %d steps (%d warm-up excluded from timing), %d interleaved repetitions; "
          "load average at start: %s" % (a.steps, a.warmup, a.reps,
                                        " ".join("%.2f" % x for x in os.getloadavg())))
    print()
    own = [] if a.only_large else [(n, []) for n in CORRECT]
    speed = [] if a.only_bugs else own + (LARGE if a.large else [])
    speed = [s for s in speed if not a.fixtures or s[0] in a.fixtures]
    if speed:
        print("| fixture | AMP dtype | fp32 steps/s (median, ±half-spread) | AMP steps/s (median, ±half-spread) | "
              "AMP/fp32 | per-rep ratios | speed check | loss parity (max gap / final gap) | "
              "AMP steps skipped | wall |")
        print("|---|---|---|---|---|---|---|---|---|---|")
    for name, extra in speed:
        path = os.path.join(TRAIN, name)
        label = name + (" " + " ".join(extra) if extra else "")
        tag = name if not extra else name + "-" + "-".join(x.lstrip("-") for x in extra)
        doc, took = verify([path, "--fixed", path, "--reps", str(a.reps)] + common
                           + (["--"] + extra if extra else []), tag, a.out)
        print(speed_row(label, doc, took), flush=True)
    print()
    if a.skip_bugs:
        return
    bugs = BUGS + (MORE_BUGS if a.all_bugs else [])
    bugs = [b for b in bugs if not a.bugs or b[0] in a.bugs]

    def one(item):
        bug, fixed, opts = item
        args = [os.path.join(TRAIN, bug), "--reps", "1"] + opts + common
        if fixed:
            args += ["--fixed", os.path.join(TRAIN, fixed)]
        return verify(args, bug, a.out)[0]

    print("| buggy fixture | AMP dtype | fixed by | original vs fp32 | fixed vs fp32 | AMP steps skipped "
          "(original / fixed) | fp32: original == fixed | AMP: original == fixed | verify |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max(1, a.jobs)) as pool:
        for (bug, fixed, _), doc in zip(bugs, pool.map(one, bugs)):
            print(bug_row(bug, fixed, doc), flush=True)
    print()
    print("load average at end: %s" % " ".join("%.2f" % x for x in os.getloadavg()))


if __name__ == "__main__":
    main()
