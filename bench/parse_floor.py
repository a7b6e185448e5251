"""What `ampfix check` must parse, against a bare parse of the whole tree (issue 21's goal).

    python bench/parse_floor.py TREE [TREE ...] [--rounds N]

For each tree: runs `ampfix check --no-cache --select ALL -j 1` in this process twice, with the
project layer and each file alone (AMPFIX_NO_PROJECT), recording every module text the run
parses with LibCST (the files analysed, and the modules parsed for their summaries); then, in
the same process and interleaved over N rounds (default 3), times ampfix's parse
(`ampfix.model.parsing.parse_module`) of those texts and LibCST's own `parse_module` of every
`*.py` file of the tree (what `bench/bare_parse.py` times). Prints, per tree, the modules and
kilobytes each run parses, the process time of their parse (and of `ast.parse` of them, for
comparison), of the whole run, and of the bare parse, and what is left of the goal's budget once the parse is paid:

    budget (CPU, two workers) = 2 x bare / GOAL - serial part

(`check -j 2` runs on two cores; GOAL is issue 21's ratio: 8 for timm, 1.5 for the others; the
serial part, before the pool starts, is measured by `bench/project_trees.sh`'s runs, about
0.25-0.30 s: it is not measured here and not subtracted.)
"""

from __future__ import annotations

import ast
import hashlib
import os
import pathlib
import sys
import time

sys.setrecursionlimit(20000)

import libcst as cst  # noqa: E402
from libcst._nodes.base import CSTNode  # noqa: E402

import ampfix.engine.guard as guard  # noqa: E402
from bare_parse import parse_all  # noqa: E402  (bench/, this script's folder)
from ampfix.model import parsing  # noqa: E402

GOALS = {"timm": 8.0}


def _record_run(tree: str, project: bool):
    """(process seconds of the run, {sha: text} of every module it parsed)."""
    import ampfix.engine.analyze as analyze
    import ampfix.project.project as project_mod
    from ampfix.engine.analyze import close_projects
    from ampfix.frontends import cli
    from ampfix.project.layout import clear_caches

    seen = {}
    original = parsing.parse_module

    def recording(text, *a, **k):
        seen[hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()] = text
        return original(text, *a, **k)

    patched = [(m, "parse_module", getattr(m, "parse_module")) for m in (parsing, analyze, project_mod)]
    for m, name, _ in patched:
        setattr(m, name, recording)
    if project:
        os.environ.pop("AMPFIX_NO_PROJECT", None)
    else:
        os.environ["AMPFIX_NO_PROJECT"] = "1"
    clear_caches()
    t0 = time.process_time()
    try:
        cli.main(["check", "--no-cache", "--select", "ALL", "-j", "1", "-q", "-o", os.devnull, tree],
                 standalone_mode=False)
    except SystemExit:
        pass
    spent = time.process_time() - t0
    close_projects()
    for m, name, value in patched:
        setattr(m, name, value)
    os.environ.pop("AMPFIX_NO_PROJECT", None)
    return spent, seen


def main(argv) -> None:
    rounds = 3
    if "--rounds" in argv:
        i = argv.index("--rounds")
        rounds = int(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    guard.UNGUARDED = True  # the run in this process, as the benchmarks' timers run it
    from ampfix.engine.registry import all_rules

    all_rules()  # the rules imported before the first run: neither run pays for it
    for tree in argv:
        name = next((k for k in ("timm", "accelerate", "peft") if k in tree), os.path.basename(tree.rstrip("/")))
        goal = GOALS.get(name, 1.5)
        with_project, parsed_p = _record_run(tree, True)
        alone, parsed_a = _record_run(tree, False)
        every = [p.read_text(encoding="utf-8", errors="replace") for p in sorted(pathlib.Path(tree).rglob("*.py"))]
        times = {"bare": [], "project": [], "alone": [], "ast": []}
        for _ in range(rounds):
            CSTNode.__post_init__ = parsing._LIBCST_POST_INIT  # LibCST as it comes, for the bare parse
            times["bare"].append(parse_all(cst.parse_module, every))
            if parsing.INSTALLED:
                CSTNode.__post_init__ = parsing._post_init  # ampfix's, for its parse
            times["project"].append(parse_all(parsing.parse_module, parsed_p.values()))
            times["alone"].append(parse_all(parsing.parse_module, parsed_a.values()))
            times["ast"].append(parse_all(ast.parse, parsed_p.values()))
        med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
        kb = lambda texts: sum(len(t) for t in texts) // 1000  # noqa: E731
        print(f"{name}: {len(every)} files, {kb(every)} KB; bare LibCST parse {med['bare']:.2f} s "
              f"(goal: check -j 2 wall at most {med['bare'] / goal:.2f} s, {goal:g}x)")
        for label, parsed, run in (("project", parsed_p, with_project), ("alone", parsed_a, alone)):
            parse = med[label]
            print(f"  {label:8s} parses {len(parsed):4d} modules, {kb(parsed.values()):5d} KB: parse {parse:.2f} s "
                  f"({parse / med['bare']:.0%} of the bare parse), whole run {run:.2f} s, "
                  f"the rest {run - parse:.2f} s; budget left after the parse on 2 cores "
                  f"{2 * med['bare'] / goal - parse:.2f} s")
        print(f"  (the standard library's ast.parse of the modules the project run parses: {med['ast']:.2f} s)")


if __name__ == "__main__":
    main(sys.argv[1:])
