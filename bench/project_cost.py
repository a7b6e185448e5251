"""Where a `check` run's CPU goes, by stage, with the project layer and each file alone (issues 17, 21).

    python bench/project_cost.py TREE [TREE ...] [--alone] [--top N]

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
so compare two checkouts by running this with each one's python, alternately.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

sys.setrecursionlimit(20000)


def measure(tree: str, top: int) -> None:
    from ampfix.engine import analyze
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
    start = time.process_time()
    try:
        cli.main(["check", "--no-cache", "--select", "ALL", "-j", "1", "-q", "-o", os.devnull, tree],
                 standalone_mode=False)
    except SystemExit:
        pass
    total = time.process_time() - start
    print(f"{os.path.basename(tree)}{' (each file alone)' if os.environ.get('AMPFIX_NO_PROJECT') else ''}: "
          f"{total:.3f} s of CPU")
    for name, spent in own.most_common(top):
        print(f"  {spent:7.3f}  {name}")
    print(f"  {total - sum(own.values()):7.3f}  rest")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trees", nargs="+")
    parser.add_argument("--alone", action="store_true", help="each file alone (AMPFIX_NO_PROJECT=1)")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    if args.alone:
        os.environ["AMPFIX_NO_PROJECT"] = "1"
    if len(args.trees) > 1:  # one process per tree: the project and the rules' memos start empty
        import subprocess

        for tree in args.trees:
            alone = ["--alone"] if args.alone else []
            subprocess.run([sys.executable, __file__, tree, "--top", str(args.top), *alone], check=False)
        return
    measure(args.trees[0], args.top)


if __name__ == "__main__":
    main()
