"""ampfix against its peers on real trees from PyPI source distributions, interleaved in one run.

    python bench/bench_corpus.py                      # every tool, every tree (about 15-20 min on 2 cores)
    python bench/bench_corpus.py --tools ampfix-cold ampfix-warm ruff --trees 1x 2x 4x
    python bench/bench_corpus.py --tools ampfix-cold ampfix-warm ruff bare-parse --trees 1x timm-x2 timm-x4 \
        --md-out bench/CORPUS_GROWTH.md
    python bench/bench_corpus.py --peer-timeout 60 --json-out /tmp/corpus.json
    python bench/bench_corpus.py --tree-dir fixture=tests/some_folder --tools ampfix-cold bare-parse

Tools (each run is a separate process, measured by a fresh wrapper process):
  * ampfix-cold: `ampfix check --no-cache` (default workers: one per CPU);
  * ampfix-warm: `ampfix check` re-run over the unchanged tree, with a fresh cache folder
    ($AMPFIX_CACHE_DIR) filled by a first, unmeasured run;
  * ruff: `ruff check --select ALL --isolated --no-cache` (the speed floor of the field);
  * bare-parse: `libcst.parse_module` of every file in one process (bench_check.bare_parse);
  * torchfix: `torchfix PATH` (default rules, default jobs: one per CPU);
  * fixit: `fixit lint PATH` (Fixit 2, default rules).
TorchFix, Fixit and ruff are installed from PyPI each in its own virtualenv under
bench/.cache/venvs/ (created when missing; --install-only stops after that).

Trees: the source distributions (pinned, `pip download --no-deps` with bench_check.fetch_sdist)
of timm, transformers, lightning, ultralytics and accelerate, and the scale corpora 1x, 2x and 4x:
the files of timm, then ultralytics, lightning, accelerate and transformers (each sorted by path),
taken in that order until the lines reach 1, 2 and 4 times the lines of timm (so 1x is timm, and
each corpus holds the one before it), and timm-x2, timm-x4: 2 and 4 copies of timm (growth with the
content unchanged; the concatenations add files that use AMP more often than timm's). Only `*.py` files are copied (hard links) into
bench/.cache/corpus/NAME/, so every tool sees the same files and no project's configuration.
Trees run from the smallest to the largest; TorchFix and Fixit get a per-run timeout
(--peer-timeout, recorded as "> N s"), and once one timed out it is not run on larger trees.

Per tool and tree: files, lines, wall time (median of --repeat runs for ampfix and ruff, which
run interleaved: cold, warm, ruff, cold, warm, ruff, ...; one run of the slow tools), peak memory
(the largest ru_maxrss of the measured process and its waited-for children, from
getrusage(RUSAGE_CHILDREN) in the wrapper) and the ratio to ampfix cold. The load average is
recorded before and after each tree. Writes a markdown report (--md-out, default
bench/CORPUS_RESULTS.md) and, with --json-out, the raw records.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_check  # noqa: E402  (download/extract helpers and the bare parse)

CACHE = bench_check.CACHE
VENVS = CACHE / "venvs"
CORPUS = CACHE / "corpus"
PINS = {
    "timm": "timm==1.0.15",
    "ultralytics": "ultralytics==8.4.190",
    "lightning": "lightning==2.6.6",
    "accelerate": "accelerate==1.15.0",
    "transformers": "transformers==5.23.0",
}
SCALE_ORDER = ["timm", "ultralytics", "lightning", "accelerate", "transformers"]
SCALES = {"1x": 1, "2x": 2, "4x": 4}
COPIES = {"timm-x2": 2, "timm-x4": 4}  # the same content again: growth with nothing else changing
ALL_TREES = list(PINS) + list(SCALES) + list(COPIES)
ALL_TOOLS = ["ampfix-cold", "ampfix-warm", "ruff", "bare-parse", "torchfix", "fixit"]
PEERS = {"torchfix": "torchfix", "fixit": "fixit", "ruff": "ruff"}  # tool -> PyPI package
SLOW = {"bare-parse", "torchfix", "fixit"}
TIMED_OUT = {"torchfix", "fixit"}

# The wrapper: a fresh process per measurement that runs the command, times it and reads the
# peak RSS of its (waited-for) children. It kills the whole process group on timeout.
WRAPPER = r"""
import json, os, resource, signal, subprocess, sys, time
timeout = float(sys.argv[1]) or None
env = json.loads(sys.argv[2])
cmd = sys.argv[3:]
t0 = time.perf_counter()
p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                     env=dict(os.environ, **env))
timed_out = False
try:
    _, err = p.communicate(timeout=timeout)
except subprocess.TimeoutExpired:
    timed_out = True
    os.killpg(p.pid, signal.SIGKILL)
    _, err = p.communicate()
wall = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall_s": wall, "maxrss_kib": ru.ru_maxrss, "rc": p.returncode, "timed_out": timed_out,
                  "stderr_tail": err.decode("utf-8", "replace")[-400:]}))
"""


def venv_bin(tool: str, exe: str) -> Path:
    return VENVS / tool / "bin" / exe


def ensure_venv(tool: str) -> None:
    exe = venv_bin(tool, PEERS[tool] if tool != "fixit" else "fixit")
    if exe.exists():
        return
    print(f"creating {VENVS / tool} and installing {PEERS[tool]} from PyPI", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENVS / tool)], check=True)
    subprocess.run([str(venv_bin(tool, "pip")), "install", "-q", PEERS[tool]], check=True)


def pkg_version(python: str, dist: str) -> str:
    out = subprocess.run([python, "-c", f"from importlib.metadata import version; print(version({dist!r}))"],
                         capture_output=True, text=True)
    return out.stdout.strip() or "?"


def count_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n")


def py_files(root: Path) -> List[Path]:
    return sorted(p for p in root.rglob("*.py") if p.is_file())


def link_tree(dest: Path, members) -> Dict[str, int]:
    """Hard-link (or copy) (source, relative path) pairs into dest; return files and lines."""
    stamp = dest / ".corpus.json"
    if stamp.is_file():
        return json.loads(stamp.read_text())
    shutil.rmtree(dest, ignore_errors=True)
    files = lines = 0
    for src, rel in members:
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, out)
        except OSError:
            shutil.copyfile(src, out)
        files += 1
        lines += count_lines(src)
    info = {"files": files, "lines": lines}
    stamp.write_text(json.dumps(info))
    return info


def build_trees(selected: List[str], extra: Dict[str, Path]) -> Dict[str, dict]:
    """name -> {"root", "files", "lines", "source"} for the selected trees."""
    CORPUS.mkdir(parents=True, exist_ok=True)
    # Fixit (trailrunner) skips whatever the .gitignore of the project root ignores, and bench/.cache/ is
    # ignored: this file makes bench/.cache/corpus/ the project root, with Fixit's default rules.
    (CORPUS / "pyproject.toml").write_text("[tool.fixit]\nroot = true\n")
    trees: Dict[str, dict] = {}
    sources: Dict[str, Path] = {}
    need = set(n for n in selected if n in PINS)
    if any(n in SCALES for n in selected):
        need |= set(SCALE_ORDER)
    if any(n in COPIES for n in selected):
        need.add("timm")
    for name in SCALE_ORDER:
        if name in need:
            sources[name] = bench_check.fetch_sdist(PINS[name])
    for name in PINS:
        if name in selected and not (name == "timm" and "1x" in selected):  # 1x is timm
            src = sources[name]
            info = link_tree(CORPUS / name, ((f, f.relative_to(src)) for f in py_files(src)))
            trees[name] = dict(info, root=CORPUS / name, source=f"{PINS[name]} (sdist)")
    if any(n in SCALES for n in selected):
        ordered = [(f, Path(name) / f.relative_to(sources[name])) for name in SCALE_ORDER
                   for f in py_files(sources[name])]
        base = sum(count_lines(f) for f, rel in ordered if rel.parts[0] == "timm")
        for scale, k in SCALES.items():
            if scale not in selected:
                continue
            members, lines = [], 0
            for f, rel in ordered:
                if lines >= k * base:
                    break
                members.append((f, rel))
                lines += count_lines(f)
            info = link_tree(CORPUS / f"scale-{scale}", members)
            last = members[-1][1].parts[0]
            used = SCALE_ORDER[:SCALE_ORDER.index(last) + 1]
            trees[scale] = dict(info, root=CORPUS / f"scale-{scale}",
                                source=f"{PINS['timm']} (sdist)" if k == 1 else
                                f"{k} x the lines of timm: all of {', '.join(used[:-1])} and the first "
                                f"files (by path) of {used[-1]}")
    for name, k in COPIES.items():
        if name in selected:
            src = sources["timm"]
            info = link_tree(CORPUS / name, ((f, Path(f"copy{i + 1}") / f.relative_to(src))
                                             for i in range(k) for f in py_files(src)))
            trees[name] = dict(info, root=CORPUS / name, source=f"{k} copies of {PINS['timm']} (sdist)")
    for name, path in extra.items():
        files = py_files(path)
        trees[name] = {"root": path, "files": len(files), "lines": sum(count_lines(f) for f in files),
                       "source": str(path)}
    return trees


def measure(cmd: List[str], timeout: float = 0, env: Optional[dict] = None, cwd: Optional[Path] = None) -> dict:
    proc = subprocess.run([sys.executable, "-c", WRAPPER, str(timeout), json.dumps(env or {}), *cmd],
                          capture_output=True, text=True, cwd=cwd)
    if proc.returncode != 0:
        raise SystemExit(f"wrapper failed for {shlex.join(cmd)}: {proc.stderr}")
    return json.loads(proc.stdout)


def commands(tree: Path, warm_cache: str) -> Dict[str, tuple]:
    """tool -> (argv, env)"""
    ampfix = [sys.executable, "-m", "ampfix", "check", "--exit-zero", "-q"]
    return {
        "ampfix-cold": ([*ampfix, "--no-cache", str(tree)], {}),
        "ampfix-warm": ([*ampfix, str(tree)], {"AMPFIX_CACHE_DIR": warm_cache}),
        "ruff": ([str(venv_bin("ruff", "ruff")), "check", "--select", "ALL", "--isolated", "--no-cache",
                  "--exit-zero", str(tree)], {}),
        "bare-parse": ([sys.executable, str(Path(__file__).resolve()), "--_bare-parse", str(tree)], {}),
        "torchfix": ([str(venv_bin("torchfix", "torchfix")), str(tree)], {}),
        "fixit": ([str(venv_bin("fixit", "fixit")), "lint", str(tree)], {}),
    }


def fmt_time(rec: Optional[dict]) -> str:
    if rec is None:
        return "-"
    if rec.get("skipped"):
        return rec["skipped"]
    if rec["timed_out"]:
        return f"> {rec['timeout_s']:.0f} s"
    return f"{rec['wall_s']:.2f} s"


def fmt_mem(rec: Optional[dict]) -> str:
    if rec is None or rec.get("skipped") or rec["timed_out"]:
        return "-"
    return f"{rec['maxrss_kib'] / 1024:.0f} MiB"


def fmt_ratio(rec: Optional[dict], cold: Optional[dict]) -> str:
    if rec is None or cold is None or rec.get("skipped") or cold.get("skipped"):
        return "-"
    r = rec["wall_s"] / cold["wall_s"]
    return (">" if rec["timed_out"] else "") + (f"{r:.1f}x" if r >= 1 or rec["timed_out"] else f"{r:.2f}x")


def run_tree(name: str, info: dict, tools: List[str], repeat: int, peer_timeout: float,
             gave_up: Dict[str, int]) -> dict:
    root = info["root"]
    load_before = os.getloadavg()
    results: Dict[str, dict] = {}
    runs: Dict[str, list] = {t: [] for t in tools}
    with tempfile.TemporaryDirectory(prefix="ampfix-warm-") as warm_cache:
        cmds = commands(root, warm_cache)
        if "ampfix-warm" in tools:  # fill the cache (not measured)
            subprocess.run(cmds["ampfix-warm"][0], capture_output=True, env=dict(os.environ, AMPFIX_CACHE_DIR=warm_cache))
        for r in range(repeat):
            for tool in tools:
                if tool in SLOW and r > 0:
                    continue
                if tool in TIMED_OUT and tool in gave_up:
                    results[tool] = {"skipped": f"> {peer_timeout:.0f} s (timed out at {gave_up[tool]} lines)"}
                    continue
                timeout = peer_timeout if tool in TIMED_OUT else 0
                cmd, env = cmds[tool]
                rec = measure(cmd, timeout, env, cwd=CACHE)
                rec["timeout_s"] = timeout
                runs[tool].append(rec)
                state = "timed out" if rec["timed_out"] else f"{rec['wall_s']:.2f} s"
                print(f"  {name} {tool}: {state}, {rec['maxrss_kib'] / 1024:.0f} MiB, rc={rec['rc']}", flush=True)
                if rec["timed_out"]:
                    gave_up.setdefault(tool, info["lines"])
    for tool, rs in runs.items():
        if not rs:
            continue
        med = statistics.median(r["wall_s"] for r in rs)
        results[tool] = {"wall_s": med, "runs_s": [round(r["wall_s"], 3) for r in rs],
                         "maxrss_kib": max(r["maxrss_kib"] for r in rs), "timed_out": any(r["timed_out"] for r in rs),
                         "timeout_s": rs[0]["timeout_s"], "rc": rs[-1]["rc"], "stderr_tail": rs[-1]["stderr_tail"]}
    load_after = os.getloadavg()
    return {"tree": name, "source": info["source"], "root": str(root), "files": info["files"],
            "lines": info["lines"], "parsed": bench_check.count_parsed(py_files(root)),
            "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in load_after],
            "tools": results}


def machine() -> str:
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 1024 / 1024:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores ({cpu}){mem}"


def markdown(meta: dict, records: List[dict], tools: List[str]) -> str:
    out = ["# ampfix and its peers on real trees", "",
           f"Command: `{meta['command']}`  ", f"Date: {meta['date']}  ", f"Machine: {meta['machine']}  ",
           "Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()), "",
           "One run, tools interleaved on the same files (only the `*.py` files of each tree, hard-linked "
           "into `bench/.cache/corpus/`). Wall time of the whole process (start-up included); ampfix and "
           f"ruff: median of {meta['repeat']} interleaved runs, the other tools one run. Peak memory: the "
           "largest resident set of one process of the run (`ru_maxrss` of the waited-for children). "
           f"TorchFix and Fixit have a {meta['peer_timeout']:.0f} s timeout per run and are not run again on "
           "larger trees once they timed out. Ratio: wall time / ampfix cold. The machine is shared with "
           "other jobs: the load average (1 min) before/after each tree is shown; compare ratios, not seconds. "
           "Files ampfix parses: those that contain a rule's trigger; ampfix reads the others without parsing "
           "them, so its cold time follows these files more than the lines (TorchFix likewise parses only "
           "the files that mention `torch`).",
           ""]
    names = {"ampfix-cold": "ampfix cold", "ampfix-warm": "ampfix warm", "ruff": "ruff --select ALL",
             "bare-parse": "bare LibCST parse", "torchfix": "TorchFix", "fixit": "Fixit 2"}
    out += ["| tree | files | lines | files ampfix parses | load | " + " | ".join(names[t] for t in tools) + " |",
            "|---|---:|---:|---:|---|" + "---:|" * len(tools)]
    for rec in records:
        cold = rec["tools"].get("ampfix-cold")
        cells = []
        for t in tools:
            r = rec["tools"].get(t)
            cell = fmt_time(r)
            if t != "ampfix-cold" and r is not None and not r.get("skipped"):
                cell += f" ({fmt_ratio(r, cold)})"
            cells.append(cell)
        out.append(f"| {rec['tree']} | {rec['files']} | {rec['lines']} | {rec.get('parsed', '?')} | "
                   f"{rec['load_before'][0]:.1f}/{rec['load_after'][0]:.1f} | " + " | ".join(cells) + " |")
    out += ["", "Peak memory:", "", "| tree | " + " | ".join(names[t] for t in tools) + " |",
            "|---|" + "---:|" * len(tools)]
    for rec in records:
        out.append(f"| {rec['tree']} | " + " | ".join(fmt_mem(rec["tools"].get(t)) for t in tools) + " |")
    by_name = {r["tree"]: r for r in records}
    families = [("1x, 2x, 4x the lines of timm: timm, then files of the other trees", list(SCALES)),
                ("timm, 2 and 4 copies of timm: the same content again", ["1x", *COPIES])]
    for title, members in families:
        scale = [by_name[n] for n in members if n in by_name]
        if len(scale) < 2:
            continue
        base = scale[0]
        out += ["", f"Growth with the corpus size, {title} (time relative to the first, and microseconds "
                "per line; linear growth keeps the microseconds per line flat):", "",
                "| tool | " + " | ".join(f"{r['tree']} ({r['lines']} lines, {r['lines'] / base['lines']:.2f}x)"
                                      for r in scale) + " |",
                "|---|" + "---:|" * len(scale),
                "| files ampfix parses | " + " | ".join(str(r.get("parsed", "?")) for r in scale) + " |"]
        for t in tools:
            cells = []
            b = base["tools"].get(t)
            for r in scale:
                x = r["tools"].get(t)
                if x is None or x.get("skipped") or x["timed_out"] or b is None or b.get("skipped") or b["timed_out"]:
                    cells.append(fmt_time(x))
                    continue
                cells.append(f"{x['wall_s']:.2f} s = {x['wall_s'] / b['wall_s']:.2f}x, "
                             f"{x['wall_s'] / r['lines'] * 1e6:.0f} us/line")
            out.append(f"| {names[t]} | " + " | ".join(cells) + " |")
    out += ["", "Trees:", ""] + [f"- {r['tree']}: {r['source']}" for r in records]
    return "\n".join(out) + "\n"


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--_bare-parse":  # the bare-parse tool, in its own process
        bench_check.bare_parse(py_files(Path(sys.argv[2])))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--tools", nargs="+", default=ALL_TOOLS, choices=ALL_TOOLS)
    ap.add_argument("--trees", nargs="+", default=None, choices=ALL_TREES,
                    help="default: all, unless --tree-dir is given")
    ap.add_argument("--tree-dir", action="append", default=[], metavar="NAME=PATH",
                    help="also (or with no --trees, only) measure an existing folder (repeatable)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of ampfix cold/warm and ruff (median)")
    ap.add_argument("--peer-timeout", type=float, default=90, help="seconds per TorchFix/Fixit run")
    ap.add_argument("--md-out", type=Path, default=HERE / "CORPUS_RESULTS.md")
    ap.add_argument("--json-out", type=Path)
    ap.add_argument("--install-only", action="store_true", help="create the peers' virtualenvs and stop")
    ap.add_argument("--render-json", type=Path, metavar="FILE",
                    help="measure nothing: write the markdown (--md-out) again from a --json-out FILE")
    args = ap.parse_args()
    if args.render_json:
        data = json.loads(args.render_json.read_text())
        for rec in data["trees"]:  # files with a rule trigger, for JSON written before they were counted
            if "parsed" not in rec:
                root = Path(rec.get("root") or CORPUS / (f"scale-{rec['tree']}" if rec["tree"] in SCALES else rec["tree"]))
                rec["parsed"] = bench_check.count_parsed(py_files(root))
        args.md_out.write_text(markdown(data["meta"], data["trees"], data["meta"]["tools"]))
        return
    extra = {}
    for spec in args.tree_dir:
        name, sep, path = spec.partition("=")
        if not sep or not Path(path).is_dir():
            ap.error(f"--tree-dir: expected NAME=FOLDER, got {spec!r}")
        extra[name] = Path(path).resolve()
    trees_sel = args.trees if args.trees is not None else ([] if extra else ALL_TREES)
    tools = [t for t in ALL_TOOLS if t in args.tools]
    for t in tools:
        if t in PEERS:
            ensure_venv(t)
    if args.install_only:
        return
    trees = build_trees(trees_sel, extra)
    order = sorted(trees, key=lambda n: trees[n]["lines"])
    versions = {"ampfix": pkg_version(sys.executable, "ampfix"), "libcst": pkg_version(sys.executable, "libcst"),
                "Python": platform.python_version()}
    for t in tools:
        if t in PEERS:
            py = str(venv_bin(t, "python"))
            versions[PEERS[t]] = pkg_version(py, PEERS[t])
            if t != "ruff":
                versions[f"libcst (in {t}'s venv)"] = pkg_version(py, "libcst")
    meta = {"command": "python " + shlex.join(["bench/bench_corpus.py", *sys.argv[1:]]),
            "date": time.strftime("%Y-%m-%d %H:%M %Z"), "machine": machine(), "versions": versions,
            "repeat": args.repeat, "peer_timeout": args.peer_timeout, "tools": tools}
    print(f"{meta['machine']}; load {os.getloadavg()[0]:.2f}", flush=True)
    records, gave_up = [], {}
    for name in order:
        print(f"{name}: {trees[name]['files']} files, {trees[name]['lines']} lines", flush=True)
        records.append(run_tree(name, trees[name], tools, args.repeat, args.peer_timeout, gave_up))
        if args.json_out:  # written after every tree, so an interrupted run keeps what it measured
            args.json_out.parent.mkdir(parents=True, exist_ok=True)
            args.json_out.write_text(json.dumps({"meta": meta, "trees": records}, indent=1, default=str) + "\n")
        args.md_out.write_text(markdown(meta, records, tools))
    print(markdown(meta, records, tools))


if __name__ == "__main__":
    main()
