"""Benchmark `ampfix check` on real third-party code downloaded from PyPI or fetched from git at run time.

    python bench/bench_check.py [--packages timm transformers] [--repeat 3]
    python bench/bench_check.py --sdists basicsr==1.4.2 --tree nanoGPT=/path/to/nanoGPT --skip-bare-parse
    python bench/bench_check.py --packages timm --json-out findings.json
    python bench/bench_check.py --packages timm==1.0.31 --baseline-python /path/to/old/.venv/bin/python

Sources (with none given, the wheels of timm and transformers):
  * --packages NAME[==VERSION]: the wheel (`pip download --no-deps --only-binary=:all:`);
  * --sdists NAME[==VERSION]: the source distribution (`pip download --no-deps --no-binary NAME`),
    for packages whose wheel leaves out the training scripts;
  * --tree NAME=PATH: a folder already extracted (e.g. a GitHub repository), checked where it is;
    or a git directory (`.git`, or a bare/mirror repository), whose HEAD's *.py/*.pyi files are
    copied into the cache first (blobs missing from a partial mirror are skipped and counted);
    NAME=GITDIR@REV takes them at another commit (e.g. the one before a fix, for known mistakes).
Everything downloaded or extracted goes to bench/.cache/ (git-ignored); no third-party code is
committed. For each tree it measures in one run, so the ratios are comparable on a noisy machine:
  * ampfix check on the whole tree (default: parallel over all cores, trigger pre-filter on);
  * ampfix check with one worker;
  * ampfix check warm: re-runs over the unchanged tree with a fresh cache folder filled by a
    first run (the other ampfix runs pass --no-cache, so they are cold);
  * a bare LibCST parse of every file (one process), the floor for a LibCST-based tool
    (--skip-bare-parse leaves it out: it takes minutes on the large trees);
and reports how many files were parsed at all and every finding (to review for precision).
--interleave-bare-parse times the bare parse in a child process after each ampfix run instead
(median), so that on a loaded machine the ratio to it compares runs made under the same load.
--json-out FILE also writes the raw findings, errors, timings and source of every tree as JSON.
--baseline-python PYTHON also runs `PYTHON -m ampfix check` (a second venv holding a reference
ampfix, e.g. an older commit installed with `pip install -e`), alternating with the current one,
and prints the time ratio and which findings differ: the way to compare two engines in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Optional, Tuple

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".cache"


def _split_spec(spec: str) -> Tuple[str, Optional[str]]:
    name, sep, version = spec.partition("==")
    return name, (version if sep else None)


def _download(spec: str, binary: bool) -> Path:
    """pip-download one distribution (no dependencies) into its own folder; return the file."""
    name, _ = _split_spec(spec)
    dl = CACHE / "downloads"
    dl.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dl) as tmp:
        # --no-binary NAME, not :all:, so the sdist's build dependencies (needed to read its metadata)
        # can still come as wheels
        fmt = ["--only-binary=:all:"] if binary else ["--no-binary", name]
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", *fmt, "-q", "-d", tmp, spec],
                       check=True)
        got = sorted(Path(tmp).iterdir())
        if len(got) != 1:
            raise SystemExit(f"{spec}: expected one file from pip download, got {[g.name for g in got]}")
        target = dl / got[0].name
        shutil.move(str(got[0]), target)
    return target


def _cache_dest(kind: str, spec: str) -> Path:
    name, version = _split_spec(spec)
    base = name if kind == "wheel" else f"sdist-{name}"
    return CACHE / (base if version is None else f"{base}-{version}")


def fetch(package: str) -> Path:
    """The unpacked wheel of `package` (NAME or NAME==VERSION)."""
    dest = _cache_dest("wheel", package)
    if dest.is_dir() and any(dest.rglob("*.py")):
        return dest
    wheel = _download(package, binary=True)
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(dest)
    (dest / "WHEEL_NAME").write_text(wheel.name)
    return dest


def fetch_sdist(package: str) -> Path:
    """The unpacked source distribution of `package` (NAME or NAME==VERSION)."""
    dest = _cache_dest("sdist", package)
    if dest.is_dir() and any(dest.rglob("*.py")):
        return dest
    sdist = _download(package, binary=False)
    dest.mkdir(parents=True, exist_ok=True)
    if sdist.name.endswith(".zip"):
        with zipfile.ZipFile(sdist) as zf:
            zf.extractall(dest)
    else:
        with tarfile.open(sdist) as tf:
            if hasattr(tarfile, "data_filter"):
                tf.extractall(dest, filter="data")
            else:  # Python before 3.11.4
                tf.extractall(dest)
    (dest / "WHEEL_NAME").write_text(sdist.name)
    return dest


def _git_dir(path: Path) -> Optional[Path]:
    if (path / ".git").is_dir():
        return path / ".git"
    if (path / "HEAD").is_file() and (path / "objects").is_dir():
        return path
    return None


def fetch_tree(name: str, path: Path, rev: str = "HEAD") -> Path:
    """A folder to check for --tree NAME=PATH[@REV]: PATH itself, or the Python files of a git
    directory at REV (default HEAD)."""
    git = _git_dir(path)
    if git is None:
        if not path.is_dir():
            raise SystemExit(f"--tree {name}={path}: not a folder")
        if rev != "HEAD":
            raise SystemExit(f"--tree {name}={path}@{rev}: a revision needs a git directory")
        return path
    head = subprocess.run(["git", "--git-dir", str(git), "rev-parse", f"{rev}^{{commit}}"], capture_output=True,
                          text=True, check=True).stdout.strip()
    dest = CACHE / f"tree-{name}"
    stamp = dest / "WHEEL_NAME"
    if stamp.is_file() and stamp.read_text().split("@")[-1].split()[0] == head:
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    listing = subprocess.run(["git", "--git-dir", str(git), "ls-tree", "-r", "-z", head], capture_output=True,
                             check=True).stdout.split(b"\0")
    blobs = []
    for entry in listing:
        if not entry:
            continue
        meta, _, rel = entry.partition(b"\t")
        mode, kind, sha = meta.split()
        if kind == b"blob" and mode != b"120000" and rel.endswith((b".py", b".pyi")):
            blobs.append((sha.decode(), os.fsdecode(rel)))
    missing = 0
    # one `cat-file --batch` process for all blobs; a blob absent from a partial mirror says "missing"
    proc = subprocess.Popen(["git", "--git-dir", str(git), "cat-file", "--batch"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    for sha, rel in blobs:
        proc.stdin.write(sha.encode() + b"\n")
        proc.stdin.flush()
        header = proc.stdout.readline().split()
        if len(header) < 3 or header[1] != b"blob":
            missing += 1
            continue
        data = proc.stdout.read(int(header[2]))
        proc.stdout.read(1)  # the newline after the content
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
    proc.stdin.close()
    proc.wait()
    note = f" ({missing} blobs missing from the mirror)" if missing else ""
    stamp.write_text(f"{name}@{head}{note}\n")
    return dest


def timed(cmd, repeat, between=None):
    times, last = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        last = subprocess.run(cmd, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        if between is not None:
            between()
    return statistics.median(times), last, times


def timed_pair(cmd, base_cmd, repeat, between=None):
    """Time `cmd` and `base_cmd` alternately (cmd, base, cmd, base, ...), so machine noise hits both.

    `base_cmd` runs from bench/.cache/, not from the checkout: `python -m ampfix` puts the working
    folder first on sys.path, which would import this checkout's ampfix instead of the baseline's."""
    times, base_times, last, base_last = [], [], None, None
    for _ in range(repeat):
        t0 = time.perf_counter()
        last = subprocess.run(cmd, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        base_last = subprocess.run(base_cmd, capture_output=True, text=True, cwd=CACHE)
        base_times.append(time.perf_counter() - t0)
        if between is not None:
            between()
    return (statistics.median(times), last, times), (statistics.median(base_times), base_last, base_times)


def _key(d):
    return (d["path"], d["line"], d["column"], d["code"])


def bare_parse(files) -> float:
    import libcst as cst

    t0 = time.perf_counter()
    for f in files:
        try:
            cst.parse_module(f.read_bytes())
        except Exception:
            pass
    return time.perf_counter() - t0


def bare_parse_child(files) -> float:
    """`bare_parse` in a child process (the parse loop's own time, imports excluded), so that it
    can run between the ampfix runs: on a shared machine the load then hits both alike."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as fh:
        fh.write("\n".join(str(f) for f in files))
    try:
        out = subprocess.run([sys.executable, __file__, "--bare-parse-worker", fh.name], capture_output=True,
                             text=True, check=True).stdout
    finally:
        os.unlink(fh.name)
    return float(out.strip().splitlines()[-1])


def count_parsed(files) -> int:
    from ampfix.engine.analyze import triggered
    from ampfix.engine.registry import all_rules

    rules = list(all_rules().values())
    n = 0
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        n += bool(triggered(rules, text))
    return n


def _tree_arg(value: str) -> Tuple[str, Path, str]:
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH or NAME=GITDIR@REV, got {value!r}")
    rev = "HEAD"
    base, at, maybe_rev = path.rpartition("@")
    if at and base and _git_dir(Path(base).expanduser()) is not None:
        path, rev = base, maybe_rev
    return name, Path(path).expanduser().resolve(), rev


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packages", nargs="+", default=None, metavar="NAME[==VERSION]",
                    help="wheels from PyPI (default, with no other source: timm transformers)")
    ap.add_argument("--sdists", nargs="+", default=[], metavar="NAME[==VERSION]",
                    help="source distributions from PyPI")
    ap.add_argument("--tree", action="append", default=[], type=_tree_arg, metavar="NAME=PATH[@REV]",
                    help="an extracted folder, or a git directory whose HEAD (or REV) is extracted (repeatable)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-bare-parse", action="store_true", help="leave out the bare LibCST parse")
    ap.add_argument("--interleave-bare-parse", action="store_true",
                    help="time the bare parse in a child process after each ampfix run (median of --repeat), "
                         "instead of once at the end: the ratio to it then holds on a loaded machine")
    ap.add_argument("--bare-parse-worker", metavar="LIST", help=argparse.SUPPRESS)
    ap.add_argument("--json-out", type=Path, help="write raw findings and timings of every tree here")
    ap.add_argument("--baseline-python", metavar="PYTHON",
                    help="also time `PYTHON -m ampfix check` (a venv with a reference ampfix, e.g. an older "
                         "commit), interleaved with the current one; print the time ratio and the findings diff")
    args = ap.parse_args()
    if args.bare_parse_worker:
        print(bare_parse([Path(line) for line in Path(args.bare_parse_worker).read_text().splitlines() if line]))
        return
    if args.packages is None:
        args.packages = [] if (args.sdists or args.tree) else ["timm", "transformers"]
    ampfix = [sys.executable, "-m", "ampfix", "check", "--output-format", "json", "--exit-zero", "--no-cache"]
    sources = ([("wheel", pkg, None) for pkg in args.packages] + [("sdist", pkg, None) for pkg in args.sdists]
               + [("tree", name, (path, rev)) for name, path, rev in args.tree])
    records = []
    for kind, spec, path in sources:
        if kind == "wheel":
            tree = fetch(spec)
        elif kind == "sdist":
            tree = fetch_sdist(spec)
        else:
            tree = fetch_tree(spec, *path)
        files = sorted(p for p in tree.rglob("*.py"))
        stamp = tree / "WHEEL_NAME"
        label = stamp.read_text().strip() if stamp.is_file() else f"{spec} ({tree})"
        base = None
        bare_times: list = []
        between = ((lambda: bare_times.append(bare_parse_child(files)))
                   if args.interleave_bare_parse and not args.skip_bare_parse else None)
        if args.baseline_python:
            base_cmd = [args.baseline_python, *ampfix[1:], str(tree)]  # cold too: --no-cache
            (t_par, res, t_all), base = timed_pair([*ampfix, str(tree)], base_cmd, args.repeat, between)
        else:
            t_par, res, t_all = timed([*ampfix, str(tree)], args.repeat, between)
        findings = json.loads(res.stdout)
        errors = [line for line in res.stderr.splitlines() if ": error:" in line]
        env = dict(os.environ, AMPFIX_WORKERS="1")
        t0 = time.perf_counter()
        subprocess.run([*ampfix, str(tree)], capture_output=True, env=env)
        t_serial = time.perf_counter() - t0
        with tempfile.TemporaryDirectory() as cache:  # warm: a re-run over the unchanged tree
            warm_cmd = [a for a in ampfix if a != "--no-cache"] + [str(tree)]
            warm_env = dict(os.environ, AMPFIX_CACHE_DIR=cache)
            subprocess.run(warm_cmd, capture_output=True, env=warm_env)
            t_warm_all = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                subprocess.run(warm_cmd, capture_output=True, env=warm_env)
                t_warm_all.append(time.perf_counter() - t0)
            t_warm = statistics.median(t_warm_all)
        if bare_times:
            t_parse = statistics.median(bare_times)
        else:
            t_parse = None if args.skip_bare_parse else bare_parse(files)
        parsed = count_parsed(files)
        print(f"## {label}: {len(files)} files, {parsed} contain a rule trigger and are parsed")
        print(f"ampfix check (parallel, {os.cpu_count()} cores, median of {args.repeat}): {t_par:.2f} s")
        print(f"ampfix check (1 worker):                       {t_serial:.2f} s")
        print(f"ampfix check warm (cache, median of {args.repeat}):      {t_warm:.2f} s")
        if t_parse is not None:
            how = f", interleaved, median of {len(bare_times)}" if bare_times else ""
            print(f"bare LibCST parse of every file (1 process{how}):  {t_parse:.2f} s; "
                  f"ampfix check is {t_parse / t_par:.2f}x faster")
        base_record = None
        if base is not None:
            t_base, base_res, base_all = base
            base_findings = json.loads(base_res.stdout)
            new_keys = {_key(d) for d in findings} - {_key(d) for d in base_findings}
            gone_keys = {_key(d) for d in base_findings} - {_key(d) for d in findings}
            print(f"baseline ampfix check ({args.baseline_python}, interleaved, median of {args.repeat}): "
                  f"{t_base:.2f} s; current/baseline = {t_par / t_base:.2f}x")
            print(f"baseline findings: {len(base_findings)} ({len(new_keys)} only in current, "
                  f"{len(gone_keys)} only in baseline)")
            base_record = {"python": args.baseline_python, "check_parallel_s": round(t_base, 3),
                           "check_parallel_runs_s": [round(t, 3) for t in base_all],
                           "ratio": round(t_par / t_base, 3), "findings": len(base_findings),
                           "only_in_baseline": [dict(d, path=os.path.relpath(d["path"], tree))
                                                for d in base_findings if _key(d) in gone_keys]}
        print(f"errors: {len(errors)}")
        for e in errors[:10]:
            print("  " + e)
        print(f"findings: {len(findings)}")
        for d in findings:
            rel = os.path.relpath(d["path"], tree)
            print(f"  {rel}:{d['line']}:{d['column']}: {d['code']} {d['message'][:100]}")
        print()
        records.append({
            "name": spec, "kind": kind, "source": label, "root": str(tree), "files": len(files), "parsed": parsed,
            "check_parallel_s": round(t_par, 3), "check_parallel_runs_s": [round(t, 3) for t in t_all],
            "check_serial_s": round(t_serial, 3), "check_warm_s": round(t_warm, 3),
            "bare_parse_s": None if t_parse is None else round(t_parse, 3),
            "bare_parse_runs_s": [round(t, 3) for t in bare_times],
            "errors": errors,
            "findings": [dict(d, path=os.path.relpath(d["path"], tree)) for d in findings],
            "baseline": base_record,
        })
    if args.json_out:
        meta = {"python": platform.python_version(), "cores": os.cpu_count(),
                "date": time.strftime("%Y-%m-%d %H:%M:%S"), "repeat": args.repeat}
        try:
            from importlib.metadata import version

            meta.update(ampfix=version("ampfix"), libcst=version("libcst"))
        except Exception:
            pass
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps({"meta": meta, "trees": records}, indent=1) + "\n")


if __name__ == "__main__":
    main()
