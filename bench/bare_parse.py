"""A bare LibCST parse of a tree: `libcst.parse_module` of every `*.py` file under TREE, in this
process; prints the seconds the parses took (the import of LibCST not counted).

    python bench/bare_parse.py TREE
    python bench/bare_parse.py TREE --against-ampfix [ROUNDS]

The second form reads the files once, then parses them all with LibCST's `parse_module` and with
ampfix's (`ampfix.model.parsing`: the same trees, without LibCST re-checking the nodes its
parser builds), alternating, ROUNDS times (default 3); it prints the process time of each and
their ratio per round.
"""

import pathlib
import sys
import time

import libcst as cst



def parse_all(parse, texts) -> float:
    t0 = time.process_time()
    for text in texts:
        try:
            parse(text)
        except Exception:  # a file LibCST cannot read costs what it cost
            pass
    return time.process_time() - t0


def main() -> None:
    files = sorted(pathlib.Path(sys.argv[1]).rglob("*.py"))
    if len(sys.argv) > 2 and sys.argv[2] == "--against-ampfix":
        from libcst._nodes.base import CSTNode

        from ampfix.model import parsing

        texts = [p.read_text(encoding="utf-8", errors="replace") for p in files]
        for r in range(int(sys.argv[3]) if len(sys.argv) > 3 else 3):
            CSTNode.__post_init__ = parsing._LIBCST_POST_INIT  # LibCST as it comes, for its rounds
            theirs = parse_all(cst.parse_module, texts)
            CSTNode.__post_init__ = parsing._post_init
            ours = parse_all(parsing.parse_module, texts)
            print(f"round {r + 1}: libcst {theirs:.2f} s, ampfix {ours:.2f} s, ampfix/libcst {ours / theirs:.2f}")
        return

    t0 = time.perf_counter()
    for p in files:
        try:
            cst.parse_module(p.read_text(encoding="utf-8"))
        except Exception:  # a file LibCST cannot read costs what it cost
            pass
    print(f"{time.perf_counter() - t0:.2f}")


if __name__ == "__main__":
    main()
