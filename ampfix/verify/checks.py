"""The verdicts of `ampfix verify`, computed from the runs' recorded losses and timings.

Pure Python (no torch): every function takes plain lists/dicts read from the bootstrap's
JSON results.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence

PASS, FAIL, INCONCLUSIVE, INFO = "PASS", "FAIL", "INCONCLUSIVE", "INFO"


@dataclass
class Thresholds:
    max_gap: float = 0.05  # max relative gap of the smoothed curves
    final_gap: float = 0.03  # relative gap of the final-window means
    min_reduction: float = 0.90  # AMP's loss reduction / fp32's
    max_skipped: float = 0.05  # fraction of post-warm-up steps GradScaler may skip
    require_speedup: Optional[float] = None  # None: report only (CPU); CUDA default 1.1
    max_spread: float = 0.25  # (max-min)/median of a run's steps/s over reps
    equiv_tol: float = 0.0  # allowed relative difference, original vs fixed, both fp32


@dataclass
class Check:
    name: str
    status: str
    detail: str
    metrics: Dict[str, object] = field(default_factory=dict)

    def to_json(self):
        return asdict(self)


def as_float(v) -> float:
    if v is None:
        return float("nan")
    if isinstance(v, str):
        return float(v)  # "nan", "inf", "-inf"
    return float(v)


def smooth(xs: Sequence[float], window: int) -> List[float]:
    """Trailing moving average (partial windows at the start)."""
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= window:
            acc -= xs[i - window]
        out.append(acc / min(i + 1, window))
    return out


def window_for(n: int) -> int:
    return max(1, min(25, n // 10))


def parity_metrics(test: Sequence, base: Sequence, warmup: int = 0,
                   skipped: Optional[Sequence[bool]] = None) -> Dict[str, object]:
    """Compare a loss curve against the fp32 baseline curve."""
    a = [as_float(v) for v in test]
    b = [as_float(v) for v in base]
    n = min(len(a), len(b))
    m: Dict[str, object] = {"steps_compared": n, "steps_test": len(a), "steps_base": len(b)}
    m["all_finite"] = all(math.isfinite(x) for x in a[:n])
    m["base_finite"] = all(math.isfinite(x) for x in b[:n])
    if skipped is not None:
        after = list(skipped[warmup:n]) if n > warmup else []
        m["skipped_after_warmup"] = sum(1 for s in after if s)
        m["skipped_total"] = sum(1 for s in skipped[:n] if s)
        m["skipped_frac"] = (m["skipped_after_warmup"] / len(after)) if after else 0.0
    if n == 0 or not m["all_finite"] or not m["base_finite"]:
        return m
    a, b = a[:n], b[:n]
    w = window_for(n)
    sa, sb = smooth(a, w), smooth(b, w)
    floor = 0.05 * max(abs(x) for x in sb) or 1e-12
    gaps = [abs(x - y) / max(abs(y), floor) for x, y in zip(sa, sb)]
    m["window"] = w
    m["max_gap"] = max(gaps)
    m["max_gap_step"] = gaps.index(m["max_gap"])
    fw = max(5, n // 10) if n >= 10 else n
    fa, fb = statistics.fmean(a[-fw:]), statistics.fmean(b[-fw:])
    m["final_window"] = fw
    m["final_test"], m["final_base"] = fa, fb
    m["final_gap"] = abs(fa - fb) / max(abs(fb), floor)
    ia, ib = statistics.fmean(a[:fw]), statistics.fmean(b[:fw])
    m["reduction_test"], m["reduction_base"] = ia - fa, ib - fb
    # a baseline that barely moves (< 2% of its starting loss) gives no usable ratio
    if ib - fb > 0.02 * abs(ib):
        m["reduction_ratio"] = (ia - fa) / (ib - fb)
    else:
        m["reduction_ratio"] = None
    return m


def judge_parity(m: Dict[str, object], th: Thresholds, name: str = "loss-parity") -> Check:
    n = m.get("steps_compared", 0)
    if not m.get("base_finite", True):
        return Check(name, INCONCLUSIVE, "the fp32 baseline itself produced non-finite losses", m)
    if not m.get("all_finite", True):
        return Check(name, FAIL, "non-finite loss (NaN/inf) in the AMP run", m)
    if n < 10:
        return Check(name, INCONCLUSIVE, "only %d steps to compare (need >= 10)" % n, m)
    problems, ok = [], []
    if m["max_gap"] > th.max_gap:
        problems.append("max gap %.1f%% > %.1f%% (step %d)"
                        % (100 * m["max_gap"], 100 * th.max_gap, m["max_gap_step"]))
    else:
        ok.append("max gap %.2f%%" % (100 * m["max_gap"]))
    if m["final_gap"] > th.final_gap:
        problems.append("final gap %.1f%% > %.1f%%" % (100 * m["final_gap"], 100 * th.final_gap))
    else:
        ok.append("final gap %.2f%%" % (100 * m["final_gap"]))
    rr = m.get("reduction_ratio")
    inconclusive = None
    if rr is None:
        inconclusive = ("the fp32 baseline does not reduce the loss (by >= 2%%) over %d steps; "
                        "run more --steps" % n)
    elif rr < th.min_reduction:
        problems.append("loss reduction %.0f%% of fp32's < %.0f%%" % (100 * rr, 100 * th.min_reduction))
    else:
        ok.append("reduction %.0f%% of fp32's" % (100 * rr))
    sf = m.get("skipped_frac")
    if sf is not None and sf > th.max_skipped:
        problems.append("%d skipped steps after warm-up (%.0f%% > %.0f%%)"
                        % (m["skipped_after_warmup"], 100 * sf, 100 * th.max_skipped))
    if m["steps_test"] != m["steps_base"]:
        problems.append("ran %d steps vs fp32's %d" % (m["steps_test"], m["steps_base"]))
    if problems:
        return Check(name, FAIL, "; ".join(problems), m)
    if inconclusive:
        return Check(name, INCONCLUSIVE, inconclusive + "; " + ", ".join(ok), m)
    return Check(name, PASS, ", ".join(ok) + " over %d steps" % n, m)


def crashed(check: Check, steps: int, error: str) -> Check:
    """The parity verdict of an AMP run that raised after `steps` steps: a FAIL."""
    m = dict(check.metrics, crashed_after=steps, error=error)
    return Check(check.name, FAIL, "raised after %d step%s (%s); %s" % (
        steps, "" if steps == 1 else "s", error, check.detail), m)


def check_equivalence(orig: Sequence, fixed: Sequence, th: Thresholds, same_source: bool,
                      original_error: Optional[str] = None, original_steps: int = 0) -> Check:
    """Original and fixed, both forced to fp32: the same losses, or the rewrite changed more
    than precision handling.

    `original_error`: the error the original raised with AMP on (after `original_steps` steps).
    Forced to fp32 (autocast and GradScaler off) it does not raise and runs on along a path the
    script as written never takes: a difference there cannot be held against the fix, so it is
    INFO, not comparable. Identical losses still show that the rewrite changed nothing but
    precision handling (PASS)."""
    name = "fp32-equivalence"
    if same_source:
        return Check(name, PASS, "the fixed script is the original (no changes)", {"max_rel_diff": 0.0})
    a = [as_float(v) for v in orig]
    b = [as_float(v) for v in fixed]
    m: Dict[str, object] = {"steps_original": len(a), "steps_fixed": len(b)}
    if len(a) != len(b):
        failed = "original ran %d steps, fixed %d (both forced to fp32)" % (len(a), len(b))
        difference = "it ran %d step%s, the fixed script %d" % (len(a), "" if len(a) == 1 else "s", len(b))
    else:
        diffs = []
        for x, y in zip(a, b):
            if math.isnan(x) and math.isnan(y):
                diffs.append(0.0)
            elif x == y:
                diffs.append(0.0)
            else:
                diffs.append(abs(x - y) / max(abs(y), 1e-12))
        worst = max(diffs) if diffs else 0.0
        m["max_rel_diff"] = worst
        m["identical"] = worst == 0.0
        if worst <= th.equiv_tol:
            what = "identical" if worst == 0.0 else "max rel diff %.2e" % worst
            return Check(name, PASS, "original and fixed, both forced to fp32: %s losses over %d steps"
                         % (what, len(a)), m)
        where = "rel %.2e at step %d" % (worst, diffs.index(worst))
        failed = "forced to fp32, original and fixed differ (%s): the rewrite changed more than " \
                 "precision handling" % where
        difference = "its losses differ from the fixed script's (%s)" % where
    if original_error:
        m.update(comparable=False, original_error=original_error, original_crashed_after=original_steps)
        return Check(name, INFO, "not comparable: the original raised with AMP on (after %d step%s: %s); "
                     "forced to fp32 it does not, and runs on where the script as written never gets: "
                     "%s, which is not held against the fix"
                     % (original_steps, "" if original_steps == 1 else "s", original_error, difference), m)
    return Check(name, FAIL, failed, m)


def _check_amp_active_mindspore(run: Dict[str, object]) -> Check:
    """MindSpore compiles the graph: its op dtypes are not visible to the bootstrap, so AMP is
    read from what the train network was built with (amp level, cells' precision flags)."""
    name = "amp-active"
    amp = run.get("amp") or {}
    levels = sorted({b.get("amp_level") for b in amp.get("build_train_network") or []} |
                    {b.get("amp_level") for b in amp.get("auto_mixed_precision") or []} - {None})
    gd = run.get("graph_dtypes") or {}
    low = {k: v for k, v in gd.items() if k in ("bfloat16", "float16")}
    total = sum(gd.values())
    m = {"amp_levels": levels, "cell_dtypes": gd, "to_float_low": amp.get("to_float_low", 0)}
    lv = ("amp_level %s" % "/".join(levels)) if levels else "no amp_level"
    if low:
        return Check(name, PASS, "MindSpore %s: %s of %d layers compute in %s (cell precision "
                     "flags)" % (lv, "+".join(str(v) for v in low.values()), total,
                                 "/".join(sorted(low))), m)
    if any(l not in ("O0",) for l in levels):
        return Check(name, PASS, "MindSpore %s: op-level casts (not visible in the cells' "
                     "precision flags)" % lv, m)
    return Check(name, FAIL, "MindSpore %s and no cell set to float16/bfloat16: the fixed "
                 "script did not run under AMP" % lv, m)


def check_amp_active(run: Dict[str, object]) -> Check:
    name = "amp-active"
    if run.get("framework") == "mindspore":
        return _check_amp_active_mindspore(run)
    entries = run.get("autocast_entries") or {}
    on = {k: v for k, v in entries.items() if k.endswith("/on")}
    gd = run.get("graph_dtypes") or {}
    low = {k: v for k, v in gd.items() if k in ("bfloat16", "float16")}
    m = {"autocast_on": on, "graph_dtypes": gd}
    if not on:
        why = "autocast was never entered" if not entries else "autocast was entered only disabled"
        return Check(name, FAIL, "%s: the fixed script did not run under AMP" % why, m)
    if low:
        return Check(name, PASS, "autocast %s; reduced-precision tensors in the graph: %s"
                     % (", ".join(sorted(k[:-3] for k in on)), ", ".join(sorted(low))), m)
    if not gd and run.get("graph_opaque_nodes"):
        return Check(name, PASS, "autocast %s (compiled graph: dtypes not visible)"
                     % ", ".join(sorted(k[:-3] for k in on)), m)
    return Check(name, FAIL, "autocast was enabled but no op of the loss's graph ran in reduced "
                 "precision (graph dtypes: %s)" % (", ".join(sorted(gd)) or "none"), m)


def spread(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x]
    if len(xs) < 2:
        return 0.0
    return (max(xs) - min(xs)) / statistics.median(xs)


def check_speed(amp_rates: Sequence[Optional[float]], fp32_rates: Sequence[Optional[float]],
                th: Thresholds, enforce: bool, required: float) -> Check:
    name = "speed"
    a = [r for r in amp_rates if r]
    b = [r for r in fp32_rates if r]
    m: Dict[str, object] = {"amp_steps_per_s": list(a), "fp32_steps_per_s": list(b),
                            "required": required if enforce else None}
    if not a or not b:
        return Check(name, INCONCLUSIVE, "no timing (too few steps after warm-up?)", m)
    ratio = statistics.median(a) / statistics.median(b)
    pair = [x / y for x, y in zip(amp_rates, fp32_rates) if x and y]
    m.update(ratio=ratio, ratios_per_rep=pair, spread_amp=spread(a), spread_fp32=spread(b))
    text = "AMP/fp32 = %.2fx (median steps/s %.1f vs %.1f, %d rep%s)" % (
        ratio, statistics.median(a), statistics.median(b), len(pair), "" if len(pair) == 1 else "s")
    if not enforce:
        return Check(name, INFO, text + "; not enforced on the CPU (use --require-speedup)", m)
    noisy = max(m["spread_amp"], m["spread_fp32"]) > th.max_spread
    straddle = pair and min(pair) < required <= max(pair)
    if len(pair) < 2:
        return Check(name, INCONCLUSIVE, text + "; one repetition cannot tell speed from noise "
                     "(use --reps >= 2)", m)
    if noisy or straddle:
        return Check(name, INCONCLUSIVE, text + "; runs disagree (spread %.0f%%/%.0f%%, per-rep "
                     "ratios %s) against the required %.2fx" % (
                         100 * m["spread_amp"], 100 * m["spread_fp32"],
                         ", ".join("%.2f" % r for r in pair), required), m)
    if ratio >= required:
        return Check(name, PASS, text + " >= %.2fx required" % required, m)
    return Check(name, FAIL, text + " < %.2fx required" % required, m)
