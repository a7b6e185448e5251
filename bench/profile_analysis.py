"""Where the time of `ampfix check` goes on the files it analyses: parse against analysis, per
file and in total, and a cProfile of the analysis (top functions by own time).

    python bench/profile_analysis.py TREE [--top 15] [--files 8]

For every `*.py` under TREE whose text holds a rule's trigger (the files `check` parses), it
times `libcst.parse_module` and then the analysis (`ampfix.engine.analyze._analyze`: the model,
the rules, `# noqa`, positions of what is reported) without a profiler, twice each (the minimum
is kept: the machine is shared), with the cyclic GC paused where the engine pauses it, then
profiles the analysis of all of them once. Run it with
another venv's python (e.g. one holding the code before a change) to compare: it imports only
what both layouts have.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tree", type=Path)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--files", type=int, default=8, help="largest files shown one by one")
    args = ap.parse_args()

    import contextlib

    import libcst as cst
    from ampfix.engine import analyze as engine
    from ampfix.engine.analyze import _analyze, triggered

    # as the engine runs a file: with the cyclic GC paused where it pauses it (process_bytes)
    paused = getattr(engine, "gc_paused", contextlib.nullcontext)
    from ampfix.engine.registry import all_rules
    from ampfix.engine.results import Settings

    rules = [r for r in all_rules().values() if r.default_enabled]
    work = []
    for f in sorted(args.tree.rglob("*.py")):
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        active = triggered(rules, text)
        if active:
            work.append((f, text, active))
    rows = []
    for f, text, active in work:
        best_parse = best_analysis = float("inf")
        for _ in range(2):
            with paused():
                t0 = time.perf_counter()
                module = cst.parse_module(text)
                t1 = time.perf_counter()
                _analyze(module, text, str(f), active, Settings(), [r.code for r in rules])
                t2 = time.perf_counter()
            best_parse, best_analysis = min(best_parse, t1 - t0), min(best_analysis, t2 - t1)
        rows.append((f, len(text), best_parse, best_analysis))
    parse_s = sum(r[2] for r in rows)
    analysis_s = sum(r[3] for r in rows)
    print(f"{args.tree.name}: {len(rows)} files analysed; parse {parse_s:.2f} s, analysis {analysis_s:.2f} s "
          f"(analysis/parse {analysis_s / parse_s:.2f}); GC paused as the engine does: "
          f"{'yes' if paused is not contextlib.nullcontext else 'no (this engine does not)'}; "
          f"load average {os.getloadavg()[0]:.1f}")
    print()
    print("| file | KB | parse | analysis | analysis/parse |")
    print("|---|---:|---:|---:|---:|")
    for f, size, p, a in sorted(rows, key=lambda r: -r[1])[:args.files]:
        print(f"| {f.relative_to(args.tree)} | {size // 1024} | {p:.3f} s | {a:.3f} s | {a / p:.2f} |")
    modules = [(f, text, active, cst.parse_module(text)) for f, text, active in work]
    prof = cProfile.Profile()
    prof.enable()
    for f, text, active, module in modules:
        _analyze(module, text, str(f), active, Settings(), [r.code for r in rules])
    prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(args.top)
    print()
    print("cProfile of the analysis (profiled, so slower than above), top functions by own time:")
    print()
    print("```text")
    root = str(Path(sys.prefix))
    for line in out.getvalue().splitlines():
        if line.strip() and not line.startswith(("   Ordered", "   List reduced")):
            print(line.replace(root + "/lib/python3.11/site-packages/", "").replace(os.getcwd() + "/", ""))
    print("```")


if __name__ == "__main__":
    main()
