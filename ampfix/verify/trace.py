"""Bootstrap that runs an unmodified training script and observes it.

    python -m ampfix.verify.trace --out RESULT.json --steps N [--warmup K] [--mode asis|fp32]
                            [--threads T] [--seed S] [--seed-offset O] [--device auto|cpu|cuda]
                            [--sys-path-dir DIR] -- SCRIPT [SCRIPT_ARGS...]

The script is executed with ``runpy`` as ``__main__``; nothing in it is edited.  What is
observed, and how:

* step boundaries: a global optimizer step post-hook
  (``torch.optim.optimizer.register_optimizer_step_post_hook``) fires for every optimizer.
  An *iteration* closes at the first optimizer step that follows at least one backward, so
  several optimizers stepping in one iteration count once, and gradient accumulation
  (several backwards, one step) counts once.  A step skipped by ``GradScaler.step`` (inf/NaN
  gradients) never reaches the optimizer, so the wrapped ``GradScaler.step`` closes the
  iteration itself and counts it as skipped.
* losses: ``torch.autograd.backward`` (which ``Tensor.backward`` calls) is wrapped; each
  scalar root is recorded (detached, read only at the end, so no per-step device sync) and
  summed per iteration.  ``GradScaler.scale`` is wrapped so that a scaled loss is mapped back
  to the real one.
* AMP: ``autocast.__enter__`` records each (device, dtype, enabled) it opens; at the first
  backwards the autograd graph is walked and the dtypes of the tensors saved for backward are
  collected (the precision the forward really ran in).  Parameter dtypes come from the
  optimizers' param groups.
* ``--mode fp32`` forces AMP off process-wide: every autocast spelling derives from
  ``torch.amp.autocast_mode.autocast`` and every GradScaler runs
  ``torch.amp.GradScaler.__init__``; both are patched to ``enabled=False``.
* frameworks that own the AMP setup (Lightning Fabric, Hugging Face Accelerate): their
  autocast and GradScaler are torch's, observed and forced like the script's own.  But Fabric's
  mixed-precision plugin also casts the module's floating inputs to bf16/fp16, which with
  autocast forced off meets fp32 weights; so the baseline switches the framework itself to
  fp32 at its public constructor, as a user would: ``Fabric(precision="32-true")``,
  ``Accelerator(mixed_precision="no")`` (and the environment variables their launchers set,
  ``LT_PRECISION`` and ``ACCELERATE_MIXED_PRECISION``).  The constructors are patched when
  their module is first imported (a post-import hook), so a plain torch script pays nothing;
  what each run asked for and what was forced is recorded under ``frameworks``.
* ranks a script launches by re-running itself (Fabric's and Lightning's default launcher
  for several devices: ``subprocess.Popen([sys.executable, SCRIPT, ...])``) are started under
  this bootstrap too, with the same mode and step count, so a forced-fp32 baseline has no
  rank left in AMP; rank 0 (this process) is the one compared.  Ranks started through
  ``multiprocessing`` spawn (``ddp_spawn``, ``mp.spawn``) are not: use ``--nproc-per-node``.
* after ``--steps`` iterations the bootstrap leaves the script (a BaseException raised from
  the step hook, outside any ``except Exception``), writes the JSON result and exits 0.

Exit status: 0 with a result; 3 when the script raised (the result holds the traceback).
"""

from __future__ import annotations

import argparse
import importlib.abc
import json
import math
import os
import random
import sys
import time
import traceback

_STATE = None  # the _Recorder while running


def _jsonable_float(v):
    """JSON has no NaN/inf: keep them as strings."""
    if v is None or math.isfinite(v):
        return v
    if v != v:
        return "nan"
    return "inf" if v > 0 else "-inf"


class _StopTraining(BaseException):
    """Raised from the step hook once enough iterations ran."""


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m ampfix.verify.trace")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--mode", choices=("asis", "fp32"), default="asis")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seed-offset", type=int, default=0)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--sys-path-dir", default=None)
    p.add_argument("script")
    p.add_argument("script_args", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    if args.script_args and args.script_args[0] == "--":
        args.script_args = args.script_args[1:]
    return args


class _Recorder:
    def __init__(self, torch, args):
        self.torch = torch
        self.args = args
        self.rank = int(os.environ.get("RANK", "0"))
        self.steps_wanted = args.steps
        self.warmup = min(args.warmup, max(args.steps - 1, 0))
        self.iter_losses = []  # per closed iteration: detached summed loss tensor or None
        self.iter_skipped = []  # bool per iteration
        self.iter_scale = []  # scale tensor (clone) or float or None per iteration
        self.pending_losses = []  # loss tensors of backwards since the last boundary
        self.pending_nonscalar = 0
        self.n_backward = 0
        self.n_backward_unscaled_with_scaler = 0
        self.n_opt_steps = 0
        self.optimizers = {}  # id -> class name
        self.param_dtypes = {}
        self.param_devices = set()
        self.autocast_entries = {}  # "device/dtype/enabled" -> count
        self.graph_dtypes = {}  # dtype name -> count of saved tensors
        self.graph_walks = 0
        self.graph_opaque_nodes = 0
        self.scaled = {}  # id(scaled tensor) -> (scaled tensor, real loss)
        self.scalers_enabled = set()
        self.scalers_created = 0
        self.in_scaler_step = 0
        self.hook_fired_in_scaler_step = False
        self.t_start = time.perf_counter()
        self.t_warm = None
        self.t_end = None
        self.step_times = []
        self.cuda_sync = False
        self.stopped_by_us = False
        self.frameworks = []  # one entry per Fabric/Accelerator constructed

    # -- timing -------------------------------------------------------------------------
    def _now(self, sync):
        if sync and self.cuda_sync:
            self.torch.cuda.synchronize()
        return time.perf_counter()

    # -- iterations ---------------------------------------------------------------------
    def on_optimizer_step(self, optimizer):
        self.n_opt_steps += 1
        if self.in_scaler_step:
            self.hook_fired_in_scaler_step = True
        key = id(optimizer)
        if key not in self.optimizers:
            self.optimizers[key] = type(optimizer).__name__
            self._collect_params(optimizer)
        if self.pending_losses or self.pending_nonscalar:
            self._close_iteration(skipped=False)
        elif self.n_backward == 0:
            # an optimizer stepping with no backward at all (gradients set by hand)
            self._close_iteration(skipped=False)
        # else: another optimizer stepping in the same iteration

    def on_skipped_scaler_step(self):
        if self.pending_losses or self.pending_nonscalar:
            self._close_iteration(skipped=True)
        elif self.iter_skipped:
            self.iter_skipped[-1] = True

    def _collect_params(self, optimizer):
        for group in optimizer.param_groups:
            for p in group.get("params", []):
                if not hasattr(p, "dtype"):
                    continue
                name = str(p.dtype).replace("torch.", "")
                self.param_dtypes[name] = self.param_dtypes.get(name, 0) + int(p.numel())
                self.param_devices.add(p.device.type)
                if p.device.type == "cuda":
                    self.cuda_sync = True

    def _close_iteration(self, skipped):
        total = None
        for t in self.pending_losses:
            t = t.detach().float()
            total = t if total is None else total + t
        self.iter_losses.append(total)
        self.iter_skipped.append(skipped)
        self.iter_scale.append(self._current_scale())
        self.pending_losses = []
        self.pending_nonscalar = 0
        n = len(self.iter_losses)
        if n == self.warmup:
            self.t_warm = self._now(sync=True)
        if self.cuda_sync:
            self.step_times.append(None)
        else:
            self.step_times.append(time.perf_counter())
        if n >= self.steps_wanted:
            self.t_end = self._now(sync=True)
            self.stopped_by_us = True
            raise _StopTraining()

    def _current_scale(self):
        sc = getattr(self, "last_scaler", None)
        if sc is None:
            return None
        s = getattr(sc, "_scale", None)
        if s is None:
            return None
        return s.detach().clone()

    # -- losses -------------------------------------------------------------------------
    def on_backward(self, tensors):
        torch = self.torch
        if isinstance(tensors, torch.Tensor):
            tensors = (tensors,)
        try:
            tensors = tuple(tensors)
        except TypeError:
            return
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                continue
            self.n_backward += 1
            if self.graph_walks < 2:
                self.graph_walks += 1
                self._walk_graph(t)
            hit = self.scaled.get(id(t))
            if hit is not None and hit[0] is t:
                real = hit[1]
            else:
                real = t
                if self.scalers_enabled:
                    self.n_backward_unscaled_with_scaler += 1
            if real.numel() == 1:
                self.pending_losses.append(real.detach().reshape(()))
            else:
                self.pending_nonscalar += 1
        self.scaled.clear()

    def _walk_graph(self, root):
        fn = getattr(root, "grad_fn", None)
        # id -> the node itself: a graph node's Python object can be a wrapper made on each
        # access (`next_functions`) and freed when dropped (seen with CUDA graphs); keeping it
        # alive keeps its id from being reused by the next wrapper, which a set of bare ids
        # would take for a node already visited, skipping the rest of the graph.
        seen = {}
        stack = [fn] if fn is not None else []
        count = 0
        while stack and count < 20000:
            node = stack.pop()
            if node is None or id(node) in seen:
                continue
            seen[id(node)] = node
            count += 1
            found = False
            for attr in dir(node):
                if not attr.startswith("_saved_"):
                    continue
                try:
                    val = getattr(node, attr)
                except Exception:
                    continue
                vals = val if isinstance(val, (tuple, list)) else (val,)
                for v in vals:
                    if isinstance(v, self.torch.Tensor) and v.is_floating_point():
                        name = str(v.dtype).replace("torch.", "")
                        self.graph_dtypes[name] = self.graph_dtypes.get(name, 0) + 1
                        found = True
            if not found and "Compiled" in type(node).__name__:
                self.graph_opaque_nodes += 1
            for nxt, _ in getattr(node, "next_functions", ()):
                if nxt is not None:
                    stack.append(nxt)

    # -- result -------------------------------------------------------------------------
    def result(self, error=None):
        losses = []
        vals = [t for t in self.iter_losses if t is not None]
        if vals:
            try:
                flat = self.torch.stack([v.reshape(()) for v in vals]).cpu().tolist()
            except Exception:
                flat = [float(v) for v in vals]
            it = iter(flat)
            losses = [next(it) if t is not None else None for t in self.iter_losses]
        losses = [_jsonable_float(v) for v in losses]
        scales = []
        for s in self.iter_scale:
            if s is None:
                scales.append(None)
            else:
                try:
                    scales.append(float(s))
                except Exception:
                    scales.append(None)
        n = len(self.iter_losses)
        t_end = self.t_end if self.t_end is not None else self._now(sync=True)
        steps_per_s = None
        timed_steps = None
        if self.t_warm is not None and n > self.warmup:
            timed_steps = n - self.warmup
            dt = t_end - self.t_warm
            if dt > 0:
                steps_per_s = timed_steps / dt
        elif self.warmup == 0 and n > 0:
            timed_steps = n
            steps_per_s = n / max(t_end - self.t_start, 1e-9)
        step_dts = []
        prev = None
        for t in self.step_times:
            if t is not None and prev is not None:
                step_dts.append(t - prev)
            prev = t
        return {
            "rank": self.rank,
            "mode": self.args.mode,
            "iterations": n,
            "steps_wanted": self.steps_wanted,
            "warmup": self.warmup,
            "stopped_by_ampfix": self.stopped_by_us,
            "losses": losses,
            "skipped": self.iter_skipped,
            "scales": scales,
            "n_backward": self.n_backward,
            "n_backward_unscaled_with_scaler": self.n_backward_unscaled_with_scaler,
            "n_optimizer_steps": self.n_opt_steps,
            "optimizers": sorted(set(self.optimizers.values())),
            "param_dtypes": self.param_dtypes,
            "param_devices": sorted(self.param_devices),
            "autocast_entries": self.autocast_entries,
            "graph_dtypes": self.graph_dtypes,
            "graph_opaque_nodes": self.graph_opaque_nodes,
            "frameworks": self.frameworks,
            "scalers_created": self.scalers_created,
            "scaler_enabled": bool(self.scalers_enabled),
            "steps_per_s": steps_per_s,
            "timed_steps": timed_steps,
            "step_seconds": step_dts[self.warmup:] if len(step_dts) > self.warmup else step_dts,
            "threads": self.torch.get_num_threads(),
            "torch": self.torch.__version__,
            "error": error,
        }


def _install(torch, rec, args):
    import functools
    import inspect

    from torch.amp import autocast_mode
    from torch.amp import grad_scaler

    # optimizer step boundaries ---------------------------------------------------------
    def post_hook(optimizer, _args, _kwargs):
        rec.on_optimizer_step(optimizer)

    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(post_hook)

    # losses ----------------------------------------------------------------------------
    orig_backward = torch.autograd.backward

    @functools.wraps(orig_backward)
    def backward(tensors, *a, **kw):
        try:
            rec.on_backward(tensors)
        except _StopTraining:
            raise
        except Exception:  # never let the observer break the script
            pass
        return orig_backward(tensors, *a, **kw)

    torch.autograd.backward = backward

    # autocast --------------------------------------------------------------------------
    ac = autocast_mode.autocast
    orig_ac_init = ac.__init__
    orig_ac_enter = ac.__enter__
    ac_sig = inspect.signature(orig_ac_init)

    if args.mode == "fp32":

        @functools.wraps(orig_ac_init)
        def ac_init(self, *a, **kw):
            bound = ac_sig.bind(self, *a, **kw)
            bound.arguments["enabled"] = False
            return orig_ac_init(*bound.args, **bound.kwargs)

        ac.__init__ = ac_init

    @functools.wraps(orig_ac_enter)
    def ac_enter(self, *a, **kw):
        try:
            key = "%s/%s/%s" % (
                getattr(self, "device", "?"),
                str(getattr(self, "fast_dtype", "?")).replace("torch.", ""),
                "on" if getattr(self, "_enabled", False) else "off",
            )
            rec.autocast_entries[key] = rec.autocast_entries.get(key, 0) + 1
        except Exception:
            pass
        return orig_ac_enter(self, *a, **kw)

    ac.__enter__ = ac_enter

    # GradScaler ------------------------------------------------------------------------
    gs = grad_scaler.GradScaler
    orig_gs_init = gs.__init__
    gs_sig = inspect.signature(orig_gs_init)

    @functools.wraps(orig_gs_init)
    def gs_init(self, *a, **kw):
        if args.mode == "fp32":
            bound = gs_sig.bind(self, *a, **kw)
            bound.arguments["enabled"] = False
            orig_gs_init(*bound.args, **bound.kwargs)
        else:
            orig_gs_init(self, *a, **kw)
        rec.scalers_created += 1
        if getattr(self, "_enabled", False):
            rec.scalers_enabled.add(id(self))

    gs.__init__ = gs_init

    orig_scale = gs.scale

    @functools.wraps(orig_scale)
    def scale(self, outputs):
        out = orig_scale(self, outputs)
        rec.last_scaler = self
        if isinstance(outputs, torch.Tensor) and isinstance(out, torch.Tensor):
            rec.scaled[id(out)] = (out, outputs)
        return out

    gs.scale = scale

    orig_step = gs.step

    @functools.wraps(orig_step)
    def step(self, optimizer, *a, **kw):
        rec.last_scaler = self
        rec.in_scaler_step += 1
        rec.hook_fired_in_scaler_step = False
        try:
            ret = orig_step(self, optimizer, *a, **kw)
        finally:
            rec.in_scaler_step -= 1
        if not rec.hook_fired_in_scaler_step:
            rec.on_skipped_scaler_step()
        return ret

    gs.step = step

    # a script asking for deterministic algorithms gets cuBLAS's deterministic workspace, which
    # the runner sets for the fp32 runs only (runner.CUBLAS_DETERMINISTIC): torch refuses cuBLAS
    # calls without it.  The variable is read at each call, so setting it here is in time.
    orig_det = torch.use_deterministic_algorithms

    @functools.wraps(orig_det)
    def use_deterministic_algorithms(mode, *a, **kw):
        if mode and "CUBLAS_WORKSPACE_CONFIG" not in os.environ:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        return orig_det(mode, *a, **kw)

    torch.use_deterministic_algorithms = use_deterministic_algorithms

    _install_framework_hooks(rec, args)
    _install_child_launch_hook(args)


def _install_child_launch_hook(args):
    import subprocess

    script = os.path.realpath(args.script)
    python = os.path.realpath(sys.executable)
    orig_init = subprocess.Popen.__init__
    launched = [0]

    def retarget(cmd):
        if not isinstance(cmd, (list, tuple)) or len(cmd) < 2:
            return cmd
        if os.path.realpath(str(cmd[0])) != python or os.path.realpath(str(cmd[1])) != script:
            return cmd
        launched[0] += 1
        child = [
            "--out", "%s.child%d" % (args.out, launched[0]),
            "--steps", str(args.steps), "--warmup", str(args.warmup), "--mode", args.mode,
            "--threads", str(args.threads), "--seed", str(args.seed),
            "--seed-offset", str(args.seed_offset), "--device", args.device,
        ]
        if args.sys_path_dir:
            child += ["--sys-path-dir", args.sys_path_dir]
        return [cmd[0], "-m", "ampfix.verify.trace"] + child + [str(cmd[1])] + [str(c) for c in cmd[2:]]

    def popen_init(self, cmd, *a, **kw):
        try:
            cmd = retarget(cmd)
        except Exception:  # never let the observer break the script
            pass
        return orig_init(self, cmd, *a, **kw)

    subprocess.Popen.__init__ = popen_init


# Frameworks that own the AMP setup ----------------------------------------------------------
# module -> (framework, class, constructor argument, its fp32 value, launcher env variable)
FRAMEWORKS = {
    "lightning.fabric.fabric": ("fabric", "Fabric", "precision", "32-true", "LT_PRECISION"),
    "lightning_fabric.fabric": ("fabric", "Fabric", "precision", "32-true", "LT_PRECISION"),
    "accelerate.accelerator": ("accelerate", "Accelerator", "mixed_precision", "no",
                               "ACCELERATE_MIXED_PRECISION"),
}


def _has_precision_plugin(plugins):
    """Fabric refuses a precision argument next to a Precision plugin instance."""
    if plugins is None:
        return False
    items = plugins if isinstance(plugins, (list, tuple)) else [plugins]
    for p in items:
        if any(c.__name__ == "Precision" for c in type(p).__mro__):
            return True
    return False


def _patch_framework(module, rec, args):
    import functools
    import inspect

    framework, clsname, param, fp32_value, env_var = FRAMEWORKS[module.__name__]
    cls = getattr(module, clsname, None)
    if cls is None or getattr(cls.__init__, "_ampfix_patched", False):
        return
    orig_init = cls.__init__
    try:
        sig = inspect.signature(orig_init)
    except (TypeError, ValueError):
        return
    if param not in sig.parameters:
        return

    @functools.wraps(orig_init)
    def init(self, *a, **kw):
        try:
            bound = sig.bind(self, *a, **kw)
        except TypeError:  # let the framework report the bad call
            return orig_init(self, *a, **kw)
        requested = bound.arguments.get(param)
        entry = {"framework": framework, "class": clsname, "argument": param,
                 "requested": None if requested is None else str(requested),
                 "env": {env_var: os.environ[env_var]} if env_var in os.environ else {},
                 "forced": None}
        if args.mode == "fp32":
            if framework == "fabric" and _has_precision_plugin(bound.arguments.get("plugins")):
                entry["forced"] = None
                entry["not_forced_why"] = "a Precision plugin instance was passed"
            else:
                bound.arguments[param] = fp32_value
                if env_var in os.environ:
                    os.environ[env_var] = fp32_value
                entry["forced"] = fp32_value
        rec.frameworks.append(entry)
        return orig_init(*bound.args, **bound.kwargs)

    init._ampfix_patched = True
    cls.__init__ = init


class _HookedLoader(importlib.abc.Loader):
    """Executes a module with its own loader, then runs a hook on it."""

    def __init__(self, loader, hook):
        self._loader = loader
        self._hook = hook

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        try:
            self._hook(module)
        except Exception:  # never let the observer break the script
            pass

    def __getattr__(self, name):  # get_source, get_resource_reader, ...
        return getattr(self._loader, name)


class _PostImportHooks(importlib.abc.MetaPathFinder):
    """A finder that lets the other finders find a module and wraps its loader."""

    def __init__(self, hooks):
        self.hooks = hooks  # module name -> callable(module)

    def find_spec(self, fullname, path, target=None):
        hook = self.hooks.get(fullname)
        if hook is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _HookedLoader(spec.loader, hook)
                return spec
        return None


def _install_framework_hooks(rec, args):
    def hook(module):
        _patch_framework(module, rec, args)

    for name in FRAMEWORKS:
        if name in sys.modules:  # imported before the bootstrap ran (sitecustomize, ...)
            hook(sys.modules[name])
    sys.meta_path.insert(0, _PostImportHooks({name: hook for name in FRAMEWORKS}))


def _seed_everything(torch, seed, offset):
    random.seed(seed + offset)
    torch.manual_seed(seed + offset)
    try:
        import numpy as np

        np.random.seed(seed + offset)
    except Exception:
        np = None
    if offset:
        # A script seeds itself with fixed seeds; shift every seed it sets by `offset` so a
        # second run really differs (used by `ampfix verify --calibrate`).
        orig_ms = torch.manual_seed
        orig_rs = random.seed

        def manual_seed(s):
            return orig_ms(int(s) + offset)

        def rseed(a=None, *k, **kw):
            if isinstance(a, int):
                a = a + offset
            return orig_rs(a, *k, **kw)

        torch.manual_seed = manual_seed
        torch.random.manual_seed = manual_seed
        random.seed = rseed
        if np is not None:
            orig_np = np.random.seed

            def npseed(s=None):
                return orig_np(None if s is None else int(s) + offset)

            np.random.seed = npseed


def main(argv=None):
    global _STATE
    from ampfix.verify import reaper

    reaper.watch_parent()  # the verifier killed outright (SIGKILL): end this run with it
    args = _parse(sys.argv[1:] if argv is None else argv)
    rank = int(os.environ.get("RANK", "0"))
    out = args.out
    if "{rank}" in out:
        out = out.replace("{rank}", str(rank))
    elif os.environ.get("WORLD_SIZE", "1") != "1":
        out = "%s.rank%d" % (out, rank)

    if args.threads > 0:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            os.environ[var] = str(args.threads)
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""

    import torch

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        err = "--device cuda: CUDA is not available to this torch (%s)" % torch.__version__
        with open(out, "w") as f:
            json.dump({"error": err, "rank": rank}, f)
        print("ampfix: " + err, file=sys.stderr)
        return 3

    rec = _Recorder(torch, args)
    _STATE = rec
    _install(torch, rec, args)
    _seed_everything(torch, args.seed, args.seed_offset)

    script = os.path.abspath(args.script)
    sys.argv = [args.script] + list(args.script_args)
    sys.path.insert(0, args.sys_path_dir or os.path.dirname(script))

    import runpy

    error = None
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except _StopTraining:
        pass
    except SystemExit as e:
        if e.code not in (None, 0):
            error = "the script exited with status %r" % (e.code,)
            code = 3
    except BaseException as exc:  # noqa: BLE001 - report whatever the script raised
        error = _script_traceback(exc, script)
        code = 3
        print(error, file=sys.stderr, end="")
    try:
        res = rec.result(error=error)
    except Exception:
        res = {"error": error or traceback.format_exc(), "rank": rank}
        code = 3
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f)
    os.replace(tmp, out)
    sys.stdout.flush()
    sys.stderr.flush()
    if rec.stopped_by_us:
        # leave without running the script's remaining cleanup (dataloader workers, atexit
        # handlers expecting a finished loop); distributed peers stop at the same step.
        try:
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()
        except Exception:
            pass
        os._exit(0)
    return code


def _script_traceback(exc: BaseException, script: str) -> str:
    """The traceback from the script's first frame on: runpy's and this bootstrap's frames
    are ours, not the user's."""
    tb = exc.__traceback__
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != script:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))


if __name__ == "__main__":
    sys.exit(main())
