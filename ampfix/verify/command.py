"""`ampfix verify`: run a training script before and after ampfix's fixes, and check that the
fixed script trains like fp32, really uses AMP, and (on CUDA) is faster.

Register with ``main.add_command(verify)``.  Importing this module does not import torch:
torch is only imported by the `ampfix.verify.trace` subprocesses.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional

import click

from ampfix.engine import signals
from ampfix.verify import checks as C
from ampfix.verify import report
from ampfix.verify.runner import RunOptions, RunResult, RunSpec, make_tmpdir, run_one

EXIT_OK, EXIT_FAIL, EXIT_ERROR = 0, 1, 2


def _err(msg: str) -> None:
    click.echo("ampfix verify: error: " + msg, err=True)


def _default_threads(nproc: int) -> int:
    n = os.cpu_count() or 1
    return max(1, n // max(1, nproc))


def detect_framework(source: str) -> Optional[str]:
    """"torch" or "mindspore" from what the script imports; None when it imports both.

    The imports say which framework trains the script without running it, and they are
    there in every script (an interpreter says nothing: a torch script can need another
    Python too, one with a CUDA build).  A script that does not parse, or imports neither,
    is taken for a torch script: its run reports what is wrong with it.
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return "torch"
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top == "mindspore":
                found.add("mindspore")
            elif top in ("torch", "lightning", "lightning_fabric", "pytorch_lightning", "accelerate"):
                found.add("torch")
    if found == {"mindspore", "torch"}:
        return None
    return "mindspore" if "mindspore" in found else "torch"


def _resolve_python(python: Optional[str]) -> Optional[str]:
    """An interpreter given as a path or a command name, as an absolute path; None if absent."""
    if python is None:
        return sys.executable
    if os.sep in python or (os.altsep and os.altsep in python):
        path = os.path.abspath(os.path.expanduser(python))
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    found = shutil.which(python)
    return os.path.abspath(found) if found else None


def _preflight(python: str, framework: str, timeout: float = 180.0) -> Optional[str]:
    """None when `python` runs and imports the framework, else a one-line reason."""
    module = "mindspore" if framework == "mindspore" else "torch"
    code = ("import sys; import %s as m; sys.stdout.write('%%s %%d.%%d' %% (m.__version__, "
            "sys.version_info[0], sys.version_info[1]))" % module)
    try:
        p = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
    except OSError as e:
        return "cannot run %s: %s" % (python, e.strerror or e)
    except subprocess.TimeoutExpired:
        return "%s did not import %s within %.0fs" % (python, module, timeout)
    if p.returncode != 0:
        lines = [l for l in p.stderr.strip().splitlines() if l.strip()]
        why = lines[-1] if lines else "exit status %d" % p.returncode
        return "%s cannot import %s (%s)" % (python, module, why)
    return None


def line_map(original: str, fixed: str) -> Dict[int, object]:
    """fixed line -> the original line it is (an int), or ("added", original line it was put
    before) for a line ampfix's fix added; 1-based."""
    a, b = original.splitlines(), fixed.splitlines()
    out: Dict[int, object] = {}
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        for k, j in enumerate(range(j1, j2)):
            out[j + 1] = i1 + k + 1 if tag == "equal" else ("added", i1 + 1)
    return out


def relabeller(fixed_path: str, script: str, lines: Dict[int, object]) -> Callable[[str], str]:
    """A function that rewrites the temporary fixed copy's path and line numbers in a text (a
    traceback, a warning) into the user's script and its lines: `File "<script>", line N`;
    a line the fix added says so (and where it went)."""
    shown = os.path.relpath(script) if not os.path.isabs(script) else script
    tb_re = re.compile(r'File "%s", line (\d+)([^\n]*)' % re.escape(fixed_path))
    warn_re = re.compile(r"%s:(\d+):" % re.escape(fixed_path))

    def where(n: int):
        m = lines.get(n, n)
        if isinstance(m, tuple):
            return m[1], " (a line ampfix's fix added before this one; line %d of the fixed copy)" % n
        return m, ""

    def tb(mt):
        line, note = where(int(mt.group(1)))
        return 'File "%s", line %d%s%s' % (shown, line, mt.group(2), note)

    def warn(mt):
        line, _ = where(int(mt.group(1)))
        return "%s:%d:" % (shown, line)

    def relabel(text: str) -> str:
        if not text:
            return text
        text = tb_re.sub(tb, text)
        text = warn_re.sub(warn, text)
        return text.replace(fixed_path, shown)

    return relabel


def _identity(text: str) -> str:
    return text


def _shown_error(run: RunResult, limit_lines: int = 40, relabel: Callable[[str], str] = _identity) -> str:
    err = run.error or ""
    tail = "\n".join(run.stderr.rstrip().splitlines()[-limit_lines:])
    text = "the %s run (%s) could not be used: " % (report.LABEL_TEXT.get(run.spec.label, run.spec.label),
                                                    run.spec.script)
    first = err.splitlines()[-1] if err else "unknown error"
    text += first
    if tail and (run.timed_out or run.result is None or (run.result or {}).get("error")):
        text += "\n--- the script's error output (last lines) ---\n" + tail
    elif err and len(err.splitlines()) > 1:
        text += "\n" + err
    return relabel(text)


@click.command("verify", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("script", type=click.Path(exists=True, dir_okay=False))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--fixed", "fixed", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A fixed copy of SCRIPT to verify (default: rewrite SCRIPT with ampfix's safe "
                   "fixes into a temporary copy; SCRIPT itself is never modified).")
@click.option("--steps", type=click.IntRange(min=2), default=200, show_default=True,
              help="Training iterations to run (the script must run at least this many).")
@click.option("--warmup", type=click.IntRange(min=0), default=10, show_default=True,
              help="Iterations excluded from timing and from the skipped-step count.")
@click.option("--reps", type=click.IntRange(min=1), default=3, show_default=True,
              help="Interleaved repetitions of the timed runs.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
              show_default=True, help="cpu hides CUDA from the script; cuda requires it.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="Intra-op threads per process (default: CPU count / processes).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed set before the script runs.")
@click.option("--timeout", type=click.FloatRange(min=1), default=600.0, show_default=True,
              help="Time limit per run in seconds; a run over it is killed with its process group.")
@click.option("--require-speedup", type=click.FloatRange(min=0), default=None,
              help="Required median steps/s ratio AMP/fp32 (default: 1.1 on CUDA; on the CPU "
                   "the speed is only reported unless this is given).")
@click.option("--max-gap", type=click.FloatRange(min=0), default=0.05, show_default=True,
              help="Max relative gap between the smoothed AMP and fp32 loss curves.")
@click.option("--final-gap", type=click.FloatRange(min=0), default=0.03, show_default=True,
              help="Max relative gap of the final-window mean losses.")
@click.option("--min-reduction", type=click.FloatRange(min=0), default=0.90, show_default=True,
              help="AMP's loss reduction must be at least this fraction of fp32's.")
@click.option("--max-skipped", type=click.FloatRange(min=0, max=1), default=0.05, show_default=True,
              help="Max fraction of post-warm-up steps GradScaler may skip.")
@click.option("--max-spread", type=click.FloatRange(min=0), default=0.25, show_default=True,
              help="Speed runs whose steps/s spread (max-min)/median exceeds this are inconclusive.")
@click.option("--calibrate", is_flag=True,
              help="Run fp32 again with shifted seeds and widen the parity thresholds to that "
                   "run-to-run noise.")
@click.option("--nproc-per-node", type=click.IntRange(min=0), default=0,
              help="Launch every run through torchrun with this many processes (gloo on the "
                   "CPU); rank 0 is compared.")
@click.option("--python", "python", default=None, metavar="PATH",
              help="Interpreter that runs the script (default: this one), e.g. the Python of "
                   "a MindSpore virtualenv.")
@click.option("--framework", type=click.Choice(["auto", "torch", "mindspore"]), default="auto",
              show_default=True, help="Which framework trains the script: auto reads its imports.")
@click.option("--unsafe-fixes", "unsafe", is_flag=True,
              help="Also apply ampfix's unsafe fixes when rewriting (as `check --fix --unsafe-fixes`).")
@click.option("--unsafe", "unsafe_old", is_flag=True, hidden=True, help="Deprecated: --unsafe-fixes.")
@click.option("--preview", is_flag=True, help="Also apply the fixes of preview rules (as `check --fix --preview`).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document instead of the table.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write the loss curves (fp32, original, fixed) to this PNG (needs matplotlib).")
@click.option("--keep", is_flag=True, help="Keep the temporary directory (runs' logs, results).")
@click.option("-y", "--yes", is_flag=True, help="Do not ask before running the script (CI; a "
                                                "non-interactive stdin does not ask either).")
def verify(script, script_args, fixed, steps, warmup, reps, device, threads, seed, timeout,
           require_speedup, max_gap, final_gap, min_reduction, max_skipped, max_spread, calibrate,
           nproc_per_node, python, framework, unsafe, unsafe_old, preview, as_json, plot_path, keep, yes):
    """Run SCRIPT and its fixed version (AMP on, AMP forced off) and check the fix.

    SCRIPT is executed: it runs with your permissions, as `python SCRIPT` would. ampfix says
    so and asks first when stdin is a terminal (--yes does not ask).

    Exit status: 0 every check passes, 1 a check fails or is inconclusive, 2 the script could
    not be run; stopped by Ctrl-C or SIGTERM, 130 or 143 (the runs and the temporary folder
    are gone first).  Arguments after `--` are passed to the script.
    """
    if unsafe_old:
        click.echo("ampfix verify: warning: --unsafe is deprecated, use --unsafe-fixes (the name `check` and "
                   "`rewrite` use)", err=True)
        unsafe = True
    del unsafe_old
    try:
        with signals.terminable():
            code = _verify(**locals())
    except (KeyboardInterrupt, signals.Terminated) as exc:  # the runs ended and the folder removed on the way
        signals.leave(signals.exit_status(exc))
    sys.exit(code)


def _consent(script: str, fixed: Optional[str], yes: bool) -> bool:
    """Say, in one line, that the user's code is about to run; ask when a person is there."""
    what = os.path.relpath(script) + (" and " + os.path.relpath(fixed) if fixed else " and its rewritten copy")
    line = "ampfix verify: this runs your code: %s, as Python, several times" % what
    if yes or not sys.stdin.isatty():
        click.echo(line + ".", err=True)
        return True
    return click.confirm(line + ". Run it?", default=False, err=True)


def _verify(script, script_args, fixed, steps, warmup, reps, device, threads, seed, timeout,
            require_speedup, max_gap, final_gap, min_reduction, max_skipped, max_spread,
            calibrate, nproc_per_node, python, framework, unsafe, as_json, plot_path,
            keep, yes, preview=False) -> int:
    if warmup >= steps:
        _err("--warmup (%d) must be smaller than --steps (%d)" % (warmup, steps))
        return EXIT_ERROR
    if plot_path:
        missing = report.plot_available()
        if missing:
            _err(missing)
            return EXIT_ERROR
    script = os.path.abspath(script)
    script_dir = os.path.dirname(script)
    try:
        with open(script, encoding="utf-8") as f:
            source = f.read()
    except (OSError, UnicodeDecodeError) as e:
        _err("cannot read %s: %s" % (script, e))
        return EXIT_ERROR
    if framework == "auto":
        framework = detect_framework(source)
        if framework is None:
            _err("%s imports both torch and mindspore: say which one trains it with "
                 "--framework torch or --framework mindspore" % os.path.relpath(script))
            return EXIT_ERROR
    interpreter = _resolve_python(python)
    if interpreter is None:
        _err("--python %s: no such interpreter (give the path of a Python executable, or a "
             "command on PATH)" % python)
        return EXIT_ERROR
    if framework == "mindspore" and nproc_per_node:
        _err("--nproc-per-node launches torchrun; it does not apply to MindSpore scripts")
        return EXIT_ERROR
    if framework == "mindspore" and device == "cuda":
        _err("--device cuda applies to torch scripts; a MindSpore script picks its device itself "
             "(ms.set_device)")
        return EXIT_ERROR
    if python is None and framework == "torch":
        if importlib.util.find_spec("torch") is None:
            _err("verify runs the script and needs PyTorch, which is not installed in this Python "
                 "(%s). Install torch, then `pip install ampfix[verify]`." % sys.executable)
            return EXIT_ERROR
    else:
        why = _preflight(interpreter, framework)
        if why:
            hint = ""
            if framework == "mindspore" and python is None:
                hint = ("; %s is a MindSpore script (it imports mindspore): pass the Python of "
                        "your MindSpore environment with --python PATH" % os.path.relpath(script))
            elif framework == "mindspore":
                hint = "; --python must be the Python of an environment with MindSpore installed"
            _err(why + hint)
            return EXIT_ERROR

    # Asked once the arguments are known to be usable, right before the first run.
    if not _consent(script, fixed, yes):
        _err("not run: answer y to run the script, or pass --yes")
        return EXIT_ERROR
    tmpdir = make_tmpdir()
    try:
        return _verify_in(**locals())
    finally:
        if keep:
            click.echo("ampfix verify: kept %s" % tmpdir, err=True)
        else:
            with signals.critical():  # a second Ctrl-C does not leave half a folder
                shutil.rmtree(tmpdir, ignore_errors=True)


def _verify_in(tmpdir, script, script_args, fixed, steps, warmup, reps, device, threads, seed,
               timeout, require_speedup, max_gap, final_gap, min_reduction, max_skipped,
               max_spread, calibrate, nproc_per_node, unsafe, as_json, plot_path, keep,
               script_dir, source, framework, interpreter, preview=False, **_ignored) -> int:
    started = time.monotonic()
    notes: List[str] = []
    fixes: List[Dict[str, object]] = []
    relabel: Callable[[str], str] = _identity
    rewritten = False
    if fixed:
        fixed_path = os.path.abspath(fixed)
        with open(fixed_path, encoding="utf-8") as f:
            same_source = f.read() == source
    else:
        try:
            from ampfix.api import AmpfixError, fix_file_report
        except ImportError as e:
            _err("the ampfix rewriter is not available (%s); pass a fixed copy with --fixed" % e)
            return EXIT_ERROR
        try:
            # as `ampfix rewrite SCRIPT` fixes it: its project's configuration and other modules read
            new, found, applied = fix_file_report(script, unsafe=unsafe, preview=preview)
            if not applied:
                new = source  # as read here (a byte order mark kept): nothing to rewrite
        except AmpfixError as e:
            _err("ampfix cannot rewrite %s: %s" % (script, e))
            return EXIT_ERROR
        fixed_path = os.path.join(tmpdir, "fixed", os.path.basename(script))
        os.makedirs(os.path.dirname(fixed_path))
        with open(fixed_path, "w", encoding="utf-8") as f:
            f.write(new)
        same_source = new == source
        rewritten = not same_source
        kind = "safe and unsafe fixes" if unsafe else "safe fixes"
        notes.append("ampfix rewrote the script (%s) into a temporary copy" % kind
                     if rewritten else "ampfix made no changes: the script is verified as written")
        # tracebacks and warnings of the copy name the user's script (its lines, when rewritten)
        relabel = relabeller(fixed_path, script, line_map(source, new))
        if rewritten:
            fixes = fixes_applied(found, applied)
        if not preview:
            hint = _preview_hint(script, unsafe, found, applied)
            if hint:
                notes.append(hint)

    th = C.Thresholds(max_gap=max_gap, final_gap=final_gap, min_reduction=min_reduction,
                      max_skipped=max_skipped, require_speedup=require_speedup,
                      max_spread=max_spread)
    opts = RunOptions(steps=steps, warmup=warmup, threads=threads or _default_threads(nproc_per_node),
                      seed=seed, device=device, timeout=timeout, nproc_per_node=nproc_per_node,
                      script_args=list(script_args), python=interpreter, framework=framework)

    plan: List[RunSpec] = []
    for rep in range(reps):
        plan.append(RunSpec("fixed-amp", fixed_path, "asis", rep, sys_path_dir=script_dir))
        plan.append(RunSpec("fp32", fixed_path, "fp32", rep, sys_path_dir=script_dir))
        if not same_source:
            plan.append(RunSpec("original", script, "asis", rep, sys_path_dir=script_dir))
        if rep == 0:
            if not same_source:
                plan.append(RunSpec("original-fp32", script, "fp32", 0, sys_path_dir=script_dir))
            if calibrate:
                plan.append(RunSpec("fp32-seed2", fixed_path, "fp32", 0, seed_offset=1,
                                    sys_path_dir=script_dir))

    progress = report.Progress(len(plan))
    results: Dict[str, List[Dict[str, object]]] = {}
    crashed: Dict[str, str] = {}  # AMP run label -> the last line of its error
    for spec in plan:
        what = "%s (rep %d/%d)" % (report.LABEL_TEXT.get(spec.label, spec.label), spec.rep + 1, reps) \
            if spec.label in ("fixed-amp", "fp32", "original") else report.LABEL_TEXT[spec.label]
        progress.start(what)
        try:
            run = run_one(spec, opts, tmpdir)
        except OSError as e:
            progress.close()
            _err("cannot start %s: %s" % (opts.python, e))
            return EXIT_ERROR
        progress.finish(what, run.elapsed, run.error is None)
        if run.error is not None and spec.label in ("original", "fixed-amp") and not run.timed_out \
                and run.result is not None and run.result.get("error") and "losses" in run.result \
                and (spec.label == "original" or run.result.get("iterations")):
            # An AMP run that crashed mid-training (e.g. MindSpore's LossMonitor stops on a NaN
            # loss) is a finding about that script, not a reason it cannot be verified: its
            # losses so far are compared, and its check fails.  (The fp32 runs must finish.)
            crashed.setdefault(spec.label, relabel(run.result["error"].rstrip().splitlines()[-1]))
            results.setdefault(spec.label, []).append(run.result)
            continue
        if run.error is not None:
            progress.close()
            msg = _shown_error(run, relabel=relabel)
            _err(msg)
            if as_json:
                click.echo(json.dumps({"status": "ERROR", "exit_code": EXIT_ERROR, "error": msg,
                                       "run": spec.label, "script": script}, indent=2))
            return EXIT_ERROR
        results.setdefault(spec.label, []).append(run.result)
    progress.close()

    first = {label: runs[0] for label, runs in results.items()}
    for label, r in first.items():
        if r.get("error"):
            continue
        if r.get("iterations", 0) < steps:
            notes.append("%s ran only %d of the %d steps asked (the script ended first)"
                         % (report.LABEL_TEXT.get(label, label), r.get("iterations", 0), steps))
    notes.extend(report.framework_notes(first))
    sink = [r for r in first.values() if r.get("sink_mode_forced_off")]
    if sink:
        notes.append("MindSpore: Model.train ran with dataset_sink_mode=False (one Python call "
                     "per step, so that every step's loss is seen)")
    for label in ("original", "fixed-amp"):
        who = "the script" if "original" not in first else \
            "the original" if label == "original" else "the fixed script"
        for w in (first.get(label) or {}).get("warnings") or []:
            note = "%s: %s" % (who, relabel(w))
            if note not in notes:
                notes.append(note)
    amp_run = first["fixed-amp"]
    if amp_run.get("n_backward_unscaled_with_scaler"):
        notes.append("the fixed script ran %d backward(s) on an unscaled loss while a GradScaler "
                     "was enabled" % amp_run["n_backward_unscaled_with_scaler"])

    calibration = None
    if calibrate:
        noise = C.parity_metrics(first["fp32-seed2"]["losses"], first["fp32"]["losses"])
        calibration = {"fp32_seed_noise": noise}
        if noise.get("max_gap") is not None:
            th.max_gap = max(th.max_gap, noise["max_gap"])
            th.final_gap = max(th.final_gap, noise["final_gap"])
            rr = noise.get("reduction_ratio")
            if rr:
                th.min_reduction = min(th.min_reduction, th.min_reduction * min(rr, 1 / rr))
        calibration["thresholds"] = {"max_gap": th.max_gap, "final_gap": th.final_gap,
                                     "min_reduction": th.min_reduction}
        notes.append("calibrated with a second fp32 seed: max gap %.1f%%, final gap %.1f%%, "
                     "min reduction %.0f%%" % (100 * th.max_gap, 100 * th.final_gap,
                                               100 * th.min_reduction))

    base = first["fp32"]["losses"]
    checks: List[C.Check] = []
    checks.append(C.judge_parity(C.parity_metrics(amp_run["losses"], base, warmup,
                                                  amp_run.get("skipped")), th))
    if "fixed-amp" in crashed:
        checks[-1] = C.crashed(checks[-1], amp_run.get("iterations", 0), crashed["fixed-amp"])
    checks.append(C.check_amp_active(amp_run))
    if same_source:
        checks.append(C.check_equivalence([], [], th, True))
    else:
        # an original that raised with AMP on has no AMP-off behaviour of its own to keep
        checks.append(C.check_equivalence(first["original-fp32"]["losses"], base, th, False,
                                          original_error=crashed.get("original"),
                                          original_steps=first["original"].get("iterations", 0)))
    on_cuda = any("cuda" in (r.get("param_devices") or []) for r in first.values()) or device == "cuda"
    enforce = on_cuda or require_speedup is not None
    required = require_speedup if require_speedup is not None else 1.1
    amp_rates = [r.get("steps_per_s") for r in results["fixed-amp"]]
    fp32_rates = [r.get("steps_per_s") for r in results["fp32"]]
    checks.append(C.check_speed(amp_rates, fp32_rates, th, enforce, required))
    original_check = None
    if not same_source:
        orig = first["original"]
        original_check = C.judge_parity(C.parity_metrics(orig["losses"], base, warmup,
                                                         orig.get("skipped")), th,
                                        name="original-vs-fp32")
        if "original" in crashed:
            original_check = C.crashed(original_check, orig.get("iterations", 0), crashed["original"])

    statuses = [c.status for c in checks]
    overall = C.FAIL if C.FAIL in statuses else C.INCONCLUSIVE if C.INCONCLUSIVE in statuses else C.PASS
    code = EXIT_OK if overall == C.PASS else EXIT_FAIL
    for label, runs in results.items():
        if len(runs) > 1 and any(r["losses"] != runs[0]["losses"] for r in runs[1:]):
            notes.append("the %s losses differ between repetitions (the script is not "
                         "deterministic); checks use the first" % report.LABEL_TEXT.get(label, label))

    rows = report.summarize_runs(results, warmup)
    if plot_path:
        curves = {k: first[k]["losses"] for k in ("fp32", "original", "fixed-amp") if k in first}
        try:
            report.write_plot(plot_path, curves, "ampfix verify: %s" % os.path.basename(script))
            notes.append("loss curves written to %s" % plot_path)
        except Exception as e:  # noqa: BLE001 - a plot problem must not hide the verdict
            notes.append("could not write the plot %s: %s" % (plot_path, e))

    if as_json:
        doc = {
            "script": script,
            "fixed": None if not fixed else os.path.abspath(fixed),
            "rewritten": rewritten,
            "same_source": same_source,
            "steps": steps, "warmup": warmup, "reps": reps, "threads": opts.threads,
            "device": "cuda" if on_cuda else "cpu",
            "nproc_per_node": nproc_per_node,
            "framework": framework,
            "python": interpreter,
            "status": overall,
            "exit_code": code,
            "checks": [c.to_json() for c in checks],
            "original_vs_fp32": original_check.to_json() if original_check else None,
            "calibration": calibration,
            "runs": rows,
            "losses": {k: v["losses"] for k, v in first.items()},
            "notes": notes,
            "fixes": fixes,
            "total_seconds": round(time.monotonic() - started, 3),
        }
        click.echo(json.dumps(doc, indent=2, default=str))
    else:
        click.echo("ampfix verify %s%s" % (os.path.relpath(script),
                                           (" (fixed: %s)" % os.path.relpath(fixed)) if fixed else ""))
        for n in notes:
            click.echo("note: " + n)
        for f in fixes:
            click.echo("fix: %s: %s%s" % (_fix_rule(f), f["description"], (" (x%d)" % f["count"]) if f["count"] > 1 else ""))
        click.echo("%d steps (%d warm-up), %d rep%s, %d thread%s%s" % (
            steps, warmup, reps, "" if reps == 1 else "s", opts.threads,
            "" if opts.threads == 1 else "s",
            ", torchrun x%d (rank 0)" % nproc_per_node if nproc_per_node else ""))
        click.echo("")
        click.echo(report.format_table(rows))
        click.echo("")
        click.echo(report.format_checks(checks, original_check))
        click.echo("")
        click.echo("result: %s" % overall)
        click.echo("total time: %s (%d runs)" % (_duration(time.monotonic() - started), len(plan)))
    return code


def _duration(seconds: float) -> str:
    if seconds < 60:
        return "%.1f s" % seconds
    return "%d min %02d s" % (seconds // 60, seconds % 60)


def _fix_rule(fix: Dict[str, object]) -> str:
    """A `fixes_applied` entry's rule and lines: "AMP003 clip-scaled-gradients (line 49)"."""
    lines: List[int] = fix["lines"]  # type: ignore[assignment]
    where = " (line%s %s)" % ("s" if len(lines) > 1 else "", ", ".join(map(str, lines))) if lines else ""
    return "%s %s%s" % (fix["code"], fix["name"], where)


def _preview_hint(script, unsafe, found, applied: Dict[str, int]) -> Optional[str]:
    """A note when the preview rules would fix more of the script than the default ones did
    (AMP003, clipping scaled gradients, is one): the rewrite was verified without them, and
    `--preview` verifies them too. None when they would not (or preview is on by configuration,
    where the two rewrites are the same)."""
    from ampfix.api import AmpfixError, fix_file_report
    try:
        _, found_p, applied_p = fix_file_report(script, unsafe=unsafe, preview=True)
    except AmpfixError:
        return None
    done = {key.split(":", 1)[0] for key in applied}
    more = fixes_applied(found_p, {k: n for k, n in applied_p.items() if k.split(":", 1)[0] not in done})
    if not more:
        return None
    by_code: Dict[str, str] = {}
    for f in more:  # one entry per rule (a rule may apply fixes of several kinds)
        by_code.setdefault(f["code"], _fix_rule(f))
    said = ", ".join(by_code.values())
    many = len(by_code) > 1
    return "not applied, from preview rules: the fix%s of %s; `--preview` applies and verifies %s" % (
        "es" if many else "", said, "them" if many else "it")


def fixes_applied(found, applied: Dict[str, int]) -> List[Dict[str, object]]:
    """The fixes a rewrite applied, one entry per rule and kind of fix: the rule, what the fix
    did, how many times, and the original script's lines of that rule's findings when every one
    of them was fixed (a rule with findings left names none: which ones were fixed is not
    known)."""
    by_code: Dict[str, List[int]] = {}
    names: Dict[str, str] = {}
    for d in found:
        by_code.setdefault(d.code, []).append(d.line)
        names[d.code] = d.name
    per_code: Dict[str, int] = {}
    for key, n in applied.items():
        per_code[key.split(":", 1)[0]] = per_code.get(key.split(":", 1)[0], 0) + n
    out: List[Dict[str, object]] = []
    for key, n in sorted(applied.items()):
        code, _, what = key.partition(": ")
        lines = sorted(set(by_code.get(code, [])))
        if per_code[code] < len(by_code.get(code, [])):
            lines = []
        if not names.get(code):
            from ampfix.engine.registry import all_rules

            rule = all_rules().get(code)
            names[code] = rule.name if rule else ""
        out.append({"code": code, "name": names[code], "description": what, "count": n, "lines": lines})
    return out


def main(argv: Optional[List[str]] = None) -> None:  # pragma: no cover - thin shim
    verify.main(args=argv, prog_name="ampfix verify")


if __name__ == "__main__":  # pragma: no cover
    main()
