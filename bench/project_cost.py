"""Where a `check` run's CPU goes, by stage, with the project layer and each file alone (issues 17, 21).

    python bench/project_cost.py TREE [TREE ...] [--alone] [--top N] [--jobs J]

Runs `ampfix check --no-cache --select ALL -j 1 TREE` in this process with timers (process
time) around LibCST's parse (`analyze.parse_module`, which the project's summaries use too),
`summarize` (a module's summary from its model), `Project._summarize` (the rest of making a
summary: the model), the trigger tests (`analyze.triggered`), each rule's `check`, and three
parts of the traces: `Events._roots` (the functions no call of the file reaches),
`Parallel.forward_kind` (a call that runs DataParallel replicas, asked of every call a trace
classifies) and `Events._inline_effects` (other modules' effects inlined into a trace). Each
timer counts its own time only (what a nested timer counts is taken out), so the stages add up
to the run; `rest` is what no timer covers (the models of the files analysed, the runner,
imports). `--alone`: with AMPFIX_NO_PROJECT=1 (each file alone). One run; the machine is shared,
so compare two checkouts by running this with each one's python, alternately. `--jobs J` (J > 1):
the run uses a pool of J workers (forks of this process), and each process's stages are printed,
then their sum: what a pool computes again is the sum's excess over a `-j 1` run's.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import sys
import tempfile
import time

sys.setrecursionlimit(20000)


_WORKER: dict = {}


def _marked_work(item):
    """`runner._marked_work`, then the worker's stages written down (a module-level function: the
    pool sends it to its workers by name)."""
    try:
        return _WORKER["work"](item)
    finally:
        with open(os.path.join(_WORKER["folder"], f"{os.getpid()}.json"), "w") as fh:
            json.dump({"total": time.process_time(), "own": _WORKER["own"]}, fh)


def measure(tree: str, top: int, jobs: int = 1) -> None:
    from ampfix.engine import analyze, runner
    from ampfix.engine.registry import all_rules
    from ampfix.frontends import cli
    from ampfix.model import summarize as summarize_module
    from ampfix.model.events import Events
    from ampfix.model.parallel import Parallel
    from ampfix.project.project import Project

    own: "collections.Counter[str]" = collections.Counter()
    open_timers: list = []

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            start = time.process_time()
            open_timers.append([name, 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.process_time() - start
                _, nested = open_timers.pop()
                own[name] += spent - nested
                if open_timers:
                    open_timers[-1][1] += spent
        return wrapper

    for code, rule in all_rules().items():
        check = rule.check
        rule.check = timed(f"rule {code}", lambda self, ctx, _check=check: list(_check(self, ctx)))
    analyze.parse_module = timed("parse (LibCST)", analyze.parse_module)
    analyze.triggered = timed("triggers", analyze.triggered)
    summarize_module.summarize = timed("summaries: summarize", summarize_module.summarize)
    Project._summarize = timed("summaries: the model", Project._summarize)
    Parallel.forward_kind = timed("traces: forward_kind", Parallel.forward_kind)
    Events._inline_effects = timed("traces: _inline_effects", Events._inline_effects)
    Events._roots = property(timed("traces: _roots", Events._roots.fget))
    folder = tempfile.mkdtemp(prefix="project-cost-")
    if jobs > 1:  # each worker writes its stages after each job (a worker's CPU counts from its fork)
        _WORKER.update(work=runner._marked_work, folder=folder, own=own)
        runner._marked_work = _marked_work
    start = time.process_time()
    try:
        cli.main(["check", "--no-cache", "--select", "ALL", "-j", str(jobs), "-q", "-o", os.devnull, tree],
                 standalone_mode=False)
    except SystemExit:
        pass
    label = f"{os.path.basename(tree)}{' (each file alone)' if os.environ.get('AMPFIX_NO_PROJECT') else ''}"
    processes = [("this process", time.process_time() - start, own)]
    for f in sorted(glob.glob(os.path.join(folder, "*.json"))):
        with open(f) as fh:
            got = json.load(fh)
        processes.append((f"worker {os.path.basename(f)[:-5]}", got["total"], collections.Counter(got["own"])))
    if jobs > 1:
        summed: "collections.Counter[str]" = collections.Counter()
        for _, _, stages in processes:
            summed.update(stages)
        processes.append(("all processes", sum(t for _, t, _ in processes), summed))
    for name, total, stages in processes:
        print(f"{label}{'' if jobs == 1 else ', ' + name}: {total:.3f} s of CPU")
        for stage, spent in stages.most_common(top):
            print(f"  {spent:7.3f}  {stage}")
        print(f"  {total - sum(stages.values()):7.3f}  rest")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trees", nargs="+")
    parser.add_argument("--alone", action="store_true", help="each file alone (AMPFIX_NO_PROJECT=1)")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--jobs", type=int, default=1, help="a pool of J workers; each process's stages")
    args = parser.parse_args()
    if args.alone:
        os.environ["AMPFIX_NO_PROJECT"] = "1"
    if len(args.trees) > 1:  # one process per tree: the project and the rules' memos start empty
        import subprocess

        for tree in args.trees:
            alone = ["--alone"] if args.alone else []
            subprocess.run([sys.executable, __file__, tree, "--top", str(args.top), "--jobs", str(args.jobs), *alone],
                           check=False)
        return
    measure(args.trees[0], args.top, args.jobs)


if __name__ == "__main__":
    main()
