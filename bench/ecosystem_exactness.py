"""Per-rule exactness over the ecosystem check's trees: what one checkout of ampfix finds on every
project of the last `bench/ecosystem.py` run (its `results.json` names the trees), saved, then
compared with another checkout's, rule by rule, fix edits included. For a refactor that must change
nothing observable (twenty-fifth session: seven rules moved into the model, each compared this way
before and after), or to see exactly what a model change adds. Without a `results.json` (no
ecosystem run yet in this checkout) it reads the pinned projects already unpacked in the cache.

    cd /tmp && OLD/.venv/bin/python /path/to/bench/ecosystem_exactness.py save base.json
    cd /tmp && NEW/.venv/bin/python /path/to/bench/ecosystem_exactness.py cmp base.json AMP009 AMP010

Run it from outside a checkout (a checkout's own `ampfix` would shadow the interpreter's). `cmp`
with rule codes compares only those rules' findings (and every non-finding entry: input errors,
skipped files; a file only another rule's trigger reads may then differ, e.g. an unparsable one);
with none, everything. It prints each project that differs with the entries gone (-) and new
(+), then `N trees compared, M entries now, K differ`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / ".cache" / "ecosystem" / "results.json"
KEYS = ("code", "filename", "location", "end_location", "message", "fix", "related", "type")


def run(root: str, codes: list) -> list:
    cmd = [sys.executable, "-m", "ampfix", "check", "--no-cache", "--preview", "--select", ",".join(codes),
           "--output-format", "json", "-j", "1", "."]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    try:
        out = json.loads(proc.stdout or "[]")
    except json.JSONDecodeError:
        out = [{"type": "error", "message": proc.stdout[:200] + proc.stderr[-300:]}]
    return [{k: d.get(k) for k in KEYS} for d in out]


def key(d: dict) -> str:
    return json.dumps(d, sort_keys=True)


def trees() -> list:
    """(package, root) of the trees of the last `bench/ecosystem.py` run (its `results.json`); in a
    checkout that has none (a fresh clone whose cache holds only the downloads of `ecosystem.py
    --fetch-only`), the pinned projects whose trees are unpacked in the cache
    (`ecosystem.cached_tree`: nothing is downloaded)."""
    if RESULTS.is_file():
        records = json.loads(RESULTS.read_text())
        return [(r["package"], r["root"]) for r in records if "root" in r and os.path.isdir(r["root"])]
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import ecosystem  # noqa: E402  (bench/ecosystem.py)

    found = [(pkg.name, ecosystem.cached_tree(pkg)) for pkg in ecosystem.PACKAGES]
    return [(name, str(root)) for name, root in found if root is not None]


def main(argv: list) -> int:
    mode, base, codes = argv[0], argv[1], argv[2:] or ["ALL"]
    roots = trees()
    with ThreadPoolExecutor(2) as pool:
        got = dict(zip([p for p, _ in roots], pool.map(lambda pr: run(pr[1], codes), roots)))
    if mode == "save":
        Path(base).write_text(json.dumps(got))
        print(len(got), "trees,", sum(len(v) for v in got.values()), "entries")
        return 0
    saved = json.loads(Path(base).read_text())
    differ = 0
    for package, now in got.items():
        want = [d for d in saved.get(package, [])
                if codes == ["ALL"] or d.get("code") in codes or d.get("type") != "finding"]
        before, after = sorted(map(key, want)), sorted(map(key, now))
        if before != after:
            differ += 1
            print("DIFF", package)
            for x in sorted(set(before) - set(after)):
                print("  -", x[:300])
            for x in sorted(set(after) - set(before)):
                print("  +", x[:300])
    print(len(got), "trees compared,", sum(len(v) for v in got.values()), "entries now,", differ, "differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
