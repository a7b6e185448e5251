"""Start-up: `ampfix check` of a file without AMP code against `python -c pass`.

    python bench/bench_startup.py [--n 21] [--baseline-python /path/to/old/.venv/bin/python]

Times, as subprocesses run alternately (so machine noise hits every command alike), median of
`--n` runs each:
  * `python -c pass` (the interpreter's own start-up, the unit of the ratios);
  * `python -m ampfix check --no-cache plain.py` (a file with no AMP code: nothing to parse);
  * `python -m ampfix check plain.py` with an empty cache folder each time (a first run);
  * `python -m ampfix check plain.py` with the cache already filled (a warm run);
and the same ampfix commands for `--baseline-python` when given. Each command runs in a
temporary folder with its own `plain.py`, and also reports whether LibCST or a rule module was
imported (`-X importtime`, one extra run each).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLAIN = '''"""A module without any AMP code."""
import os
import json


def load(path):
    with open(os.path.join(path, "config.json")) as fh:
        return json.load(fh)


class Registry:
    def __init__(self):
        self.items = {}

    def add(self, name, value):
        self.items[name] = value
        return value
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=21)
    ap.add_argument("--baseline-python", metavar="PYTHON")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ampfix-startup-"))
    try:
        (work / "plain.py").write_text(PLAIN)
        pythons = [("current", sys.executable)]
        if args.baseline_python:
            pythons.append(("baseline", args.baseline_python))
        env = dict(os.environ)
        env.pop("AMPFIX_CACHE_DIR", None)
        cmds = {"python -c pass": ([sys.executable, "-c", "pass"], None)}
        for label, py in pythons:
            cmds[f"{label}: check --no-cache"] = ([py, "-m", "ampfix", "check", "--no-cache", "plain.py"], None)
            cmds[f"{label}: check, first run"] = ([py, "-m", "ampfix", "check", "plain.py"], "fresh")
            cmds[f"{label}: check, warm"] = ([py, "-m", "ampfix", "check", "plain.py"], "warm")
        caches = {k: work / f"cache-{i}" for i, k in enumerate(cmds)}
        for k, (cmd, mode) in cmds.items():  # fill the warm caches once
            if mode == "warm":
                subprocess.run(cmd, cwd=work, env=dict(env, AMPFIX_CACHE_DIR=str(caches[k])), capture_output=True)
        times = {k: [] for k in cmds}
        for _ in range(args.n):
            for k, (cmd, mode) in cmds.items():
                run_env = env
                if mode is not None:
                    if mode == "fresh":
                        shutil.rmtree(caches[k], ignore_errors=True)
                    run_env = dict(env, AMPFIX_CACHE_DIR=str(caches[k]))
                t0 = time.perf_counter()
                p = subprocess.run(cmd, cwd=work, env=run_env, capture_output=True)
                times[k].append(time.perf_counter() - t0)
                if p.returncode != 0:
                    raise SystemExit(f"{k}: exit {p.returncode}: {p.stderr.decode()[-500:]}")
        heavy = {}
        for k, (cmd, mode) in cmds.items():
            run_env = dict(env, AMPFIX_CACHE_DIR=str(caches[k])) if mode else env
            if mode == "fresh":
                shutil.rmtree(caches[k], ignore_errors=True)
            err = subprocess.run([cmd[0], "-X", "importtime", *cmd[1:]], cwd=work, env=run_env,
                                 capture_output=True, text=True).stderr
            mods = [line.rsplit("|", 1)[-1].strip() for line in err.splitlines() if line.startswith("import time:")]
            found = []
            if any(m == "libcst" for m in mods):
                found.append("libcst")
            n_rules = sum(m.startswith("ampfix.rules.") for m in mods)
            if n_rules:
                found.append(f"{n_rules} rule modules")
            heavy[k] = found
        base = statistics.median(times["python -c pass"])
        print(f"{args.n} runs each, alternating; {os.cpu_count()} cores, load average "
              f"{os.getloadavg()[0]:.1f} at the end")
        print()
        print("| command | median | / `python -c pass` | imports LibCST or rules |")
        print("|---|---:|---:|---|")
        for k, v in times.items():
            med = statistics.median(v)
            print(f"| {k} | {med * 1000:.0f} ms | {med / base:.1f}x | {', '.join(heavy[k]) or 'no'} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
