"""Time and peak memory of `ampfix check` on generated files of short statements plus one AMP
finding (issue 22: "1 MB of simple lines costs 37 s and 2 GB"), this checkout against a
baseline checkout, interleaved in one run.

    python bench/bench_resources.py [--lines 20000 40000 80000 170000] [--baseline /path/to/old/checkout]
        [--reps N] [--shape short|long] [--profile N]

Each file is the AMP007 trainer of tests/test_robust_check.py followed by N lines `aK = K`
(--shape short, 5-7 bytes a line) or `x_K_padding_name = K` (long, ~25 bytes). Each run is a
cold `ampfix check -j 1 --no-cache FILE` in a subprocess (`os.wait4` gives its peak RSS), with
`max-file-memory` raised so that nothing is skipped; --baseline runs the same file with the
other checkout's package first on PYTHONPATH (its rules folder is this venv's, the same code).
Prints a markdown table: lines, bytes, tokens, the estimate of ampfix/engine/budget.py,
seconds and peak MiB per checkout, and the ratios.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TRAINER = '''import torch


def train(model, optimizer, loader):
    scaler = torch.amp.GradScaler("cuda")
    for x, y in loader:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(x).sum()
        scaler.scale(loss).backward()
        optimizer.step()
        optimizer.zero_grad()
'''


def source(lines: int, shape: str) -> str:
    if shape == "short":
        return TRAINER + "".join(f"a{i % 10} = {i}\n" for i in range(lines))
    return TRAINER + "".join(f"x_{i}_padding_name = {i}\n" for i in range(lines))


def run(path: Path, pythonpath: str):
    env = dict(os.environ, PYTHONPATH=pythonpath)
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "ampfix", "check", "-j", "1", "--no-cache", str(path.name)],
                            cwd=path.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    found = b"AMP007" in out
    return time.perf_counter() - t, usage.ru_maxrss / 1024, found


def _median(runs):
    runs = sorted(runs)
    mid = runs[len(runs) // 2]
    return mid[0], sorted(r[1] for r in runs)[len(runs) // 2], all(r[2] for r in runs)


def main() -> None:
    from ampfix.engine import budget

    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, nargs="+", default=[20000, 40000, 80000, 170000])
    ap.add_argument("--baseline", default=None, help="a checkout of the code before the change")
    ap.add_argument("--shape", choices=["short", "long"], default="short")
    ap.add_argument("--reps", type=int, default=1, help="runs of each (interleaved); the medians are shown")
    ap.add_argument("--profile", type=int, default=None, help="cProfile the analysis of N lines instead")
    args = ap.parse_args()
    if args.profile:
        import cProfile
        import pstats

        from ampfix.engine.analyze import process_bytes
        from ampfix.engine.registry import select_rules
        from ampfix.engine.results import Settings

        data = source(args.profile, args.shape).encode()
        prof = cProfile.Profile()
        prof.runcall(process_bytes, data, "gen.py", select_rules(None, []), Settings())
        pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
        return
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as base_tmp:
        folder = Path(tmp)
        (folder / "pyproject.toml").write_text('[tool.ampfix]\nmax-file-memory = "64GiB"\n')
        base_folder = Path(base_tmp)  # apart: the baseline does not know max-file-memory
        head = "| lines | bytes | tokens | estimate MiB | s | peak MiB |"
        if args.baseline:
            head += " baseline s | baseline peak MiB | s new/base | peak new/base |"
        print(head)
        print("|" + "---|" * (head.count("|") - 1))
        for n in args.lines:
            text = source(n, args.shape)
            path = folder / f"gen_{n}.py"
            path.write_text(text)
            row = f"| {n} | {len(text.encode())} | {budget.tokens(text)} | {budget.estimate(text) / 2 ** 20:.0f} |"
            new_runs, base_runs = [], []
            if args.baseline:
                (base_folder / path.name).write_text(text)
            for _ in range(args.reps):
                if args.baseline:
                    base_runs.append(run(base_folder / path.name, args.baseline))
                new_runs.append(run(path, str(ROOT)))
            s, m, found = _median(new_runs)
            assert found, "the finding was not reported"
            if args.baseline:
                bs, bm, bfound = _median(base_runs)
            row += f" {s:.1f} | {m:.0f} |"
            if args.baseline:
                assert bfound
                row += f" {bs:.1f} | {bm:.0f} | {s / bs:.2f} | {m / bm:.2f} |"
            print(row, flush=True)


if __name__ == "__main__":
    main()
