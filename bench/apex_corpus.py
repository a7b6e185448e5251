"""Count how much of real NVIDIA apex code `ampfix rewrite --select AMP1 --unsafe-fixes` migrates.

One command (downloads the packages listed in PACKAGES into bench/.cache/apex, extracts them,
counts, and replaces the "Apex migration corpus (issue 13)" section at the end of
bench/CHECK_RESULTS.md):

    python bench/apex_corpus.py --fetch --write-results

Without --fetch it reads the trees already in bench/.cache/apex/trees (or `--trees DIR`, a folder
whose sub-folders are the trees); `--tree NAME=PATH[@REV]` (repeatable) adds a folder or a git
directory (e.g. a mirror of NVIDIA/DeepLearningExamples, whose HEAD's Python files are extracted
into bench/.cache as bench_check.py does):

    python bench/apex_corpus.py --write-results --tree DLE=/path/to/DeepLearningExamples/.git

For every *.py file that imports apex it:

  1. counts the apex uses (each reference to a name imported from apex, by what it resolves to)
     by kind: amp.initialize, amp.scale_loss, amp (other), parallel DDP, parallel (other),
     optimizers, normalization, other;
  2. copies the file and runs `python -m ampfix rewrite --select AMP1 --unsafe-fixes
     --output-format json` on the copy (the same fixes as `--diff` shows; the diff is saved under
     bench/.cache/apex/diffs/ to be read), then counts the apex uses left in the rewritten copy;
  3. a use is *migrated* when it is gone after the rewrite, *reported* when it is left with an
     AMP1xx finding on its line (the finding's message is the reason), *silent* when it is left
     with none.

Nothing third-party is committed: the packages, trees and diffs stay in bench/.cache (ignored).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "bench" / ".cache" / "apex"
RESULTS = ROOT / "bench" / "CHECK_RESULTS.md"
HEADING = "## Apex migration corpus (issue 13)"
END = "<!-- /apex-corpus: generated above by bench/apex_corpus.py; notes written by hand below are kept -->"
KINDS = ["amp.initialize", "amp.scale_loss", "amp (other)", "parallel DDP", "parallel (other)", "optimizers",
         "normalization", "other"]
# (spec, how): sdists where their metadata builds, else the (pure-Python) wheel for Python 3.8
PACKAGES = [
    ("pytorch-pretrained-bert==0.6.2", "sdist"), ("pytorch-transformers==1.2.0", "sdist"), ("timm==0.4.12", "sdist"),
    ("allennlp==0.9.0", "sdist"), ("simpletransformers==0.20.3", "sdist"), ("transformers==2.11.0", "sdist"),
    ("sentence-transformers==0.3.0", "sdist"), ("fairseq==0.10.2", "wheel"), ("nemo_toolkit==0.10.1", "wheel"),
    ("pytorch-lightning==0.9.0", "wheel"), ("pytorch-lightning==1.2.10", "wheel"), ("flair==0.4.5", "wheel"),
    ("espnet==0.9.7", "wheel"), ("catalyst==20.12", "wheel"), ("mmdet==2.28.2", "wheel"),
    ("OpenNMT-py==2.3.0", "wheel"), ("farm==0.8.0", "wheel"), ("fast-bert==1.9.9", "wheel"),
    ("pytext-nlp==0.3.3", "wheel"), ("transformers==3.5.1", "wheel"), ("timm==0.6.13", "wheel"),
    ("nemo_toolkit==1.0.0", "wheel"),
]


def fetch() -> None:
    dl = CACHE / "downloads"
    dl.mkdir(parents=True, exist_ok=True)
    for spec, how in PACKAGES:
        name, _, version = spec.partition("==")
        tree = CACHE / "trees" / f"{name}-{version}"
        if tree.exists():
            continue
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(dl), spec]
        cmd += ["--no-binary", ":all:", "--no-build-isolation"] if how == "sdist" else \
            ["--only-binary", ":all:", "--python-version", "3.8", "--platform", "manylinux2014_x86_64",
             "--platform", "manylinux1_x86_64", "--platform", "any"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        norm = f"{name}_{version}".lower().replace("-", "_")
        new = [p for p in dl.iterdir() if p.name.lower().replace("-", "_").startswith(norm)]
        if not new:
            print(f"skip {spec}: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else 'not downloaded'}")
            continue
        tree.mkdir(parents=True)
        archive = new[0]
        if archive.name.endswith(".whl"):
            zipfile.ZipFile(archive).extractall(tree)
        else:
            with tarfile.open(archive) as tf:
                tf.extractall(tree, filter="data")
        print(f"fetched {spec}")


def uses(text: str, path: str) -> List[Tuple[int, str, str, int]]:
    """(line, kind, qualified name, line of its import) of every reference to a name imported from apex."""
    import libcst as cst

    from ampfix.knowledge.apex_api import category
    from ampfix.model import AmpModel

    model = AmpModel(cst.parse_module(text))
    out = []
    seen = set()
    for b in model.import_bindings:
        if not (b.qualified == "apex" or b.qualified.startswith("apex.")):
            continue
        for ref in b.refs:
            node = ref
            while isinstance(model.parent(node), cst.Attribute) and model.parent(node).value is node:
                node = model.parent(node)
            if id(node) in seen:
                continue
            seen.add(id(node))
            q = sorted(n.name for n in model.qualified_names(node) if n.name.startswith("apex"))
            q0 = q[0] if q else b.qualified
            if q0 == "apex.amp.initialize":
                kind = "amp.initialize"
            elif q0 == "apex.amp.scale_loss":
                kind = "amp.scale_loss"
            elif q0.startswith("apex.amp"):
                kind = "amp (other)"
            elif q0.split(".")[-1] == "DistributedDataParallel" and q0.startswith("apex.parallel"):
                kind = "parallel DDP"
            else:
                cat = category(q0)
                kind = {"parallel": "parallel (other)"}.get(cat, cat)
            out.append((model.line(node), kind, q0, model.line(b.stmt)))
    return out


def rewrite(path: Path) -> Tuple[str, List[dict]]:
    env = dict(os.environ, NO_COLOR="1")
    r = subprocess.run([sys.executable, "-m", "ampfix", "rewrite", "--select", "AMP1", "--unsafe-fixes",
                        "--output-format", "json", str(path)], capture_output=True, text=True, env=env, cwd=ROOT)
    findings = json.loads(r.stdout) if r.stdout.strip().startswith("[") else []
    if r.returncode == 2:  # ampfix could not handle the file (or a rule raised): say so in the results
        findings.append({"code": "ERROR", "line": 0, "message": r.stderr.strip().splitlines()[-1:]})
    return path.read_text(encoding="utf-8"), findings


def count(trees: List[Tuple[str, Path]]) -> Tuple[Dict[str, Counter], List[str], Dict[str, List[str]]]:
    totals: Dict[str, Counter] = defaultdict(Counter)
    reported: List[str] = []
    per_tree: Dict[str, List[str]] = defaultdict(list)
    diffs = CACHE / "diffs"
    shutil.rmtree(diffs, ignore_errors=True)
    diffs.mkdir(parents=True)
    for name, tree in trees:
        for f in sorted(tree.rglob("*.py")):
            text = f.read_text(encoding="utf-8", errors="replace")
            if "apex" not in text:
                continue
            rel = Path(name) / f.relative_to(tree)
            try:
                before = uses(text, str(f))
            except Exception:  # Python 2 files and the like
                continue
            if not before:
                continue
            with tempfile.TemporaryDirectory() as tmp:
                copy = Path(tmp) / f.name
                copy.write_text(text, encoding="utf-8")
                new, findings = rewrite(copy)
            after = uses(new, str(f))
            if new != text:
                (diffs / (str(rel).replace("/", "__") + ".diff")).write_text("".join(difflib.unified_diff(
                    text.splitlines(True), new.splitlines(True), f"a/{rel}", f"b/{rel}")), encoding="utf-8")
            b_count, a_count = Counter(u[1] for u in before), Counter(u[1] for u in after)
            for kind in b_count:
                totals[kind]["uses"] += b_count[kind]
                totals[kind]["migrated"] += max(0, b_count[kind] - a_count[kind])
            for d in findings:
                if d["code"] == "ERROR":
                    reported.append(f"| `{rel}` | (file) | ampfix error: {d['message']} |")
            by_line = defaultdict(list)
            for d in findings:
                if d["code"].startswith("AMP1"):
                    by_line[d["line"]].append(d)
            for line, kind, q, import_line in after:
                hit = by_line.get(line) or by_line.get(import_line)
                if hit:
                    totals[kind]["reported"] += 1
                    where = "" if by_line.get(line) else f" (reported at its import, line {import_line})"
                    reported.append(f"| `{rel}:{line}` | {kind} | {hit[0]['code']}{where}: "
                                    f"{hit[0]['message'].replace('|', '/')} |")
                else:
                    totals[kind]["silent"] += 1
                    reported.append(f"| `{rel}:{line}` | {kind} | no finding (`{q}`) |")
            per_tree[name].append(f"{rel}: {sum(b_count.values())} uses, "
                                  f"{sum(b_count.values()) - len(after)} migrated")
    return totals, reported, per_tree


def markdown(totals: Dict[str, Counter], reported: List[str], per_tree: Dict[str, List[str]],
             sources: List[str] = ()) -> str:
    files = sum(len(v) for v in per_tree.values())
    lines = [HEADING, "",
             f"`python bench/apex_corpus.py --fetch --write-results --tree ...`: {len(per_tree)} packages and "
             f"repositories that still use apex ({files} files with apex uses; the PyPI packages and versions are "
             "listed in the script, the git trees with their commit below), each file "
             "rewritten with `ampfix rewrite --select AMP1 --unsafe-fixes`. A use is a reference to a name "
             "imported from apex; *migrated*: gone after the rewrite; *reported*: left, with an AMP1xx finding on "
             "its line; *silent*: left with no finding.", "",
             "| kind | uses | migrated | reported | silent |", "|---|---|---|---|---|"]
    for kind in KINDS:
        c = totals.get(kind, Counter())
        if c["uses"]:
            lines.append(f"| {kind} | {c['uses']} | {c['migrated']} | {c['reported']} | {c['silent']} |")
    t = Counter()
    for c in totals.values():
        t.update(c)
    lines.append(f"| **all** | {t['uses']} | {t['migrated']} | {t['reported']} | {t['silent']} |")
    if sources:
        lines += ["", "Git trees (extracted at these commits): " + "; ".join(sources) + "."]
    lines += ["", "Per package:", ""]
    for tree, rows in sorted(per_tree.items()):
        lines.append(f"- {tree}: " + "; ".join(r.split("/", 1)[1] if "/" in r else r for r in rows))
    lines += ["", "Each use left after the rewrite, with the reason:", "", "| where | kind | reason |", "|---|---|---|",
              *reported, "", END]
    return "\n".join(lines)


def write_results(md: str) -> None:
    text = RESULTS.read_text(encoding="utf-8")
    after = ""
    if HEADING in text:
        head, rest = text[:text.index(HEADING)], text[text.index(HEADING):]
        after = rest[rest.index(END) + len(END):] if END in rest else "\n"
        text = head
    RESULTS.write_text(text.rstrip("\n") + "\n\n" + md + (after if after.strip() else "\n"), encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fetch", action="store_true", help="download and extract PACKAGES first")
    ap.add_argument("--trees", type=Path, default=CACHE / "trees")
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=PATH[@REV]",
                    help="a further tree: a folder, or a git directory whose HEAD (or REV) is extracted")
    ap.add_argument("--write-results", action="store_true", help=f"replace the section at the end of {RESULTS.name}")
    args = ap.parse_args()
    if args.fetch:
        fetch()
    trees = [(p.name, p) for p in sorted(args.trees.iterdir()) if p.is_dir()] if args.trees.is_dir() else []
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_check import _tree_arg, fetch_tree

    sources = []
    for spec in args.tree:
        name, path, rev = _tree_arg(spec)
        dest = fetch_tree(name, path, rev)
        trees.append((name, dest))
        stamp = dest / "WHEEL_NAME"
        sources.append(f"`{stamp.read_text().strip()}`" if stamp.is_file() else f"`{name}` ({path})")
    totals, reported, per_tree = count(trees)
    md = markdown(totals, reported, per_tree, sources)
    print(md)
    if args.write_results:
        write_results(md)


if __name__ == "__main__":
    main()
