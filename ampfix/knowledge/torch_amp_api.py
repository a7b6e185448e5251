"""The deprecated torch.cuda.amp / torch.cpu.amp API and its torch.amp replacement (AMP101).

What the migration needs to know about names and arguments: the deprecated modules and what
each offers in torch.amp (and from which torch version), the new argument list of a call, and
the names bound by imports of a deprecated module together with their uses; and the
device-specific autocast state functions (`torch.get_autocast_gpu_dtype()`) with their
device-generic replacements (`AUTOCAST_STATE`).
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import libcst as cst

from ampfix.fixes.edits import first_arg, keyword_arg, string
from ampfix.migrations.bindings import Binding
from ampfix.model import AmpModel, dotted

DEP_MODULES = {"torch.cuda.amp": "cuda", "torch.cpu.amp": "cpu"}
SUBMODULES = ("autocast_mode", "grad_scaler")
# what torch.amp offers in place of each deprecated module
MIGRATABLE = {"cuda": ("autocast", "GradScaler", "custom_fwd", "custom_bwd"), "cpu": ("autocast", "GradScaler")}
STATE_KIND = "autocast_state"  # the model's Api.kind of the old autocast state functions (`AUTOCAST_STATE`)
# the oldest torch with the replacement (torch.amp.GradScaler: 2.3; device_type= on custom_fwd/bwd: 2.4)
MIN_TORCH = {"autocast": (1, 10), "GradScaler": (2, 3), "custom_fwd": (2, 4), "custom_bwd": (2, 4),
             STATE_KIND: (2, 4)}
AUTOCAST_POSITIONAL = ("enabled", "dtype", "cache_enabled")

#: The device-specific autocast state functions: old name -> (device-generic replacement, how many
#: positional arguments the old one takes). As measured in torch 2.13.0: every call of each warns
#: (each time, not once) with a `DeprecationWarning` (not a FutureWarning, so Python's default filters
#: hide it outside `__main__`; pytest and `-W error::DeprecationWarning` show it), raised in C++
#: (torch/csrc/autograd/init.cpp): "torch.get_autocast_gpu_dtype() is deprecated. Please use
#: torch.get_autocast_dtype('cuda') instead.", "torch.set_autocast_gpu_dtype(dtype) is deprecated.
#: Please use torch.set_autocast_dtype('cuda', dtype) instead.", and so for cpu, ipu and xla
#: (`is_autocast_cpu_enabled()` -> `is_autocast_enabled('cpu')`, `set_autocast_cpu_enabled(enabled)`
#: -> `set_autocast_enabled('cpu', enabled)`, ...). The old ones take no keyword arguments (TypeError).
#: The replacements arrived with the deprecation, in torch 2.4 (pytorch#124359): `get_autocast_dtype
#: (device_type)`, `set_autocast_dtype(device_type, dtype)`, `is_autocast_enabled(device_type)`,
#: `set_autocast_enabled(device_type, enabled)`; the old ones return and set the same state (in
#: `torch.autocast("cpu", dtype=torch.bfloat16)` both getters give torch.bfloat16). Not deprecated
#: (no warning in 2.13): the no-argument `torch.is_autocast_enabled()` and one-argument
#: `torch.set_autocast_enabled(enabled)` (CUDA's flag, which never had a device-specific name),
#: `is_autocast_cache_enabled`, `set_autocast_cache_enabled`, `clear_autocast_cache`.
AUTOCAST_STATE = {
    "get_autocast_gpu_dtype": ("get_autocast_dtype", 0), "set_autocast_gpu_dtype": ("set_autocast_dtype", 1),
    "get_autocast_cpu_dtype": ("get_autocast_dtype", 0), "set_autocast_cpu_dtype": ("set_autocast_dtype", 1),
    "is_autocast_cpu_enabled": ("is_autocast_enabled", 0), "set_autocast_cpu_enabled": ("set_autocast_enabled", 1),
    "get_autocast_ipu_dtype": ("get_autocast_dtype", 0), "set_autocast_ipu_dtype": ("set_autocast_dtype", 1),
    "is_autocast_ipu_enabled": ("is_autocast_enabled", 0), "set_autocast_ipu_enabled": ("set_autocast_enabled", 1),
    "get_autocast_xla_dtype": ("get_autocast_dtype", 0), "set_autocast_xla_dtype": ("set_autocast_dtype", 1),
    "is_autocast_xla_enabled": ("is_autocast_enabled", 0), "set_autocast_xla_enabled": ("set_autocast_enabled", 1),
}
#: the names a feature probe of the replacements asks for (`getattr(torch, "get_autocast_dtype", None)`)
AUTOCAST_STATE_NEW = frozenset(new for new, _ in AUTOCAST_STATE.values())
CLASSES = ("autocast", "GradScaler")
IMPORT_DESCRIPTION = "imports of torch.cuda.amp / torch.cpu.amp -> torch.amp"


def new_spelling(kind: str, device: str, q: str) -> str:
    if kind in ("autocast", "GradScaler"):
        return f"torch.amp.{kind}({q}{device}{q}, ...)"
    return f"torch.amp.{kind}(device_type={q}{device}{q})"


def state_spelling(old: str, device: str, q: str) -> str:
    """`torch.get_autocast_dtype("cuda")` for `get_autocast_gpu_dtype`, `torch.set_autocast_dtype("cuda", ...)`."""
    new, n_args = AUTOCAST_STATE[old]
    return f"torch.{new}({q}{device}{q}{', ...' if n_args else ''})"


def state_args(call: cst.Call, old: str, device: str, q: str) -> Tuple[Optional[List[cst.Arg]], str]:
    """The arguments of the replacement of a call of `old` (the device first), or (None, why not):
    only a call the old function accepts is rewritten (it takes its arguments by position only)."""
    n_args = AUTOCAST_STATE[old][1]
    if any(a.star for a in call.args):
        return None, "it passes `*args`/`**kwargs`, whose count is not known"
    if any(a.keyword is not None for a in call.args) or len(call.args) != n_args:
        return None, f"torch.{old} takes {n_args} positional argument{'s' if n_args != 1 else ''} (this call raises TypeError)"
    return [first_arg(call, string(device, q)), *call.args], ""


def describe(kind: str, device: str) -> str:
    """The summary line of one migrated use (grouped and counted by the CLI)."""
    if kind in AUTOCAST_STATE:
        return f"torch.{kind} -> " + state_spelling(kind, device, '"').replace(", ...", "")
    new = new_spelling(kind, device, '"').replace(", ...", "")
    return f"torch.{device}.amp.{kind} -> {new}"


def literal_str(node: Optional[cst.CSTNode]) -> bool:
    return isinstance(node, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString))


def new_call_args(call: cst.Call, kind: str, device: str, q: str) -> Tuple[Optional[List[cst.Arg]], str]:
    """The migrated argument list of a deprecated call, or (None, why not)."""
    args = list(call.args)
    dev = first_arg(call, string(device, q))
    if kind == "autocast":
        out = [dev]
        pos = 0
        for a in args:
            if a.star == "*":
                return None, "it passes `*args`, whose meaning changes (torch.amp.autocast takes device_type first)"
            if a.keyword is None and not a.star:
                if pos >= len(AUTOCAST_POSITIONAL):
                    return None, "it has more positional arguments than torch.cuda.amp.autocast accepts"
                out.append(keyword_arg(AUTOCAST_POSITIONAL[pos], a.value).with_changes(comma=a.comma))
                pos += 1
            else:
                out.append(a)
        return out, ""
    if kind == "GradScaler":
        return [dev, *args], ""
    # custom_fwd / custom_bwd: device_type is keyword-only; put it after the positional args
    if any(a.keyword is not None and a.keyword.value == "device_type" for a in args):
        return None, "it already passes device_type"
    n_pos = sum(1 for a in args if a.keyword is None and a.star != "**")
    return [*args[:n_pos], keyword_arg("device_type", string(device, q)), *args[n_pos:]], ""


def looks_migrated(call: cst.Call, kind: str) -> bool:
    """A call through a not-yet-rewritten imported name whose arguments were already migrated
    (the first pass rewrites the uses, the next one the import)."""
    if kind in ("autocast", "GradScaler"):
        return bool(call.args) and call.args[0].keyword is None and not call.args[0].star \
            and literal_str(call.args[0].value)
    return any(a.keyword is not None and a.keyword.value == "device_type" for a in call.args)


# ----------------------------------------------------------------------------- bindings


def _module_device(module: str) -> Optional[Tuple[str, bool]]:
    """(device, is_exactly_the_amp_module) for torch.cuda.amp[.submodule]."""
    for mod, dev in DEP_MODULES.items():
        if module == mod:
            return dev, True
        if module.startswith(mod + ".") and module[len(mod) + 1:] in SUBMODULES:
            return dev, False
    return None


def _state_device(old: str) -> str:
    infix = old.split("_")[2]
    return "cuda" if infix == "gpu" else infix


def collect_bindings(model: AmpModel) -> List[Binding]:
    """Names bound by imports of a deprecated module (or of something in it), with their uses."""
    found: List[Binding] = []
    for ib in model.import_bindings:
        stmt = ib.stmt
        if isinstance(stmt, cst.ImportFrom):
            if stmt.relative or stmt.module is None or isinstance(stmt.names, cst.ImportStar):
                continue
            mod = dotted(stmt.module) or ""
            md = _module_device(mod)
            name = dotted(ib.alias.name) or ""
            if mod in ("torch", "torch._C") and name in AUTOCAST_STATE:
                # `from torch import get_autocast_gpu_dtype`: the import and its uses change together
                b = Binding(stmt, ib.alias, ib.name, _state_device(name), name)
            elif md is not None:
                kind = name if name in MIGRATABLE[md[0]] else None
                if kind is None:
                    continue
                b = Binding(stmt, ib.alias, ib.name, md[0], kind)
            elif mod in ("torch.cuda", "torch.cpu") and name == "amp":
                b = Binding(stmt, ib.alias, ib.name, mod.split(".")[1], None)
            else:
                continue
        else:
            name = dotted(ib.alias.name) or ""
            if name not in DEP_MODULES or ib.alias.asname is None:
                continue
            b = Binding(stmt, ib.alias, ib.name, DEP_MODULES[name], None)
        b.refs = ib.refs  # shared by an import written twice (the twins migrate together)
        if model.binding_is_ambiguous(ib):
            b.blocked = f"`{ib.name}` is also bound to something else in the same scope"
        found.append(b)
    return found
