"""Issue 22, processes and signals: a stopped run (Ctrl-C, SIGTERM, SIGHUP, SIGKILL) leaves no
process and no temporary folder behind, and exits with 128 + the signal's number.

Each test starts the real CLI (`python -m ampfix`) in its own session with TMPDIR pointing at a
folder of the test's own, waits for a readiness marker (a worker that spent CPU time, the analysing
thread, the parsing child) rather than for a fixed time, sends a real signal, and then looks at
/proc and at the temporary folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT
from tests.test_robust_check import TRAINER

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

TIMEOUT = 120  # generous: the machine may be loaded


def _slow_tree(folder, n_files=4, lines=30_000):
    """Files that take seconds each to analyse (one finding plus many short statements)."""
    folder.mkdir(exist_ok=True)
    body = "".join(f"a{i % 10} = {i}\n" for i in range(lines))
    for k in range(n_files):
        (folder / f"train_{k}.py").write_text(TRAINER + body)
    return folder


def _start(tmp_path, command, *args):
    """`ampfix COMMAND --preview ARGS`: the files' finding, AMP007's, is a preview rule."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir(exist_ok=True)
    env = dict(os.environ, TMPDIR=str(tmpdir), PYTHONPATH=str(ROOT))
    env.pop("AMPFIX_WORKERS", None)
    return subprocess.Popen([sys.executable, "-m", "ampfix", command, "--preview", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def _wait_for(what, cond, timeout=TIMEOUT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _children(pid):
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    stat = fh.read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def _alive(pid):
    """Running (a zombie that nobody reaps - PID 1 in a container may not - is dead)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _run_folders(tmp_path):
    return sorted(p.name for p in (tmp_path / "tmp").iterdir() if p.name.startswith("ampfix-run-"))


def _cpu_ticks(pid):
    """The CPU time the process has spent (user and system, in clock ticks; 0 when gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def _worker_busy(tmp_path, pid):
    """A worker of the run's pool has started on a file: the pool's folder is there, and a
    child of the run has spent CPU time (a fork waiting for its first job has spent none)."""
    return bool(_run_folders(tmp_path)) and any(_cpu_ticks(child) >= 5 for child in _children(pid))


def _finish(proc):
    out, err = proc.communicate(timeout=TIMEOUT)
    return proc.returncode, out.decode(), err.decode()


def _assert_all_gone(pids):
    _wait_for(f"processes {pids} to end", lambda: not [p for p in pids if _alive(p)], timeout=60)


@pytest.mark.parametrize("command", ["check", "rewrite"])
def test_ctrl_c_in_a_parallel_run_exits_130_and_leaves_nothing(tmp_path, command):
    src = _slow_tree(tmp_path / "src")
    before = {p.name: p.read_text() for p in src.iterdir()}
    proc = _start(tmp_path, command, "--no-cache", "--unsafe-fixes" if command == "rewrite" else "-q", "-j", "2", "src")
    _wait_for("a busy worker", lambda: _worker_busy(tmp_path, proc.pid))
    workers = _children(proc.pid)
    assert len(workers) == 2
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal does on Ctrl-C: the whole foreground group
    code, out, err = _finish(proc)
    assert code == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    _assert_all_gone(workers)
    assert _run_folders(tmp_path) == []
    assert {p.name: p.read_text() for p in src.iterdir()} == before  # stopped before any write


@pytest.mark.parametrize("sig, status", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_stopped_sequential_run_exits_with_the_signal(tmp_path, sig, status):
    """The analysis runs on a thread of its own (a large stack), possibly inside LibCST's
    native parser when the signal comes: the interpreter's finalization must not abort under
    it (it did: SIGABRT, exit status -6)."""
    _slow_tree(tmp_path / "src", n_files=2)
    proc = _start(tmp_path, "check", "--no-cache", "-j", "1", "src")
    _wait_for("the analysing thread", lambda: len(os.listdir(f"/proc/{proc.pid}/task")) >= 2)
    if sig == "SIGINT":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        os.kill(proc.pid, signal.SIGTERM)
    code, out, err = _finish(proc)
    assert code == status and "Traceback" not in err and "Fatal Python error" not in err, (code, err)


@pytest.mark.parametrize("command, sig, status", [("check", "SIGTERM", 143), ("rewrite", "SIGTERM", 143),
                                                  ("check", "SIGHUP", 129)])
def test_sigterm_to_a_parallel_run_ends_its_workers_and_removes_its_folder(tmp_path, command, sig, status):
    _slow_tree(tmp_path / "src")
    proc = _start(tmp_path, command, "--no-cache", "-j", "2", "src")
    _wait_for("a busy worker", lambda: _worker_busy(tmp_path, proc.pid))
    workers = _children(proc.pid)
    assert len(workers) == 2
    os.kill(proc.pid, getattr(signal, sig))  # the main process only, as `kill PID` or a CI runner does
    code, out, err = _finish(proc)
    assert code == status, err
    assert "Traceback" not in err
    _assert_all_gone(workers)
    assert _run_folders(tmp_path) == []


def test_sigkill_to_a_parallel_run_takes_its_workers_and_the_next_run_its_folder(tmp_path):
    _slow_tree(tmp_path / "src")
    proc = _start(tmp_path, "check", "--no-cache", "-j", "2", "src")
    _wait_for("a busy worker", lambda: _worker_busy(tmp_path, proc.pid))
    workers = _children(proc.pid)
    assert len(workers) == 2
    os.kill(proc.pid, signal.SIGKILL)
    code, _, _ = _finish(proc)
    assert code == -signal.SIGKILL
    _assert_all_gone(workers)  # the kernel told them (parent-death signal)
    (left,) = _run_folders(tmp_path)
    assert left.startswith(f"ampfix-run-{proc.pid}-")
    # the next run that uses a pool removes the folder of the dead run
    small = _slow_tree(tmp_path / "small", n_files=2, lines=4000)
    again = _start(tmp_path, "check", "--no-cache", "-q", "-j", "2", str(small))
    code, out, err = _finish(again)
    assert code == 1, err
    assert _run_folders(tmp_path) == []


def test_sigterm_while_a_risky_file_is_parsed_in_a_child(tmp_path):
    """A file with a very long line is parsed in a child process even in a sequential run:
    SIGTERM to the run ends that child too."""
    src = tmp_path / "src"
    src.mkdir()
    long_line = "x = [" + ", ".join(str(i) for i in range(400)) + "]\n"
    (src / "risky.py").write_text(TRAINER + "".join(f"a{i % 10} = {i}\n" for i in range(60_000)) + long_line)
    proc = _start(tmp_path, "check", "--no-cache", "-j", "1", "src")
    child = _wait_for("the parsing child", lambda: _children(proc.pid))
    os.kill(proc.pid, signal.SIGTERM)
    code, out, err = _finish(proc)
    assert code == 143 and "Traceback" not in err, err
    _assert_all_gone(child)


def test_critical_sections_hold_ctrl_c_and_sigterm_back_until_they_end():
    """What the in-place write relies on, in a process of its own (real signals to itself)."""
    code = (
        "import os, signal\n"
        "from ampfix.engine import signals\n"
        "done = []\n"
        "for sig, exc in ((signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, signals.Terminated)):\n"
        "    try:\n"
        "        with signals.terminable():\n"
        "            with signals.critical():\n"
        "                os.kill(os.getpid(), sig)\n"
        "                for _ in range(1000):\n"
        "                    sum(range(100))  # bytecodes run: the handler would have raised here\n"
        "                done.append(sig)\n"
        "    except exc:\n"
        "        done.append('raised after')\n"
        "assert done == [signal.SIGINT, 'raised after', signal.SIGTERM, 'raised after'], done\n"
        "assert signal.getsignal(signal.SIGINT) is signal.default_int_handler\n"
        "print('ok')\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         timeout=TIMEOUT)
    assert res.returncode == 0 and res.stdout == b"ok\n", res.stderr
