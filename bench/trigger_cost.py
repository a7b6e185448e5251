"""Where the project triggers' cost goes, and what each worker of a pool repeats (issue 21).

    python bench/trigger_cost.py TREE [TREE ...] [--first N] [--every K]
    python bench/trigger_cost.py TREE --workers 2

Default: the files of `ampfix check --no-cache --select ALL TREE` that the runner hands to its
workers (largest first, as `runner._run` orders them), each tested by `analyze.triggered` in
this process in that order, one project for the run: the process time of the first N files
(default 12: where the project's first readings of the tree are paid) against the rest, and
the files over 20 ms with the time of each stage (`reach_bound`, `reach_words`, `reach_held`),
and each stage's total with the files' own tests (`analyze._Tests`). `--every K`: only every
K-th job, as one worker of a pool of K reads the tree (what it repeats of the others' reading).

`--workers J`: runs `check --no-cache --select ALL -j J` with timers (process time, the
outermost call only) around `analyze.triggered`, LibCST's parse (`parsing.parse_module`) and
`Project._summarize` in every process (the pool's workers are forks of this one), and prints
each process's totals and their sum: run it with J = 1 and J = 2 to see what each worker of a
pool computes again.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
import time

sys.setrecursionlimit(20000)


def _jobs(tree: str):
    """The jobs the runner would hand to a pool, in its order (the pool is not started)."""
    import ampfix.engine.runner as runner
    from ampfix.frontends import cli

    captured = {}

    def stop(jobs, n, results):
        captured["jobs"] = jobs
        raise SystemExit(0)

    original = runner._pool
    runner._pool = stop
    try:
        cli.main(["check", "--no-cache", "--select", "ALL", "-j", "2", "-q", "-o", os.devnull, tree],
                 standalone_mode=False)
    except SystemExit:
        pass
    finally:
        runner._pool = original
    return captured.get("jobs", [])


def in_order(tree: str, first: int, every: int = 1) -> None:
    from ampfix.engine import analyze
    from ampfix.engine.registry import find_rule
    from ampfix.project.project import Project

    jobs = _jobs(tree)[::every]
    analyze.close_projects()
    stages: dict = {}
    totals: dict = {}
    for name in ("reach_bound", "reach_words", "reach_held"):
        def timed(self, *a, _f=getattr(Project, name), _n=name, **k):
            t0 = time.process_time()
            try:
                return _f(self, *a, **k)
            finally:
                spent = time.process_time() - t0
                stages[_n] = stages.get(_n, 0.0) + spent
                totals[_n] = (totals.get(_n, (0.0, 0))[0] + spent, totals.get(_n, (0.0, 0))[1] + 1)
        setattr(Project, name, timed)
    real_tests = analyze._Tests

    def tests(*a, **k):  # the files' own trigger tests (their masks, and each rule's strings)
        t0 = time.process_time()
        try:
            return real_tests(*a, **k)
        finally:
            got = totals.get("_Tests", (0.0, 0))
            totals["_Tests"] = (got[0] + time.process_time() - t0, got[1] + 1)
    analyze._Tests = tests
    times = []
    for k, (_, (path, codes, settings, _fix, data)) in enumerate(jobs):
        rules = [find_rule(c) for c in codes]
        stages.clear()
        t0 = time.process_time()
        found = analyze.triggered(rules, data.decode("utf-8", "replace"), path, settings)
        spent = time.process_time() - t0
        times.append(spent)
        if spent > 0.02:
            detail = " ".join(f"{s}={v:.3f}" for s, v in stages.items())
            print(f"  {k:4d} {spent:.3f} s {os.path.relpath(path, tree)} ({len(found)} rules) {detail}")
    analyze.close_projects()
    analyze._Tests = real_tests
    which = f" (one job in {every}, as one worker of {every} sees them)" if every > 1 else ""
    print(f"{os.path.basename(tree)}: {len(times)} files{which}, triggered {sum(times):.3f} s; the first {first} "
          f"{sum(times[:first]):.3f} s, the rest {sum(times[first:]):.3f} s")
    print("  stages: " + ", ".join(f"{n} {t:.3f} s ({c} calls)" for n, (t, c) in totals.items()))


def per_worker(tree: str, jobs: int) -> None:
    import ampfix.engine.analyze as analyze
    import ampfix.model.parsing as parsing
    import ampfix.project.project as project
    from ampfix.frontends import cli

    folder = tempfile.mkdtemp(prefix="trigger-cost-")
    totals: dict = {}
    depth: dict = {}

    def wrap(owner, name, label):
        original = getattr(owner, name)

        def timed(*a, **k):
            level = depth.get(label, 0)
            depth[label] = level + 1
            t0 = time.process_time()
            try:
                return original(*a, **k)
            finally:
                depth[label] = level
                if level == 0:
                    totals[label] = totals.get(label, 0.0) + time.process_time() - t0
                    totals[label + " calls"] = totals.get(label + " calls", 0) + 1
                    with open(os.path.join(folder, f"{os.getpid()}.json"), "w") as fh:
                        json.dump(totals, fh)
        setattr(owner, name, timed)

    wrap(analyze, "triggered", "triggered")
    wrap(parsing, "parse_module", "parse")
    wrap(project.Project, "_summarize", "summaries")
    for module in (analyze, project):
        module.parse_module = parsing.parse_module
    try:
        cli.main(["check", "--no-cache", "--select", "ALL", "-j", str(jobs), "-q", "-o", os.devnull, tree],
                 standalone_mode=False)
    except SystemExit:
        pass
    summed: dict = {}
    for f in sorted(glob.glob(os.path.join(folder, "*.json"))):
        with open(f) as fh:
            got = json.load(fh)
        print(f"  process {os.path.basename(f)[:-5]}: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                                                    for k, v in sorted(got.items())))
        for k, v in got.items():
            summed[k] = summed.get(k, 0) + v
    print(f"{os.path.basename(tree)} -j {jobs}, all processes: " +
          ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in sorted(summed.items())))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trees", nargs="+")
    ap.add_argument("--first", type=int, default=12)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--every", type=int, default=1, help="test every K-th job only (what one worker of K reads)")
    args = ap.parse_args(argv)
    for tree in args.trees:
        tree = os.path.abspath(tree)
        if args.workers:
            per_worker(tree, args.workers)
        else:
            in_order(tree, args.first, max(1, args.every))


if __name__ == "__main__":
    main()
