"""AMP011's reach, by running the shapes with real torch on the CPU (float16 autocast and
GradScaler run there): float16 parameters that the optimizer trains (a submodule cast with
`.half()`, parameters cast one by one through `.data`) make the first `scaler.step` raise
"Attempting to unscale FP16 gradients."; a frozen float16 base with trainable float32 adapters
(LoRA's shape) trains. The same source is checked: the first two are reported, the third not."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from ampfix.engine.analyze import Settings, check_text
from ampfix.engine.registry import select_rules

HEADER = """
import torch
import torch.nn as nn

torch.manual_seed(0)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.encoder(x))


class Adapter(nn.Module):
    def __init__(self, base):
        super().__init__()
        self.base = base
        self.a = nn.Parameter(torch.randn(4, 16) * 0.01)
        self.b = nn.Parameter(torch.zeros(4, 4))

    def forward(self, x):
        return self.base(x).float() + (x.float() @ self.a.t()) @ self.b.t()


x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
model = Model()
"""

TRAIN = """
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu")
for step in range(3):
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = nn.functional.cross_entropy(model(x).float(), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
print("trained", loss.item())
"""

CASES = {
    "submodule": ("model.encoder.half()\n", True),
    "parameters": ("for p in model.parameters():\n    p.data = p.data.half()\n", True),
    "frozen_base_adapters": ("model.half()\nfor p in model.parameters():\n    p.requires_grad = False\n"
                             "model = Adapter(model)\n", False),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_runs_as_reported(name, tmp_path):
    pytest.importorskip("torch")
    cast, bad = CASES[name]
    source = textwrap.dedent(HEADER) + cast + TRAIN
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    p = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=240)
    diags, _ = check_text(source, str(path), select_rules(["AMP011"], [], preview=True), Settings())
    if bad:
        assert p.returncode != 0 and "Attempting to unscale FP16 gradients." in p.stderr, p.stdout + p.stderr
        assert [d.code for d in diags] == ["AMP011"]
        assert diags[0].line == source.splitlines().index(cast.splitlines()[-1]) + 1
    else:
        assert p.returncode == 0 and "trained" in p.stdout, p.stderr
        assert diags == []


def test_bfloat16_alone_is_no_float16_trigger():
    # `float16` inside `bfloat16` is no float16 cast to look for: the file is not analysed for
    # AMP011, on its own or through the project; `.half()`, `torch.half`, `float16` are
    from rules.amp011_half_with_autocast import HalfWithAutocast as R

    bf16 = "with torch.autocast('cuda', dtype=torch.bfloat16):\n    y = model(x.to(torch.bfloat16))\n"
    assert not R.triggered_by(bf16, bf16.lower()) and not R.project_candidate(bf16)
    for cast in ("model.half()", "model.to(torch.half)", "model.to(torch.float16)", "dtype='float16'"):
        text = bf16 + cast + "\n"
        assert R.triggered_by(text, text.lower()) and R.project_candidate(text), cast
