"""Find and end every process a verified script started, wherever it went.

A run of the script is its own process group, and the verifier ends the group; but a script
(or a library it uses) can leave the group - a daemon that double-forks and calls
`os.setsid()` - and would outlive the run. So each run carries a token in its environment
(`AMPFIX_VERIFY_RUN`), which every process it starts inherits: after the run, and when the
verifier is stopped, every process of this user carrying the token is killed (Linux: found
in /proc/PID/environ).

And when the verifier itself is killed (SIGKILL: no clean-up of its own), the bootstrap of the
run notices (`watch_parent`, started before the script runs) and ends the run the same way.

Standard library only: the MindSpore bootstrap loads this file by path in an interpreter
without ampfix's dependencies.
"""

import os
import signal
import sys
import threading
import time

TOKEN_VAR = "AMPFIX_VERIFY_RUN"
PARENT_VAR = "AMPFIX_VERIFY_PARENT"


def _environ_has(pid, needle):
    try:
        with open("/proc/%d/environ" % pid, "rb") as fh:
            return needle in fh.read().split(b"\0")
    except OSError:
        return False


def tagged(token, exclude=()):
    """The pids of this user's live processes whose environment carries the token."""
    if not token or not os.path.isdir("/proc"):
        return []
    needle = ("%s=%s" % (TOKEN_VAR, token)).encode()
    uid = os.getuid()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid in exclude or pid == os.getpid():
            continue
        try:
            st = os.stat("/proc/%d" % pid)
            with open("/proc/%d/stat" % pid, "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if st.st_uid != uid or state in (b"Z", b"X"):
            continue
        if _environ_has(pid, needle):
            out.append(pid)
    return out


def kill_tagged(token, exclude=(), rounds=10):
    """Kill every process carrying the token: stop them all first (a process that forks while
    it is killed cannot outrun it), then kill; repeat until a round finds none. Returns the
    pids killed."""
    killed = []
    for _ in range(rounds):
        pids = tagged(token, exclude)
        if not pids:
            break
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        killed.extend(pids)
        time.sleep(0.01)
    return killed


def _parent_gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def _wait_for_exit(pid):
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is not None:
        try:
            fd = pidfd_open(pid)
        except OSError:
            fd = None
        if fd is not None:
            import select

            try:
                while not _parent_gone(pid):
                    select.select([fd], [], [], 5.0)
            finally:
                os.close(fd)
            return
    while not _parent_gone(pid):
        time.sleep(0.5)


def watch_parent():
    """In the bootstrap of a run: when the verifier that started it is gone (killed with
    SIGKILL, so it could not end the run), end the run - every process carrying the run's
    token, this process's group, this process."""
    token = os.environ.get(TOKEN_VAR)
    try:
        parent = int(os.environ.get(PARENT_VAR, ""))
    except ValueError:
        return None
    if not token or not sys.platform.startswith("linux"):
        return None

    def watch():
        _wait_for_exit(parent)
        kill_tagged(token)
        try:
            os.killpg(os.getpgrp(), signal.SIGKILL)
        finally:
            os._exit(137)

    t = threading.Thread(target=watch, name="ampfix-verify-watchdog", daemon=True)
    t.start()
    return t
