"""How ampfix's time grows with the size of one training function (issue 11).

    python bench/bench_scaling.py [--blocks 150 600 1200] [--profile N]

Generates one function whose loop body holds N blocks of autocast / scale / clip / step /
update (6 lines each, in a temporary folder), times `ampfix check` on it in a subprocess
(one worker, cold) and prints a markdown table: lines, seconds, seconds per 1000 lines, peak
memory. With
linear analysis the time grows as the size: 1x, 4x, 16x (default --blocks 150 600 2400).
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

HEAD = """import torch


def train(model, optimizer, loader, scaler):
    for x, y in loader:
"""
BLOCK = """        with torch.autocast("cuda", dtype=torch.float16):
            loss{i} = model(x).sum()
        scaler.scale(loss{i}).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
"""


def source(n: int) -> str:
    return HEAD + "".join(BLOCK.format(i=i) for i in range(n))


def time_check(path: Path):
    """(seconds, peak MiB) of a cold `ampfix check -j 1 --no-cache` in a subprocess."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "ampfix", "check", "-j", "1", "--no-cache", str(path)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    return time.perf_counter() - t, usage.ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, nargs="+", default=[150, 600, 2400])
    ap.add_argument("--profile", type=int, default=None, help="cProfile one run with N blocks instead")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.profile:
            import cProfile
            import pstats

            from ampfix.engine.analyze import Settings, check_text
            from ampfix.engine.registry import select_rules

            text = source(args.profile)
            prof = cProfile.Profile()
            prof.enable()
            check_text(text, "train.py", select_rules(None, []), Settings())
            prof.disable()
            pstats.Stats(prof).sort_stats(os.environ.get("SORT", "cumulative")).print_stats(30)
            return
        base = None
        print("| blocks | lines | seconds | s / 1000 lines | peak MiB | size | time |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for n in args.blocks:
            p = Path(tmp) / f"train_{n}.py"
            p.write_text(source(n))
            lines = source(n).count("\n")
            secs, peak = time_check(p)
            if base is None:
                base = (n, secs)
            print(f"| {n} | {lines} | {secs:.2f} | {1000 * secs / lines:.3f} | {peak:.0f} | {n / base[0]:.0f}x | "
                  f"{secs / base[1]:.1f}x |", flush=True)


if __name__ == "__main__":
    main()
