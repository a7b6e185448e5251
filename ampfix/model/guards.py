"""Code that must not be modernised: fallbacks for an old torch.

* `in_fallback`: inside `except ImportError/ModuleNotFoundError/AttributeError/TypeError:`,
  the branch that runs only where the modern API is missing;
* `in_version_branch`: in a branch of an `if` that picks between torch versions (its test
  names a version or probes `torch.amp`, or its other branch uses the modern `torch.amp`
  spelling), the fallback operand of `getattr(torch.amp, ...) or ...`, or after an early
  `return` of such a test;
* `has_modern_alternative`: the same, but a test that merely names a version does not count
  (used for imports, whose branch under a version test may be the new path of its day).
"""

from __future__ import annotations

import re

import libcst as cst

from ampfix.model.facet import Facet
from ampfix.model.syntax import literal_string
from ampfix.model.tree import child_nodes, dotted

FALLBACK_ERRORS = {"ImportError", "ModuleNotFoundError", "AttributeError", "TypeError"}
VERSION_TEST = re.compile(r"version|TORCH_\d|TORCH_(?:GREATER|LESS|GE|LT|AT_LEAST)|_TORCH_\w*\d", re.IGNORECASE)
MODERN_KINDS = {"autocast", "GradScaler", "custom_fwd", "custom_bwd"}


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
                if by_test and VERSION_TEST.search(self.model.code(anc.test)):
                    return True
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
            if isinstance(prev, cst.If) and isinstance(prev.body, cst.IndentedBlock) and prev.body.body:
                last = prev.body.body[-1]
                returns = isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[-1], (cst.Return, cst.Raise))
                if returns and (VERSION_TEST.search(self.model.code(prev.test)) or self._uses_modern_api(prev.body)):
                    return True
        return False

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
