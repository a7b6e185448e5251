"""AMP019 overflow-skips-update, on a real GradScaler (CPU): a loop that skips `step()` and
`update()` when the scaled gradients' norm is not finite never lowers the scale, so every step
overflows and none trains; the loop that lets the scaler see the overflow backs the scale off
and trains. The same source is what ampfix reports (and its correct twin is silent)."""

import inspect
import textwrap

import pytest

from ampfix.engine.analyze import Settings, check_text
from ampfix.engine.registry import find_rule

torch = pytest.importorskip("torch")

HUGE = 1e36  # times the initial scale 2**16, past float32's largest value: every scaled gradient is inf


def skipping_loop(model, optimizer, batches):
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    steps = 0
    for x in batches:
        loss = model(x).sum() * HUGE
        scaler.scale(loss).backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
        if not torch.isfinite(grad_norm):
            optimizer.zero_grad()
            continue
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        steps += 1
    return scaler.get_scale(), steps


def updating_loop(model, optimizer, batches):
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    steps = 0
    for x in batches:
        loss = model(x).sum() * HUGE
        scaler.scale(loss).backward()
        before = model.weight.detach().clone()
        scaler.step(optimizer)  # skips the optimizer's step itself when the gradients hold inf
        scaler.update()
        optimizer.zero_grad()
        steps += not torch.equal(before, model.weight)
    return scaler.get_scale(), steps


def _run(loop):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-40)
    batches = [torch.randn(8, 4) for _ in range(40)]
    return loop(model, optimizer, batches)


def _findings(func):
    text = "import torch\nHUGE = 1e36\n\n\n" + textwrap.dedent(inspect.getsource(func))
    diags, _ = check_text(text, "loop.py", [find_rule("AMP019")], Settings(min_torch_version=(2, 4)))
    return [d.code for d in diags]


def test_skipping_the_scaler_on_overflow_never_lowers_the_scale():
    scale, steps = _run(skipping_loop)
    assert scale == 2.0 ** 16 and steps == 0  # stuck: every one of the 40 steps overflowed and was skipped
    assert _findings(skipping_loop) == ["AMP019"]


def test_letting_the_scaler_see_the_overflow_backs_it_off():
    scale, steps = _run(updating_loop)
    assert scale < 2.0 ** 16 and steps > 0  # halved until the scaled gradients were finite, then trained
    assert _findings(updating_loop) == []
