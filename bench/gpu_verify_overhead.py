"""Why `ampfix verify` measured the large MLP's float16 AMP step 30-40% slower on CUDA than the
same step run alone (bench/RESULTS.md, "On CUDA, third run": 249-297 steps/s under `verify`,
420 alone), while its fp32 step cost nothing more.

Each configuration runs in a fresh process, as each of `verify`'s runs does, and trains
`fixtures/train/mlp.py`'s step at `--width 4096 --depth 4 --batch 1024 --lr 0.02` (autocast
float16, an enabled GradScaler, `unscale_`, clipping) for `--steps` steps after `--warmup`,
synchronising every `--block` steps to time each block. What `verify` changes, one at a time:

  plain          the step alone, torch's default threads
  t4             OMP/MKL threads and torch.set_num_threads at 4 (`verify --threads 4`)
  cublas         CUBLAS_WORKSPACE_CONFIG=:4096:8 (what `verify`'s runner sets in the child)
  hooks          the tracer's hooks (`trace._Recorder`, `trace._install`, as `verify` installs them)
  all            t4 + cublas + hooks
  bootstrap      the real `python -m ampfix.verify.trace ... fixtures/train/mlp.py` in the
                 runner's environment (everything `verify` does to a run), its own `steps_per_s`
  bootstrap-old  the same with cuBLAS's setting in the AMP run too, as the runner gave it before
                 2026-11-27

Prints, per configuration and round, the rate over `verify`'s window (the steps after the warmup
up to step 200, which is what `verify --steps 200 --warmup 20` times) and over the steps after
200, and the block rates; then the median per configuration.

    python bench/gpu_verify_overhead.py [--rounds 2] [--steps 1000] [--modes amp fp32]
                                        [--configs plain t4 cublas hooks all bootstrap bootstrap-old]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WINDOW_END = 200  # `verify --steps 200` stops here
SIZE = ["--width", "4096", "--depth", "4", "--batch", "1024", "--lr", "0.02"]


def _child(args: argparse.Namespace) -> None:
    threads = int(os.environ.get("GVO_THREADS", "0"))
    import torch
    import torch.nn.functional as F

    if threads > 0:
        torch.set_num_threads(threads)
    amp = args.mode == "amp"
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU only to try the script out
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    if os.environ.get("GVO_HOOKS") == "1":
        from ampfix.verify import trace

        targs = trace._parse(["--out", "/dev/null", "--steps", str(10 ** 9), "--warmup", "0",
                              "--device", dev, "--mode", "asis" if amp else "fp32", "mlp.py"])
        rec = trace._Recorder(torch, targs)
        trace._STATE = rec
        trace._install(torch, rec, targs)
    torch.manual_seed(0)
    n_in, n_cls, width, depth, batch = 256, 10, 4096, 4, 1024
    if dev == "cpu":
        width, batch = 64, 32
    teacher = torch.randn(n_in, n_cls)
    data_x = torch.randn(8192, n_in)
    data_y = (data_x @ teacher).argmax(dim=1)
    data_x, data_y = data_x.to(dev), data_y.to(dev)
    layers = [torch.nn.Linear(n_in, width), torch.nn.ReLU()]
    for _ in range(depth - 2):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(width, n_cls)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    scaler = torch.amp.GradScaler(dev, enabled=amp)
    marks = []
    for step in range(args.warmup + args.steps):
        if step >= args.warmup and (step - args.warmup) % args.block == 0:
            sync()
            marks.append((step, time.perf_counter()))
        i = (step * batch) % data_x.shape[0]
        x, y = data_x[i:i + batch], data_y[i:i + batch]
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=dev, dtype=torch.float16 if dev == "cuda" else torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
    sync()
    marks.append((args.warmup + args.steps, time.perf_counter()))
    print(json.dumps({"marks": marks}))


def _rate(marks, lo, hi):
    pts = [(s, t) for s, t in marks if lo <= s <= hi]
    if len(pts) < 2:
        return None
    (s0, t0), (s1, t1) = pts[0], pts[-1]
    return (s1 - s0) / (t1 - t0)


def _one(cfg: str, mode: str, args: argparse.Namespace) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("CUBLAS_WORKSPACE_CONFIG", None)
    if cfg in ("t4", "all"):
        env["GVO_THREADS"] = "4"
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[var] = "4"
    if cfg in ("cublas", "all"):
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    if cfg in ("hooks", "all"):
        env["GVO_HOOKS"] = "1"
    t0 = time.perf_counter()
    if cfg in ("bootstrap", "bootstrap-old"):
        from ampfix.verify import runner

        out = tempfile.mktemp(suffix=".json")
        env = runner.child_env(4, "cuda" if args.cuda else "cpu", "torch", "asis" if mode == "amp" else "fp32")
        if cfg == "bootstrap-old":  # before 2026-11-27 the runner gave every run cuBLAS's setting
            env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        n = args.warmup + args.steps
        cmd = [sys.executable, "-m", "ampfix.verify.trace", "--out", out, "--steps", str(n),
               "--warmup", str(args.warmup), "--mode", "asis" if mode == "amp" else "fp32",
               "--threads", "4", "--device", "cuda" if args.cuda else "cpu", os.path.join(ROOT, "fixtures", "train", "mlp.py"),
               *(SIZE if args.cuda else ["--width", "64", "--batch", "32"]), "--steps", str(n)]
        subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
        with open(out) as f:
            doc = json.load(f)
        os.unlink(out)
        return {"all": doc["steps_per_s"], "window": None, "after": None, "blocks": [],
                "wall": time.perf_counter() - t0}
    p = subprocess.run([sys.executable, __file__, "--child", "--mode", mode, "--steps", str(args.steps),
                        "--warmup", str(args.warmup), "--block", str(args.block)],
                       env=env, check=True, capture_output=True, text=True)
    marks = json.loads(p.stdout.strip().splitlines()[-1])["marks"]
    blocks = [(b[0] - a[0]) / (b[1] - a[1]) for a, b in zip(marks, marks[1:])]
    return {"window": _rate(marks, args.warmup, WINDOW_END), "after": _rate(marks, WINDOW_END, 10 ** 9),
            "all": _rate(marks, 0, 10 ** 9), "blocks": blocks, "wall": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--block", type=int, default=20)
    ap.add_argument("--modes", nargs="+", default=["amp", "fp32"], choices=("amp", "fp32"))
    ap.add_argument("--configs", nargs="+", default=["plain", "t4", "cublas", "hooks", "all", "bootstrap", "bootstrap-old"])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="amp", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args)
        return
    import torch

    args.cuda = torch.cuda.is_available()
    print(f"{torch.cuda.get_device_name(0) if args.cuda else 'CPU (a try-out: small model)'}, torch {torch.__version__}; {args.steps} steps after "
          f"{args.warmup}, blocks of {args.block}, {args.rounds} round(s), one process each", flush=True)
    res: dict = {}
    for r in range(args.rounds):
        for mode in args.modes:
            for cfg in args.configs:
                if mode == "fp32" and cfg not in ("plain", "all", "bootstrap"):  # the others change AMP only
                    continue
                x = _one(cfg, mode, args)
                res.setdefault((mode, cfg), []).append(x)
                fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
                print(f"round {r + 1} {mode:4} {cfg:9} window {fmt(x['window'])} after {fmt(x['after'])} "
                      f"all {fmt(x['all'])} steps/s ({x['wall']:.1f} s wall); blocks "
                      + " ".join(f"{b:.0f}" for b in x["blocks"]), flush=True)
    print("\n| mode | config | window (20-200) | after 200 | all | per round (all) |")
    print("|---|---|---:|---:|---:|---|")
    med = lambda xs: None if any(v is None for v in xs) else statistics.median(xs)  # noqa: E731
    for (mode, cfg), xs in res.items():
        cells = [med([x[k] for x in xs]) for k in ("window", "after", "all")]
        print(f"| {mode} | {cfg} | " + " | ".join("-" if c is None else f"{c:.1f}" for c in cells)
              + " | " + ", ".join(f"{x['all']:.1f}" for x in xs) + " |")


if __name__ == "__main__":
    main()
