"""The process environment: every literal variable name used with `os.environ`, `os.getenv`,
`os.putenv` (and copies of `os.environ` meant for child processes), and the variables set in
this process's environment, with their values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Set

import libcst as cst

from ampfix.model.syntax import get_arg, literal_string
from ampfix.model.tree import dotted

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


class Environ:
    """Environment accesses (a part of `AmpModel`)."""

    @property
    def environment(self) -> "_EnvCollector":
        env = getattr(self, "_environment", None)
        if env is None:
            env = self._environment = _EnvCollector(self).run()
        return env
