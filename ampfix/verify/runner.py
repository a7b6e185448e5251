"""Run a training script under the `ampfix.verify.trace` bootstrap in a time-limited subprocess.

Each run is its own process group (``start_new_session=True``); when it runs over its time
limit the whole group (the script and anything it spawned: dataloader workers, torchrun
ranks) is sent SIGTERM, then SIGKILL.  Thread counts are pinned through the environment
(OMP/MKL) and ``torch.set_num_threads`` in the bootstrap; seeds are fixed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import ampfix


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


def child_env(threads: int, device: str, framework: str = "torch") -> Dict[str, str]:
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    env["PYTHONHASHSEED"] = "0"
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
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


def run_one(spec: RunSpec, opts: RunOptions, tmpdir: str) -> RunResult:
    tag = "%s-%d" % (spec.label, spec.rep)
    out_path = os.path.join(tmpdir, tag + ".json")
    err_path = os.path.join(tmpdir, tag + ".stderr")
    log_path = os.path.join(tmpdir, tag + ".stdout")
    cmd = build_command(spec, opts, out_path)
    env = child_env(opts.threads, opts.device, opts.framework)
    t0 = time.monotonic()
    timed_out = False
    with open(err_path, "wb") as ferr, open(log_path, "wb") as fout:
        proc = subprocess.Popen(cmd, stdout=fout, stderr=ferr, stdin=subprocess.DEVNULL,
                                env=env, cwd=opts.workdir or os.getcwd(), start_new_session=True)
        try:
            proc.wait(timeout=opts.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc.pid, proc=proc)
        except BaseException:  # Ctrl-C: take the run down with us
            _kill_group(proc.pid, grace=1.0, proc=proc)
            raise
        else:
            _kill_group(proc.pid, grace=1.0)  # stray children left behind by the script
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


def make_tmpdir() -> str:
    return tempfile.mkdtemp(prefix="ampfix-verify-")
