"""The objects of a training step: GradScalers, optimizers, backward calls, and the calls that
initialise CUDA."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Set

import libcst as cst
from libcst.metadata import QualifiedNameSource

from ampfix.model.conditions import NeverTrue
from ampfix.model.foreign import ForeignClass
from ampfix.model.syntax import call_name, get_arg, literal_bool, literal_string
from ampfix.model.tree import dotted

# torch.cuda functions that initialise CUDA (cuInit) when called, in current torch.
# Not here on purpose: device_count (NVML), manual_seed/manual_seed_all/set_rng_state (deferred),
# memory_allocated/memory_reserved/max_memory_allocated/empty_cache (no-ops before init),
# get_arch_list (compile-time flags), is_initialized.
CUDA_INIT_FUNCS = {
    "is_available", "set_device", "current_device", "get_device_name", "get_device_properties",
    "get_device_capability", "synchronize", "init", "mem_get_info", "current_stream", "default_stream",
    "Stream", "Event", "is_bf16_supported", "ipc_collect", "get_rng_state", "get_rng_state_all",
}
# torch callables that take device="cuda" without touching the GPU.
NON_INIT_DEVICE_CALLEES = ("torch.device", "torch.autocast", "torch.amp.", "torch.cuda.amp.", "torch.GradScaler",
                           "torch.set_default_device", "torch.get_default_device")
TENSOR_NEW_METHODS = {"new_zeros", "new_ones", "new_empty", "new_full", "new_tensor"}
# names people give optimizers (`optimizer`, `opt_g`, `self.optim`, `d_optimizer`)
OPTIMIZER_NAME = re.compile(r"^(?:\w+_)?(?:opt|optim|optimizer|optimiser)(?:_\w+|\d+)?$", re.IGNORECASE)
OPTIMIZER_FACTORY = re.compile(r"optim", re.IGNORECASE)
MAX_SCALE_DEPTH = 6
SCALER_NAME = re.compile(r"^(?:\w+_)?(?:grad_?)?scaler(?:_\w+|\d+)?$", re.IGNORECASE)
# a GradScaler's interface: a class of the file with these methods stands in for one
SCALER_METHODS = ("scale", "step", "update", "unscale_")
SCALER_EXTRAS = ("get_scale", "is_enabled", "state_dict", "load_state_dict")


@dataclass
class BackwardCall:
    call: cst.Call
    kind: str  # "tensor" (x.backward()), "scaled" (scaler.scale(x).backward()), "autograd"
    scaler: Optional[str] = None  # scaler key for "scaled"


def _leaves(value: cst.CSTNode) -> List[cst.CSTNode]:
    """The alternatives of a conditional expression (not following names)."""
    if isinstance(value, cst.IfExp):
        return _leaves(value.body) + _leaves(value.orelse)
    if isinstance(value, cst.BooleanOperation):
        return _leaves(value.left) + _leaves(value.right)
    return [value]


class Objects:
    """Scalers, optimizers, backward calls, CUDA initialisation (a part of `AmpModel`)."""

    def _init_objects(self) -> None:
        self._scalers: Optional[Set[str]] = None
        self._stepped: Optional[Set[str]] = None
        self._scaler_classes_memo: Optional[List[cst.ClassDef]] = None

    # ---------------------------------------------------------------- the project's own scaler classes
    @property
    def _scaler_classes(self) -> List[cst.ClassDef]:
        """Classes of this file that stand in for a GradScaler: a subclass of GradScaler (through
        this file), or a class with `scale` and `step` methods and another of a GradScaler's
        (`update`, `unscale_`, `get_scale`, `is_enabled`, `state_dict`, `load_state_dict`: a
        project's no-op scaler used when AMP is off, a wrapper around a GradScaler). A call of
        one of their scaler methods is a scaler call, whatever the method's body does."""
        if self._scaler_classes_memo is None:
            out: List[cst.ClassDef] = []
            for cls in self.nodes_of(cst.ClassDef):
                if self._subclasses_grad_scaler(cls):  # type: ignore[arg-type]
                    out.append(cls)  # type: ignore[arg-type]
                    continue
                has = {m for m in SCALER_METHODS if self.lookup_method(cls, m) is not None}  # type: ignore[arg-type]
                if {"scale", "step"} <= has and (has & {"update", "unscale_"} or any(
                        self.lookup_method(cls, m) is not None for m in SCALER_EXTRAS)):  # type: ignore[arg-type]
                    out.append(cls)  # type: ignore[arg-type]
            self._scaler_classes_memo = out
        return self._scaler_classes_memo

    def _subclasses_grad_scaler(self, cls: cst.ClassDef, depth: int = 0) -> bool:
        if depth > 6:
            return False
        for b in cls.bases:
            if self.is_api(b.value, "GradScaler"):
                return True
            base = self._class_named(b.value)
            if base is not None and base is not cls and self._subclasses_grad_scaler(base, depth + 1):
                return True
        return False

    def _scaler_class_of(self, value: cst.CSTNode) -> Optional[cst.ClassDef]:
        """The scaler class of this file (`scaler_classes`) that `value` constructs, if any."""
        if not self._scaler_classes or not isinstance(value, cst.Call):
            return None
        cls = self._class_of_value(value)
        return cls if cls is not None and cls in self._scaler_classes else None

    def _scaler_method_call(self, call: cst.Call) -> bool:
        """`call` runs a scaler method (`scale`/`step`/`update`/`unscale_`) of a scaler class of
        this file: it is the scaler's call (a no-op scaler's `step()` calls `optimizer.step()`,
        which is no bypass of the scaler), not a helper to follow."""
        if not (isinstance(call.func, cst.Attribute) and call.func.attr.value in SCALER_METHODS):
            return False
        callees = self.callees(call)
        classes = self._scaler_classes
        return bool(callees) and all(self.class_of(f) in classes for f in callees)

    def _passes_loss_through(self, cls: cst.ClassDef) -> bool:
        """The scaler class's `scale(x)` returns `x` unchanged (a no-op scaler)."""
        method = self.lookup_method(cls, "scale")
        if method is None:
            return False
        params = [*method.params.posonly_params, *method.params.params]
        if self._is_method(method):
            params = params[1:]
        if not params:
            return False
        returns = self._nodes_in_scope(method, cst.Return)
        return bool(returns) and all(isinstance(r.value, cst.Name) and r.value.value == params[0].name.value
                                     for r in returns)  # type: ignore[attr-defined]

    # ---------------------------------------------------------------- scalers
    def constructs_scaler(self, value: cst.CSTNode) -> bool:
        """`value` (or one branch of it) constructs a GradScaler, any spelling."""
        return any(isinstance(v, cst.Call) and self.is_api(v, "GradScaler") for v in _leaves(value))

    @property
    def scalers(self) -> Set[str]:
        """Dotted keys ("scaler", "self.scaler", parameter names) that hold a GradScaler."""
        if self._scalers is None:
            keys: Set[str] = {key for key, entries in self._by_key.items()
                              if any(self.constructs_scaler(v) or any(self._scaler_class_of(leaf) is not None
                                                                      for leaf in _leaves(v)) for _, v, _ in entries)}
            for funcs in self.functions.values():  # parameters annotated as GradScaler
                for f in funcs:
                    for p in [*f.params.params, *f.params.kwonly_params, *f.params.posonly_params]:
                        if p.annotation is not None and self.is_api(p.annotation.annotation, "GradScaler"):
                            keys.add(p.name.value)
            changed = bool(keys)  # parameters that receive a known scaler at a call site in this file
            while changed:
                changed = False
                for call in self.calls:
                    for f in self.callees(call):
                        for pname, arg in self.bind_arguments(call, f).items():
                            if dotted(arg) in keys and pname not in keys:
                                keys.add(pname)
                                changed = True
            if self.foreign is not None:  # type: ignore[attr-defined]
                keys |= self._foreign_scalers()
            # duck typing: x.scale(loss).backward() together with x.step and x.update/x.unscale_
            used: Dict[str, Set[str]] = {}
            for call in self.calls:
                if isinstance(call.func, cst.Attribute):
                    base = dotted(call.func.value)
                    if base is not None:
                        used.setdefault(base, set()).add(call.func.attr.value)
            for base, methods in used.items() if not self.other_frameworks() else ():
                if "scale" in methods and methods & {"update", "unscale_"} and "step" in methods:
                    if any(self._scaled_backward_base(c) == base for c in self.calls):
                        keys.add(base)
            self._scalers = keys
        return self._scalers

    def _foreign_scalers(self) -> Set[str]:
        """Keys that hold a GradScaler built in another module: `self.<attr>` of a class whose
        base (of another module) builds one, a name imported from a module that builds one."""
        out: Set[str] = set()
        used = {dotted(c.func.value) for c in self.calls if isinstance(c.func, cst.Attribute)}
        for key in used:
            if key is None:
                continue
            root, _, rest = key.partition(".")
            if root == "self" and rest and "." not in rest:
                for cls in self.nodes_of(cst.ClassDef):
                    if any(self.constructs_scaler(v) for v in self.inherited_attribute(cls, rest)):  # type: ignore[attr-defined]
                        out.add(key)
                        break
            elif not rest and self.binding_scope(root, self.module) is self.module \
                    and self._index.imports.get(self.module, {}).get(root):
                if any(self.constructs_scaler(v) for v in self._imported_values(cst.Name(root))):  # type: ignore[attr-defined]
                    out.add(key)
        for call in self.calls:  # a parameter other modules pass a GradScaler to
            func = call.func
            if not (isinstance(func, cst.Attribute) and func.attr.value in ("scale", "step", "update", "unscale_")
                    and isinstance(func.value, cst.Name)) or func.value.value in out:
                continue
            name = func.value.value
            scope = self.function_of(call)
            if scope is not None and self._is_param(scope, name) and \
                    self.binding_scope(name, self.scope_of(call)) is scope and \
                    any(self.constructs_scaler(v) for v in self.foreign_argument_values(scope, name)):  # type: ignore[attr-defined]
                out.add(name)
        return out

    @staticmethod
    def _scaled_backward_base(call: cst.Call) -> Optional[str]:
        """For `X.scale(loss).backward()` the dotted X, else None."""
        if (isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward"
                and isinstance(call.func.value, cst.Call) and isinstance(call.func.value.func, cst.Attribute)
                and call.func.value.func.attr.value == "scale"):
            return dotted(call.func.value.func.value)
        return None

    def scaler_key(self, expr: cst.CSTNode) -> Optional[str]:
        key = dotted(expr)
        return key if key is not None and key in self.scalers else None

    def is_scaler(self, expr: Optional[cst.CSTNode]) -> bool:
        """`expr` holds a GradScaler: a scaler key, or a value (through properties, aliases)
        that constructs one."""
        if expr is None:
            return False
        return self.scaler_key(expr) is not None or any(
            isinstance(v, cst.Call) and self.is_api(v, "GradScaler") for v in self.possible_values(expr))

    def _scaler_method(self, call: cst.Call, method: str) -> Optional[str]:
        """For `scaler.<method>(...)` on a known scaler, the scaler key."""
        if isinstance(call.func, cst.Attribute) and call.func.attr.value == method:
            return self.scaler_key(call.func.value)
        return None

    def scale_call_scaler(self, call: cst.CSTNode) -> Optional[str]:
        """For `X.scale(...)` on a known scaler, or on a receiver named like one (`grad_scaler`,
        `self.amp_scaler`: a parameter defaulting to None, set by another file), the key of X."""
        if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "scale"):
            return None
        key = self.scaler_key(call.func.value)
        if key is None and SCALER_NAME.search((dotted(call.func.value) or "").rpartition(".")[2]) \
                and not any(self._builds_other_class(v) for v in self.possible_values(call.func.value)):
            key = dotted(call.func.value)
        return key

    def _builds_other_class(self, value: cst.CSTNode) -> bool:
        """`value` builds an object known not to be a GradScaler, so a receiver named like one
        that holds it is not guessed to be one (unimol-tools' `DynamicLossScaler`, fairseq's
        and apex's loss scalers: their `unscale_` and overflow checks are their own): an
        instance of a class of this file that is not one of its scaler classes and whose bases
        are all of this file, of a class of another module of the project whose bases are all of
        the project and that has no `step` method (a wrapper that steps for a GradScaler stands
        in for one), or of a class imported from a library other than torch."""
        if not isinstance(value, cst.Call):
            return False
        local = self._class_of_value(value)
        if local is not None:
            return local not in self._scaler_classes and self._bases_all_local(local)
        foreign = self._foreign_class_of(value)  # type: ignore[attr-defined]
        if foreign is not None:
            return self.foreign is not None and self._plain_project_class(foreign)  # type: ignore[attr-defined]
        func = value.func
        names = [q for q in self.qualified_names(func) if q.source == QualifiedNameSource.IMPORT]
        last = (dotted(func) or "").rpartition(".")[2]
        return bool(names) and last[:1].isupper() and not any(q.name == "torch" or q.name.startswith("torch.")
                                                               for q in names)

    def _bases_all_local(self, cls: cst.ClassDef, depth: int = 0) -> bool:
        if depth > MAX_SCALE_DEPTH:
            return False
        for b in cls.bases:
            if isinstance(b.value, cst.Name) and b.value.value == "object":
                continue
            base = self._class_named(b.value)
            if base is None or base is cls or not self._bases_all_local(base, depth + 1):
                return False
        return True

    def _plain_project_class(self, cls) -> bool:
        """Every class of `cls`'s MRO is of the project, and none has a `step` method."""
        for c in self.foreign_mro(cls):  # type: ignore[attr-defined]
            if "step" in c.summary.methods:
                return False
            if not all(isinstance(b, ForeignClass) for b in self.foreign.bases(c)):  # type: ignore[attr-defined]
                return False  # a base of a library, or not resolved: it may be a GradScaler
        return True

    def scaler_disabled(self, expr: cst.CSTNode) -> bool:
        """Every value the scaler expression `expr` may hold is a GradScaler built with a literal
        `enabled=False`, or a scaler class of this file whose `scale(x)` returns `x`: its `scale()`
        returns the loss unchanged and its `step()` is a plain `optimizer.step()`.
        (`enabled=use_amp` is not known to be off.)"""
        values = [v for v in self.possible_values(expr) if v is not expr]
        if not values:
            return False

        def off(v: cst.CSTNode) -> bool:
            if isinstance(v, cst.Call) and self.is_api(v, "GradScaler"):
                return self.built_disabled(v)
            cls = self._scaler_class_of(v)  # the project's no-op scaler: `scale(loss)` returns the loss
            return cls is not None and self._passes_loss_through(cls)

        return all(off(v) for v in values)

    def scaler_enabled(self, call: cst.Call) -> Optional[cst.BaseExpression]:
        """The `enabled` argument of a GradScaler construction, by keyword or by position
        (`torch.amp.GradScaler(device, init_scale, growth_factor, backoff_factor,
        growth_interval, enabled)`; the deprecated `torch.cuda.amp.GradScaler` has no device);
        None when it is not given (so True)."""
        api = self.api_of(call)
        arg = get_arg(call, 4 if api is not None and api.device is not None else 5, "enabled")
        return arg.value if arg is not None else None

    def built_disabled(self, call: cst.Call) -> bool:
        """The GradScaler construction `call` passes a literal False for `enabled`, or a test
        that can never be true (`enabled=(args.dtype == "float16")` where every value the option
        may hold is known and none is "float16": `test_value`) (the one test of "this scaler is
        built disabled": every rule and fact asks it here)."""
        enabled = self.scaler_enabled(call)
        return literal_bool(enabled) is False or self.test_value(enabled) is False  # type: ignore[attr-defined]

    def never_true_float16_gate(self, scale: cst.Call) -> Optional[NeverTrue]:
        """For `scaler.scale(x)`: the `enabled=` test of a GradScaler the scaler may be that names
        float16 (`precision.float16_gated`) and can never be true (`never_true_reason`:
        `enabled=(self.configs.dtype == "float16")` where the dtype is one of fp32/bf16/fp16),
        with what it compares and its values; None for a literal `enabled=False`, a test that may
        be true or that names no float16."""
        if not isinstance(scale.func, cst.Attribute):
            return None
        for built in self.possible_values(scale.func.value):  # type: ignore[attr-defined]
            enabled = self.scaler_enabled(built) if isinstance(built, cst.Call) else None
            reason = self.never_true_reason(enabled)  # type: ignore[attr-defined]
            if enabled is not None and reason is not None and self.precision.float16_gated(enabled):  # type: ignore[attr-defined]
                return NeverTrue(enabled, reason[0], tuple(reason[1]))
        return None

    def scale_sources(self, expr: Optional[cst.CSTNode], depth: int = 0) -> List[cst.Call]:
        """The calls that may have scaled the value of `expr` for a GradScaler: `scaler.scale(x)`
        on a known scaler, written there or reached through names, parameters (the arguments
        at call sites), arithmetic (`scaler.scale(loss) / accum`) and the `return`s of this
        file's functions; also calls that may scale it unseen (`.scale(...)` on an unknown
        object, a function named like `scale_loss`, a product with `get_scale()`, a call of
        unknown effect on a scaled value: `cast(Tensor, scaler.scale(loss))`). Empty: the
        value is not scaled; `scale_call_scaler(c)` tells the calls of (what look like) GradScalers."""
        if expr is None or depth > MAX_SCALE_DEPTH:
            return []
        if isinstance(expr, (cst.BinaryOperation, cst.BooleanOperation)):
            return self.scale_sources(expr.left, depth + 1) + self.scale_sources(expr.right, depth + 1)
        if isinstance(expr, cst.UnaryOperation):
            return self.scale_sources(expr.expression, depth + 1)
        if isinstance(expr, cst.IfExp):
            return self.scale_sources(expr.body, depth + 1) + self.scale_sources(expr.orelse, depth + 1)
        if isinstance(expr, (cst.Name, cst.Attribute)) and dotted(expr) is not None:
            out: List[cst.Call] = []
            for v in self.possible_values(expr):
                if v is not expr:
                    out.extend(self.scale_sources(v, depth + 1))
            return out
        if not isinstance(expr, cst.Call):
            return []
        name = call_name(expr) or ""
        if name == "scale" and isinstance(expr.func, cst.Attribute):
            return [expr]  # a known scaler's, or an unknown object's `.scale(x)`: either may scale
        if "scale" in name.lower() and not name.startswith("unscale"):
            return [expr]  # scale_loss(loss), `loss * scaler.get_scale()`: not followed, may scale
        out = []
        callees = self.callees(expr)
        for f in callees:
            for ret in self._nodes_in_scope(f, cst.Return):  # type: ignore[attr-defined]
                if ret.value is not None:
                    out.extend(self.scale_sources(ret.value, depth + 1))  # type: ignore[attr-defined]
        if not callees:  # `cast(Tensor, scaler.scale(loss))`, `scaler.scale(loss).float()`: may pass it through
            if isinstance(expr.func, cst.Attribute):
                out.extend(self.scale_sources(expr.func.value, depth + 1))
            for a in expr.args:
                out.extend(self.scale_sources(a.value, depth + 1))
        return out

    # ---------------------------------------------------------------- optimizers
    def _stepped_optimizers(self) -> Set[str]:
        """Keys passed to a scaler's step/unscale_ anywhere in the file: the code says they
        are optimizers."""
        if self._stepped is None:
            out: Set[str] = set()
            for call in self.calls:
                if (self._scaler_method(call, "step") or self._scaler_method(call, "unscale_")) and call.args:
                    key = dotted(call.args[0].value)
                    if key is not None:
                        out.add(key)
            self._stepped = out
        return self._stepped

    def is_optimizer(self, expr: cst.CSTNode) -> bool:
        """`expr` holds a torch optimizer: built by torch.optim or an optimizer factory, passed
        to a scaler's step/unscale_, or named like one; never a learning-rate scheduler."""
        key = dotted(expr)
        if key is None:
            return False
        values = [v for v in self.possible_values(expr) if v is not expr]
        for v in values:
            if isinstance(v, cst.Call):
                names = self.qualnames(v)
                if any("lr_scheduler" in n or "scheduler" in n.lower() for n in names):
                    return False
                name = call_name(v) or ""
                if "sched" in name.lower():
                    return False
        if any(isinstance(v, cst.Call) and (self.is_api(v, "optimizer") or OPTIMIZER_FACTORY.search(call_name(v) or ""))
               for v in values):
            return True
        return key in self._stepped_optimizers() or bool(OPTIMIZER_NAME.match(key.rpartition(".")[2]))

    # ---------------------------------------------------------------- modules
    def _is_module_class(self, cls: cst.ClassDef) -> bool:
        """A class of this file that subclasses `nn.Module` (directly or through this file)."""
        for b in cls.bases:
            name = dotted(b.value) or ""
            if name.rpartition(".")[2] == "Module" or any(q.startswith("torch.nn") for q in self.qualnames(b.value)):
                return True
            base = self._class_named(b.value)
            if base is not None and base is not cls and self._is_module_class(base):
                return True
        return False

    def module_classes(self, expr: cst.CSTNode) -> List[cst.ClassDef]:
        """The nn.Module classes of this file that `expr` may hold."""
        return [c for c in self._classes_of(expr) if self._is_module_class(c)]

    def optimizer_over(self, clip: cst.CSTNode) -> Optional[str]:
        """The optimizer built, in the clip's own function, over exactly the parameters clipped
        (`clip(model0.parameters())` with `opt0 = torch.optim.SGD(model0.parameters(), ...)`)."""
        if not isinstance(clip, cst.Call) or not clip.args or clip.args[0].keyword is not None:
            return None
        clipped = self.code(clip.args[0].value)
        scope = self.scope_of(clip)
        # scope -> {parameters' code -> optimizer keys}, built once (linear in the file)
        index = self.__dict__.get("_optimizers_over")
        if index is None:
            index = self._optimizers_over = {}
            for key, entries in self._by_key.items():
                for stmt, v, s in entries:
                    if isinstance(v, cst.Call) and self.is_api(v, "optimizer") and v.args \
                            and v.args[0].keyword is None:
                        index.setdefault(id(s), (s, {}))[1].setdefault(self.code(v.args[0].value), set()).add(key)
        hit = index.get(id(scope))
        owners = set(hit[1].get(clipped, ())) if hit is not None and hit[0] is scope else set()
        return owners.pop() if len(owners) == 1 else None

    # ---------------------------------------------------------------- backward calls
    def _backward_call(self, call: cst.Call) -> Optional[BackwardCall]:
        if self.is_api(call, "autograd.backward"):  # before `.backward`: its receiver is a module
            return BackwardCall(call, "autograd")
        if isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward":
            receiver = call.func.value
            base = self._scaled_backward_base(call)
            if base is not None and base in self.scalers:
                return BackwardCall(call, "scaled", base)
            # Function.backward(ctx, ...) / super().backward(...) are not tensor backward calls
            if isinstance(receiver, cst.Call) and call_name(receiver) == "super":
                return None
            if isinstance(receiver, cst.Name) and receiver.value in self.classes:
                return None
            if self.is_api(receiver, "autograd.Function"):
                return None
            if self.callees(call):  # `self.backward(loss)`: a method of this file (traces inline it)
                return None
            return BackwardCall(call, "tensor")
        return None

    @property
    def backward_calls(self) -> List[BackwardCall]:
        return [b for b in (self._backward_call(c) for c in self.calls) if b is not None]

    # ---------------------------------------------------------------- CUDA initialisation
    def _is_cuda_device(self, expr: Optional[cst.CSTNode], depth: int = 0, allow_int: bool = False) -> bool:
        """True when `expr` is certainly a CUDA device: "cuda...", torch.device("cuda..."), or a
        name always bound to one."""
        if expr is None or depth > 4:
            return False
        prefix = _string_prefix(expr)
        if prefix is not None:
            return prefix.startswith("cuda")
        if allow_int and isinstance(expr, cst.Integer):
            return True
        if isinstance(expr, cst.Call) and "torch.device" in self.qualnames(expr.func):
            arg = get_arg(expr, 0, "type")
            if arg is None:
                return False
            return isinstance(arg.value, cst.Integer) or self._is_cuda_device(arg.value, depth + 1)
        if isinstance(expr, cst.IfExp):
            return self._is_cuda_device(expr.body, depth + 1, allow_int) and \
                self._is_cuda_device(expr.orelse, depth + 1, allow_int)
        if isinstance(expr, (cst.Name, cst.Attribute)):
            values = self._values_before(expr)
            return bool(values) and all(self._is_cuda_device(v, depth + 1, allow_int) for v in values)
        return False

    def _values_before(self, expr: cst.CSTNode) -> List[cst.BaseExpression]:
        """Values the name may hold at `expr`: its assignments earlier in the same scope when
        there are any, else every visible assignment (none for an unbound parameter)."""
        key = dotted(expr)
        if key is None:
            return []
        scope = self.scope_of(expr)
        local = [v for node, v, s in self._by_key.get(key, []) if s is scope and self.before(node, expr)]
        if local:
            return local
        if self._is_param(scope, key.split(".")[0]):
            return []  # a parameter: could be anything
        return [v for _, v, _ in self._by_key.get(key, [])]

    def device_index_uses(self, scope: cst.CSTNode, var: str) -> List[cst.CSTNode]:
        """Places in `scope` (not nested defs) that use `var` as a CUDA device index:
        `f"cuda:{var}"`, `torch.device("cuda", var)`, `set_device(var)`, `device_ids=[var]`, ..."""
        return _device_index_uses(self, scope, var)

    def _cuda_init_reason(self, call: cst.Call) -> Optional[str]:
        """A short description when this call initialises CUDA, else None."""
        func = call.func
        for name in self.qualnames(func):
            if name.startswith("torch.cuda.") and name.count(".") == 2:
                short = name.split(".")[2]
                return f"torch.cuda.{short}()" if short in CUDA_INIT_FUNCS else None
        if isinstance(func, cst.Attribute):
            method = func.attr.value
            imported = [q.name for q in self.qualified_names(func) if q.source is QualifiedNameSource.IMPORT]
            if imported and not any(n.startswith("torch.") for n in imported):
                return None  # numba.cuda..., cupy...
            if method == "cuda":
                return ".cuda()"
            if method == "to":
                dev = get_arg(call, 0, "device")
                return ".to(<cuda device>)" if dev is not None and self._is_cuda_device(dev.value, allow_int=True) else None
            if method in TENSOR_NEW_METHODS:
                dev = get_arg(call, None, "device")
                if dev is not None and self._is_cuda_device(dev.value, allow_int=True):
                    return f".{method}(device=<cuda>)"
                return None
        torch_names = [n for n in self.qualnames(func) if n.startswith("torch.")]
        if torch_names and not any(n == p or n.startswith(p) for n in torch_names for p in NON_INIT_DEVICE_CALLEES):
            dev = get_arg(call, None, "device")
            if dev is not None and self._is_cuda_device(dev.value, allow_int=True):
                return f"{torch_names[0]}(device=<cuda>)"
            if "torch.load" in torch_names:
                loc = get_arg(call, None, "map_location")
                if loc is not None and self._is_cuda_device(loc.value):
                    return "torch.load(map_location=<cuda>)"
        return None


def _is_var(node: Optional[cst.CSTNode], var: str) -> bool:
    if node is None:
        return False
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value in ("int", "str"):
        return len(node.args) == 1 and dotted(node.args[0].value) == var
    return dotted(node) == var


def _device_index_uses(model, scope: cst.CSTNode, var: str) -> List[cst.CSTNode]:
    """Nodes in `scope` (not nested defs) that use `var` as a CUDA device index."""
    uses: List[cst.CSTNode] = []

    def in_scope(node: cst.CSTNode) -> bool:
        return model.scope_of(node) is scope

    class V(cst.CSTVisitor):
        def visit_FormattedString(self, node: cst.FormattedString) -> None:
            # the whole string is a device: f"cuda:{V}" (not a log line mentioning it)
            parts = node.parts
            if (
                len(parts) == 2
                and isinstance(parts[0], cst.FormattedStringText)
                and parts[0].value == "cuda:"
                and isinstance(parts[1], cst.FormattedStringExpression)
                and parts[1].format_spec is None
                and _is_var(parts[1].expression, var)
            ):
                uses.append(node)

        def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
            left = literal_string(node.left)
            if left is None:
                return
            if isinstance(node.operator, cst.Modulo) and left in ("cuda:%d", "cuda:%s", "cuda:%i"):
                right = node.right
                items = [e.value for e in right.elements] if isinstance(right, cst.Tuple) else [right]
                if any(_is_var(x, var) for x in items):
                    uses.append(node)
            elif isinstance(node.operator, cst.Add) and left == "cuda:" and _is_var(node.right, var):
                uses.append(node)

        def visit_Call(self, node: cst.Call) -> None:
            func = node.func
            if isinstance(func, cst.Attribute):
                method = func.attr.value
                if method == "format" and literal_string(func.value) in ("cuda:{}", "cuda:{0}", "cuda:{:d}"):
                    if len(node.args) == 1 and _is_var(node.args[0].value, var):
                        uses.append(node)
                        return
                if method == "cuda":
                    arg = get_arg(node, 0, "device")
                    if arg is not None and _is_var(arg.value, var):
                        uses.append(node)
                        return
                if method == "to":
                    arg = get_arg(node, 0, "device")
                    if arg is not None and _is_var(arg.value, var):
                        uses.append(node)
                        return
            names = model.qualnames(func)
            if "torch.device" in names:
                t = get_arg(node, 0, "type")
                idx = get_arg(node, 1, "index")
                if t is not None and idx is not None and literal_string(t.value) == "cuda" and _is_var(idx.value, var):
                    uses.append(node)
                elif t is not None and idx is None and _is_var(t.value, var):
                    uses.append(node)
                return
            if names & {"torch.cuda.set_device", "torch.cuda.device"}:
                arg = get_arg(node, 0, "device")
                if arg is not None and _is_var(arg.value, var):
                    uses.append(node)
                return
            for arg in node.args:
                if arg.keyword is None:
                    continue
                kw = arg.keyword.value
                if kw == "device_ids" and isinstance(arg.value, (cst.List, cst.Tuple)):
                    if any(_is_var(e.value, var) for e in arg.value.elements):
                        uses.append(node)
                        return
                if kw == "output_device" and _is_var(arg.value, var):
                    uses.append(node)
                    return

    scope.visit(V())
    return [u for u in uses if in_scope(u)]


def _string_prefix(node: cst.CSTNode) -> Optional[str]:
    """The literal text a string or f-string starts with."""
    s = literal_string(node)
    if s is not None:
        return s
    if isinstance(node, cst.FormattedString) and node.parts and isinstance(node.parts[0], cst.FormattedStringText):
        return node.parts[0].value
    return None
