"""Build (once) the MindSpore virtualenv that the MindSpore verifier tests run scripts in.

MindSpore needs ``numpy<2`` while the project's environment has numpy 2, so it gets its own
virtualenv, cached in an ignored folder of the repository (``.ampfix-envs/``):

    python tests/mindspore_env.py            # build it if missing, print its python
    python tests/mindspore_env.py --rebuild  # throw it away and build it again

``pip install mindspore==2.10.0 "numpy<2"`` downloads an ~800 MB wheel from PyPI.  The folder
is complete only once the marker file ``.ampfix-ready`` is written, so an interrupted build is
redone rather than half-used.  The tests call :func:`ensure` (see tests/test_verify_mindspore.py).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
import venv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MINDSPORE_VERSION = "2.10.0"
ENV_DIR = os.path.join(ROOT, ".ampfix-envs", "mindspore-%s" % MINDSPORE_VERSION)
REQUIREMENTS = ["mindspore==%s" % MINDSPORE_VERSION, "numpy<2"]
MARKER = ".ampfix-ready"


def python_of(env_dir: str = ENV_DIR) -> str:
    return os.path.join(env_dir, "bin", "python")


def is_ready(env_dir: str = ENV_DIR) -> bool:
    return os.path.exists(os.path.join(env_dir, MARKER)) and os.path.exists(python_of(env_dir))


def build(env_dir: str = ENV_DIR, log=sys.stderr) -> float:
    """Create the virtualenv and install MindSpore into it; returns the seconds it took."""
    t0 = time.monotonic()
    if os.path.exists(env_dir):
        shutil.rmtree(env_dir)
    os.makedirs(os.path.dirname(env_dir), exist_ok=True)
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    cmd = [python_of(env_dir), "-m", "pip", "install", "-q", "--disable-pip-version-check"] + REQUIREMENTS
    print("ampfix: building the MindSpore environment: %s" % " ".join(cmd), file=log, flush=True)
    subprocess.run(cmd, check=True)
    check = subprocess.run([python_of(env_dir), "-c", "import mindspore; print(mindspore.__version__)"],
                           capture_output=True, text=True)
    if check.returncode != 0 or check.stdout.strip() != MINDSPORE_VERSION:
        raise RuntimeError("mindspore does not import in %s:\n%s" % (env_dir, check.stderr[-2000:]))
    took = time.monotonic() - t0
    with open(os.path.join(env_dir, MARKER), "w") as f:
        f.write("mindspore %s, built in %.0fs\n" % (MINDSPORE_VERSION, took))
    return took


def ensure(env_dir: str = ENV_DIR) -> str:
    """The environment's python, building the environment first when it is missing."""
    if not is_ready(env_dir):
        build(env_dir)
    return python_of(env_dir)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rebuild", action="store_true", help="build again even if it exists")
    p.add_argument("--dir", default=ENV_DIR, help="where the virtualenv goes (default: %(default)s)")
    args = p.parse_args(argv)
    if args.rebuild or not is_ready(args.dir):
        took = build(args.dir)
        print("ampfix: built %s in %.0fs" % (args.dir, took), file=sys.stderr)
    print(python_of(args.dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
