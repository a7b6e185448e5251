"""AMP005 cuda-visible-devices.

Three mistakes with the `CUDA_VISIBLE_DEVICES` environment variable:

(a) the name is misspelled where the environment is read or written (silently ignored);
(b) it is set after CUDA was initialised in the same flow (it is read once, by cuInit);
(c) it is set per process to one GPU, and the process then indexes devices with the rank.
"""

from __future__ import annotations

from typing import Iterator, List, Optional, Set

import libcst as cst

from ampfix.fixes.edits import move_before_import
from ampfix.model import AmpModel
from ampfix.model.environ import TARGET, EnvKey, EnvWrite, is_misspelling, may_name_visible_devices, single_device_var
from ampfix.model.events import CUDA_INIT
from ampfix.rule import SAFE, UNSAFE, FileContext, Fix, Rule, Violation

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
        return may_name_visible_devices(text)

    docs = """
`CUDA_VISIBLE_DEVICES` is read once, when CUDA initialises (cuInit). Three mistakes:

* **Misspelled name** (`CUDA_VISIBLE_DEVICE`, `cuda_visible_devices`, `CUDA_VISABLE_DEVICES`, ...) in
  `os.environ[...]`, `.get`, `.setdefault`, `.pop`, `.update`, `in os.environ`, `os.getenv`, `os.putenv`:
  the variable is silently ignored. Fix (safe): correct the name.
* **Set after CUDA is initialised** in the same function body or module level: `torch.cuda.is_available()`
  (it calls cuInit), `set_device`, `current_device`, `get_device_name`, `synchronize`, `.cuda()`, a tensor
  or module created on or moved to "cuda" ... The assignment then has no effect. `import torch`,
  `torch.device("cuda")`, `torch.cuda.device_count()` (NVML based) and `torch.cuda.manual_seed_all`
  (deferred) do not initialise CUDA: setting the variable after them is fine. Nor is a process
  that picks its own GPU first, with `torch.cuda.set_device(local_rank)` on every path, and then
  writes a value naming the same variable (`str(devices[local_rank])`): that is for the processes
  it launches. Nor is a write in a file that starts child processes (`torch.multiprocessing.spawn`
  / `start_processes`, `multiprocessing` `Process` / `Pool`, `ProcessPoolExecutor`, `subprocess`,
  `os.system` / `exec*` / `spawn*`) that none of them runs (a trainer probes CUDA and sets the
  variable in one method, another starts the DDP workers with `mp.spawn`): the children inherit
  the environment and initialise CUDA after reading it (a write that a launched child runs itself
  is still reported). Fix (unsafe, it reorders code; only for a module-level assignment whose
  value is known before `import torch`): move the assignment before the first `import torch`.
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
            # this process picked its GPU itself, and the value names it too: the variable can only
            # be meant for the processes it launches (neither late nor this one's devices)
            if model.device_chosen_before(write):
                late.add(id(write.node))
                continue
            v = self._after_init(model, write)
            if v is not None:
                late.add(id(write.node))
                # a child process that does not run the write may be what it is set for (unimol-tools'
                # trainer sets it in `_init_dist` after `is_available()`, `fit_predict` starts the
                # workers with `mp.spawn`); where the file launches nothing, it is for this process
                if not model.launches_not_running(write.node):
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
        """The module-level statement that only sets the variable, moved before `import torch`."""
        stmt = model.statement_of(write.node)
        if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
            return None
        small = stmt.body[0]
        if not (small is write.node or (isinstance(small, cst.Expr) and small.value is write.node)):
            return None
        edit = move_before_import(model, stmt, "torch")
        return None if edit is None else Fix(edit, applicability=UNSAFE,
                                             description=f"{TARGET} assignment moved before import torch")

    # ------------------------------------------------------------------ (c)
    def _rank_index(self, model: AmpModel, write: EnvWrite) -> Iterator[Violation]:
        var = single_device_var(write.value)
        if var is None:
            return
        scope = model.scope_of(write.node)
        trace = model.trace(scope)
        at = model.point(trace, write.node)
        for use in model.device_index_uses(scope, var):
            if not model.may_precede(trace, at, model.point(trace, use)):
                continue
            if model.bound.assigned_between(var, scope, write.node, use):
                continue
            msg = (
                f"{TARGET} is set to the single GPU `{var}` on line {model.line(write.node)}, so this process "
                f"sees only cuda:0 and `{var}` as a device index fails for every rank but 0; keep all GPUs "
                f"visible and pick this process's GPU with `torch.cuda.set_device({var})`"
            )
            yield Violation(use, message=msg)
