"""A check's CPU per file and stage: `analyze.triggered` (the trigger tests, with the project's
reach tests), the parse (`parse_in_project`) and the analysis (`_analyze`), around
`analyze.check_text`, in one `-j 1` process (bench/SPEED.md, twenty-fifth session).

    python bench/file_stages.py TREE                       # with the project
    AMPFIX_NO_PROJECT=1 python bench/file_stages.py TREE   # each file alone

Prints the files over 10 ms (milliseconds of process time per stage), then the totals.
"""

from __future__ import annotations

import collections
import os
import sys
import time

sys.setrecursionlimit(20000)

import ampfix.engine.analyze as A  # noqa: E402
from ampfix.frontends import cli  # noqa: E402

STAGES = ("check_text", "triggered", "parse_in_project", "_analyze")
# which positional argument holds the file's path
PATH_ARG = {"check_text": 1, "parse_in_project": 1, "triggered": 2, "_analyze": 2}


def main(tree: str) -> None:
    rows: dict = collections.defaultdict(collections.Counter)

    def wrap(name: str) -> None:
        inner = getattr(A, name)

        def timed(*args, **kwargs):
            path = args[PATH_ARG[name]] if len(args) > PATH_ARG[name] else "?"
            start = time.process_time()
            try:
                return inner(*args, **kwargs)
            finally:
                key = os.path.relpath(path, tree) if isinstance(path, str) and path.startswith("/") else str(path)
                rows[key][name] += time.process_time() - start

        setattr(A, name, timed)

    for name in STAGES:
        wrap(name)
    try:
        cli.main(["check", "--no-cache", "--select", "ALL", "-j", "1", "-q", "-o", os.devnull, tree],
                 standalone_mode=False)
    except SystemExit:
        pass
    total: collections.Counter = collections.Counter()
    for path, c in sorted(rows.items(), key=lambda x: -x[1]["check_text"]):
        total.update(c)
        if c["check_text"] > 0.01:
            print(f"{c['check_text'] * 1000:7.1f} ms  triggered {c['triggered'] * 1000:6.1f}  parse "
                  f"{c['parse_in_project'] * 1000:6.1f}  analysis {c['_analyze'] * 1000:6.1f}  {path}")
    print("total (s):", {k: round(v, 3) for k, v in total.items()}, f"{len(rows)} files asked")


if __name__ == "__main__":
    main(os.path.abspath(sys.argv[1]))
