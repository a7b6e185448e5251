"""A bare LibCST parse of a tree: `libcst.parse_module` of every `*.py` file under TREE, in this
process; prints the seconds the parses took (the import of LibCST not counted).

    python bench/bare_parse.py TREE
"""

import pathlib
import sys
import time

import libcst as cst

files = sorted(pathlib.Path(sys.argv[1]).rglob("*.py"))
t0 = time.perf_counter()
for p in files:
    try:
        cst.parse_module(p.read_text(encoding="utf-8"))
    except Exception:  # a file LibCST cannot read costs what it cost
        pass
print(f"{time.perf_counter() - t0:.2f}")
