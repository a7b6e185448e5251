"""A speed change must not change what `check` says: the same findings, the same traces, the same
dependencies of every file's result. This compares the code of two checkouts on real trees.

    python bench/exactness.py --baseline-python ../wt-base/.venv/bin/python TREE [TREE ...]
    python bench/exactness.py --baseline-python B --what json TREE       # one comparison only

For each tree and each of the two pythons (the baseline's venv, and this one), it runs (in a
child process, so each imports its own checkout's ampfix):
- json: `ampfix check --no-cache --select ALL --preview -j 2 --output-format json TREE`, compared
  byte for byte (every finding, message, fix edit and related location);
- traces: every trace the rules read (`Events.traces`, `-j 1`), event by event: kind, keys,
  order, path length, frame, contexts, origin, region; the numbers that are object ids or run
  numbers renumbered, since they differ between any two processes;
- deps: what each file's result depends on (`Project.end`: the texts read and the import
  graph's answers used), in job order at `-j 1`: the check cache's correctness rests on it;
- summaries: the summary of every module of the tree (`Project.summary`, as JSON), the facts
  other modules read of it, whether or not a check of the tree reads it.
Prints `same` or `DIFF` (with the first differing line) per tree and comparison; exit status
1 when anything differs. The trees are the sdists of `bench_check.py --sdists`. Both venvs need
the same extras (`nbformat`: a notebook is an error in a venv without it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

WHAT = ("json", "traces", "deps", "summaries")


def _dump(what: str, tree: str, out: str) -> None:
    """In the child: write the `what` of `tree` to `out`."""
    lines: list = []
    if what == "json":
        done = subprocess.run([sys.executable, "-m", "ampfix", "check", "--no-cache", "--select", "ALL", "--preview",
                               "-j", "2", "--output-format", "json", tree], capture_output=True)
        Path(out).write_bytes(done.stdout)
        return
    if what == "summaries":
        from ampfix.project import Project
        from ampfix.project.layout import find_root

        projects: dict = {}
        for path in sorted(Path(tree).rglob("*.py")):
            root = str(find_root(path.resolve()))
            project = projects.get(root)
            if project is None:
                project = projects[root] = Project(Path(root))
            try:
                summary = project.summary(str(path))
            except RecursionError:
                summary = "RecursionError"
            lines.append(json.dumps([str(path), summary if summary is None or isinstance(summary, str)
                                     else summary.to_json()], sort_keys=True))
        Path(out).write_text("\n".join(lines))
        return
    if what == "traces":
        from ampfix.model import events

        original = events.Events.traces

        def value(v, model):
            if isinstance(v, tuple):
                return tuple(value(x, model) for x in v)
            if isinstance(v, int) and not isinstance(v, bool) and abs(v) > 10 ** 6:
                return "ID"
            if type(v).__module__.startswith("libcst"):
                return ("node", type(v).__name__, model.code(v)[:100])
            return repr(v)

        def traces(self):
            out_traces = original(self)
            if not getattr(self, "_dumped", False):
                self._dumped = True
                for t in out_traces:
                    for e in t.events:
                        o = e.event.origin
                        lines.append(repr((os.path.basename(self.path), type(t.root).__name__, str(e.kind),
                                           e.event.detail, e.scaler, e.target, e.order, len(e.path),
                                           tuple("ID" if i > 0 else i for i in e.frame),
                                           sorted((repr(value(k, self)), repr(value(v, self))) for k, v in e.ctx.items()),
                                           (os.path.basename(o.path), o.line, o.col, o.function) if o else None,
                                           e.event.loop is not None, e.event.scale_source, e.event.chosen_here,
                                           e.region is not None)))
                    lines.append(repr(("truncated", len(t.truncated))))
            return out_traces

        events.Events.traces = traces  # type: ignore[method-assign]
    else:
        from ampfix.engine import runner
        from ampfix.project import project

        end, work = project.Project.end, runner._work

        def recorded_end(self):
            found = end(self)
            lines.append(json.dumps([sorted(found[0]), sorted(found[1].items())]))
            return found

        def recorded_work(job):
            lines.append(json.dumps(["job", job[0]]))
            return work(job)

        project.Project.end = recorded_end  # type: ignore[method-assign]
        runner._work = recorded_work
    from ampfix.engine import guard
    from ampfix.frontends import cli

    guard.UNGUARDED = True  # the analysis on this thread, where the patches above are
    sys.setrecursionlimit(20000)
    try:
        cli.main(["check", "--no-cache", "--select", "ALL", "--preview", "-j", "1", "-q", tree], standalone_mode=False)
    except SystemExit:
        pass
    text = "\n".join(lines)
    Path(out).write_text(re.sub(r"\d{9,}", "#", text) if what == "traces" else text)  # run numbers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trees", nargs="*")
    ap.add_argument("--baseline-python", required=True, help="the python of the checkout to compare against")
    ap.add_argument("--what", choices=WHAT, action="append", help="one comparison (default: all four)")
    ap.add_argument("--dump", nargs=3, metavar=("WHAT", "TREE", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.dump:
        _dump(*args.dump)
        return
    if not args.trees:
        ap.error("name at least one tree")
    differ = False
    with tempfile.TemporaryDirectory() as tmp:
        for tree in args.trees:
            tree = os.path.abspath(tree)
            for what in args.what or WHAT:
                outs = []
                for side, python in (("baseline", args.baseline_python), ("current", sys.executable)):
                    out = os.path.join(tmp, f"{side}.{what}")
                    subprocess.run([python, __file__, "--baseline-python", python, "--dump", what, tree, out],
                                   check=True, cwd=tmp, stdout=subprocess.DEVNULL)
                    outs.append(Path(out).read_bytes())
                name = os.path.basename(tree.rstrip("/"))
                if outs[0] == outs[1]:
                    lines = outs[1].count(b"\n") + 1
                    print(f"same  {what:6} {name} ({lines} lines)")
                    continue
                differ = True
                a, b = outs[0].decode().splitlines(), outs[1].decode().splitlines()
                i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                print(f"DIFF  {what:6} {name}: line {i + 1}\n  baseline: {a[i][:300] if i < len(a) else '(end)'}\n"
                      f"  current:  {b[i][:300] if i < len(b) else '(end)'}")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
