"""Random edits against the language server's incremental re-parse (`ampfix/engine/incremental.py`).

    python bench/fuzz_reparse.py SEED FILE...

From each file, 60 edits one after the other (a character typed in an identifier, a comment line
at some indentation, a blank, duplicated or deleted line, a character deleted inside a word); after
each, `Reparser.parse` must give what `libcst.parse_module` gives (`deep_equals`, same code) or
fail as it does. Prints the re-parser's counts per file (spliced / full / fallback) and `bad N`.
"""
import sys, random
import libcst as cst
from ampfix.engine.incremental import Reparser
from ampfix.engine.analyze import InputError
rng = random.Random(int(sys.argv[1])); bad = 0
for f in sys.argv[2:]:
    cur = open(f).read(); r = Reparser(); r.parse(cur, f)
    for step in range(60):
        k = rng.random(); lines = cur.split("\n"); i = rng.randrange(len(lines))
        if k < 0.3:
            pos = rng.randrange(len(cur)); 
            while not cur[pos-1].isalpha(): pos = rng.randrange(len(cur))
            new = cur[:pos] + "q" + cur[pos:]
        elif k < 0.5:
            ind = rng.choice(["", "    ", "        ", "            "]); lines.insert(i, ind + "# note"); new = "\n".join(lines)
        elif k < 0.6:
            lines.insert(i, ""); new = "\n".join(lines)
        elif k < 0.75:
            del lines[i]; new = "\n".join(lines)
        elif k < 0.85:
            lines.insert(i, lines[i]); new = "\n".join(lines)
        else:
            pos = rng.randrange(len(cur)); 
            while not (cur[pos-1].isalpha() and cur[pos].isalpha()): pos = rng.randrange(len(cur))
            new = cur[:pos] + cur[pos+1:]
        try: fresh = cst.parse_module(new)
        except Exception: fresh = None
        try: got = r.parse(new, f)
        except InputError: got = None
        if (fresh is None) != (got is None): print("MISMATCH ok", f, step); bad += 1
        elif fresh is not None:
            if got.code != new or not got.deep_equals(fresh): print("MISMATCH tree", f, step, k); bad += 1
        if fresh is not None or rng.random() < 0.1: cur = new
    print(f, r.stats, flush=True)
print("bad", bad)
