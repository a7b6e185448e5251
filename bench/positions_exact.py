"""Exactness of the model's cheap positions on real code (bench/SPEED.md, fifth session).

Two checks over the Python files of the given folders (sdists fetched by the other benchmarks
into bench/.cache/):

* `positions`: every node of each file, asked in a random order, gets from `Tree.position`
  (a top-level statement, a body statement of a top-level class or function, or a header line
  rendered alone) what one code generation pass over the whole module gives.
* `summaries`: each place a module summary finds for an effect by its code in the function's
  text (`Summarizer._find`) is the node's position; counts how many needed the position pass.

    python bench/positions_exact.py positions --files 3000 bench/.cache/sdist-*/
    python bench/positions_exact.py summaries --files 1500 bench/.cache/sdist-*/

Exits 1 when a position differs. Timings are not the point (see bench/SPEED.md for those).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time
from typing import List


def _files(roots: List[str], seed: int) -> List[str]:
    out = []
    for root in roots:
        for folder, _, names in os.walk(root):
            out.extend(os.path.join(folder, n) for n in names if n.endswith(".py"))
    out.sort()
    random.Random(seed).shuffle(out)
    return out


def _read(path: str):
    import libcst as cst

    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        return text, cst.parse_module(text)
    except (OSError, UnicodeDecodeError, cst.ParserSyntaxError, RecursionError):
        return None


def check_positions(files: List[str], limit: int, seed: int) -> int:
    import libcst as cst

    from ampfix.model import AmpModel
    from ampfix.model.tree import positions
    from ampfix.project.project import NO_FACTS

    done = wrong = whole = parts = 0
    for path in files:
        if done >= limit:
            break
        read = _read(path)
        if read is None:
            continue
        text, module = read
        try:
            model = AmpModel(module, foreign=NO_FACTS, path=path)
        except (RecursionError, ValueError, KeyError, AttributeError, TypeError):
            continue
        model.source_text = text  # as the engine gives it
        want = positions(module)
        nodes = [n for n in want if n is not module]
        random.Random(seed + done).shuffle(nodes)
        for node in nodes:
            if model._raw_position(node) != want[node]:
                wrong += 1
                if wrong <= 10:
                    print(f"DIFFERS {path}: {type(node).__name__} {model._raw_position(node)} != {want[node]}")
        whole += "_raw_positions" in model.__dict__
        parts += sum(1 for k, v in model.__dict__.get("_part_positions", {}).items()
                     if v and model._parent(k) is not module and not isinstance(k, cst.EmptyLine))
        done += 1
    print(f"positions: {done} files, {wrong} nodes differ, {whole} files needed a whole-module pass, "
          f"{parts} body statements placed alone")
    return wrong


def check_summaries(files: List[str], limit: int) -> int:
    import libcst as cst

    from ampfix.model import AmpModel
    from ampfix.model import summarize as S
    from ampfix.project.project import NO_FACTS

    stats = {"found": 0, "position pass": 0, "differ": 0}
    find = S.Summarizer._find

    def checked(self, node):
        hit = find(self, node)
        if hit is None:
            stats["position pass"] += 1
        else:
            stats["found"] += 1
            if hit != self.model.start(node):
                stats["differ"] += 1
                if stats["differ"] <= 10:
                    print(f"DIFFERS {self.model.path}: {hit} != {self.model.start(node)} `{self._needle(node)}`")
        return hit

    S.Summarizer._find = checked
    done = 0
    try:
        for path in files:
            if done >= limit:
                break
            read = _read(path)
            if read is None or not S.relevant_code(read[0]):
                continue
            text, module = read
            try:
                model = AmpModel(module, foreign=NO_FACTS, path=path)
                model.source_text = text
                S.summarize(model, "", text)
            except (RecursionError, ValueError, KeyError, AttributeError, TypeError, cst.CSTValidationError):
                continue
            done += 1
    finally:
        S.Summarizer._find = find
    print(f"summaries: {done} AMP modules, {stats['found']} effects placed by the text, "
          f"{stats['position pass']} by the position pass, {stats['differ']} places differ")
    return stats["differ"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("positions", "summaries"))
    ap.add_argument("roots", nargs="+")
    ap.add_argument("--files", type=int, default=1000, help="how many files (positions) or AMP modules (summaries)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    files = _files(args.roots, args.seed)
    out: List[int] = []
    start = time.time()

    def run() -> None:
        if args.what == "positions":
            out.append(check_positions(files, args.files, args.seed))
        else:
            out.append(check_summaries(files, args.files))

    sys.setrecursionlimit(20000)
    threading.stack_size(256 * 1024 * 1024)  # deep trees, as the engine's own threads allow
    t = threading.Thread(target=run)
    t.start()
    t.join()
    print(f"({time.time() - start:.0f} s)")
    return 1 if not out or out[0] else 0


if __name__ == "__main__":
    sys.exit(main())
