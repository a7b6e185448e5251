"""The process environment: every literal variable name used with `os.environ`, `os.getenv`,
`os.putenv` (and copies of `os.environ` meant for child processes), and the variables set in
this process's environment, with their values; and the calls that start child processes, which
inherit the environment and read it when they start (`launches`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Optional, Set

import libcst as cst

from ampfix.model.events import CUDA_INIT
from ampfix.model.syntax import get_arg, literal_string
from ampfix.model.tree import dotted, nodes_under

ENV_KEY_METHODS = {"get", "setdefault", "pop", "__getitem__", "__setitem__", "__delitem__", "__contains__"}


@dataclass
class EnvKey:
    """A variable name used to access the process environment (or a copy of it)."""

    node: cst.CSTNode  # the string literal, or the keyword Name of update(KEY=...)
    key: str
    real_env: bool  # os.environ / os.putenv itself, not a copy meant for a child process


@dataclass
class EnvWrite:
    """A variable set in this process's environment."""

    key: str
    node: cst.CSTNode  # the Assign or Call that sets it
    value: Optional[cst.BaseExpression]


def _is_name(model, node: cst.CSTNode, qualname: str) -> bool:
    names = {q.name for q in model.qualified_names(node)}
    if names:
        return qualname in names
    return dotted(node) == qualname


def _is_environ(model, node: cst.CSTNode) -> bool:
    return isinstance(node, (cst.Name, cst.Attribute)) and _is_name(model, node, "os.environ")


def _is_environ_copy_value(model, value: cst.CSTNode) -> bool:
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

    def __init__(self, model):
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
                    if key is not None and write_node is not None:
                        self.writes.append(EnvWrite(key, write_node, el.value))
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "dict":
            for arg in node.args:
                if arg.keyword is not None:
                    key = self._add_key(arg.keyword, real)
                    if key is not None and write_node is not None:
                        self.writes.append(EnvWrite(key, write_node, arg.value))
                elif arg.star == "" and isinstance(arg.value, cst.Dict):
                    self._dict_items(arg.value, real, write_node)

    def run(self) -> "_EnvCollector":
        """One look at each subscript, assignment, comparison and call (from the model's index)."""
        collector = self
        model = self.model

        class V:
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
                        key = literal_string(sl.value) if isinstance(sl, cst.Index) else None
                        if key is not None:
                            collector.writes.append(EnvWrite(key, node, node.value))

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
                        if key is not None and _is_name(model, func, "os.putenv"):
                            val = get_arg(node, 1, "value")
                            collector.writes.append(EnvWrite(key, node, val.value if val else None))
                    return
                real = collector._env_target(func.value) if isinstance(func, cst.Attribute) else None
                if isinstance(func, cst.Attribute) and real is not None:
                    method = func.attr.value
                    if method in ENV_KEY_METHODS:
                        arg = get_arg(node, 0, None)
                        if arg is not None:
                            key = collector._add_key(arg.value, real)
                            if key is not None and real and method == "setdefault":
                                val = get_arg(node, 1, None)
                                collector.writes.append(EnvWrite(key, node, val.value if val else None))
                    if method == "update":
                        for arg in node.args:
                            if arg.keyword is not None:
                                key = collector._add_key(arg.keyword, real)
                                if key is not None and real:
                                    collector.writes.append(EnvWrite(key, node, arg.value))
                            elif arg.star == "":
                                collector._dict_items(arg.value, real, node if real else None)
                    return
                # subprocess.run(..., env={**os.environ, "KEY": ...})
                env_arg = get_arg(node, None, "env")
                if env_arg is not None and _is_environ_copy_value(model, env_arg.value):
                    collector._dict_items(env_arg.value, False, None)

        v = V()
        for node in model.nodes_of(cst.Subscript, cst.Assign, cst.Comparison, cst.Call):
            getattr(v, f"visit_{type(node).__name__}")(node)
        return self


# --------------------------------------------------------------------------- child processes

# Calls that start another process: a fresh interpreter or program that inherits this process's
# environment (as it is when the call runs) and initialises CUDA, if at all, by itself. The value:
# where the function the child runs is given (positional index, keyword), or None.
_MP = ("multiprocessing", "torch.multiprocessing")
LAUNCHERS = {
    **{f"torch.multiprocessing{m}.{f}": (0, "fn") for m in ("", ".spawn") for f in ("spawn", "start_processes")},
    **{f"{p}.Process": (1, "target") for p in _MP},
    **{f"{p}.Pool": None for p in _MP},
    "multiprocessing.pool.Pool": None,
    "multiprocessing.process.BaseProcess": (1, "target"),
    "concurrent.futures.ProcessPoolExecutor": None,
    "concurrent.futures.process.ProcessPoolExecutor": None,
    **{f"subprocess.{f}": None
       for f in ("Popen", "run", "call", "check_call", "check_output", "getoutput", "getstatusoutput")},
    **{f"os.{f}": None for f in ("system", "popen", "posix_spawn", "posix_spawnp")},
    **{f"os.exec{s}": None for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")},
    **{f"os.spawn{s}": None for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")},
    **{f"asyncio.create_subprocess_{f}": None for f in ("exec", "shell")},
}
_CONTEXT_LAUNCHERS = {"Process": (1, "target"), "Pool": None, "ProcessPoolExecutor": None}


@dataclass
class Launch:
    """A call that starts child processes."""

    call: cst.Call
    runs: List[cst.FunctionDef]  # the functions of this file the children run (empty: a program, or unknown)


class Environ:
    """Environment accesses (a part of `AmpModel`)."""

    @property
    def environment(self) -> "_EnvCollector":
        env = getattr(self, "_environment", None)
        if env is None:
            env = self._environment = _EnvCollector(self).run()
        return env

    @property
    def launches(self) -> List[Launch]:
        """Every call of this file that starts child processes: `torch.multiprocessing.spawn` /
        `start_processes`, `multiprocessing` `Process` / `Pool` (also of a `get_context(...)`),
        `ProcessPoolExecutor`, `subprocess.*`, `os.system` / `exec*` / `spawn*`, asyncio's
        subprocesses; with the functions of this file the children run, where given
        (`mp.spawn(self.worker, ...)`, `Process(target=worker)`)."""
        found = self.__dict__.get("_launches")
        if found is None:
            found = self._launches = []
            for call in self.nodes_of(cst.Call):
                where = self._launcher(call)
                if where is False:
                    continue
                runs: List[cst.FunctionDef] = []
                if where is not None:
                    arg = get_arg(call, where[0], where[1])
                    if arg is not None and isinstance(arg.value, (cst.Name, cst.Attribute)):
                        runs = list(self._resolve_callable(arg.value, call, 0))
                found.append(Launch(call, runs))
        return found

    def launches_not_running(self, node: cst.CSTNode) -> List[Launch]:
        """The launches of this file whose children run none of the functions whose runs may
        reach `node` (`functions_reaching`): those children inherit the environment as `node`
        may leave it, and read it when they start (a launch of a program, or of what the file
        does not name, runs none of them). Empty where the file launches nothing."""
        launches = self.launches
        if not launches:
            return []
        running = {id(f) for f in self.functions_reaching(node)}
        return [launch for launch in launches if not any(id(f) in running for f in launch.runs)]

    def device_chosen_before(self, write: EnvWrite) -> bool:
        """This process picks its GPU itself before `write`, with `torch.cuda.set_device(x)` on
        every path of its function (or module) to it, and the value written names `x` too
        (`set_device(local_rank)`, then `CUDA_VISIBLE_DEVICES = str(devices[local_rank])`)."""
        written = {n.value for n in nodes_under(write.value, cst.Name)} if write.value is not None else set()
        if not written:
            return False
        trace = self.trace(self.function_of(write.node) or self.module)
        point = self.point(trace, write.node)
        for i in trace.before(point, CUDA_INIT):
            if i.event.detail == "torch.cuda.set_device()" and isinstance(i.node, cst.Call) and i.node.args \
                    and self.mandatory_between(i, None, point):
                chosen = {n.value for a in i.node.args for n in nodes_under(a.value, cst.Name)}
                if chosen & written:
                    return True
        return False

    def _launcher(self, call: cst.Call):
        """False when `call` starts no process, else where it names what the child runs (or None)."""
        func = call.func
        for q in self.qualnames(call):
            if q in LAUNCHERS:
                return LAUNCHERS[q]
        if isinstance(func, cst.Attribute) and func.attr.value in _CONTEXT_LAUNCHERS:
            # mp.get_context("spawn").Process(...), ctx = mp.get_context(...); ctx.Pool(...)
            owner = func.value
            values = [owner] if isinstance(owner, cst.Call) else self.possible_values(owner)
            contexts = {f"{p}.get_context" for p in _MP}
            if any(isinstance(v, cst.Call) and self.qualnames(v) & contexts for v in values):
                return _CONTEXT_LAUNCHERS[func.attr.value]
        return False


# --------------------------------------------------------------------------- the variable's name, and its slips


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


def may_name_visible_devices(text: str) -> bool:
    """`text` holds CUDA_VISIBLE_DEVICES, or a slip of it, as a quoted string or a keyword
    (`KEY=`): the test a file passes before its environment accesses are read (AMP005)."""
    candidates = set(_QUOTED.findall(text)) | set(_KEYWORD.findall(text))
    return any(c == TARGET or is_misspelling(c) for c in candidates)


def single_device_var(value: Optional[cst.CSTNode]) -> Optional[str]:
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
