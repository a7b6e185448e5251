"""Run a training script under the `ampfix.verify.trace` bootstrap in a time-limited subprocess.

Each run is its own session and process group (``start_new_session=True``); when it ends,
runs over its time limit, or the verifier is stopped (Ctrl-C, SIGTERM), the whole group (the
script and anything it spawned: dataloader workers, torchrun ranks) is sent SIGTERM, then
SIGKILL, and so is every process that left the group but carries the run's token (a daemon:
see `ampfix.verify.reaper`, which also ends the run when the verifier is killed outright).
Its output is captured through pipes into capped files (`_Capture`). Thread counts are pinned
through the environment (OMP/MKL) and ``torch.set_num_threads`` in the bootstrap; seeds are
fixed. The temporary folder is ``ampfix-verify-<pid>-*`` (`make_tmpdir`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import ampfix
from ampfix.engine import signals
from ampfix.verify import reaper


@dataclass
class RunSpec:
    label: str  # "fixed-amp", "fp32", "original", "original-fp32", "fp32-seed2"
    script: str  # the path actually executed
    mode: str  # "asis" | "fp32"
    rep: int = 0
    seed_offset: int = 0
    sys_path_dir: Optional[str] = None  # directory for sys.path[0] (the user's script's)


@dataclass
class RunOptions:
    steps: int
    warmup: int
    threads: int
    seed: int = 0
    device: str = "auto"
    timeout: float = 600.0
    nproc_per_node: int = 0
    script_args: Sequence[str] = ()
    python: str = sys.executable
    workdir: Optional[str] = None
    framework: str = "torch"  # "torch" | "mindspore": which bootstrap runs the script


@dataclass
class RunResult:
    spec: RunSpec
    returncode: Optional[int]
    elapsed: float
    timed_out: bool = False
    result: Optional[Dict[str, object]] = None
    stderr: str = ""
    stdout: str = ""
    command: List[str] = field(default_factory=list)

    @property
    def error(self) -> Optional[str]:
        """A one-paragraph reason why this run cannot be used, or None."""
        if self.timed_out:
            return "killed after %.0fs (time limit --timeout)" % self.elapsed
        if self.result is None:
            return "the bootstrap produced no result (exit status %s)" % self.returncode
        if self.result.get("error"):
            return str(self.result["error"]).rstrip()
        if self.returncode not in (0, None):
            return "exit status %s" % self.returncode
        if not self.result.get("iterations"):
            if not self.result.get("n_backward"):
                return ("no optimizer step and no backward observed: the script has no training "
                        "loop ampfix can see (no optimizer.step() / scaler.step())")
            return ("no optimizer step observed (%d backward calls): the script never called "
                    "optimizer.step() or scaler.step()" % self.result.get("n_backward", 0))
        return None


def _package_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(ampfix.__file__)))


def ms_bootstrap_path() -> str:
    """The MindSpore bootstrap, run by path in the user's MindSpore interpreter."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "ms_trace.py")


# cuBLAS's setting for bitwise-reproducible results, given to the fp32 runs only: their losses are
# compared bit for bit (`fp32-equivalence`).  An AMP run's are compared within tolerances, and on
# an H100 this setting cost the large MLP fixture's float16 step a third of its speed (fp32
# nothing), so `verify` understated the AMP speed-up (bench/RESULTS.md, "On CUDA, fourth run").
# A script that calls `torch.use_deterministic_algorithms(True)` gets it in every run
# (`trace._install`), since torch then refuses cuBLAS calls without it.
CUBLAS_DETERMINISTIC = ":4096:8"


def child_env(threads: int, device: str, framework: str = "torch", mode: str = "fp32") -> Dict[str, str]:
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    env["PYTHONHASHSEED"] = "0"
    env["PYTHONUNBUFFERED"] = "1"
    if mode == "fp32":
        env.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_DETERMINISTIC)
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    if framework == "mindspore":
        env.setdefault("GLOG_v", "3")  # MindSpore's own log: errors only, not every warning
        return env  # the bootstrap is run by path and imports nothing from ampfix
    root = _package_root()
    pp = env.get("PYTHONPATH", "")
    if root not in pp.split(os.pathsep):
        env["PYTHONPATH"] = root + (os.pathsep + pp if pp else "")
    return env


def build_command(spec: RunSpec, opts: RunOptions, out_path: str) -> List[str]:
    trace = [
        "--out", out_path,
        "--steps", str(opts.steps),
        "--warmup", str(opts.warmup),
        "--mode", spec.mode,
        "--threads", str(opts.threads),
        "--seed", str(opts.seed),
        "--seed-offset", str(spec.seed_offset),
        "--device", opts.device,
    ]
    if spec.sys_path_dir:
        trace += ["--sys-path-dir", spec.sys_path_dir]
    trace += [spec.script] + list(opts.script_args)
    if opts.framework == "mindspore":
        return [opts.python, ms_bootstrap_path()] + trace
    if opts.nproc_per_node and opts.nproc_per_node > 0:
        return [opts.python, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(opts.nproc_per_node), "-m", "ampfix.verify.trace"] + trace
    return [opts.python, "-m", "ampfix.verify.trace"] + trace


def _kill_group(pgid: int, grace: float = 3.0, proc: Optional[subprocess.Popen] = None) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        if sig == signal.SIGKILL:
            break
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is None:
                time.sleep(0.05)
                continue
            try:
                os.killpg(pgid, 0)  # anyone left in the group?
            except ProcessLookupError:
                return
            time.sleep(0.05)
    if proc is not None:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def _tail(path: str, limit: int = 20000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


OUTPUT_HEAD = 512 * 1024  # bytes of each stream kept from its start ...
OUTPUT_TAIL = 512 * 1024  # ... and from its end; what lies between is dropped, with a note


class _Capture:
    """Drain a run's stdout and stderr pipes into capped log files: the first OUTPUT_HEAD and
    the last OUTPUT_TAIL bytes of each stream are kept, and a note says how much was dropped
    between them (300 MB of output cost 300 MB of temporary files before). Reading goes on
    for as long as the pipes are open, so the script never blocks on a full pipe."""

    def __init__(self, streams: Dict[int, str]):
        self.files = {fd: open(path, "wb") for fd, path in streams.items()}
        self.head_left = {fd: OUTPUT_HEAD for fd in streams}
        self.tail: Dict[int, bytearray] = {fd: bytearray() for fd in streams}
        self.dropped = {fd: 0 for fd in streams}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._pump, name="ampfix-verify-output", daemon=True)
        self._thread.start()

    def _keep(self, fd: int, data: bytes) -> None:
        n = min(len(data), self.head_left[fd])
        if n:
            self.files[fd].write(data[:n])
            self.head_left[fd] -= n
            data = data[n:]
        if data:
            tail = self.tail[fd]
            tail += data
            if len(tail) > OUTPUT_TAIL:
                cut = len(tail) - OUTPUT_TAIL
                self.dropped[fd] += cut
                del tail[:cut]

    def _pump(self) -> None:
        import select

        live = set(self.files)
        deadline = None
        while live:
            try:
                ready, _, _ = select.select(list(live), [], [], 0.2)
            except (OSError, ValueError):
                break
            for fd in ready:
                try:
                    data = os.read(fd, 1 << 16)
                except OSError:
                    data = b""
                if not data:
                    live.discard(fd)
                    continue
                self._keep(fd, data)
            if self._stop.is_set():
                # the run is over: read what is left in the pipes, but not forever (a process
                # that escaped every clean-up may still hold a pipe open)
                deadline = deadline or time.monotonic() + 2.0
                if not ready or time.monotonic() > deadline:
                    break

    def close(self) -> None:
        """Stop reading (the run and everything it started are gone) and complete the files."""
        self._stop.set()
        self._thread.join()  # bounded: it stops reading 2 s after this at the latest
        for fd, fh in self.files.items():
            if self.dropped[fd]:
                fh.write(("\n[ampfix: %d bytes of output not kept here (the first %d and the last %d bytes "
                          "are)]\n" % (self.dropped[fd], OUTPUT_HEAD, OUTPUT_TAIL)).encode())
            fh.write(bytes(self.tail[fd]))
            fh.close()
            try:
                os.close(fd)
            except OSError:
                pass


def _end_run(pgid: int, token: str, grace: float, proc: Optional[subprocess.Popen] = None) -> None:
    """End the run's process group, then any process that left it but carries the run's token
    (a daemon), as one step that a second Ctrl-C or SIGTERM does not cut short."""
    with signals.critical():
        _kill_group(pgid, grace=grace, proc=proc)
        reaper.kill_tagged(token)


def run_one(spec: RunSpec, opts: RunOptions, tmpdir: str) -> RunResult:
    tag = "%s-%d" % (spec.label, spec.rep)
    out_path = os.path.join(tmpdir, tag + ".json")
    err_path = os.path.join(tmpdir, tag + ".stderr")
    log_path = os.path.join(tmpdir, tag + ".stdout")
    cmd = build_command(spec, opts, out_path)
    env = child_env(opts.threads, opts.device, opts.framework, spec.mode)
    token = "%d-%s-%s" % (os.getpid(), tag, uuid.uuid4().hex)
    env[reaper.TOKEN_VAR] = token  # inherited by everything the run starts (see ampfix/verify/reaper.py)
    env[reaper.PARENT_VAR] = str(os.getpid())
    t0 = time.monotonic()
    timed_out = False
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            env=env, cwd=opts.workdir or os.getcwd(), start_new_session=True)
    out_fd, err_fd = os.dup(proc.stdout.fileno()), os.dup(proc.stderr.fileno())
    proc.stdout.close()
    proc.stderr.close()
    capture = _Capture({out_fd: log_path, err_fd: err_path})
    try:
        try:
            proc.wait(timeout=opts.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _end_run(proc.pid, token, grace=3.0, proc=proc)
        except BaseException:  # Ctrl-C, SIGTERM: take the run down with us
            _end_run(proc.pid, token, grace=1.0, proc=proc)
            raise
        else:
            _end_run(proc.pid, token, grace=1.0)  # stray children and daemons left behind by the script
    finally:
        capture.close()
    elapsed = time.monotonic() - t0
    result = None
    if not timed_out:
        path = out_path
        if opts.nproc_per_node and not os.path.exists(path):
            path = out_path + ".rank0"
        try:
            with open(path) as f:
                result = json.load(f)
        except (OSError, ValueError):
            result = None
    return RunResult(spec=spec, returncode=proc.returncode, elapsed=elapsed, timed_out=timed_out,
                     result=result, stderr=_tail(err_path), stdout=_tail(log_path, 4000),
                     command=cmd)


TMP_PREFIX = "ampfix-verify-"  # ampfix-verify-<pid>-XXXXXXXX


def make_tmpdir() -> str:
    """A temporary folder for one verification; those of verifications killed with SIGKILL
    (their process is gone) are removed first."""
    signals.sweep_temp_folders(TMP_PREFIX)
    return signals.make_temp_folder(TMP_PREFIX)
