"""What `ampfix verify`'s tracer costs a training step: the same step timed with and without the
tracer's hooks (`ampfix/verify/trace.py`: `_Recorder` and `_install`, as `verify` installs them),
in fp32 and in AMP (autocast + an enabled GradScaler), each combination in its own process
(the hooks patch torch for the life of a process), alternated over rounds.

    python bench/tracer_overhead.py [--rounds 3] [--steps 2000] [--device cpu|cuda]
                                    [--threads N] [--width 16] [--batch 8]

The default model is tiny (a 16-wide MLP, batch 8), so that the step is launch-bound and the
tracer's per-step Python cost shows as a share of it; on CUDA, `--width 4096 --depth 4
--batch 1024` is `fixtures/train/mlp.py`'s large model (bench/RESULTS.md, "On CUDA, third
run"). `--threads` sets torch's CPU threads as `verify --threads` does. Prints steps/s per
round, and per mode the best rate and microseconds per step with and without the tracer.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def _step_rate(args: argparse.Namespace, amp: bool, traced: bool) -> float:
    import torch
    import torch.nn.functional as F

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    dev = args.device
    if traced:
        from ampfix.verify import trace

        targs = trace._parse(["--out", "/dev/null", "--steps", str(10 ** 9), "--warmup", "0",
                              "--device", dev, "bench.py"])
        rec = trace._Recorder(torch, targs)
        trace._STATE = rec
        trace._install(torch, rec, targs)
    torch.manual_seed(0)
    layers = [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    for _ in range(args.depth - 2):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(args.width, 4)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler(dev, enabled=amp)
    dtype = torch.float16 if dev == "cuda" else torch.bfloat16
    x = torch.randn(args.batch, args.width, device=dev)
    y = torch.randint(0, 4, (args.batch,), device=dev)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    start = 0.0
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            sync()
            start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev, dtype=dtype, enabled=amp):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    sync()
    return args.steps / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # "amp,traced": one child's run
    args = ap.parse_args()
    if args.one is not None:
        amp, traced = (v == "1" for v in args.one.split(","))
        print(json.dumps(_step_rate(args, amp, traced)))
        return
    passed = [f"--{k}={v}" for k, v in vars(args).items() if k not in ("rounds", "one")]
    rates: dict = {}
    for r in range(args.rounds):
        for amp in (False, True):
            for traced in (False, True):
                out = subprocess.run([sys.executable, __file__, *passed, "--one", f"{int(amp)},{int(traced)}"],
                                     check=True, capture_output=True, text=True).stdout
                rate = json.loads(out.strip().splitlines()[-1])
                rates.setdefault((amp, traced), []).append(rate)
                print(f"round {r + 1} {'amp ' if amp else 'fp32'} {'traced' if traced else 'plain '} "
                      f"{rate:10.1f} steps/s", flush=True)
    print(f"\n{args.device}, width {args.width}, depth {args.depth}, batch {args.batch}, {args.threads} thread(s), "
          f"{args.steps} steps; best of {args.rounds}")
    for amp in (False, True):
        plain, traced = max(rates[(amp, False)]), max(rates[(amp, True)])
        print(f"{'AMP ' if amp else 'fp32'}: plain {plain:.1f} steps/s ({1e6 / plain:.1f} us/step), traced {traced:.1f} "
              f"({1e6 / traced:.1f} us/step): the tracer adds {1e6 / traced - 1e6 / plain:.1f} us/step, "
              f"{plain / traced - 1:.1%} of the step")


if __name__ == "__main__":
    main()
