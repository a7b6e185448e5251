"""AMP002 autocast-outside-dataparallel."""

from __future__ import annotations

from typing import Iterator, Optional, Tuple

import libcst as cst

from ampfix.model import AmpModel, Region, dotted, get_arg
from ampfix.model.events import DP_FORWARD, THREAD_RUN
from ampfix.rule import UNSAFE, FileContext, Fix, Rule, Violation

# parallel_apply re-enters autocast in its worker threads since torch 1.7 (pytorch#43102),
# but with `enabled` only: the worker regions use the device's default dtype (float16).
DP_PROPAGATES_ENABLED = (1, 7)
# Third-party constructors whose modules certainly don't enable autocast in forward.
KNOWN_LIBRARIES = ("torch.", "torchvision.", "timm.", "transformers.")


class AutocastOutsideDataParallel(Rule):
    code = "AMP002"
    name = "autocast-outside-dataparallel"
    message = ("`nn.DataParallel` runs its replicas in worker threads that do not inherit this autocast "
               "region's dtype: they run float16; enable autocast inside the module's `forward`")
    triggers = ("DataParallel", "parallel_apply", "data_parallel", "Thread")
    requires = (("autocast",),)
    project_requires = (("DataParallel", "parallel_apply", "data_parallel", "Thread"),)
    fixable = "sometimes"
    fix_note = "unsafe (autocast on the module's `forward`)"
    docs = """
autocast state is thread-local. `nn.DataParallel` (any spelling, a subclass of it,
`replicate` + `parallel_apply`, or the functional `data_parallel`) runs each replica's forward
in a worker thread. Since torch 1.7 the workers re-enter autocast, but with `enabled` only: a
region opened with `dtype=torch.bfloat16`, or with a dtype chosen at run time that is not
float16, runs the replicas in float16 (a silent bug). Before torch 1.7 the replicas ran in
float32 altogether; that legacy case is reported only when the configured `min-torch-version`
is older than 1.7. Threads of your own (`threading.Thread`, `ThreadPoolExecutor`) inherit no
autocast state at all: a model run there from inside a region runs in float32.

Apply autocast inside the module instead: decorate `forward` with `@torch.autocast(...)` (or
open the region inside it), or open the region in the thread's function. When the wrapped
module's class is not in the file (`DataParallel(build_model(cfg))`), the finding stands unless
the file shows a module opening its own region. The fix adds the decorator, with the region's
device type and dtype, when the wrapped class is defined in the same file (unsafe: it also
applies to other uses of the class).

Bad:
```python
import torch
import torch.nn as nn

model = nn.DataParallel(Net().cuda())
with torch.autocast("cuda", dtype=torch.bfloat16):
    out = model(x)
```

Good:
```python
import torch
import torch.nn as nn

class Net(nn.Module):
    @torch.autocast("cuda", dtype=torch.bfloat16)
    def forward(self, x):
        return x

model = nn.DataParallel(Net().cuda())
with torch.autocast("cuda", dtype=torch.bfloat16):
    out = model(x)
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        legacy = ctx.min_torch_version < DP_PROPAGATES_ENABLED
        for trace in model.traces():
            for ev in trace.of(DP_FORWARD, THREAD_RUN):
                region = ev.region
                if region is None or region.effective_device not in ("cuda", None):
                    continue
                shown = model.shown_in_region(ev)
                if ev.kind == THREAD_RUN:
                    if self._thread_runs_model(model, ev.node):
                        yield Violation(shown, message=(
                            "this thread runs the model outside the autocast region: threads inherit no autocast "
                            "state, so it runs in float32; open the region inside the thread's function"
                            + model.where(ev, shown)))
                    continue
                report, message = self._dtype_message(region, legacy)
                if not report:
                    continue
                inner = _wrapped(model, ev.node, ev.event.detail)
                classes = model.module_classes(inner) if inner is not None else []
                if classes and all(self._forward_enables(model, c) for c in classes):
                    continue
                if not classes and not model.parallel.library_module(inner, KNOWN_LIBRARIES) and \
                        self._some_forward_enables(model):
                    continue  # an unknown module, and the file shows modules opening their own region
                fix = self._fix(model, classes[0], region) if len(classes) == 1 and shown is ev.node else None
                yield Violation(shown, message=(message or self.message) + model.where(ev, shown), fix=fix)

    @staticmethod
    def _dtype_message(region: Region, legacy: bool) -> Tuple[bool, Optional[str]]:
        """(whether the replicas run in another dtype than the region's, the message)."""
        if region.dtype == "bfloat16":
            return True, None  # the rule's message
        if region.dtype == "dynamic":
            return True, ("`nn.DataParallel` replicas run in worker threads that re-enter autocast with its "
                          "default dtype, float16: wrong unless this region's dtype is float16; enable autocast "
                          "inside the module's `forward`")
        if region.dtype in (None, "float16") and legacy:
            return True, ("`nn.DataParallel` replicas run in worker threads outside this autocast region: before "
                          "torch 1.7 they run in float32; enable autocast inside the module's `forward`")
        return False, None

    def _thread_runs_model(self, model: AmpModel, call: cst.Call) -> bool:
        """The thread's function is a module, or a function/lambda of this file that calls one,
        and does not open an autocast region itself."""
        fn = model.parallel.thread_target(call)
        if fn is None:
            return False
        if model.module_classes(fn) or model.parallel.library_module(fn, KNOWN_LIBRARIES):
            return True
        bodies = [fn] if isinstance(fn, cst.Lambda) else model.functions_named_by(fn)
        for body in bodies:
            if isinstance(body, cst.FunctionDef) and model.parallel.function_enables_autocast(body):
                return False
            for c in model.calls:
                if model.is_ancestor(body, c) and isinstance(c.func, (cst.Name, cst.Attribute)) and \
                        (model.module_classes(c.func) or model.parallel.dataparallel_module(c.func) is not None
                         or model.parallel.library_module(c.func, KNOWN_LIBRARIES)):
                    return True
        return False

    @staticmethod
    def _forward_enables(model: AmpModel, cls: cst.ClassDef) -> bool:
        fwd = model.lookup_method(cls, "forward")
        return fwd is not None and model.parallel.function_enables_autocast(fwd)

    @staticmethod
    def _some_forward_enables(model: AmpModel) -> bool:
        """The file shows a module opening its own region (so an unknown module may, too)."""
        return any(model.parallel.function_enables_autocast(f) for f in model.functions.get("forward", []))

    def _fix(self, model: AmpModel, cls: cst.ClassDef, region: Region) -> Optional[Fix]:
        fwd = model.method(cls, "forward")
        if fwd is None or region.call is None or not model.is_api(region.call, "autocast"):
            return None
        callee = dotted(region.call.func)
        # The decorator may only use names the module level sees: the autocast callee as imported
        # at module level, literal device strings and torch dtypes.
        if callee is None or not model.module_binds(callee.split(".")[0]):
            return None
        parts = []
        if region.api.device is None:
            parts.append(f'"{region.effective_device}"')
        if region.dtype_node is not None:
            droot = dotted(region.dtype_node)
            if droot is None or not model.module_binds(droot.split(".")[0]):
                return None
            parts.append(f"dtype={model.code(region.dtype_node)}")
        decorator = cst.Decorator(cst.parse_expression(f"{callee}({', '.join(parts)})"))
        return Fix({fwd: fwd.with_changes(decorators=[*fwd.decorators, decorator])}, applicability=UNSAFE,
                   description="autocast applied inside the module's forward")

def _wrapped(model: AmpModel, call: cst.Call, how: Optional[str]) -> Optional[cst.CSTNode]:
    """The module the replicas copy: DataParallel's module, data_parallel's first argument,
    the module `replicate(module, ...)` made the replicas passed to parallel_apply from."""
    if how == "DataParallel":
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value == "forward":
            func = func.value
        return model.parallel.dataparallel_module(func)
    arg = get_arg(call, 0, "module" if how == "data_parallel" else "modules")
    if arg is None or how == "data_parallel":
        return arg.value if arg is not None else None
    for v in model.possible_values(arg.value):
        if isinstance(v, cst.Call) and model.qualname(v) in ("torch.nn.parallel.replicate",
                                                              "torch.nn.parallel.replicate.replicate"):
            inner = get_arg(v, 0, "network")
            return inner.value if inner is not None else None
    return None
