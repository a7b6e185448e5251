"""AMP005 cuda-visible-devices.

Three mistakes with the `CUDA_VISIBLE_DEVICES` environment variable:

(a) the name is misspelled where the environment is read or written (silently ignored);
(b) it is set after CUDA was initialised in the same flow (it is read once, by cuInit);
(c) it is set per process to one GPU, and the process then indexes devices with the rank.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator, List, Optional, Set

import libcst as cst
from libcst.metadata import QualifiedNameSource

from ampfix.model import AmpModel, dotted, get_arg, literal_string
from ampfix.rule import FileContext, Fix, Rule, Violation

TARGET = "CUDA_VISIBLE_DEVICES"

# Real variables that look like CUDA_VISIBLE_DEVICES (other vendors' equivalents, CUDA's own).
LEGITIMATE = {
    "NVIDIA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "GPU_VISIBLE_DEVICES",
    "MUSA_VISIBLE_DEVICES",
    "MLU_VISIBLE_DEVICES",
    "XPU_VISIBLE_DEVICES",
    "NPU_VISIBLE_DEVICES",
    "TPU_VISIBLE_DEVICES",
    "DCU_VISIBLE_DEVICES",
    "GCU_VISIBLE_DEVICES",
    "MACA_VISIBLE_DEVICES",
    "TOPS_VISIBLE_DEVICES",
    "ASCEND_RT_VISIBLE_DEVICES",
    "ASCEND_VISIBLE_DEVICES",
    "HABANA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "CUDA_DEVICE_MAX_CONNECTIONS",
}

# torch.cuda functions that initialise CUDA (cuInit) when called, in current torch.
# Not here on purpose: device_count (NVML), manual_seed/manual_seed_all/set_rng_state (deferred),
# memory_allocated/memory_reserved/max_memory_allocated/empty_cache (no-ops before init),
# get_arch_list (compile-time flags), is_initialized.
CUDA_INIT_FUNCS = {
    "is_available",
    "set_device",
    "current_device",
    "get_device_name",
    "get_device_properties",
    "get_device_capability",
    "synchronize",
    "init",
    "mem_get_info",
    "current_stream",
    "default_stream",
    "Stream",
    "Event",
    "is_bf16_supported",
    "ipc_collect",
    "get_rng_state",
    "get_rng_state_all",
}

# torch callables that take device="cuda" without touching the GPU.
NON_INIT_DEVICE_CALLEES = (
    "torch.device",
    "torch.autocast",
    "torch.amp.",
    "torch.cuda.amp.",
    "torch.GradScaler",
    "torch.set_default_device",
    "torch.get_default_device",
)

ENV_KEY_METHODS = {"get", "setdefault", "pop", "__getitem__", "__setitem__", "__delitem__", "__contains__"}
TENSOR_NEW_METHODS = {"new_zeros", "new_ones", "new_empty", "new_full", "new_tensor"}
TERMINATORS = (cst.Return, cst.Raise, cst.Break, cst.Continue)
BUILTIN_NAMES = {"str", "int", "len", "range", "map", "list", "tuple", "sorted", "True", "False", "None"}


# --------------------------------------------------------------------------- misspellings


def _osa_distance(a: str, b: str, limit: int = 3) -> int:
    """Damerau-Levenshtein (optimal string alignment) distance, capped at `limit`."""
    if abs(len(a) - len(b)) >= limit:
        return limit
    prev2: List[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        if min(cur) >= limit:
            return limit
        prev2, prev = prev, cur
    return min(prev[len(b)], limit)


def is_misspelling(key: str) -> bool:
    """True when `key` is a slip for CUDA_VISIBLE_DEVICES (case, letters, separators)."""
    if key == TARGET:
        return False
    up = key.upper()
    if up == TARGET or up.strip() == TARGET:
        return True
    if up in LEGITIMATE:
        return False
    if TARGET in up:
        # "CUDA_VISIBLE_DEVICES_0", "OLD_CUDA_VISIBLE_DEVICES": a different variable
        rest = up.replace(TARGET, "", 1)
        if "_" in rest or len(rest) > 1:
            return False
    return _osa_distance(up, TARGET) <= 2


_QUOTED = re.compile(r"(?=[\"']([^\"'\n]{14,28})[\"'])")  # overlapping: a closing quote may open the next
_KEYWORD = re.compile(r"\b([A-Za-z_]{16,24})\s*=")


# --------------------------------------------------------------------------- env access


@dataclass
class EnvKey:
    """A variable name used to access the process environment (or a copy of it)."""

    node: cst.CSTNode  # the string literal, or the keyword Name of update(KEY=...)
    key: str
    real_env: bool  # os.environ / os.putenv itself, not a copy meant for a child process


@dataclass
class EnvWrite:
    """`CUDA_VISIBLE_DEVICES` set in this process's environment."""

    node: cst.CSTNode  # the Assign or Call that sets it
    value: Optional[cst.BaseExpression]


def _is_name(model: AmpModel, node: cst.CSTNode, qualname: str) -> bool:
    names = {q.name for q in model.qualified_names(node)}
    if names:
        return qualname in names
    return dotted(node) == qualname


def _is_environ(model: AmpModel, node: cst.CSTNode) -> bool:
    return isinstance(node, (cst.Name, cst.Attribute)) and _is_name(model, node, "os.environ")


def _is_environ_copy_value(model: AmpModel, value: cst.CSTNode) -> bool:
    if isinstance(value, cst.Call):
        if isinstance(value.func, cst.Attribute) and value.func.attr.value == "copy" and _is_environ(model, value.func.value):
            return True
        if isinstance(value.func, cst.Name) and value.func.value == "dict" and value.args:
            return _is_environ(model, value.args[0].value)
    if isinstance(value, cst.Dict):
        return any(isinstance(e, cst.StarredDictElement) and _is_environ(model, e.value) for e in value.elements)
    return False


class _EnvCollector:
    """Finds every literal key used with os.environ / os.getenv / os.putenv (and copies of os.environ)."""

    def __init__(self, model: AmpModel):
        self.model = model
        self.keys: List[EnvKey] = []
        self.writes: List[EnvWrite] = []
        self._copies: Optional[Set[str]] = None

    def _env_target(self, node: cst.CSTNode) -> Optional[bool]:
        """True for os.environ, False for a copy of it, None for anything else."""
        if _is_environ(self.model, node):
            return True
        key = dotted(node)
        if key is not None:
            values = self.model.values_of(node)
            if values and all(_is_environ_copy_value(self.model, v) for v in values):
                return False
        return None

    def _add_key(self, node: cst.CSTNode, real: bool) -> Optional[str]:
        if isinstance(node, cst.Name):  # keyword of update(KEY=...)/dict(KEY=...)
            self.keys.append(EnvKey(node, node.value, real))
            return node.value
        value = literal_string(node)
        if value is None:
            return None
        self.keys.append(EnvKey(node, value, real))
        return value

    def _dict_items(self, node: cst.CSTNode, real: bool, write_node: Optional[cst.CSTNode]) -> None:
        """Keys of {..} or dict(..) passed to environ.update / env=."""
        if isinstance(node, cst.Dict):
            for el in node.elements:
                if isinstance(el, cst.DictElement):
                    key = self._add_key(el.key, real)
                    if key == TARGET and write_node is not None:
                        self.writes.append(EnvWrite(write_node, el.value))
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "dict":
            for arg in node.args:
                if arg.keyword is not None:
                    key = self._add_key(arg.keyword, real)
                    if key == TARGET and write_node is not None:
                        self.writes.append(EnvWrite(write_node, arg.value))
                elif arg.star == "" and isinstance(arg.value, cst.Dict):
                    self._dict_items(arg.value, real, write_node)

    def run(self) -> "_EnvCollector":
        collector = self
        model = self.model

        class V(cst.CSTVisitor):
            def visit_Subscript(self, node: cst.Subscript) -> None:
                real = collector._env_target(node.value)
                if real is None or len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
                    return
                collector._add_key(node.slice[0].slice.value, real)

            def visit_Assign(self, node: cst.Assign) -> None:
                for t in node.targets:
                    tgt = t.target
                    if isinstance(tgt, cst.Subscript) and _is_environ(model, tgt.value) and len(tgt.slice) == 1:
                        sl = tgt.slice[0].slice
                        if isinstance(sl, cst.Index) and literal_string(sl.value) == TARGET:
                            collector.writes.append(EnvWrite(node, node.value))

            def visit_Comparison(self, node: cst.Comparison) -> None:
                left = node.left
                for target in node.comparisons:
                    if isinstance(target.operator, (cst.In, cst.NotIn)):
                        real = collector._env_target(target.comparator)
                        if real is not None:
                            collector._add_key(left, real)
                    left = target.comparator

            def visit_Call(self, node: cst.Call) -> None:
                func = node.func
                if _is_name(model, func, "os.getenv") or _is_name(model, func, "os.putenv") or _is_name(
                    model, func, "os.unsetenv"
                ):
                    arg = get_arg(node, 0, "key")
                    if arg is not None:
                        key = collector._add_key(arg.value, True)
                        if key == TARGET and _is_name(model, func, "os.putenv"):
                            val = get_arg(node, 1, "value")
                            collector.writes.append(EnvWrite(node, val.value if val else None))
                    return
                real = collector._env_target(func.value) if isinstance(func, cst.Attribute) else None
                if isinstance(func, cst.Attribute) and real is not None:
                    method = func.attr.value
                    if method in ENV_KEY_METHODS:
                        arg = get_arg(node, 0, None)
                        if arg is not None:
                            key = collector._add_key(arg.value, real)
                            if key == TARGET and real and method == "setdefault":
                                val = get_arg(node, 1, None)
                                collector.writes.append(EnvWrite(node, val.value if val else None))
                    if method == "update":
                        for arg in node.args:
                            if arg.keyword is not None:
                                key = collector._add_key(arg.keyword, real)
                                if key == TARGET and real:
                                    collector.writes.append(EnvWrite(node, arg.value))
                            elif arg.star == "":
                                collector._dict_items(arg.value, real, node if real else None)
                    return
                # subprocess.run(..., env={**os.environ, "KEY": ...})
                env_arg = get_arg(node, None, "env")
                if env_arg is not None and _is_environ_copy_value(model, env_arg.value):
                    collector._dict_items(env_arg.value, False, None)

        model.module.visit(V())
        return self


# --------------------------------------------------------------------------- CUDA initialisation


def _qnames(model: AmpModel, node: cst.CSTNode) -> Set[str]:
    return {q.name for q in model.qualified_names(node)}


def _torch_cuda_func(model: AmpModel, call: cst.Call) -> Optional[str]:
    for name in _qnames(model, call.func):
        if name.startswith("torch.cuda.") and name.count(".") == 2:
            return name.split(".")[2]
    return None


def _string_prefix(node: cst.CSTNode) -> Optional[str]:
    """The literal text a string or f-string starts with."""
    s = literal_string(node)
    if s is not None:
        return s
    if isinstance(node, cst.FormattedString) and node.parts and isinstance(node.parts[0], cst.FormattedStringText):
        return node.parts[0].value
    return None


def is_cuda_device(model: AmpModel, expr: Optional[cst.CSTNode], depth: int = 0, allow_int: bool = False) -> bool:
    """True when `expr` is certainly a CUDA device: "cuda...", torch.device("cuda..."), or a name always bound to one."""
    if expr is None or depth > 4:
        return False
    prefix = _string_prefix(expr)
    if prefix is not None:
        return prefix.startswith("cuda")
    if allow_int and isinstance(expr, cst.Integer):
        return True
    if isinstance(expr, cst.Call) and "torch.device" in _qnames(model, expr.func):
        arg = get_arg(expr, 0, "type")
        if arg is None:
            return False
        return isinstance(arg.value, cst.Integer) or is_cuda_device(model, arg.value, depth + 1)
    if isinstance(expr, cst.IfExp):
        return is_cuda_device(model, expr.body, depth + 1, allow_int) and is_cuda_device(
            model, expr.orelse, depth + 1, allow_int
        )
    if isinstance(expr, (cst.Name, cst.Attribute)):
        values = _values_at(model, expr)
        return bool(values) and all(is_cuda_device(model, v, depth + 1, allow_int) for v in values)
    return False


def _values_at(model: AmpModel, expr: cst.CSTNode) -> List[cst.BaseExpression]:
    """Values the name may hold at `expr`: its assignments earlier in the same scope when there are
    any, else every assignment in the file."""
    key = dotted(expr)
    if key is None:
        return []
    entries = model.assignments.get(key, [])
    scope = model.scope_of(expr)
    local = [v for node, v in entries if model.scope_of(node) is scope and model.before(node, expr)]
    if local:
        return local
    if isinstance(scope, (cst.FunctionDef, cst.Lambda)):
        params = scope.params
        root = key.split(".")[0]
        if any(p.name.value == root for p in [*params.posonly_params, *params.params, *params.kwonly_params]):
            return []  # a parameter: could be anything
    return [v for _, v in entries]


def cuda_init_reason(model: AmpModel, call: cst.Call) -> Optional[str]:
    """A short description when this call initialises CUDA, else None."""
    func = call.func
    name = _torch_cuda_func(model, call)
    if name is not None:
        return f"torch.cuda.{name}()" if name in CUDA_INIT_FUNCS else None
    if isinstance(func, cst.Attribute):
        method = func.attr.value
        imported = [q.name for q in model.qualified_names(func) if q.source is QualifiedNameSource.IMPORT]
        if imported and not any(n.startswith("torch.") for n in imported):
            return None  # numba.cuda..., cupy...
        if method == "cuda":
            return ".cuda()"
        if method == "to":
            dev = get_arg(call, 0, "device")
            if dev is not None and is_cuda_device(model, dev.value, allow_int=True):
                return ".to(<cuda device>)"
            return None
        if method in TENSOR_NEW_METHODS:
            dev = get_arg(call, None, "device")
            if dev is not None and is_cuda_device(model, dev.value, allow_int=True):
                return f".{method}(device=<cuda>)"
            return None
    names = _qnames(model, func)
    torch_names = [n for n in names if n.startswith("torch.")]
    if torch_names and not any(n == p or n.startswith(p) for n in torch_names for p in NON_INIT_DEVICE_CALLEES):
        dev = get_arg(call, None, "device")
        if dev is not None and is_cuda_device(model, dev.value, allow_int=True):
            return f"{torch_names[0]}(device=<cuda>)"
        if "torch.load" in torch_names:
            loc = get_arg(call, None, "map_location")
            if loc is not None and is_cuda_device(model, loc.value):
                return "torch.load(map_location=<cuda>)"
    return None


# --------------------------------------------------------------------------- flow helpers


def _terminates(stmt: cst.CSTNode) -> bool:
    if isinstance(stmt, cst.SimpleStatementLine):
        for small in stmt.body:
            if isinstance(small, TERMINATORS):
                return True
            if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                name = dotted(small.value.func)
                if name in ("sys.exit", "exit", "quit", "os._exit"):
                    return True
    return False


def reaches(model: AmpModel, a: cst.CSTNode, b: cst.CSTNode) -> bool:
    """False when a block holding `a` (but not `b`) ends its run (return/raise/...) after `a`."""
    b_path = {id(b), *(id(x) for x in model.ancestors(b))}
    child = a
    for anc in model.ancestors(a):
        if id(anc) in b_path:
            return True
        if isinstance(anc, (cst.IndentedBlock, cst.Module)):
            idx = next((i for i, s in enumerate(anc.body) if s is child), None)
            if idx is not None and any(_terminates(s) for s in anc.body[idx:]):
                return False
        child = anc
    return True


def _same_flow_before(model: AmpModel, a: cst.CSTNode, b: cst.CSTNode) -> bool:
    """`a` runs before `b` in one run of the same function body or module level."""
    if model.scope_of(a) is not model.scope_of(b):
        return False
    if not (model.before(a, b) or model.is_ancestor(b, a)):
        return False
    return not model.exclusive(a, b) and reaches(model, a, b)


def _line(model: AmpModel, node: cst.CSTNode) -> int:
    return model.position(node).start.line


# --------------------------------------------------------------------------- the rule


class CudaVisibleDevices(Rule):
    code = "AMP005"
    name = "cuda-visible-devices"
    message = (
        "CUDA_VISIBLE_DEVICES is misspelled, set after CUDA is initialised, or restricted to one GPU per "
        "process and then indexed with the rank: set it (spelled right) before any CUDA call, or use "
        "torch.cuda.set_device(rank)"
    )
    triggers = ("environ", "getenv", "putenv")
    fixable = "sometimes"

    @classmethod
    def triggered_by(cls, text: str, lowered: str) -> bool:
        # parse only files with an environment access and a string (or keyword) that is the
        # variable's name or a slip of it
        if not super().triggered_by(text, lowered) or not any(w in lowered for w in ("cuda", "visib", "devic")):
            return False
        candidates = set(_QUOTED.findall(text)) | set(_KEYWORD.findall(text))
        return any(c == TARGET or is_misspelling(c) for c in candidates)

    docs = """
`CUDA_VISIBLE_DEVICES` is read once, when CUDA initialises (cuInit). Three mistakes:

* **Misspelled name** (`CUDA_VISIBLE_DEVICE`, `cuda_visible_devices`, `CUDA_VISABLE_DEVICES`, ...) in
  `os.environ[...]`, `.get`, `.setdefault`, `.pop`, `.update`, `in os.environ`, `os.getenv`, `os.putenv`:
  the variable is silently ignored. Fix (safe): correct the name.
* **Set after CUDA is initialised** in the same function body or module level: `torch.cuda.is_available()`
  (it calls cuInit), `set_device`, `current_device`, `get_device_name`, `synchronize`, `.cuda()`, a tensor
  or module created on or moved to "cuda" ... The assignment then has no effect. `import torch`,
  `torch.device("cuda")`, `torch.cuda.device_count()` (NVML based) and `torch.cuda.manual_seed_all`
  (deferred) do not initialise CUDA: setting the variable after them is fine. Fix (unsafe, it reorders
  code; only for a module-level assignment whose value is known before `import torch`): move the
  assignment before the first `import torch`.
* **One GPU per process, then indexed with the rank**: after `CUDA_VISIBLE_DEVICES = str(rank)` the
  process sees only `cuda:0`, so `cuda:{rank}`, `set_device(rank)`, `device_ids=[rank]` fail for every
  rank but 0. Leave the variable alone and call `torch.cuda.set_device(rank)`. No fix.

Bad:
```python
import os
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
os.environ["CUDA_VISIBLE_DEVICES"] = "1"       # too late: CUDA is initialised

def worker(rank):
    os.environ["CUDA_VISIBLE_DEVICE"] = str(rank)   # misspelled
    model = Net().to(f"cuda:{rank}")
```

Good:
```python
import os
os.environ["CUDA_VISIBLE_DEVICES"] = "1"       # before torch touches CUDA
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"

def worker(rank):
    torch.cuda.set_device(rank)
    model = Net().to(f"cuda:{rank}")
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        env = _EnvCollector(model).run()
        yield from self._misspellings(model, env)
        late: Set[int] = set()
        for write in env.writes:
            v = self._after_init(model, write)
            if v is not None:
                late.add(id(write.node))
                yield v
        for write in env.writes:
            if id(write.node) not in late:
                yield from self._rank_index(model, write)

    # ------------------------------------------------------------------ (a)
    def _misspellings(self, model: AmpModel, env: _EnvCollector) -> Iterator[Violation]:
        seen: Set[int] = set()
        for k in env.keys:
            if id(k.node) in seen or not is_misspelling(k.key):
                continue
            seen.add(id(k.node))
            msg = (
                f"`{k.key}` is not `{TARGET}`: the misspelled variable is silently ignored; "
                f"spell it `{TARGET}`"
            )
            yield Violation(k.node, message=msg, fix=self._spelling_fix(k.node))

    @staticmethod
    def _spelling_fix(node: cst.CSTNode) -> Optional[Fix]:
        if isinstance(node, cst.Name):
            new: cst.CSTNode = node.with_changes(value=TARGET)
        elif isinstance(node, cst.SimpleString):
            prefix = node.prefix
            if "b" in prefix.lower():
                return None
            new = node.with_changes(value=f"{prefix}{node.quote}{TARGET}{node.quote}")
        else:
            return None
        return Fix({node: new}, safe=True, description=f"misspelled {TARGET} name corrected")

    # ------------------------------------------------------------------ (b)
    def _after_init(self, model: AmpModel, write: EnvWrite) -> Optional[Violation]:
        scope = model.scope_of(write.node)
        for call in model.calls_in_scope(scope):
            if call is write.node:
                continue
            if not (model.before(call, write.node) or model.is_ancestor(write.node, call)):
                break
            reason = cuda_init_reason(model, call)
            if reason is None or not _same_flow_before(model, call, write.node):
                continue
            msg = (
                f"{TARGET} is set after CUDA was initialised by `{reason}` on line {_line(model, call)}: "
                "CUDA reads it once, at initialisation, so this has no effect; set it before `import torch` "
                "(before any CUDA call)"
            )
            return Violation(write.node, message=msg, fix=self._move_fix(model, write))
        return None

    def _move_fix(self, model: AmpModel, write: EnvWrite) -> Optional[Fix]:
        stmt = model.statement_of(write.node)
        module = model.module
        if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
            return None
        if not any(s is stmt for s in module.body):
            return None
        small = stmt.body[0]
        if not (small is write.node or (isinstance(small, cst.Expr) and small.value is write.node)):
            return None
        torch_index = next((i for i, s in enumerate(module.body) if _imports_torch(s)), None)
        if torch_index is None:
            return None
        stmt_index = next(i for i, s in enumerate(module.body) if s is stmt)
        if stmt_index < torch_index:
            return None
        bound = _names_bound(module.body[:torch_index])
        if not _uses_only(stmt, bound):
            return None
        torch_stmt = module.body[torch_index]
        comments = [ln for ln in stmt.leading_lines if ln.comment is not None]
        moved = stmt.with_changes(leading_lines=[*torch_stmt.leading_lines, *comments])
        new_torch = torch_stmt.with_changes(leading_lines=[])
        return Fix(
            {stmt: cst.RemoveFromParent(), torch_stmt: cst.FlattenSentinel([moved, new_torch])},
            safe=False,
            description=f"{TARGET} assignment moved before import torch",
        )

    # ------------------------------------------------------------------ (c)
    def _rank_index(self, model: AmpModel, write: EnvWrite) -> Iterator[Violation]:
        var = _single_device_var(write.value)
        if var is None:
            return
        scope = model.scope_of(write.node)
        for use in _index_uses(model, scope, var):
            if not _same_flow_before(model, write.node, use):
                continue
            if _reassigned_between(model, var, scope, write.node, use):
                continue
            msg = (
                f"{TARGET} is set to the single GPU `{var}` on line {_line(model, write.node)}, so this process "
                f"sees only cuda:0 and `{var}` as a device index fails for every rank but 0; keep all GPUs "
                f"visible and pick this process's GPU with `torch.cuda.set_device({var})`"
            )
            yield Violation(use, message=msg)


# --------------------------------------------------------------------------- fix helpers


def _imports_torch(stmt: cst.CSTNode) -> bool:
    found = False

    class V(cst.CSTVisitor):
        def visit_Import(self, node: cst.Import) -> None:
            nonlocal found
            if any(dotted(a.name) is not None and (dotted(a.name) + ".").startswith("torch.") for a in node.names):
                found = True

        def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
            nonlocal found
            mod = dotted(node.module) if node.module is not None else None
            if not node.relative and mod is not None and (mod + ".").startswith("torch."):
                found = True

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return False

        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            return False

    stmt.visit(V())
    return found


def _names_bound(stmts) -> Set[str]:
    names: Set[str] = set()

    class V(cst.CSTVisitor):
        def visit_Import(self, node: cst.Import) -> None:
            for a in node.names:
                if a.asname is not None and isinstance(a.asname.name, cst.Name):
                    names.add(a.asname.name.value)
                else:
                    names.add((dotted(a.name) or "").split(".")[0])

        def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
            if isinstance(node.names, cst.ImportStar):
                return
            for a in node.names:
                if a.asname is not None and isinstance(a.asname.name, cst.Name):
                    names.add(a.asname.name.value)
                elif isinstance(a.name, cst.Name):
                    names.add(a.name.value)

        def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
            if isinstance(node.target, cst.Name):
                names.add(node.target.value)

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            names.add(node.name.value)
            return False

        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            names.add(node.name.value)
            return False

    for s in stmts:
        s.visit(V())
    return names


def _uses_only(stmt: cst.CSTNode, bound: Set[str]) -> bool:
    """Every name the statement loads is bound before the torch import (or a builtin)."""
    ok = True

    class V(cst.CSTVisitor):
        def visit_Attribute(self, node: cst.Attribute) -> bool:
            node.value.visit(self)
            return False

        def visit_Arg(self, node: cst.Arg) -> bool:
            node.value.visit(self)
            return False

        def visit_Name(self, node: cst.Name) -> None:
            nonlocal ok
            if node.value not in bound and node.value not in BUILTIN_NAMES:
                ok = False

        def visit_Lambda(self, node: cst.Lambda) -> bool:
            nonlocal ok
            ok = False
            return False

        def visit_GeneratorExp(self, node: cst.GeneratorExp) -> bool:
            nonlocal ok
            ok = False
            return False

    stmt.visit(V())
    return ok


# --------------------------------------------------------------------------- (c) helpers


def _single_device_var(value: Optional[cst.CSTNode]) -> Optional[str]:
    """V when the value is one device derived from V: V, str(V), f"{V}", "%d" % V, "{}".format(V)."""
    if value is None:
        return None
    if isinstance(value, (cst.Name, cst.Attribute)):
        return dotted(value)
    if isinstance(value, cst.Call):
        if isinstance(value.func, cst.Name) and value.func.value == "str" and len(value.args) == 1:
            arg = value.args[0]
            return dotted(arg.value) if arg.keyword is None and not arg.star else None
        if (
            isinstance(value.func, cst.Attribute)
            and value.func.attr.value == "format"
            and literal_string(value.func.value) in ("{}", "{0}", "{:d}")
            and len(value.args) == 1
        ):
            return dotted(value.args[0].value)
        return None
    if isinstance(value, cst.FormattedString):
        parts = value.parts
        if len(parts) == 1 and isinstance(parts[0], cst.FormattedStringExpression):
            p = parts[0]
            if p.conversion is None and p.format_spec is None:
                return dotted(p.expression)
        return None
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Modulo):
        if literal_string(value.left) in ("%d", "%s", "%i"):
            return dotted(value.right)
    return None


def _is_var(node: Optional[cst.CSTNode], var: str) -> bool:
    if node is None:
        return False
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value in ("int", "str"):
        return len(node.args) == 1 and dotted(node.args[0].value) == var
    return dotted(node) == var


def _index_uses(model: AmpModel, scope: cst.CSTNode, var: str) -> List[cst.CSTNode]:
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
            names = _qnames(model, func)
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


def _reassigned_between(model: AmpModel, var: str, scope: cst.CSTNode, a: cst.CSTNode, b: cst.CSTNode) -> bool:
    for node, _ in model.assignments.get(var, []):
        if model.scope_of(node) is scope and model.before(a, node) and model.before(node, b):
            return True
    return False
