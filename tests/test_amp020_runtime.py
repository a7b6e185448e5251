"""AMP020 grads-sanitized-before-unscale, on a real GradScaler (CPU): a loop that replaces the
non-finite scaled gradients before the scaler looks never lets it see an overflow, so the scale
is never lowered and the optimizer steps on the replaced values; the loop that unscales first
records the overflow, skips those steps and backs the scale off. The same source is what ampfix
reports (and its correct twin is silent)."""

import inspect
import textwrap

import pytest

from ampfix.engine.analyze import Settings, check_text
from ampfix.engine.registry import find_rule

torch = pytest.importorskip("torch")

HUGE = 1e36  # times the initial scale 2**16, past float32's largest value: every scaled gradient is inf


def zeroing_loop(model, optimizer, batches):
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    for x in batches:
        loss = model(x).sum() * HUGE
        scaler.scale(loss).backward()
        for p in model.parameters():
            p.grad[~torch.isfinite(p.grad)] = 0.0
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    return scaler.get_scale()


def unscaling_loop(model, optimizer, batches):
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    for x in batches:
        loss = model(x).sum() * HUGE
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)  # records the overflow: step() skips this step
        for p in model.parameters():
            p.grad[~torch.isfinite(p.grad)] = 0.0
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    return scaler.get_scale()


def _run(loop):
    """(the scale after 40 steps, how many times the optimizer stepped)"""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-40)
    stepped = []
    step = optimizer.step
    optimizer.step = lambda *a, **k: (stepped.append(1), step(*a, **k))[1]  # GradScaler calls it only when it steps
    batches = [torch.randn(8, 4) for _ in range(40)]
    return loop(model, optimizer, batches), len(stepped)


def _findings(func):
    text = "import torch\nHUGE = 1e36\n\n\n" + textwrap.dedent(inspect.getsource(func))
    diags, _ = check_text(text, "loop.py", [find_rule("AMP020")], Settings(min_torch_version=(2, 4)))
    return [d.code for d in diags]


def test_replacing_the_overflow_before_the_scaler_looks_never_lowers_the_scale():
    scale, stepped = _run(zeroing_loop)
    assert scale == 2.0 ** 16 and stepped == 40  # stuck, and every overflowed step taken on gradients set to 0
    assert _findings(zeroing_loop) == ["AMP020"]


def test_unscaling_first_lets_the_scaler_see_the_overflow():
    scale, stepped = _run(unscaling_loop)
    assert scale < 2.0 ** 16 and stepped < 40  # the overflowed steps skipped, the scale halved at each of them
    assert _findings(unscaling_loop) == []
