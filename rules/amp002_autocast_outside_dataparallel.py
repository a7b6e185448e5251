"""AMP002 autocast-outside-dataparallel."""

from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from ampfix.model import AmpModel, Region, dotted
from ampfix.rule import FileContext, Fix, Rule, Violation

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
    triggers = ("DataParallel",)
    requires = (("autocast",),)
    fixable = "sometimes"
    docs = """
autocast state is thread-local. `nn.DataParallel` runs each replica's forward in a worker
thread. Since torch 1.7 the workers re-enter autocast, but with `enabled` only: a region opened
with `dtype=torch.bfloat16` runs the replicas in float16 (a silent bug today). Before torch 1.7
the replicas ran in float32 altogether; that legacy case is reported only when the configured
`min-torch-version` is older than 1.7.

Apply autocast inside the module instead: decorate `forward` with `@torch.autocast(...)` (or
open the region inside it). The fix adds that decorator, with the region's device type and
dtype, when the wrapped class is defined in the same file (unsafe: it also applies to other
uses of the class).

Bad:
```python
model = nn.DataParallel(Net().cuda())
with torch.autocast("cuda", dtype=torch.bfloat16):
    out = model(x)
```

Good:
```python
class Net(nn.Module):
    @torch.autocast("cuda", dtype=torch.bfloat16)
    def forward(self, x):
        ...

model = nn.DataParallel(Net().cuda())
with torch.autocast("cuda", dtype=torch.bfloat16):
    out = model(x)
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        wrapped = self._dataparallel_names(model)
        if not wrapped:
            return
        legacy = ctx.min_torch_version < DP_PROPAGATES_ENABLED
        for call in model.calls:
            key = dotted(call.func)
            if key is None:
                continue
            if key.endswith(".forward"):
                key = key[: -len(".forward")]
            if key not in wrapped:
                continue
            region = model.region_of(call)
            if region is None or region.device not in ("cuda", None):
                continue
            if region.device is None and region.api.device is None:
                continue  # device type unknown: cannot tell
            inner = wrapped[key]
            cls = model.class_of_value(inner) if inner is not None else None
            if cls is not None:
                fwd = model.method(cls, "forward")
                if fwd is not None and model.function_enables_autocast(fwd):
                    continue
            elif not self._known_library_module(model, inner):
                continue  # we cannot see the module's forward: stay silent
            if region.dtype == "bfloat16":
                message = None
            elif region.dtype in (None, "float16") and legacy:
                message = ("`nn.DataParallel` replicas run in worker threads outside this autocast region: before "
                           "torch 1.7 they run in float32; enable autocast inside the module's `forward`")
            else:
                continue
            yield Violation(call, message=message, fix=self._fix(model, cls, region))

    def _dataparallel_names(self, model: AmpModel):
        """dotted name -> the expression wrapped (`self.model = nn.DataParallel(Net())` -> Net())."""
        names = {}
        for key, entries in model.assignments.items():
            for _, value in entries:
                if isinstance(value, cst.Call) and model.is_api(value, "DataParallel"):
                    arg = value.args[0].value if value.args and not value.args[0].star else None
                    if arg is None:
                        kw = [a for a in value.args if a.keyword is not None and a.keyword.value == "module"]
                        arg = kw[0].value if kw else None
                    names[key] = arg
        return names

    def _known_library_module(self, model: AmpModel, inner: Optional[cst.CSTNode], depth: int = 0) -> bool:
        if inner is None or depth > 4:
            return False
        if isinstance(inner, cst.Call):
            if isinstance(inner.func, cst.Attribute) and inner.func.attr.value in ("cuda", "to"):
                return self._known_library_module(model, inner.func.value, depth + 1)
            return any(qn.name.startswith(KNOWN_LIBRARIES) for qn in model.qualified_names(inner.func))
        values = model.values_of(inner)
        return bool(values) and all(self._known_library_module(model, v, depth + 1) for v in values)

    def _fix(self, model: AmpModel, cls: Optional[cst.ClassDef], region: Region) -> Optional[Fix]:
        if cls is None or region.call is None:
            return None
        fwd = model.method(cls, "forward")
        if fwd is None:
            return None
        callee = dotted(region.call.func)
        # The decorator must only use names the module level can see: the autocast callee as
        # imported at module level, literal device strings and torch dtypes.
        root = callee.split(".")[0] if callee else None
        if root is None or not _module_binds(model, root):
            return None
        device = region.device or region.api.device
        parts = []
        if region.api.device is None:
            parts.append(f'"{device}"')
        if region.dtype_node is not None:
            dtype_src = model.module.code_for_node(region.dtype_node)
            droot = dotted(region.dtype_node)
            if droot is None or not _module_binds(model, droot.split(".")[0]):
                return None
            parts.append(f"dtype={dtype_src}")
        decorator = cst.Decorator(cst.parse_expression(f"{callee}({', '.join(parts)})"))
        new_fwd = fwd.with_changes(decorators=[*fwd.decorators, decorator])
        return Fix({fwd: new_fwd}, safe=False, description="autocast applied inside the module's forward")


def _module_binds(model: AmpModel, name: str) -> bool:
    """True when `name` is bound by a module-level import."""
    for stmt in model.module.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(small.names, cst.ImportStar):
                    for alias in small.names:
                        if alias.asname is not None:
                            bound = dotted(alias.asname.name)
                        else:
                            bound = (dotted(alias.name) or "").split(".")[0]
                        if bound == name:
                            return True
    return False
