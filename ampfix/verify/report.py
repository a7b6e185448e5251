"""Text table, JSON document and loss-curve plot for `ampfix verify`."""

from __future__ import annotations

import statistics
import sys
from typing import Dict, List, Optional, Sequence

from ampfix.verify.checks import Check, as_float, spread

LABEL_TEXT = {
    "fixed-amp": "fixed (AMP)",
    "fp32": "fixed, fp32",
    "original": "original",
    "original-fp32": "original, fp32",
    "fp32-seed2": "fixed, fp32, seed 2",
}


class Progress:
    """A one-line progress bar on stderr (a line per run when stderr is not a terminal)."""

    def __init__(self, total: int, enabled: bool = True, stream=None):
        self.total = total
        self.done = 0
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()

    def _bar(self) -> str:
        width = 24
        filled = int(width * self.done / max(self.total, 1))
        return "[" + "#" * filled + "-" * (width - filled) + "] %d/%d" % (self.done, self.total)

    def start(self, what: str) -> None:
        if self.tty:
            self.stream.write("\r\033[K" + self._bar() + " running " + what)
            self.stream.flush()

    def finish(self, what: str, seconds: float, ok: bool) -> None:
        self.done += 1
        if not self.enabled:
            return
        msg = "%s %s %s (%.1fs)" % (self._bar(), what, "done" if ok else "FAILED", seconds)
        if self.tty:
            self.stream.write("\r\033[K" + msg + ("\n" if self.done == self.total or not ok else ""))
        else:
            self.stream.write("ampfix verify: " + msg + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self.done != self.total:
            self.stream.write("\n")
            self.stream.flush()


def _fmt_loss(v) -> str:
    x = as_float(v)
    if x != x:
        return "nan"
    return "%.4g" % x


def summarize_runs(results: Dict[str, List[Dict[str, object]]], warmup: int) -> List[Dict[str, object]]:
    """One row per label, aggregated over repetitions (losses from the first repetition)."""
    rows = []
    for label, runs in results.items():
        first = runs[0]
        rates = [r.get("steps_per_s") for r in runs if r.get("steps_per_s")]
        entries = first.get("autocast_entries") or {}
        on = sorted({k.split("/")[1] for k in entries if k.endswith("/on")})
        graph = first.get("graph_dtypes") or {}
        low = sorted(k for k in graph if k in ("bfloat16", "float16"))
        losses = first.get("losses") or []
        skipped = first.get("skipped") or []
        scales = [s for s in (first.get("scales") or []) if s is not None]
        rows.append({
            "label": label,
            "amp_active": bool(on) and (bool(low) or bool(first.get("graph_opaque_nodes"))),
            "autocast_dtypes": on,
            "graph_dtypes": sorted(graph),
            "param_dtypes": first.get("param_dtypes") or {},
            "param_devices": first.get("param_devices") or [],
            "optimizers": first.get("optimizers") or [],
            "steps": first.get("iterations"),
            "steps_per_s": rates,
            "steps_per_s_median": statistics.median(rates) if rates else None,
            "steps_per_s_spread": spread(rates) if rates else None,
            "skipped_total": sum(1 for s in skipped if s),
            "skipped_after_warmup": sum(1 for s in skipped[warmup:] if s),
            "scaler_enabled": bool(first.get("scaler_enabled")),
            "scale_min": min(scales) if scales else None,
            "scale_max": max(scales) if scales else None,
            "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None,
            "unscaled_backwards": first.get("n_backward_unscaled_with_scaler", 0),
            "frameworks": first.get("frameworks") or [],
            "reps": len(runs),
        })
    return rows


FRAMEWORK_TEXT = {"fabric": "Lightning Fabric", "accelerate": "Accelerate", "mindspore": "MindSpore"}


def _shown(value) -> str:
    """A recorded setting as the script would spell it: strings quoted, numbers and
    constructor texts (`FixedLossScaleManager(...)`, `None`) as they are."""
    if value is None:
        return "None"
    text = str(value)
    try:
        float(text)
        return text
    except ValueError:
        pass
    if text == "None" or (text.endswith(")") and "(" in text):
        return text
    return repr(text)


def _calls(entries, key: str) -> List[str]:
    by_class: Dict[str, List[str]] = {}
    for e in entries:
        if "argument" not in e:
            continue
        arg = "%s=%s" % (e["argument"], _shown(e.get(key)))
        args = by_class.setdefault(e.get("class", "?"), [])
        if arg not in args:
            args.append(arg)
    return ["%s(%s)" % (cls, ", ".join(args)) for cls, args in by_class.items()]


def framework_notes(first: Dict[str, Dict[str, object]]) -> List[str]:
    """What the framework's own precision switches asked for, and what the fp32 baseline forced."""
    notes: List[str] = []
    for label, who in (("fixed-amp", "the script"), ("original", "the original")):
        entries = (first.get(label) or {}).get("frameworks") or []
        for fw in sorted({e.get("framework") for e in entries if "argument" in e}):
            mine = [e for e in entries if e.get("framework") == fw]
            text = "%s: %s constructs %s" % (FRAMEWORK_TEXT.get(fw, fw), who,
                                             ", ".join(_calls(mine, "requested")))
            if label == "original" and first.get("fixed-amp") and \
                    _calls(mine, "requested") == _calls(
                        [e for e in first["fixed-amp"].get("frameworks") or []
                         if e.get("framework") == fw], "requested"):
                continue
            if label == "fixed-amp" and "original" in first:
                text = text.replace("the script", "the fixed script", 1)
            notes.append(text)
    entries = (first.get("fp32") or {}).get("frameworks") or []
    for fw in sorted({e.get("framework") for e in entries if "argument" in e}):
        mine = [e for e in entries if e.get("framework") == fw]
        forced = [e for e in mine if e.get("forced") is not None]
        name = FRAMEWORK_TEXT.get(fw, fw)
        if forced:
            notes.append("%s: the fp32 baseline forced %s" % (name, ", ".join(_calls(forced, "forced"))))
        for e in mine:
            if e.get("forced") is None and e.get("not_forced_why"):
                notes.append("%s: the fp32 baseline could not switch %s's precision (%s): only "
                             "autocast and GradScaler were forced off" % (
                                 name, e.get("class"), e["not_forced_why"]))
    return notes


def format_table(rows: Sequence[Dict[str, object]]) -> str:
    head = ["run", "AMP", "params", "steps/s (median ±spread)", "skipped", "scale", "loss first→last"]
    lines = []
    for r in rows:
        amp = ("on " + "/".join(r["autocast_dtypes"])) if r["amp_active"] else (
            "off" if not r["autocast_dtypes"] else "entered, no low-prec ops")
        params = ",".join(sorted(r["param_dtypes"])) or "-"
        if r["param_devices"]:
            params += " @" + ",".join(r["param_devices"])
        if r["steps_per_s_median"]:
            sp = "%.1f" % r["steps_per_s_median"]
            if r["reps"] > 1:
                sp += " ±%.0f%%" % (50 * r["steps_per_s_spread"])
            sp += " (n=%d)" % len(r["steps_per_s"])
        else:
            sp = "-"
        skipped = "%d (%d after warm-up)" % (r["skipped_total"], r["skipped_after_warmup"]) \
            if r["scaler_enabled"] or r["skipped_total"] else "-"
        if r["scale_min"] is not None:
            scale = "%g..%g" % (r["scale_min"], r["scale_max"])
        else:
            scale = "scaler off" if not r["scaler_enabled"] else "-"
        loss = "%s → %s (%s steps)" % (_fmt_loss(r["loss_first"]), _fmt_loss(r["loss_last"]), r["steps"])
        lines.append([LABEL_TEXT.get(r["label"], r["label"]), amp, params, sp, skipped, scale, loss])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    out = []
    for i, row in enumerate([head] + lines):
        out.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
        if i == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def format_checks(checks: Sequence[Check], original: Optional[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = ["%-*s  %-12s %s" % (width, c.name, c.status, c.detail) for c in checks]
    if original is not None:
        lines.append("")
        lines.append("for information: the original, as written, against fp32: %s (%s)"
                     % (original.status, original.detail))
    return "\n".join(lines)


def plot_available() -> Optional[str]:
    """None when matplotlib can be imported, else the message to show."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return ("--plot needs matplotlib, which is not installed: "
                "pip install 'ampfix[plot]' (or pip install matplotlib)")
    return None


def write_plot(path: str, curves: Dict[str, Sequence], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    styles = {"fp32": ("fp32 baseline", "k", "-"), "original": ("original", "tab:red", "--"),
              "fixed-amp": ("fixed (AMP)", "tab:blue", "-")}
    for label in ("fp32", "original", "fixed-amp"):
        if label not in curves:
            continue
        ys = [as_float(v) for v in curves[label]]
        name, color, ls = styles[label]
        # the fp32 baseline wide and pale underneath, so a matching AMP curve stays visible
        width, alpha = (3.0, 0.35) if label == "fp32" else (1.2, 1.0)
        ax.plot(range(1, len(ys) + 1), ys, ls, color=color, label=name, linewidth=width, alpha=alpha)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
