"""The AMP2xx fixes, run on the CPU with the real frameworks (the `frameworks` extra): the
original fails the way the rule says, the rewritten script runs clean."""

import subprocess
import sys

import pytest

from ampfix.engine.analyze import Settings, fix_text
from ampfix.engine.registry import select_rules

FABRIC_SCRIPT = '''\
import torch
from lightning.fabric import Fabric

fabric = Fabric(accelerator="cpu", devices=1, precision="bf16")
torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = fabric.setup(model, optimizer)
for _ in range(3):
    optimizer.zero_grad()
    loss = model(torch.randn(4, 8)).float().pow(2).mean()
    loss.backward()
    optimizer.step()
print("trained", loss.item())
'''

ACCELERATE_SCRIPT = '''\
import torch
from accelerate import Accelerator

accelerator = Accelerator(cpu=True, mixed_precision="bf16-mixed")
torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
for _ in range(3):
    optimizer.zero_grad()
    loss = model(torch.randn(4, 8)).float().pow(2).mean()
    accelerator.backward(loss)
    optimizer.step()
print("trained", loss.item())
'''


def _run(path):
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300)


def _rewrite(text, codes, unsafe):
    new, fixed, remaining = fix_text(text, "train.py", select_rules(codes, [], preview=True), Settings(unsafe_fixes=unsafe))
    assert fixed and not remaining
    return new


def test_fabric_alias_and_plain_backward_fail_and_the_rewrite_trains(tmp_path):
    pytest.importorskip("lightning")
    original = tmp_path / "fabric_original.py"
    original.write_text(FABRIC_SCRIPT)
    out = _run(original)
    assert "discouraged" in out.stderr  # AMP204: the alias warns
    assert out.returncode != 0 and "fabric.backward(loss)" in out.stderr, out.stderr[-2000:]  # AMP201: Fabric's error
    fixed = tmp_path / "fabric_fixed.py"
    fixed.write_text(_rewrite(FABRIC_SCRIPT, ["AMP201", "AMP204"], False))
    assert 'precision="bf16-mixed"' in fixed.read_text() and "fabric.backward(loss)" in fixed.read_text()
    out = _run(fixed)
    assert out.returncode == 0 and "trained" in out.stdout and "discouraged" not in out.stderr, out.stderr[-2000:]


def test_accelerate_rejected_spelling_raises_and_the_unsafe_rewrite_trains(tmp_path):
    pytest.importorskip("accelerate")
    original = tmp_path / "acc_original.py"
    original.write_text(ACCELERATE_SCRIPT)
    out = _run(original)
    assert out.returncode != 0 and "Unknown mixed_precision mode" in out.stderr  # AMP205
    fixed = tmp_path / "acc_fixed.py"
    fixed.write_text(_rewrite(ACCELERATE_SCRIPT, ["AMP205"], True))
    assert 'mixed_precision="bf16"' in fixed.read_text()
    out = _run(fixed)
    assert out.returncode == 0 and "trained" in out.stdout, out.stderr[-2000:]
