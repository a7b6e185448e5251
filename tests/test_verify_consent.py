"""`ampfix verify` runs the user's script: it says so, and asks first when a person is there."""

import os
import pty
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "fixtures", "train", "mlp.py")


def _run_with_terminal(answer: bytes, *extra):
    master, slave = pty.openpty()
    try:
        p = subprocess.Popen([sys.executable, "-m", "ampfix", "verify", SCRIPT, "--steps", "3", "--warmup", "1",
                              "--reps", "1", *extra], cwd=ROOT, stdin=slave, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": ROOT})
        os.write(master, answer)
        out, err = p.communicate(timeout=300)
        return p.returncode, err.decode()
    finally:
        os.close(master)
        os.close(slave)


def test_a_person_is_asked_and_no_means_nothing_runs():
    code, err = _run_with_terminal(b"n\n")
    assert code == 2
    assert "this runs your code: fixtures/train/mlp.py and its rewritten copy" in err
    assert "Run it? [y/N]" in err and "not run: answer y" in err
    assert "fixed (AMP)" not in err  # no run started


def test_yes_does_not_ask(tmp_path):
    p = subprocess.run([sys.executable, "-m", "ampfix", "verify", "--yes", "--help"], cwd=ROOT,
                       capture_output=True, text=True)
    assert p.returncode == 0 and "--yes" in p.stdout


def test_non_interactive_stdin_says_so_in_one_line_and_runs(tmp_path):
    p = subprocess.run([sys.executable, "-m", "ampfix", "verify", "/nonexistent.py"], cwd=ROOT,
                       capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert p.returncode == 2  # the missing script is a usage error before anything runs
    p = subprocess.run([sys.executable, "-m", "ampfix", "verify", "--json", SCRIPT, "--steps", "3", "--warmup", "1",
                        "--reps", "1", "--threads", "1"], cwd=ROOT, capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=300)
    lines = [ln for ln in p.stderr.splitlines() if "this runs your code" in ln]
    assert len(lines) == 1 and "[y/N]" not in p.stderr
