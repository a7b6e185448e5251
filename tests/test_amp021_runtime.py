"""AMP021 autocast-never-exited, on a real autocast (CPU, bfloat16): a training loop that enters
its autocast context by hand and never exits it computes every forward after the first with the
weights' casts cached at the first one (autocast clears its cache only when the outermost region
exits), so its outputs do not follow the optimizer's steps; its twin with a `with` block around the
forward and the loss does. The same source is what ampfix reports (and its correct twin is
silent)."""

import inspect
import textwrap

import pytest

from ampfix.engine.analyze import Settings, check_text
from ampfix.engine.registry import find_rule

torch = pytest.importorskip("torch")


def never_exited_loop(model, optimizer, batches):
    amp_context = torch.autocast("cpu", dtype=torch.bfloat16)
    outputs = []
    for x, y in batches:
        amp_context.__enter__()
        out = model(x)
        outputs.append(out.detach().float())
        loss = torch.nn.functional.mse_loss(out.float(), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return outputs


def with_block_loop(model, optimizer, batches):
    amp_context = torch.autocast("cpu", dtype=torch.bfloat16)
    outputs = []
    for x, y in batches:
        with amp_context:
            out = model(x)
            loss = torch.nn.functional.mse_loss(out.float(), y)
        outputs.append(out.detach().float())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return outputs


def _nesting():
    """How deep the autocast regions entered now are (torch has no getter)."""
    depth = torch.autocast_increment_nesting() - 1
    torch.autocast_decrement_nesting()
    return depth


def _run(loop):
    """(the forward's outputs on one batch, fed again at each of 5 steps; the regions the loop left
    open). The autocast state the never-exited loop leaves behind (enabled, nested, its cache) is
    undone afterwards."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    x, y = torch.randn(8, 4), torch.randn(8, 4)
    state = (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"), torch.is_autocast_cache_enabled())
    depth = _nesting()
    try:
        outputs = loop(model, optimizer, [(x, y)] * 5)
        return outputs, _nesting() - depth
    finally:
        while _nesting() > depth:
            torch.autocast_decrement_nesting()
        torch.clear_autocast_cache()
        torch.set_autocast_enabled("cpu", state[0])
        torch.set_autocast_dtype("cpu", state[1])
        torch.set_autocast_cache_enabled(state[2])


def _findings(func):
    text = "import torch\n\n\n" + textwrap.dedent(inspect.getsource(func))
    diags, _ = check_text(text, "loop.py", [find_rule("AMP021")], Settings(min_torch_version=(2, 4)))
    return [d.code for d in diags]


def test_a_region_never_exited_keeps_the_weights_cast_before_the_steps():
    outputs, left_open = _run(never_exited_loop)
    assert left_open == 5
    assert all(torch.equal(outputs[0], o) for o in outputs[1:])  # four steps taken, the same output every time
    assert not torch.is_autocast_enabled("cpu") and _nesting() == 0
    assert _findings(never_exited_loop) == ["AMP021"]


def test_a_with_block_sees_every_step():
    outputs, left_open = _run(with_block_loop)
    assert left_open == 0 and _nesting() == 0
    assert all(not torch.equal(a, b) for a, b in zip(outputs, outputs[1:]))
    assert _findings(with_block_loop) == []
