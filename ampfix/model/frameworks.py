"""Framework facts: Lightning Fabric, Hugging Face Accelerate, Lightning `Trainer`, MindSpore.

Static only (nothing here imports the frameworks). For one file's model (`frameworks(model)`,
built once and cached on it):

* `frameworks_of(expr)`: the `Fabric(...)` / `Accelerator(...)` constructions `expr` may hold
  (names, `self.` attributes, parameters through call sites, the function `fabric.launch(fn)`
  runs with the Fabric as its first argument);
* `Framework.precisions`: the precision the construction selects, canonical, as read from the
  literal argument (`None`: not known statically: absent, where the launcher's environment or
  config decides, or computed); `scales` / `mixed_dtypes` derived from it;
* `prepared_by(expr)`: the `fabric.setup(...)` / `setup_module` / `setup_optimizers` /
  `accelerator.prepare(...)` / `prepare_model` / `prepare_optimizer` calls whose result `expr`
  may hold, with the role of that result (module, optimizer, other);
* `derives_from_prepared_module(expr)`: the value of `expr` is computed by calling a prepared
  module (`loss = F.cross_entropy(model(x), y)`, `out = model(**batch); loss = out.loss`);
* `usable_at(key, where, site)`: the dotted name `key`, bound where `where` is, means the same
  object at `site` (same function, module global, or `self.` attribute of the same class);
* precision spellings of Lightning 2.6 and Accelerate 1.15 (`FABRIC_ALIASES`, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import libcst as cst

from ampfix.model.facet import Facet
from ampfix.model.syntax import call_name, get_arg, literal_string
from ampfix.model.tree import child_nodes, dotted
from ampfix.model.values import SAME_OBJECT_METHODS, ReturnedElement

FABRIC = {"lightning.fabric.Fabric", "lightning_fabric.Fabric", "lightning.Fabric", "lightning.fabric.fabric.Fabric",
          "lightning_fabric.fabric.Fabric"}
ACCELERATOR = {"accelerate.Accelerator", "accelerate.accelerator.Accelerator"}
TRAINER = {"lightning.Trainer", "lightning.pytorch.Trainer", "pytorch_lightning.Trainer",
           "lightning.pytorch.trainer.Trainer", "pytorch_lightning.trainer.Trainer",
           "lightning.pytorch.trainer.trainer.Trainer", "pytorch_lightning.trainer.trainer.Trainer"}
PREPARE = {"fabric": {"setup", "setup_module", "setup_optimizers"},
           "accelerate": {"prepare", "prepare_model", "prepare_optimizer"}}
NAME = {"fabric": "Fabric", "accelerate": "Accelerate"}

# Lightning 2.6.6 (lightning_fabric/plugins/precision/precision.py, connector.py): accepted values;
# the aliases 16/"16"/"bf16" warn "supported for historical reasons but its usage is discouraged";
# 32/64 (int or str) are accepted silently.
FABRIC_VALUES = ("transformer-engine", "transformer-engine-float16", "16-true", "16-mixed", "bf16-true", "bf16-mixed",
                 "32-true", "64-true")
FABRIC_ALIASES = {"16": "16-mixed", "bf16": "bf16-mixed"}
FABRIC_SILENT_ALIASES = {"32": "32-true", "64": "64-true"}
# Accelerate 1.15.0 (accelerate/utils/dataclasses.py PrecisionType): anything else raises ValueError.
ACCELERATE_VALUES = ("no", "fp8", "fp16", "bf16")
MIXED_DTYPE = {"16-mixed": "float16", "bf16-mixed": "bfloat16", "fp16": "float16", "bf16": "bfloat16"}
MAX_DEPTH = 6
DETACHED = {"detach", "detach_", "item", "tolist", "numpy"}


@dataclass(frozen=True)
class Framework:
    kind: str  # "fabric" | "accelerate"
    call: cst.Call  # the construction
    precisions: Optional[Tuple[str, ...]]  # canonical values it may select; None: not known statically

    @property
    def name(self) -> str:
        return NAME[self.kind]

    @property
    def scales(self) -> bool:
        """Known to use a GradScaler (fp16 mixed precision) on some path, every path known."""
        return self.precisions is not None and any(p in ("16-mixed", "fp16") for p in self.precisions)

    @property
    def mixed_dtypes(self) -> Optional[Tuple[str, ...]]:
        """The autocast dtypes it runs (empty: none); None when not known."""
        if self.precisions is None:
            return None
        return tuple(MIXED_DTYPE[p] for p in self.precisions if p in MIXED_DTYPE)

    def describe(self, scaling_only: bool = False) -> str:
        """`Accelerator(mixed_precision='fp16'/'bf16')`: the precisions it may be built with.
        `scaling_only`: those that use a GradScaler, the others said apart (`... (it may also
        be built with 'bf16'/'no')`)."""
        arg = "precision" if self.kind == "fabric" else "mixed_precision"
        cls = "Fabric" if self.kind == "fabric" else "Accelerator"
        chosen = [p for p in self.precisions or () if not scaling_only or p in ("16-mixed", "fp16")]
        others = [p for p in self.precisions or () if p not in chosen]
        also = f" (it may also be built with {'/'.join(repr(p) for p in others)})" if others else ""
        return f"{cls}({arg}={'/'.join(repr(p) for p in chosen)}){also}"


@dataclass(frozen=True)
class Prepared:
    call: cst.Call  # fabric.setup(...) / accelerator.prepare(...)
    receiver: cst.BaseExpression  # the framework object the method is called on
    role: str  # "module" | "optimizer" | "other"
    frameworks: Tuple[Framework, ...]


def frameworks(model) -> "FrameworkFacts":
    facts = getattr(model, "_framework_facts", None)
    if facts is None:
        facts = FrameworkFacts(model)
        model._framework_facts = facts
    return facts


def _named_as_data(arg: cst.BaseExpression) -> bool:
    """What `accelerator.prepare` is given is named as a scheduler, a data loader or data."""
    text = (dotted(arg) or "").rpartition(".")[2].lower()
    return "sched" in text or "loader" in text or text.endswith("_dl") or text in ("dl", "data", "dataset")


def _int_text(node: cst.CSTNode) -> Optional[str]:
    if isinstance(node, cst.Integer):
        return node.value
    return None


class FrameworkFacts(Facet):
    def __init__(self, model):
        super().__init__(model)  # (a proxy of the model, which keeps these facts: `Facet`)
        self.m = self.model
        self._fw_cache: dict = {}

    # ---------------------------------------------------------------- constructions
    def construction_kind(self, call: cst.CSTNode) -> Optional[str]:
        """"fabric" / "accelerate" / "trainer" for a construction call, any import spelling."""
        if not isinstance(call, cst.Call):
            return None
        names = self.m.qualnames(call)
        if names & FABRIC:
            return "fabric"
        if names & ACCELERATOR:
            return "accelerate"
        if names & TRAINER:
            return "trainer"
        return None

    def constructions(self, *kinds: str) -> List[cst.Call]:
        return [c for c in self.m.calls if self.construction_kind(c) in kinds]

    def precision_arg(self, call: cst.Call) -> Optional[cst.Arg]:
        kind = self.construction_kind(call)
        if kind == "accelerate":
            return get_arg(call, 2, "mixed_precision")
        if kind == "trainer":
            return get_arg(call, None, "precision")
        return get_arg(call, None, "precision")  # Fabric's arguments are keyword-only

    def literal_values(self, expr: cst.CSTNode) -> Optional[List[Tuple[cst.CSTNode, str]]]:
        """(node, text) for each literal string/int `expr` may be; None when one is not literal."""
        out = []
        for v in self.m.possible_values(expr):
            text = literal_string(v)
            if text is None:
                text = _int_text(v)
            if text is None:
                return None
            out.append((v, text))
        return out or None

    def framework(self, call: cst.Call) -> Optional[Framework]:
        kind = self.construction_kind(call)
        if kind not in ("fabric", "accelerate"):
            return None
        if call in self._fw_cache:
            return self._fw_cache[call]
        arg = self.precision_arg(call)
        values = self.literal_values(arg.value) if arg is not None else None
        precisions: Optional[Tuple[str, ...]] = None
        if values is not None:
            canon = []
            for _, text in values:
                if kind == "fabric":
                    text = FABRIC_ALIASES.get(text, FABRIC_SILENT_ALIASES.get(text, text))
                    if text == "16-mixed" and self._fabric_on_cpu(call):
                        text = "bf16-mixed"  # Fabric switches fp16 AMP to bf16 on the CPU
                    ok = text in FABRIC_VALUES
                else:
                    if text == "fp16" and self._accelerate_on_cpu(call):
                        text = "no"  # Accelerator(cpu=True, mixed_precision="fp16") enables no AMP
                    ok = text in ACCELERATE_VALUES
                if not ok:
                    canon = None
                    break
                canon.append(text)
            precisions = tuple(canon) if canon else None
        if kind == "fabric" and get_arg(call, None, "plugins") is not None:
            precisions = None  # a precision plugin decides
        fw = Framework(kind, call, precisions)
        self._fw_cache[call] = fw
        return fw

    def _fabric_on_cpu(self, call: cst.Call) -> bool:
        arg = get_arg(call, None, "accelerator")
        return arg is not None and literal_string(arg.value) == "cpu"

    def _accelerate_on_cpu(self, call: cst.Call) -> bool:
        arg = get_arg(call, 4, "cpu")
        return arg is not None and isinstance(arg.value, cst.Name) and arg.value.value == "True"

    # ---------------------------------------------------------------- framework objects
    def frameworks_of(self, expr: Optional[cst.CSTNode], depth: int = 0) -> List[Framework]:
        """The Fabric/Accelerator constructions `expr` may hold."""
        if expr is None or depth > MAX_DEPTH:
            return []
        out: List[Framework] = []
        for v in self.m.possible_values(expr):
            fw = self.framework(v) if isinstance(v, cst.Call) else None
            if fw is not None:
                out.append(fw)
            elif isinstance(v, cst.Name):
                out.extend(self._launched_with(v, depth))
        return out

    def _launched_with(self, name: cst.Name, depth: int) -> List[Framework]:
        """`def train(fabric): ...` run by `fabric.launch(train)`: its first parameter."""
        func = self.m.scope_of(name)
        if not isinstance(func, cst.FunctionDef) or not func.params.params \
                or func.params.params[0].name.value != name.value:
            return []
        out = []
        for call in self.m.calls:
            if call_name(call) == "launch" and call.args and call.args[0].keyword is None \
                    and func in self.m.functions_named_by(call.args[0].value):
                out.extend(self.frameworks_of(call.func.value, depth + 1))  # type: ignore[union-attr]
        return out

    # ---------------------------------------------------------------- prepared objects
    def prepare_call(self, call: cst.CSTNode) -> Optional[List[Framework]]:
        """For `X.setup(...)`/`X.prepare(...)` (the methods of the framework X holds): X's frameworks."""
        if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)):
            return None
        method = call.func.attr.value
        if not any(method in ms for ms in PREPARE.values()):
            return None
        fws = [f for f in self.frameworks_of(call.func.value) if method in PREPARE[f.kind]]
        return fws or None

    def _role(self, call: cst.Call, index: Optional[int]) -> str:
        method = call_name(call)
        if method in ("setup_module", "prepare_model"):
            return "module"
        if method in ("setup_optimizers", "prepare_optimizer"):
            return "optimizer"
        if method == "setup":
            return "module" if not index else "optimizer"
        # accelerator.prepare(...): the role of what was passed at that position
        positional = [a for a in call.args if a.keyword is None]
        if index is None:
            if len(positional) != 1:
                return "other"
            index = 0
        if index >= len(positional) or positional[index].star:
            return "other"
        arg = positional[index].value
        if _named_as_data(arg):
            return "other"
        text = (dotted(arg) or "").rpartition(".")[2].lower()
        if self.m.is_optimizer(arg):
            return "optimizer"
        if self.m.module_classes(arg) or "model" in text or "net" in text or "module" in text:
            return "module"
        return "other"

    def prepared_by(self, expr: Optional[cst.CSTNode], depth: int = 0) -> List[Prepared]:
        """The framework prepare calls whose result `expr` may hold."""
        if expr is None or depth > MAX_DEPTH:
            return []
        if isinstance(expr, ReturnedElement):
            fws = self.prepare_call(expr.call)
            if fws:
                return [Prepared(expr.call, expr.call.func.value, self._role(expr.call, expr.index), tuple(fws))]
            return [p for e in self.m._returned(expr.call, expr.index) for p in self.prepared_by(e, depth + 1)]
        if isinstance(expr, cst.Call):
            fws = self.prepare_call(expr)
            if fws:
                return [Prepared(expr, expr.func.value, self._role(expr, None), tuple(fws))]  # type: ignore
            if isinstance(expr.func, cst.Attribute) and expr.func.attr.value in SAME_OBJECT_METHODS:
                return self.prepared_by(expr.func.value, depth + 1)
            return [p for e in self.m._returned(expr, None) for p in self.prepared_by(e, depth + 1)]
        if isinstance(expr, cst.IfExp):
            return self.prepared_by(expr.body, depth + 1) + self.prepared_by(expr.orelse, depth + 1)
        if isinstance(expr, (cst.Name, cst.Attribute)) and dotted(expr) is not None:
            out: List[Prepared] = []
            for v in self.m.values_of(expr):
                if v is not expr:
                    out.extend(self.prepared_by(v, depth + 1))
            return out
        return []

    def prepared_modules(self, expr: Optional[cst.CSTNode]) -> List[Prepared]:
        return [p for p in self.prepared_by(expr) if p.role == "module"]

    def derives_from_prepared_module(self, expr: Optional[cst.CSTNode], depth: int = 0,
                                     seen: Optional[set] = None) -> List[Prepared]:
        """The prepared modules whose call computes (part of) the value of `expr`."""
        if expr is None or depth > MAX_DEPTH:
            return []
        seen = set() if seen is None else seen
        out: List[Prepared] = []
        stack = [expr]
        while stack:
            n = stack.pop()
            if id(n) in seen:
                continue
            seen.add(id(n))
            if isinstance(n, (cst.Lambda, cst.FunctionDef)):
                continue
            if isinstance(n, cst.Call):
                if isinstance(n.func, cst.Attribute) and n.func.attr.value in DETACHED:
                    continue  # `model(x).detach()`: no gradient flows back into the model
                if isinstance(n.func, (cst.Name, cst.Attribute)):
                    out.extend(self.prepared_modules(n.func))
                for r in self.m._returned(n, None):
                    out.extend(self.derives_from_prepared_module(r, depth + 1, seen))
            if isinstance(n, (cst.Name, cst.Attribute)) and dotted(n) is not None:
                for v in self.m.values_of(n):
                    if isinstance(v, ReturnedElement):
                        for r in self.m._returned(v.call, v.index):
                            out.extend(self.derives_from_prepared_module(r, depth + 1, seen))
                        stack.append(v.call)
                    elif v is not n:
                        out.extend(self.derives_from_prepared_module(v, depth + 1, seen))
                if isinstance(n, cst.Attribute):
                    stack.append(n.value)
                continue
            stack.extend(child_nodes(n))
        return out

    # ---------------------------------------------------------------- names usable elsewhere
    def usable_at(self, key: str, where: cst.CSTNode, site: cst.CSTNode) -> bool:
        """`key` (dotted text as written at `where`) names the same object at `site`."""
        root = key.split(".")[0]
        if root == "self":
            a, b = self.m.self_class(where), self.m.self_class(site)
            return a is not None and b is not None and b in self.m.related_classes(a)
        sa = self.m.binding_scope(root, self.m.scope_of(where))
        sb = self.m.binding_scope(root, self.m.scope_of(site))
        return sa is not None and sa is sb

    def framework_key_at(self, prepared: Prepared, site: cst.CSTNode) -> Optional[str]:
        key = dotted(prepared.receiver)
        if key is not None and self.usable_at(key, prepared.call, site):
            return key
        return None

    def may_prepare_optimizer(self, fws: Sequence[Framework]) -> bool:
        """Some setup or prepare call of the file, by one of `fws`, may hand an optimizer to the
        framework: `setup`'s arguments after the first, `setup_optimizers`, `prepare_optimizer`,
        and an argument of `prepare(...)` not known to be a module, a scheduler or a data loader
        (or passed by keyword or star). False: each of them prepares only modules, loaders or
        schedulers, as far as the file shows."""
        for call in self.m.calls:
            found = self.prepare_call(call)
            if not found or not any(f in fws for f in found):
                continue
            assert isinstance(call, cst.Call)
            if any(a.keyword is not None or a.star for a in call.args):
                return True
            for i, arg in enumerate(call.args):
                role = self._role(call, i)
                if role == "optimizer" or (role == "other" and not _named_as_data(arg.value)):
                    return True
        return False

    def prepared_targets(self, call: cst.Call, role: str) -> List[Tuple[cst.CSTNode, str]]:
        """(assignment, dotted target) of the results of the prepare call `call` with `role`."""
        out = []
        for key, entries in self.m.assignments.items():
            for node, value in entries:
                if isinstance(value, ReturnedElement) and value.call is call and self._role(call, value.index) == role:
                    out.append((node, key))
                elif value is call and self._role(call, None) == role:
                    out.append((node, key))
        return out

    # ---------------------------------------------------------------- LightningModule
    def manual_lightning_module(self, node: cst.CSTNode) -> Optional[cst.ClassDef]:
        """The LightningModule class whose `training_step` (or a function nested in it) holds
        `node`, when that class turns automatic optimization off (`self.automatic_optimization
        = False`, literal); else None."""
        func = self.m.function_of(node)
        while func is not None and func.name.value != "training_step":
            func = self.m.function_of(self.m.parent(func))
        cls = self.m.class_of(func) if func is not None else None
        if cls is None or not self._is_lightning_module(cls):
            return None
        values = self.m.attribute_values(cls, "automatic_optimization")
        if values and all(isinstance(v, cst.Name) and v.value == "False" for v in values):
            return cls
        return None

    def _is_lightning_module(self, cls: cst.ClassDef, depth: int = 0) -> bool:
        for b in cls.bases:
            if any(q.endswith(".LightningModule") and q.split(".")[0] in ("lightning", "pytorch_lightning")
                   for q in self.m.qualnames(b.value)):
                return True
            base = self.m._class_named(b.value)
            if base is not None and base is not cls and depth < MAX_DEPTH and self._is_lightning_module(base, depth + 1):
                return True
        return False

    # ---------------------------------------------------------------- precision spellings
    def precision_literals(self, call: cst.Call) -> List[Tuple[cst.CSTNode, str]]:
        """(node, text) of the literal strings/ints written in the precision argument of a
        Fabric/Trainer/Accelerator construction (the argument itself, or branches of a
        conditional expression there; names are not followed: a rewrite edits only the call)."""
        arg = self.precision_arg(call)
        out: List[Tuple[cst.CSTNode, str]] = []
        stack = [arg.value] if arg is not None else []
        while stack:
            n = stack.pop()
            if isinstance(n, cst.IfExp):
                stack += [n.orelse, n.body]
                continue
            text = literal_string(n) if not isinstance(n, cst.Integer) else n.value
            if text is not None:
                out.append((n, text))
        return out


# Spellings people write that Lightning 2.6 / Accelerate 1.15 reject, and what they mean.
FABRIC_SUGGEST = {"fp16": "16-mixed", "float16": "16-mixed", "mixed": "16-mixed", "amp": "16-mixed",
                  "16_mixed": "16-mixed", "16-amp": "16-mixed", "bfloat16": "bf16-mixed", "bf16_mixed": "bf16-mixed",
                  "bf16mixed": "bf16-mixed", "fp32": "32-true", "float32": "32-true", "no": "32-true",
                  "32-mixed": "32-true", "fp64": "64-true", "float64": "64-true", "double": "64-true",
                  "16_true": "16-true", "bf16_true": "bf16-true"}
ACCELERATE_SUGGEST = {"16-mixed": "fp16", "16": "fp16", "float16": "fp16", "half": "fp16", "FP16": "fp16",
                      "bf16-mixed": "bf16", "bfloat16": "bf16", "BF16": "bf16", "fp32": "no", "32": "no",
                      "32-true": "no", "float32": "no", "none": "no", "None": "no", "NO": "no", "False": "no"}


# ----------------------------------------------------------------------------- MindSpore
# mindspore.nn optimizers that take `loss_scale` (its position in the signature, MindSpore 2.x),
# and those that do not (the gradients must be divided by a custom TrainOneStepCell).
MS_LOSS_SCALE_AT = {"Momentum": 4, "SGD": 6, "Adam": 8, "AdamOffload": 8, "LazyAdam": 8, "FTRL": 7,
                    "ProximalAdagrad": 6, "Adagrad": 4, "RMSProp": 7, "Adadelta": 4, "Adamax": 6}
MS_NO_LOSS_SCALE = {"AdamWeightDecay", "Lamb", "ASGD", "Rprop"}
MS_ADAPTIVE = {"Adam", "AdamOffload", "LazyAdam", "FTRL", "ProximalAdagrad", "Adagrad", "RMSProp", "Adadelta", "Adamax"}


def ms_name(model, call: cst.CSTNode) -> Optional[str]:
    """The last component of the mindspore API a call constructs (`ms.FixedLossScaleManager`,
    `mindspore.train.Model`, `nn.Momentum` after `from mindspore import nn`), else None."""
    if not isinstance(call, cst.Call):
        return None
    for name in model.qualnames(call):
        if name.startswith("mindspore."):
            return name.rpartition(".")[2]
    return None


@dataclass(frozen=True)
class MsTraining:
    """A MindSpore train network built by `Model(...)` or `amp.build_train_network(...)`."""

    call: cst.Call
    manager: Optional[cst.Call]  # FixedLossScaleManager(..., drop_overflow_update=False), when it is one
    optimizer: Optional[cst.Call]  # the optimizer construction


def ms_trainings(model) -> List[MsTraining]:
    out = []
    for call in model.calls:
        name = ms_name(model, call)
        if name not in ("Model", "build_train_network"):
            continue
        mgr_arg = get_arg(call, None, "loss_scale_manager")
        opt_arg = get_arg(call, 2 if name == "Model" else 1, "optimizer")
        if mgr_arg is None or opt_arg is None:
            continue
        managers = [v for v in model.possible_values(mgr_arg.value) if ms_name(model, v) == "FixedLossScaleManager"]
        opts = [v for v in model.possible_values(opt_arg.value) if ms_name(model, v)]
        for mgr in managers:
            drop = get_arg(mgr, 1, "drop_overflow_update")
            if drop is None or not (isinstance(drop.value, cst.Name) and drop.value.value == "False"):
                continue
            for opt in opts:
                out.append(MsTraining(call, mgr, opt))
    return out
