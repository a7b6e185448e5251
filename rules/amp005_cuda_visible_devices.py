"""AMP005 cuda-visible-devices.

Three mistakes with the `CUDA_VISIBLE_DEVICES` environment variable:

(a) the name is misspelled where the environment is read or written (silently ignored);
(b) it is set after CUDA was initialised in the same flow (it is read once, by cuInit);
(c) it is set per process to one GPU, and the process then indexes devices with the rank.
"""

from __future__ import annotations

import re
from typing import Iterator, List, Optional, Set

import libcst as cst

from ampfix.model import AmpModel, dotted, literal_string, names_bound, uses_only
from ampfix.model.environ import EnvKey, EnvWrite
from ampfix.model.events import CUDA_INIT
from ampfix.rule import SAFE, UNSAFE, FileContext, Fix, Rule, Violation

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
    fix_note = "misspelling: safe; set after CUDA init: unsafe move before `import torch`; rank indexing: none"

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
        env = model.environment
        yield from self._misspellings(model, env.keys)
        late: Set[int] = set()
        writes = [w for w in env.writes if w.key == TARGET]
        for write in writes:
            v = self._after_init(model, write)
            if v is not None:
                late.add(id(write.node))
                yield v
        for write in writes:
            if id(write.node) not in late:
                yield from self._rank_index(model, write)

    # ------------------------------------------------------------------ (a)
    def _misspellings(self, model: AmpModel, keys: List[EnvKey]) -> Iterator[Violation]:
        seen: Set[int] = set()
        for k in keys:
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
        return Fix({node: new}, applicability=SAFE, description=f"misspelled {TARGET} name corrected")

    # ------------------------------------------------------------------ (b)
    def _after_init(self, model: AmpModel, write: EnvWrite) -> Optional[Violation]:
        """CUDA initialised earlier in the same run of the function (or module) that sets the
        variable, directly or inside a call made before (`args = get_args()`)."""
        scope = model.function_of(write.node) or model.module
        trace = model.trace(scope)
        point = model.point(trace, write.node)
        inits = [i for i in trace.before(point, CUDA_INIT) if model.may_precede(trace, i, point)]
        # the message names an initialisation that runs on every path to the write where there is one
        always = next((i for i in inits if model.mandatory_between(i, None, point)), None)
        init = always or (inits[0] if inits else None)
        if init is not None:
            shown = init.path[0]
            via = "" if shown is init.node else f" inside `{model.code(shown)}` (line {model.line(shown)})"
            msg = (
                f"{TARGET} is set after CUDA was initialised by `{init.event.detail}` on line "
                f"{model.line(init.node)}{via}{'' if always else ' (on the paths that run it)'}: CUDA reads it "
                "once, at initialisation, so this has no effect; "
                "set it before `import torch` (before any CUDA call)"
            )
            return Violation(write.node, message=msg, fix=self._move_fix(model, write) if shown is init.node else None)
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
        if not uses_only(stmt, names_bound(module.body[:torch_index])):
            return None
        torch_stmt = module.body[torch_index]
        comments = [ln for ln in stmt.leading_lines if ln.comment is not None]
        moved = stmt.with_changes(leading_lines=[*torch_stmt.leading_lines, *comments])
        new_torch = torch_stmt.with_changes(leading_lines=[])
        return Fix(
            {stmt: cst.RemoveFromParent(), torch_stmt: cst.FlattenSentinel([moved, new_torch])},
            applicability=UNSAFE,
            description=f"{TARGET} assignment moved before import torch",
        )

    # ------------------------------------------------------------------ (c)
    def _rank_index(self, model: AmpModel, write: EnvWrite) -> Iterator[Violation]:
        var = _single_device_var(write.value)
        if var is None:
            return
        scope = model.scope_of(write.node)
        trace = model.trace(scope)
        at = model.point(trace, write.node)
        for use in model.device_index_uses(scope, var):
            if not model.may_precede(trace, at, model.point(trace, use)):
                continue
            if _reassigned_between(model, var, scope, write.node, use):
                continue
            msg = (
                f"{TARGET} is set to the single GPU `{var}` on line {model.line(write.node)}, so this process "
                f"sees only cuda:0 and `{var}` as a device index fails for every rank but 0; keep all GPUs "
                f"visible and pick this process's GPU with `torch.cuda.set_device({var})`"
            )
            yield Violation(use, message=msg)


# --------------------------------------------------------------------------- helpers


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


def _reassigned_between(model: AmpModel, var: str, scope: cst.CSTNode, a: cst.CSTNode, b: cst.CSTNode) -> bool:
    for node, _ in model.assignments.get(var, []):
        if model.scope_of(node) is scope and model.before(a, node) and model.before(node, b):
            return True
    return False
