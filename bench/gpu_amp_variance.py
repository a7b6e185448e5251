"""Where the large MLP's float16 AMP speed varies on CUDA: the fixture's training step
(`fixtures/train/mlp.py` at `--width 4096 --depth 4 --batch 1024 --lr 0.02`) timed in one process
without `ampfix verify`'s tracer, in three modes alternated over repetitions:

  fp32         no autocast, no scaler
  amp          autocast float16 + an enabled GradScaler (what the fixture does on CUDA)
  amp-noscale  autocast float16, the GradScaler disabled (no per-step inf check)

    python bench/gpu_amp_variance.py [--reps 5] [--steps 200] [--warmup 20]

Prints steps/s per repetition and mode, and each mode's spread ((max - min) / median). If the
`amp` rates vary as they did under `verify` (bench/RESULTS.md, "On CUDA, third run") and
`amp-noscale` does not, the scaler's synchronisation is the cause; if neither varies here, the
variation comes from the verifier's processes or its tracer.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--reps", type=int, default=5)
p.add_argument("--steps", type=int, default=200)
p.add_argument("--warmup", type=int, default=20)
p.add_argument("--width", type=int, default=4096)
p.add_argument("--depth", type=int, default=4)
p.add_argument("--batch", type=int, default=1024)
args = p.parse_args()
assert torch.cuda.is_available(), "a CUDA device is needed"
dev = "cuda"


def run(mode: str, seed: int) -> float:
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(256, args.width), torch.nn.ReLU()]  # the fixture's model and optimizer
    for _ in range(args.depth - 2):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(args.width, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda", enabled=(mode == "amp"))
    x = torch.randn(args.batch, 256, device=dev)
    y = torch.randint(0, 10, (args.batch,), device=dev)
    start = None
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            torch.cuda.synchronize()
            start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16, enabled=(mode != "fp32")):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
    torch.cuda.synchronize()
    return args.steps / (time.perf_counter() - start)


modes = ["fp32", "amp", "amp-noscale"]
rates = {m: [] for m in modes}
for r in range(args.reps):
    for m in modes:
        rates[m].append(run(m, r))
    print(f"rep {r + 1}: " + ", ".join(f"{m} {rates[m][-1]:.1f}" for m in modes), flush=True)
print(f"\n{torch.cuda.get_device_name(0)}, torch {torch.__version__}, {args.reps} reps of {args.steps} steps")
print("| mode | steps/s per rep | median | spread | / fp32 (median) |")
print("|---|---|---:|---:|---:|")
base = statistics.median(rates["fp32"])
for m in modes:
    xs = rates[m]
    med = statistics.median(xs)
    print(f"| {m} | {', '.join(f'{x:.1f}' for x in xs)} | {med:.1f} | {(max(xs) - min(xs)) / med:.0%} | {med / base:.2f}x |")
