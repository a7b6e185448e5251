"""What keeping a module summary costs in each store (`ampfix/engine/cache.py`'s `Summaries`, the
cache between runs, against `ampfix/engine/share.py`'s `SharedSummaries`, the pool's folder
within one run), and `ModuleSummary.to_json` against `dataclasses.asdict`, on the largest
summaries of a tree. Each figure is the minimum of `--repeat` process-time runs; the two stores
are timed in the same process, one after the other.

    python bench/summary_store.py bench/.cache/sdist-accelerate-1.15.0/accelerate-1.15.0 --top 5
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tree")
    ap.add_argument("--top", type=int, default=5, help="the largest summaries (by JSON size) to time")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    from ampfix.engine.cache import Summaries
    from ampfix.engine.share import SharedSummaries
    from ampfix.project.project import Project

    root = Path(args.tree).resolve()
    project = Project(root)
    found = []
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith(".py"):
                s = project.summary(os.path.join(folder, name))
                if s is not None:
                    found.append((len(s.dumps()), s))
    found.sort(key=lambda x: -x[0])
    print(f"{len(found)} summaries; the {args.top} largest, ms (minimum of {args.repeat}):")
    print(f"{'module':48} {'JSON KB':>8} {'asdict':>7} {'to_json':>7} {'cache put':>9} {'cache get':>9} "
          f"{'pool put':>8} {'pool get':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        cache, pool = Summaries(Path(tmp) / "cache"), SharedSummaries(Path(tmp) / "pool")
        totals = [0.0] * 6
        for size, s in found[:args.top]:
            row = [_best(lambda: dataclasses.asdict(s), args.repeat), _best(s.to_json, args.repeat),
                   _best(lambda: cache.put(s.path, s.digest, s), args.repeat),
                   _best(lambda: cache.get(s.path, s.digest), args.repeat),
                   _best(lambda: pool.put(s.path, s.digest, s), args.repeat),
                   _best(lambda: pool.get(s.path, s.digest), args.repeat)]
            assert cache.get(s.path, s.digest) == s and pool.get(s.path, s.digest) == s
            totals = [a + b for a, b in zip(totals, row)]
            print(f"{os.path.relpath(s.path, root)[:48]:48} {size / 1024:8.0f} " + " ".join(
                f"{1000 * v:{w}.1f}" for v, w in zip(row, (7, 7, 9, 9, 8, 8))))
        print(f"{'total':48} {'':>8} " + " ".join(f"{1000 * v:{w}.1f}" for v, w in zip(totals, (7, 7, 9, 9, 8, 8))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
