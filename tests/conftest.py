import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"


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
