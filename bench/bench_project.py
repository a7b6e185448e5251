"""What the project layer costs: the whole tree, and one changed file of a large project.

    python bench/bench_project.py --baseline-python /path/to/pre-project/.venv/bin/python
    python bench/bench_project.py --tree timm=bench/.cache/sdist-timm-1.0.31/timm-1.0.31 --file timm/utils/cuda.py

For a tree (default: the timm 1.0.31 sdist that `bench_check.py --sdists timm==1.0.31` or
`ecosystem.py --packages timm` downloads into the git-ignored bench/.cache/), in one run:

1. the whole tree, `ampfix check --no-cache -j 1`, with the project layer and without it
   (`AMPFIX_NO_PROJECT=1`: each file alone, the same checkout), interleaved, median of
   `--repeat`; the ratio is the project layer's cost; the findings of both (those the project
   layer adds or removes are listed); optionally also a baseline interpreter (`--baseline-python`);
2. one changed file, as pre-commit passes it: `ampfix check FILE` on a scratch copy of the tree,
   cold (`--no-cache`: the project reads, and parses, what the file imports) and warm (the cache
   filled by a whole-tree run, then a comment added to FILE: only FILE is parsed, the summaries
   of the modules it reads come from the cache), median of `--repeat`;
3. with `AMPFIX_STATS=1` (printed on stderr): files parsed for analysis, and modules the project
   summarised by parsing or read from the cache.

Results are printed as a Markdown table; `bench/PROJECT_RESULTS.md` records them.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_TREE = HERE / ".cache" / "sdist-timm-1.0.31" / "timm-1.0.31"


def run(cmd, cwd=None, env=None):
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env={**os.environ, **(env or {})})
    return time.perf_counter() - t0, res


def median_of(cmd, repeat, cwd=None, env=None, before=None):
    times, last = [], None
    for _ in range(repeat):
        if before is not None:
            before()
        t, last = run(cmd, cwd, env)
        times.append(t)
    return statistics.median(times), last


def findings(stdout: str) -> set:
    import json

    try:
        return {(d["filename"], d["location"]["row"], d["code"]) for d in json.loads(stdout or "[]")
                if d.get("type", "finding") == "finding"}
    except (ValueError, KeyError, TypeError):
        return set()


def stats(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.startswith("ampfix stats:")]
    return lines[-1][len("ampfix stats:"):].strip() if lines else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", default=f"timm={DEFAULT_TREE}", help="NAME=PATH of an unpacked project")
    ap.add_argument("--file", default="timm/utils/cuda.py", help="the changed file, relative to the tree")
    ap.add_argument("--baseline-python", default=None, help="an interpreter with ampfix before the project layer")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    name, _, path = args.tree.partition("=")
    tree = Path(path)
    if not tree.is_dir():
        sys.exit(f"{tree}: not found (download it first: python bench/ecosystem.py --fetch-only --packages timm)")
    me = [sys.executable, "-m", "ampfix", "check", "--select", "ALL", "--exit-zero", "-q"]
    files = sum(1 for _ in tree.rglob("*.py"))
    print(f"# project layer cost: {name} ({files} .py files), {platform.python_version()}, "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}, repeat {args.repeat}\n")

    # 1. the whole tree, with and without the project layer (the same checkout, interleaved)
    rows = []
    whole_cmd = [*me, "--no-cache", "-j", "1", "--output-format", "json", str(tree)]
    on_times, off_times, on_res, off_res = [], [], None, None
    for _ in range(args.repeat):
        t, on_res = run(whole_cmd, env={"AMPFIX_STATS": "1"})
        on_times.append(t)
        t, off_res = run(whole_cmd, env={"AMPFIX_STATS": "1", "AMPFIX_NO_PROJECT": "1"})
        off_times.append(t)
    whole, alone = statistics.median(on_times), statistics.median(off_times)
    rows.append(("whole tree, project layer on", whole, stats(on_res.stderr)))
    rows.append(("whole tree, each file alone (AMPFIX_NO_PROJECT=1)", alone, stats(off_res.stderr)))
    found_on, found_off = findings(on_res.stdout), findings(off_res.stdout)
    base = None
    if args.baseline_python:
        base, bres = median_of([args.baseline_python, "-m", "ampfix", "check", "--select", "ALL", "--exit-zero", "-q",
                                "--no-cache", "-j", "1", str(tree)], args.repeat, cwd=tempfile.gettempdir())
        rows.append(("whole tree, baseline interpreter", base, "-"))
    # 2. one changed file, cold and warm
    scratch = Path(tempfile.mkdtemp(prefix="ampfix-bench-project-"))
    try:
        copy = scratch / tree.name
        shutil.copytree(tree, copy)
        target = copy / args.file
        (copy / "pyproject.toml").touch()
        cold, cres = median_of([*me, "--no-cache", str(target)], args.repeat, env={"AMPFIX_STATS": "1"})
        rows.append((f"1 file ({args.file}), cold", cold, stats(cres.stderr)))
        cache = scratch / "cache"
        env = {"AMPFIX_CACHE_DIR": str(cache), "AMPFIX_STATS": "1"}
        run([*me, "-j", "1", str(copy)], env=env)  # fill the cache (results and summaries)
        original = target.read_text()
        counter = [0]

        def touch():
            counter[0] += 1
            target.write_text(original + f"\n# edit {counter[0]}\n")

        warm, wres = median_of([*me, str(target)], args.repeat, env=env, before=touch)
        rows.append((f"1 file ({args.file}), changed, warm cache", warm, stats(wres.stderr)))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print("| run | median s | stats (analysed, summaries parsed / from the cache) |")
    print("|---|---:|---|")
    for what, t, s in rows:
        print(f"| {what} | {t:.2f} | {s} |")
    print(f"\nproject layer on / off on the whole tree: {whole / alone:.2f}x (medians; "
          f"per-run ratios {', '.join(f'{a / b:.2f}' for a, b in zip(on_times, off_times))})")
    print(f"findings: {len(found_on)} with the project layer, {len(found_off)} without; only with it: "
          f"{sorted(found_on - found_off)}; only without it: {sorted(found_off - found_on)}")
    if base is not None:
        print(f"this checkout / baseline interpreter on the whole tree: {whole / base:.2f}x")


if __name__ == "__main__":
    main()
