"""Issue 22, `ampfix verify`'s processes: every process a verified script starts ends with its
run (its process group, and daemons that left it), the verifier stopped by Ctrl-C, SIGTERM or
SIGKILL leaves nothing running, its temporary folder goes, and captured output is capped.

The verifier is the real CLI in a subprocess with TMPDIR pointing at the test's own folder;
the scripts are real (they fork, double-fork into daemons with `os.setsid()`, loop forever,
flood their output) and write their pids to files the test waits for."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.conftest import ROOT

pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

TIMEOUT = 180

# writes its pid, starts a child in its group and a daemon out of it, then loops (or not)
SCRIPT = textwrap.dedent("""\
    import os, sys, time

    ready = os.environ["READY_FILE"]
    if os.fork() == 0:  # a helper in the run's process group (a dataloader worker, say)
        open(ready + ".child", "w").write(str(os.getpid()))
        while True:
            time.sleep(0.1)
    if os.fork() == 0:  # a daemon: double fork, new session, out of the group
        os.setsid()
        if os.fork() == 0:
            open(ready + ".daemon.tmp", "w").write(str(os.getpid()))
            os.rename(ready + ".daemon.tmp", ready + ".daemon")
            while True:
                time.sleep(0.1)
        os._exit(0)
    while not os.path.exists(ready + ".daemon"):
        time.sleep(0.05)
    open(ready + ".tmp", "w").write(str(os.getpid()))
    os.rename(ready + ".tmp", ready)
    if os.environ.get("LOOP") == "1":
        while True:
            time.sleep(0.1)
    """)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _wait_for(what, cond, timeout=TIMEOUT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _start(tmp_path, *args, loop=True, extra_env=None):
    (tmp_path / "tmp").mkdir(exist_ok=True)
    script = tmp_path / "train.py"
    if not script.exists():
        script.write_text(SCRIPT)
    env = dict(os.environ, TMPDIR=str(tmp_path / "tmp"), READY_FILE=str(tmp_path / "ready"),
               LOOP="1" if loop else "0", PYTHONPATH=str(ROOT), **(extra_env or {}))
    return subprocess.Popen([sys.executable, "-m", "ampfix", "verify", "--yes", "--reps", "1", "--threads", "1",
                             *args, str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)


def _pids(tmp_path):
    """The script, its helper child and its daemon, once all three are running."""
    names = ["ready", "ready.child", "ready.daemon"]
    _wait_for("the script's processes", lambda: all((tmp_path / n).exists() for n in names))
    return [int((tmp_path / n).read_text()) for n in names]


def _verify_folders(tmp_path):
    return sorted(p.name for p in (tmp_path / "tmp").iterdir() if p.name.startswith("ampfix-verify-"))


def _finish(proc):
    out, err = proc.communicate(timeout=TIMEOUT)
    return proc.returncode, out.decode(), err.decode()


def _assert_gone(pids, timeout=60):
    _wait_for(f"{pids} to end", lambda: not [p for p in pids if _alive(p)], timeout=timeout)


@pytest.mark.parametrize("sig, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stopped_verify_ends_the_run_its_daemon_and_removes_its_folder(tmp_path, sig, status):
    proc = _start(tmp_path)
    pids = _pids(tmp_path)
    assert all(_alive(p) for p in pids)
    (folder,) = _verify_folders(tmp_path)
    assert folder.startswith(f"ampfix-verify-{proc.pid}-")
    os.kill(proc.pid, sig)
    code, out, err = _finish(proc)
    assert code == status, err
    assert "Traceback" not in err
    _assert_gone(pids, timeout=10)  # gone by the time verify has exited (a few ms of reaping aside)
    assert _verify_folders(tmp_path) == []


def test_verify_killed_outright_takes_its_run_along_and_the_next_verify_its_folder(tmp_path):
    proc = _start(tmp_path)
    pids = _pids(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    code, _, _ = _finish(proc)
    assert code == -signal.SIGKILL
    _assert_gone(pids)  # the bootstrap's watchdog saw its verifier go
    (left,) = _verify_folders(tmp_path)
    assert left.startswith(f"ampfix-verify-{proc.pid}-")
    (tmp_path / "raises.py").write_text("raise SystemExit('no training here')\n")
    again = subprocess.run([sys.executable, "-m", "ampfix", "verify", "--yes", "--reps", "1", "raises.py"],
                           cwd=tmp_path, env=dict(os.environ, TMPDIR=str(tmp_path / "tmp"), PYTHONPATH=str(ROOT)),
                           capture_output=True, timeout=TIMEOUT)
    assert again.returncode == 2, again.stderr
    assert _verify_folders(tmp_path) == []


def test_a_run_over_its_time_limit_is_ended_with_its_daemon(tmp_path):
    proc = _start(tmp_path, "--timeout", "60")  # the bootstrap imports torch first: slow on a loaded machine
    pids = _pids(tmp_path)
    code, out, err = _finish(proc)
    assert code == 2 and "killed after" in err and "(time limit --timeout)" in err, err
    _assert_gone(pids, timeout=10)
    assert _verify_folders(tmp_path) == []


def test_a_daemon_left_by_a_script_that_finished_is_ended(tmp_path):
    proc = _start(tmp_path, loop=False)
    pids = _pids(tmp_path)
    code, out, err = _finish(proc)
    assert code == 2, err  # the script trains nothing: it cannot be verified
    _assert_gone(pids, timeout=10)


FLOOD = textwrap.dedent("""\
    import sys
    chunk = "x" * 1023 + "\\n"
    for _ in range(40 * 1024):  # 40 MiB on each stream
        sys.stdout.write(chunk)
        sys.stderr.write(chunk)
    sys.stderr.write("the last line of the error output\\n")
    raise SystemExit("flooded")
    """)


def test_captured_output_is_capped_with_a_note(tmp_path):
    from ampfix.verify.runner import OUTPUT_HEAD, OUTPUT_TAIL

    (tmp_path / "train.py").write_text(FLOOD)
    proc = _start(tmp_path, "--keep")
    code, out, err = _finish(proc)
    assert code == 2, err[-2000:]
    assert "the last line of the error output" in err  # the tail of the output is what is shown
    kept = [line for line in err.splitlines() if line.startswith("ampfix verify: kept ")]
    folder = kept[0].split("kept ", 1)[1]
    logs = [os.path.join(folder, n) for n in os.listdir(folder) if n.endswith((".stdout", ".stderr"))]
    assert len(logs) == 2
    for log in logs:
        size = os.path.getsize(log)
        assert size <= OUTPUT_HEAD + OUTPUT_TAIL + 200, (log, size)
        with open(log, "rb") as fh:
            text = fh.read()
        note = re.search(rb"\n\[ampfix: (\d+) bytes of output not kept here \(the first (\d+) and the last (\d+) "
                         rb"bytes are\)\]\n", text)
        assert note is not None and note.start() == OUTPUT_HEAD, text[OUTPUT_HEAD: OUTPUT_HEAD + 200]
        # all of it is accounted for: kept at the start, dropped, kept at the end
        assert OUTPUT_HEAD + int(note.group(1)) + OUTPUT_TAIL >= 40 * 1024 * 1024
        assert len(text) - note.end() == OUTPUT_TAIL
