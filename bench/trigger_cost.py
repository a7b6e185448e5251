"""Where the project triggers' cost goes, and what each worker of a pool repeats (issue 21).

    python bench/trigger_cost.py TREE [TREE ...] [--first N] [--every K]
    python bench/trigger_cost.py TREE --workers 2
    python bench/trigger_cost.py TREE --inherit index,spans,resolutions,words [--rounds 3]

Default: the files of `ampfix check --no-cache --select ALL TREE` that the runner hands to its
workers (largest first, as `runner._run` orders them), each tested by `analyze.triggered` in
this process in that order, one project for the run: the process time of the first N files
(default 12: where the project's first readings of the tree are paid) against the rest, and
the files over 20 ms with the time of each stage (`reach_bound`, `reach_words`, `reach_held`),
and each stage's total with the files' own tests (`analyze._Tests`). `--every K`: only every
K-th job, as one worker of a pool of K reads the tree (what it repeats of the others' reading).

`--inherit KINDS`: `check -j 2`'s pool timed, rounds alternating, as it is and with the project's
per-module text facts KINDS read in the parent before the fork (the workers inherit them for
free): the most that sharing those facts between the workers could save.

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
from typing import List

sys.setrecursionlimit(20000)


def _jobs(tree: str):
    """The jobs the runner would hand to a pool, in its order (the pool is not started)."""

    captured = {}

    def stop(jobs, n, results):
        captured["jobs"] = jobs
        raise SystemExit(0)

    _check_with_pool(tree, stop)
    return captured.get("jobs", [])


def _check_with_pool(tree: str, pool) -> None:
    """`ampfix check --no-cache --select ALL -j 2 TREE` in this process, with `pool` in place of
    the runner's `_pool(jobs, n, results)`."""
    import ampfix.engine.runner as runner
    from ampfix.frontends import cli

    original = runner._pool
    runner._pool = pool
    try:
        cli.main(["check", "--no-cache", "--select", "ALL", "-j", "2", "-q", "-o", os.devnull, tree],
                 standalone_mode=False)
    except SystemExit:
        pass
    finally:
        runner._pool = original


def in_order(tree: str, first: int, every: int = 1) -> None:
    from ampfix.engine import analyze
    from ampfix.engine.registry import find_rule
    from ampfix.project.project import Project

    jobs = _jobs(tree)[::every]
    analyze.close_projects()
    stages: dict = {}  # the current file's time per stage
    totals: dict = {}  # name -> (time, calls) over the run

    def timed(f, name, per_file):
        def wrapper(*a, **k):
            t0 = time.process_time()
            try:
                return f(*a, **k)
            finally:
                spent = time.process_time() - t0
                if per_file:
                    stages[name] = stages.get(name, 0.0) + spent
                t, c = totals.get(name, (0.0, 0))
                totals[name] = (t + spent, c + 1)
        return wrapper

    real = {name: getattr(Project, name) for name in ("reach_bound", "reach_words", "reach_held")}
    for name, f in real.items():
        setattr(Project, name, timed(f, name, True))
    real_tests = analyze._Tests
    # the files' own trigger tests (their masks, and each rule's strings)
    analyze._Tests = timed(real_tests, "_Tests", False)
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
    for name, f in real.items():
        setattr(Project, name, f)
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


FACTS = ("index", "spans", "resolutions", "words", "uses", "masks")


def inherited(tree: str, kinds: List[str], rounds: int) -> None:
    """`check --no-cache --select ALL -j 2` with the pool's wall time measured, alternately as
    it is and with the per-module text facts `kinds` (of `FACTS`) computed for every module of
    the project in the parent before the fork and not counted: what sharing them between the
    workers could save at most (its cost, the reading in the parent, is printed beside). Each
    run in a process of its own (`_one_run`): a process's memos would carry over."""
    import subprocess

    rows = []
    for _ in range(rounds):
        for prefill in (False, True):
            done = subprocess.run([sys.executable, os.path.abspath(__file__), tree, "--inherit", ",".join(kinds),
                                   "--one-run", "1" if prefill else "0"], capture_output=True, text=True)
            got = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append((prefill, got["pool"], got.get("reading", 0.0)))
    for prefill in (False, True):
        pools = [r[1] for r in rows if r[0] is prefill]
        what = f"{','.join(kinds)} inherited" if prefill else "as it is"
        extra = f"; the reading in the parent {max(r[2] for r in rows if r[0]):.3f} s" if prefill else ""
        print(f"{os.path.basename(tree)}, {what}: the pool {' '.join(f'{p:.3f}' for p in pools)} s{extra}")


def _one_run(tree: str, kinds: List[str], prefill: bool) -> None:
    """One run of `inherited`'s, in this process: prints {"pool": s, "reading": s} as JSON."""
    import ampfix.engine.runner as runner
    from ampfix.engine import analyze
    from ampfix.engine.registry import find_rule
    from ampfix.lexemes import masked

    real_pool = runner._pool
    got: dict = {}

    def pool(jobs, n, results):
        if prefill:
            t0 = time.process_time()
            path, codes, settings = jobs[0][1][0], jobs[0][1][1], jobs[0][1][2]
            project = analyze.project_for(path, settings)
            words = analyze._rule_set([find_rule(c) for c in codes])
            for f in project.graph.files():
                if "index" in kinds:
                    project.index(f)
                if "spans" in kinds:
                    project._def_spans(f)
                if "resolutions" in kinds:
                    project.graph._resolutions(f)
                if "words" in kinds:
                    project._text_words(f, words.words, words.lower_words)
                if "uses" in kinds:
                    project._uses_of(f)
                if "masks" in kinds:
                    masked(project.text(f) or "")
            if "resolutions" in kinds:
                project.graph._importers_map()
            got["reading"] = time.process_time() - t0
        t0 = time.time()
        real_pool(jobs, n, results)
        got["pool"] = time.time() - t0

    _check_with_pool(tree, pool)
    print(json.dumps(got))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trees", nargs="+")
    ap.add_argument("--first", type=int, default=12)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--every", type=int, default=1, help="test every K-th job only (what one worker of K reads)")
    ap.add_argument("--inherit", help=f"comma-separated, of {', '.join(FACTS)}: the pool with these facts "
                                      "read in the parent before the fork, against the pool as it is")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--one-run", choices=("0", "1"), help=argparse.SUPPRESS)  # `inherited`'s child
    args = ap.parse_args(argv)
    for tree in args.trees:
        tree = os.path.abspath(tree)
        if args.inherit:
            kinds = [k for k in args.inherit.split(",") if k]
            unknown = [k for k in kinds if k not in FACTS]
            if unknown:
                ap.error(f"--inherit: unknown {', '.join(unknown)} (of {', '.join(FACTS)})")
            if args.one_run is not None:
                _one_run(tree, kinds, args.one_run == "1")
            else:
                inherited(tree, kinds, args.rounds)
        elif args.workers:
            per_worker(tree, args.workers)
        else:
            in_order(tree, args.first, max(1, args.every))


if __name__ == "__main__":
    main()
