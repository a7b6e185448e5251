import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"

# a training loop whose backward pass runs in a helper of another module (indented: the
# project tests write it through `textwrap.dedent`)
HELPER_CALLER = """\
    import torch

    from pkg.helpers import backward_step


    def fit(model, optimizer, loader, epochs):
        scaler = torch.amp.GradScaler("cuda")
        for _ in range(epochs):
            for x, y in loader:
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = torch.nn.functional.mse_loss(model(x), y)
                    backward_step(loss, scaler)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
    """


def model(src: str):
    """The model of one file's source (dedented), with no project: what the model-fact tests
    (`test_model_*.py`) ask their questions of."""
    import textwrap

    import libcst as cst

    from ampfix.model import AmpModel

    return AmpModel(cst.parse_module(textwrap.dedent(src)))


def call_named(m, text: str):
    """The first call of model `m` whose code is `text`."""
    found = [c for c in m.calls if m.code(c) == text]
    assert found, f"no call {text!r} in {[m.code(c) for c in m.calls]}"
    return found[0]


def run_ampfix(*args, cwd=None, input=None, env=None):
    """Run the CLI as a user does: a subprocess of `python -m ampfix`."""
    full_env = dict(os.environ)
    full_env.pop("NO_COLOR", None)
    full_env["NO_COLOR"] = "1"
    if env:
        full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "ampfix", *map(str, args)],
        cwd=cwd,
        input=input,
        capture_output=True,
        env=full_env,
        timeout=300,
    )


@pytest.fixture
def ampfix():
    return run_ampfix
