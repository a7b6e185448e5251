"""A `-j N` check's timeline (bench/SPEED.md, twenty-seventh session): when the pool starts and
ends, when each worker starts and ends each job (seconds of wall time since this script
started), and the files each job analysed (a worker's first job also analyses the files it
claimed while it parsed them for their summaries, `share.Claims`); then what the main process
does after the pool: leaving the run (`runner.run`, the collector's batch), and every garbage
collection from then on, with its duration.

    python bench/pool_timeline.py TREE [-j 2] [-v]

`-v` prints every job; without it, each worker's totals and its five longest jobs.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time

T0 = time.perf_counter()
sys.setrecursionlimit(20000)

from ampfix.engine import runner  # noqa: E402
from ampfix.frontends import cli  # noqa: E402

_INNER_WORK = runner._marked_work
_SETUP: dict = {}  # the rows' file and the tree (set before the pool forks its workers)


def _timed_work(item):
    """`runner._marked_work`, timed (in the workers: forks, appending to the same file); by name
    at module level, as the pool pickles what it submits."""
    start = time.perf_counter()
    out = _INNER_WORK(item)
    end = time.perf_counter()
    i, job = item
    with open(_SETUP["rows"], "a") as fh:
        fh.write(json.dumps([os.getpid(), i, os.path.relpath(job[0], _SETUP["tree"]), len(job[4]),
                             start - T0, end - T0, [j for j, _ in out]]) + "\n")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("tree")
    ap.add_argument("-j", type=int, default=2)
    ap.add_argument("-v", action="store_true")
    args = ap.parse_args()
    imported = time.perf_counter() - T0
    rows_file = tempfile.NamedTemporaryFile(prefix="ampfix-timeline-", suffix=".jsonl", delete=False).name
    marks: dict = {}

    _SETUP.update(rows=rows_file, tree=args.tree)

    def wrap(name: str, before: str, after: str) -> None:
        inner = getattr(runner, name)

        def timed(*a, **k):
            if before:
                marks[before] = time.perf_counter() - T0
            try:
                return inner(*a, **k)
            finally:
                marks[after] = time.perf_counter() - T0

        setattr(runner, name, timed)

    runner._marked_work = _timed_work
    wrap("_pool", "pool start", "pool end")
    wrap("_run", "", "_run end")
    wrap("run", "", "run end")
    collections: list = []
    started: dict = {}

    def note(phase, info):
        if phase == "start":
            started["t"] = time.perf_counter()
        elif "_run end" in marks:
            collections.append((info["generation"], time.perf_counter() - started["t"]))

    gc.callbacks.append(note)
    try:
        cli.main(["check", "--no-cache", "--select", "ALL", "-j", str(args.j), "-q", "-o", os.devnull, args.tree],
                 standalone_mode=False)
    except SystemExit:
        pass
    gc.callbacks.remove(note)
    end = time.perf_counter() - T0
    rows = []
    with open(rows_file) as fh:
        rows = [json.loads(line) for line in fh]
    os.unlink(rows_file)
    print(f"imports {imported:.3f}  pool start {marks.get('pool start', 0):.3f}  pool end {marks.get('pool end', 0):.3f}"
          f"  run end {marks.get('run end', 0):.3f}  (leaving the run "
          f"{(marks.get('run end', 0) - marks.get('_run end', 0)) * 1000:.1f} ms)  end {end:.3f}  jobs {len(rows)}")
    print("collections after the run (generation, ms):", [(g, round(t * 1000, 1)) for g, t in collections])
    for pid in sorted({r[0] for r in rows}):
        mine = sorted((r for r in rows if r[0] == pid), key=lambda r: r[4])
        busy = sum(r[5] - r[4] for r in mine)
        print(f"worker {pid}: {len(mine)} jobs, {sum(len(r[6]) for r in mine)} files analysed, first start "
              f"{mine[0][4]:.3f}, last end {mine[-1][5]:.3f}, busy {busy:.3f}")
        shown = mine if args.v else sorted(mine, key=lambda r: r[4] - r[5])[:5]
        for r in shown:
            print(f"   {r[4]:.3f}-{r[5]:.3f} {r[5] - r[4]:6.3f} s {r[3]:8d} B  {r[2]}  analysed {r[6]}")


if __name__ == "__main__":
    main()
