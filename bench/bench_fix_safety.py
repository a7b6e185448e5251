"""Rewrites that are safe by construction (issue 18), measured on real trees.

For each tree (an unpacked source distribution; the ones bench_corpus.py downloads into
bench/.cache/ will do), on a fresh copy per run: `ampfix rewrite` (safe, then with
--unsafe-fixes) and then a fresh `ampfix check` of the written tree, with this checkout and,
when `--base DIR` names an exported older checkout, with that one too. It reports per tree and
tool: the findings before, the fixes written, the findings the rewrite says remain, what a
fresh check of the written files reports, whether a second rewrite changes anything, whether
every written file compiles, and the fixes refused with their reasons (`(not fixed: ...)` that
the older checkout did not print). Then `ampfix check --no-cache` timings, the two checkouts
interleaved on the same files, as a ratio (machines are noisy: compare ratios of one run).

    python bench/bench_fix_safety.py --trees bench/.cache/sdist-timm-1.0.31 ... \\
        --base /tmp/base --md-out bench/FIX_SAFETY.md

`--base DIR`: an older checkout exported with `git archive <commit> | tar -x -C DIR`; the script
links DIR/ampfix/rules to DIR/rules (the wheel's layout) and runs it with PYTHONPATH=DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import py_compile
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
NOT_FIXED = re.compile(r"\(not fixed: (.*)\)$")


def ampfix(env_root: Optional[Path], *args: str, cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, NO_COLOR="1", AMPFIX_WORKERS="1")
    if env_root is not None:
        env["PYTHONPATH"] = str(env_root)
    # `python -m` puts the working folder first on sys.path: never this checkout's, or the base
    # run would import this checkout's ampfix
    return subprocess.run([sys.executable, "-m", "ampfix", *args], cwd=cwd or tempfile.gettempdir(),
                          capture_output=True, text=True, env=env, timeout=3600)


def findings(env_root: Optional[Path], tree: Path) -> List[dict]:
    res = ampfix(env_root, "check", "--no-cache", "--exit-zero", "--output-format", "json", str(tree))
    return json.loads(res.stdout or "[]")


def snapshot(tree: Path) -> Dict[str, bytes]:
    return {str(p.relative_to(tree)): p.read_bytes() for p in tree.rglob("*.py")}


def one_run(env_root: Optional[Path], tree: Path, unsafe: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / tree.name
        shutil.copytree(tree, copy, symlinks=True)
        before = findings(env_root, copy)
        old = snapshot(copy)
        opts = ["--unsafe-fixes"] if unsafe else []
        res = ampfix(env_root, "rewrite", "--no-cache", "--output-format", "json", *opts, str(copy))
        reported = json.loads(res.stdout or "[]")
        summary = [ln for ln in res.stderr.splitlines() if ln.startswith("Found ")]
        new = snapshot(copy)
        changed = [k for k in new if new[k] != old.get(k)]
        broken = []
        for k in changed:
            try:
                py_compile.compile(str(copy / k), doraise=True)
            except py_compile.PyCompileError as exc:
                broken.append(f"{k}: {exc.msg.splitlines()[-1]}")
        fresh = findings(env_root, copy)
        ampfix(env_root, "rewrite", "--no-cache", *opts, str(copy))
        second = [k for k, v in snapshot(copy).items() if v != new.get(k)]
        key = lambda d: (d["path"], d["line"], d["column"], d["code"])  # noqa: E731
        refused = [(d["code"], NOT_FIXED.search(d["message"]).group(1)) for d in reported
                   if NOT_FIXED.search(d["message"])]
        left = {(d["path"].replace(str(copy), ""), d["code"], _norm(d["message"])) for d in reported}
        fixed = sorted({(d["path"].replace(str(copy), ""), d["line"], d["code"]) for d in before
                        if (d["path"].replace(str(copy), ""), d["code"], _norm(d["message"])) not in left})
        return {
            "before": len(before), "changed_files": len(changed), "remaining": len(reported),
            "fresh": len(fresh), "agrees": sorted(map(key, reported)) == sorted(map(key, fresh)),
            "summary": summary[-1] if summary else "", "second_rewrite_changes": len(second),
            "compile_errors": broken, "refused": refused, "fixed": fixed,
        }


def _norm(message: str) -> str:
    """A finding's message without line numbers and without the reason a fix was not applied."""
    return re.sub(r"\d+", "#", NOT_FIXED.sub("", message)).strip()


def check_times(roots: Dict[str, Optional[Path]], tree: Path, reps: int) -> Dict[str, List[float]]:
    out: Dict[str, List[float]] = {name: [] for name in roots}
    for _ in range(reps):
        for name, root in roots.items():  # interleaved: the same load for both
            t0 = time.perf_counter()
            ampfix(root, "check", "--no-cache", "--exit-zero", "-q", str(tree))
            out[name].append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trees", nargs="+", required=True, type=Path)
    ap.add_argument("--base", type=Path, help="an exported older checkout to compare with")
    ap.add_argument("--reps", type=int, default=3, help="check timings per tree and checkout")
    ap.add_argument("--json-out", type=Path)
    ap.add_argument("--md-out", type=Path)
    args = ap.parse_args()
    roots: Dict[str, Optional[Path]] = {"this": None}
    if args.base is not None:
        link = args.base / "ampfix" / "rules"
        if not link.exists():
            link.symlink_to(Path("..") / "rules")
        roots = {"base": args.base.resolve(), "this": None}
    results: Dict[str, dict] = {}
    for tree in args.trees:
        tree = tree.resolve()
        entry: dict = {}
        for name, root in roots.items():
            for unsafe in (False, True):
                entry[f"{name}-{'unsafe' if unsafe else 'safe'}"] = one_run(root, tree, unsafe)
        entry["check_seconds"] = check_times(roots, tree, args.reps)
        results[tree.name] = entry
        print(tree.name, json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "refused"} if isinstance(v, dict)
                                     and "before" in v else v for k, v in entry.items()}), flush=True)
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=1))
    if args.md_out:
        args.md_out.write_text(render(results, roots))


def render(results: Dict[str, dict], roots) -> str:
    lines = ["| tree | checkout | mode | found | files written | remaining (rewrite) | fresh check | agree | "
             "2nd rewrite changes | compile errors | refused |", "|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|"]
    for tree, entry in results.items():
        for run, r in entry.items():
            if run == "check_seconds":
                continue
            name, mode = run.split("-")
            lines.append(f"| {tree} | {name} | {mode} | {r['before']} | {r['changed_files']} | {r['remaining']} | "
                         f"{r['fresh']} | {'yes' if r['agrees'] else 'NO'} | {r['second_rewrite_changes']} | "
                         f"{len(r['compile_errors'])} | {len(r['refused'])} |")
    if "base" in roots:
        lines += ["", "| tree | check --no-cache, base (median s) | this (median s) | this/base |", "|---|---:|---:|---:|"]
        for tree, entry in results.items():
            t = entry["check_seconds"]
            b, h = statistics.median(t["base"]), statistics.median(t["this"])
            lines.append(f"| {tree} | {b:.2f} | {h:.2f} | {h / b:.2f}x |")
    if "base" in roots:
        lines += ["", "Findings the base checkout fixes and this one leaves (with --unsafe-fixes), and the reverse:", ""]
        for tree, entry in results.items():
            b, h = set(map(tuple, entry["base-unsafe"]["fixed"])), set(map(tuple, entry["this-unsafe"]["fixed"]))
            for path, line, code in sorted(b - h):
                lines.append(f"- {tree}: not fixed any more: {code} {path}:{line}")
            for path, line, code in sorted(h - b):
                lines.append(f"- {tree}: fixed now: {code} {path}:{line}")
    lines += ["", "Refused fixes (this checkout, --unsafe-fixes): code and reason", ""]
    for tree, entry in results.items():
        for code, why in entry.get("this-unsafe", {}).get("refused", []):
            lines.append(f"- {tree}: {code}: {why}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
