"""Code that must not be modernised: fallbacks for an old torch.

* `in_fallback`: inside `except ImportError/ModuleNotFoundError/AttributeError/TypeError:`,
  the branch that runs only where the modern API is missing;
* `in_version_branch`: in a branch of an `if` that picks between torch versions (its test
  names a version or probes `torch.amp`, or its other branch uses the modern `torch.amp`
  spelling), the fallback operand of `getattr(torch.amp, ...) or ...`, or after an early
  `return` of such a test; not the branch every torch from 2.4 on takes, where the test reads
  (`modern_torch_takes`: `else` of `if digit_version(TORCH_VERSION) < digit_version("1.10")`),
  which is the code that runs, and warns (`modern_version_test` names that test);
* `has_modern_alternative`: the same, but a test that merely names a version does not count
  (used for imports, whose branch under a version test may be the new path of its day).
"""

from __future__ import annotations

import re
from typing import Optional, Tuple

import libcst as cst

from ampfix.model.facet import Facet
from ampfix.model.syntax import literal_string
from ampfix.model.tree import child_nodes, dotted

FALLBACK_ERRORS = {"ImportError", "ModuleNotFoundError", "AttributeError", "TypeError"}
VERSION_TEST = re.compile(r"version|TORCH_\d|TORCH_(?:GREATER|LESS|GE|LT|AT_LEAST)|_TORCH_\w*\d", re.IGNORECASE)
MODERN_KINDS = {"autocast", "GradScaler", "custom_fwd", "custom_bwd"}
MODERN_TORCH = (2, 4)  # the first torch to deprecate torch.cuda.amp and the device-specific autocast state
# the torch version as a project names it (`TORCH_VERSION = torch.__version__`), and what wraps a version to compare it
TORCH_VERSION_NAME = re.compile(r"^_?torch_version$", re.IGNORECASE)
VERSION_WRAPPERS = {"digit_version", "parse", "parse_version", "Version", "LooseVersion", "StrictVersion"}
VERSION_LITERAL = re.compile(r"^\s*v?(\d+(?:\.\d+)*)(?:[.+\-]?[A-Za-z0-9.+\-]*)?\s*$")
# `V op L` where V (any torch from 2.4 on) is above L (a version below 2.4)
ABOVE = {cst.LessThan: False, cst.LessThanEqual: False, cst.GreaterThan: True, cst.GreaterThanEqual: True,
         cst.Equal: False, cst.NotEqual: True}
FLIPPED = {cst.LessThan: cst.GreaterThan, cst.LessThanEqual: cst.GreaterThanEqual, cst.GreaterThan: cst.LessThan,
           cst.GreaterThanEqual: cst.LessThanEqual, cst.Equal: cst.Equal, cst.NotEqual: cst.NotEqual}
OPERATORS = {"<": cst.LessThan, "<=": cst.LessThanEqual, ">": cst.GreaterThan, ">=": cst.GreaterThanEqual,
             "==": cst.Equal, "!=": cst.NotEqual}


class Guards(Facet):
    """Old-torch fallbacks, stage and version branches (`model.guards`)."""

    def in_fallback(self, node: cst.CSTNode) -> bool:
        """Inside `except ImportError/AttributeError/TypeError:` (a fallback for an old torch), or
        inside a bare `except:` (or `except Exception:`) of a `try` whose body spells `torch.amp`
        (megatron-core's shim: `try: if is_torch_min_version("2.4"): custom_fwd =
        partial(torch.amp.custom_fwd, ...) ... except: custom_fwd = torch.cuda.amp.custom_fwd`)."""
        for anc in self.model.ancestors(node):
            if not isinstance(anc, cst.ExceptHandler):
                continue
            types = [] if anc.type is None else anc.type.elements if isinstance(anc.type, cst.Tuple) else [anc.type]
            names = {dotted(t.value if isinstance(t, cst.Element) else t) for t in types}
            if names & FALLBACK_ERRORS:
                return True
            if (anc.type is None or names <= {"Exception", "BaseException"}) and self._try_prefers_torch_amp(anc):
                return True
        return False

    def _try_prefers_torch_amp(self, handler: cst.ExceptHandler) -> bool:
        """The `try` that `handler` belongs to spells `torch.amp` in its body."""
        owner = self.model.parent(handler)
        return isinstance(owner, cst.Try) and "torch.amp" in self.model.code(owner.body)

    def in_stage_test(self, node: cst.CSTNode) -> bool:
        """`node` runs under a test of the GradScaler's per-optimizer stage (`if
        scaler._per_optimizer_states[id(opt)]["stage"] is not OptState.UNSCALED:`): code that
        unscales only what is not unscaled yet, so it cannot unscale twice."""
        for anc in self.model.ancestors(node):
            if isinstance(anc, (cst.If, cst.IfExp)):
                test = self.model.code(anc.test)
                if "OptState" in test or "_per_optimizer_states" in test:
                    return True
            if isinstance(anc, (cst.FunctionDef, cst.ClassDef)):
                return False
        return False

    def in_version_branch(self, node: cst.CSTNode) -> bool:
        """In a branch that picks between torch versions (see the module docstring): the old
        spelling there is the old-torch path, written on purpose."""
        return self._version_choice(node, by_test=True)

    def has_modern_alternative(self, node: cst.CSTNode) -> bool:
        """The old spelling at `node` is the fallback of a shim that prefers `torch.amp`: the
        other branch of its `if` (or conditional expression) uses the modern spelling, its test
        probes `torch.amp` (`hasattr(torch.amp, "GradScaler")`), it is the right operand of
        `getattr(torch.amp, "custom_fwd", None) or torch.cuda.amp.custom_fwd`, or it follows an
        early `return` of the modern spelling. (A test that only names a version does not say
        which branch is the old one: `if TORCH_GE_1_6: from torch.cuda.amp import GradScaler`
        is the new path of its day.)"""
        return self._version_choice(node, by_test=False)

    def _version_choice(self, node: cst.CSTNode, by_test: bool) -> bool:
        child = node
        for anc in self.model.ancestors(node):
            if isinstance(anc, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                return False
            if isinstance(anc, (cst.If, cst.IfExp)) and child is not anc.test:
                if by_test and VERSION_TEST.search(self.model.code(anc.test)) \
                        and self.modern_torch_takes(anc.test) is not (child is anc.body):
                    return True  # (not the branch torch 2.4 and later take: the code that runs there)
                if self._probes_modern(anc.test):
                    return True
                other = anc.orelse if child is anc.body else anc.body
                if other is not None and self._uses_modern_api(other):
                    return True
            if isinstance(anc, cst.BooleanOperation) and isinstance(anc.operator, cst.Or) and child is anc.right \
                    and self._uses_modern_api(anc.left):
                return True
            # classes accepted beside the modern one: `(torch.cuda.amp.GradScaler, torch.amp.GradScaler)`,
            # `(torch.cuda.amp.GradScaler,) + ((torch.amp.GradScaler,) if TORCH_2_3 else ())` (an isinstance shim)
            if isinstance(anc, cst.Tuple) and any(e is not child and self._uses_modern_api(e) for e in anc.elements):
                return True
            if isinstance(anc, cst.BinaryOperation) and isinstance(anc.operator, cst.Add) \
                    and self._uses_modern_api(anc.right if child is anc.left else anc.left):
                return True
            if isinstance(anc, (cst.IndentedBlock, cst.Module)) and self._after_early_return(anc, child):
                return True
            child = anc
        return False

    def _probes_modern(self, test: cst.CSTNode) -> bool:
        """`test` asks whether this torch has `torch.amp` (or one of its names): `hasattr(torch,
        "amp")`, `hasattr(torch.amp, "custom_fwd")`, `"GradScaler" in dir(torch.amp)`,
        `importlib.util.find_spec("torch.amp")`."""
        for n in self._nodes_in(test, cst.Call):
            if n.args and "importlib.util.find_spec" in self.model.qualnames(n.func) \
                    and (literal_string(n.args[0].value) or "").startswith("torch.amp"):
                return True  # `importlib.util.find_spec("torch.amp")`
            if isinstance(n.func, cst.Name) and n.func.value in ("hasattr", "getattr", "dir") and n.args:
                owner = self.model.qualnames(n.args[0].value)
                attr = literal_string(n.args[1].value) if len(n.args) > 1 else None
                if "torch.amp" in owner or ("torch" in owner and attr == "amp"):
                    return True
        return False

    def _nodes_in(self, subtree: cst.CSTNode, kind: type) -> list:
        out, stack = [], [subtree]
        while stack:
            n = stack.pop()
            if isinstance(n, kind):
                out.append(n)
            stack.extend(child_nodes(n))
        return out

    def _after_early_return(self, block: cst.CSTNode, stmt: cst.CSTNode) -> bool:
        """`if <version test>: return <torch.amp ...>` earlier in the same block."""
        for prev in block.body:
            if prev is stmt:
                return False
            if _returns(prev) and ((VERSION_TEST.search(self.model.code(prev.test))  # type: ignore[attr-defined]
                                    and self.modern_torch_takes(prev.test) is not False)  # type: ignore[attr-defined]
                                   or self._uses_modern_api(prev.body)):  # type: ignore[attr-defined]
                return True
        return False

    # ------------------------------------------------------------------ version tests that read
    def modern_version_test(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        """The test on the torch version of the innermost `if` (or conditional expression, or
        early return) in the function running `node` that lets every torch from 2.4 on through
        to it (`modern_torch_takes`), which older torch passes too: the code runs on those."""
        child = node
        for anc in self.model.ancestors(node):
            if isinstance(anc, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                return None
            if isinstance(anc, (cst.If, cst.IfExp)) and child is not anc.test \
                    and self.modern_torch_takes(anc.test) is (child is anc.body):
                return anc.test
            if isinstance(anc, (cst.IndentedBlock, cst.Module)):
                for prev in anc.body:
                    if prev is child:
                        break
                    if _returns(prev) and self.modern_torch_takes(prev.test) is False:
                        return prev.test  # (`if <old torch>: return ...` before it)
            child = anc
        return None

    def modern_torch_takes(self, test: cst.CSTNode) -> Optional[bool]:
        """What `test` is on every torch from 2.4 on, where it compares the torch version
        (`torch.__version__`, a name `TORCH_VERSION`, either in `digit_version(...)`,
        `version.parse(...)`, `LooseVersion(...)`) with versions below 2.4 (`"1.10.0"`, `(1, 10)`,
        in the same wrappers), or is `is_torch_version(">=", "1.10")`; through `not`, `and`, `or`
        and chained comparisons. None: not known (another test, a version at or above 2.4)."""
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            inner = self.modern_torch_takes(test.expression)
            return None if inner is None else not inner
        if isinstance(test, cst.BooleanOperation):
            sides = (self.modern_torch_takes(test.left), self.modern_torch_takes(test.right))
            decides = isinstance(test.operator, cst.Or)  # the value that decides `or` (True) or `and` (False)
            return decides if decides in sides else None if None in sides else not decides
        if isinstance(test, cst.Comparison):
            left, values = test.left, []
            for target in test.comparisons:
                values.append(self._compare(left, type(target.operator), target.comparator))
                left = target.comparator
            return False if False in values else None if None in values else True
        if isinstance(test, cst.Call) and _last_name(test.func) == "is_torch_version" and len(test.args) == 2 \
                and not any(a.keyword or a.star for a in test.args):
            op, version = OPERATORS.get(literal_string(test.args[0].value) or ""), \
                _version(literal_string(test.args[1].value))
            return ABOVE[op] if op is not None and version is not None and version < MODERN_TORCH else None
        return None

    def _compare(self, left: cst.BaseExpression, op: type, right: cst.BaseExpression) -> Optional[bool]:
        """`left op right`, one side the torch version, the other a version below 2.4, on every
        torch from 2.4 on; None: not known (the two not comparable as versions)."""
        if op not in ABOVE:
            return None
        mine, theirs = self._torch_side(left), self._literal_side(right)
        if mine is None or theirs is None:
            mine, theirs, op = self._torch_side(right), self._literal_side(left), FLIPPED[op]
        if mine is None or theirs is None:
            return None
        (torch_kind, (literal_kind, version)) = mine, theirs
        if torch_kind == "wrapped" and literal_kind != "wrapped":
            return None  # `digit_version(v) < "1.10"`: not compared as versions
        if torch_kind == "name" and literal_kind == "str" and version[0] >= 2:
            return None  # a plain string may compare as text: "2.10" < "2.3"
        return ABOVE[op]

    def _torch_side(self, expr: cst.BaseExpression, wrapped: bool = False) -> Optional[str]:
        if isinstance(expr, cst.Call) and not wrapped and _last_name(expr.func) in VERSION_WRAPPERS \
                and len(expr.args) == 1 and not expr.args[0].keyword and not expr.args[0].star:
            return "wrapped" if self._torch_side(expr.args[0].value, wrapped=True) else None
        if self.model.qualnames(expr) & {"torch.__version__", "torch.version.__version__"}:
            return "torch.__version__"
        name = _last_name(expr)
        return "name" if name is not None and TORCH_VERSION_NAME.match(name) else None

    def _literal_side(self, expr: cst.BaseExpression) -> Optional[Tuple[str, Tuple[int, ...]]]:
        """("str" | "tuple" | "wrapped", the version) of a literal version below 2.4."""
        kind, version = "str", _version(literal_string(expr))
        if isinstance(expr, cst.Call) and _last_name(expr.func) in VERSION_WRAPPERS and len(expr.args) == 1 \
                and not expr.args[0].keyword and not expr.args[0].star:
            kind, version = "wrapped", _version(literal_string(expr.args[0].value))
        elif isinstance(expr, cst.Tuple) and expr.elements:
            parts = [e.value for e in expr.elements]
            kind = "tuple"
            version = tuple(int(p.value) for p in parts) if all(isinstance(p, cst.Integer) and p.value.isdigit()
                                                                for p in parts) else None
        return (kind, version) if version is not None and version < MODERN_TORCH else None

    def _uses_modern_api(self, subtree: cst.CSTNode) -> bool:
        for n in self.model.nodes_of(cst.Attribute, cst.Name):
            api = self.model.api_of(n)
            if api is not None and api.kind in MODERN_KINDS and not api.deprecated \
                    and (n is subtree or self.model.is_ancestor(subtree, n)):  # `torch.amp.autocast` itself, as a value
                return True
        # `from torch.amp import GradScaler` (its name may also be bound to the old class elsewhere)
        for imp in self.model.nodes_of(cst.ImportFrom):
            if (imp is subtree or self.model.is_ancestor(subtree, imp)) and imp.module is not None and not imp.relative and dotted(imp.module) == "torch.amp" and (
                    isinstance(imp.names, cst.ImportStar)
                    or any(dotted(a.name) in MODERN_KINDS for a in imp.names)):  # type: ignore[union-attr]
                return True
        # `getattr(torch.amp, "custom_fwd", None)`: the modern name, looked up
        for call in self.model.calls:
            if isinstance(call.func, cst.Name) and call.func.value == "getattr" and len(call.args) > 1 \
                    and (call is subtree or self.model.is_ancestor(subtree, call)) \
                    and "torch.amp" in self.model.qualnames(call.args[0].value) \
                    and literal_string(call.args[1].value) in MODERN_KINDS:
                return True
        return False


def _returns(stmt: cst.CSTNode) -> bool:
    """`if <test>: ... return/raise`: an `if` whose block ends by leaving."""
    if not (isinstance(stmt, cst.If) and isinstance(stmt.body, cst.IndentedBlock) and stmt.body.body):
        return False
    last = stmt.body.body[-1]
    return isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[-1], (cst.Return, cst.Raise))


def _last_name(expr: cst.CSTNode) -> Optional[str]:
    """`x` of `x` or of `a.b.x`."""
    return expr.value if isinstance(expr, cst.Name) else expr.attr.value if isinstance(expr, cst.Attribute) else None


def _version(text: Optional[str]) -> Optional[Tuple[int, ...]]:
    """The release numbers of a version's text ("1.10.0a0": (1, 10, 0)); None: not a version."""
    found = VERSION_LITERAL.match(text) if text is not None else None
    return tuple(int(p) for p in found.group(1).split(".")) if found else None
