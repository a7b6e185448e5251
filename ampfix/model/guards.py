"""Code that must not be modernised: fallbacks for an old torch.

* `in_fallback`: inside `except ImportError/ModuleNotFoundError/AttributeError/TypeError:`,
  the branch that runs only where the modern API is missing;
* `in_version_branch`: in a branch of an `if` that picks between torch versions (its test
  names a version, or its other branch uses the modern `torch.amp` spelling), or after an
  early `return` of such a test.
"""

from __future__ import annotations

import re

import libcst as cst

from ampfix.model.tree import dotted

FALLBACK_ERRORS = {"ImportError", "ModuleNotFoundError", "AttributeError", "TypeError"}
VERSION_TEST = re.compile(r"version|TORCH_\d|TORCH_(?:GREATER|LESS|GE|LT|AT_LEAST)|_TORCH_\w*\d", re.IGNORECASE)
MODERN_KINDS = {"autocast", "GradScaler", "custom_fwd", "custom_bwd"}


class Guards:
    """Old-torch fallbacks (a part of `AmpModel`)."""

    def in_fallback(self, node: cst.CSTNode) -> bool:
        """Inside `except ImportError/AttributeError/TypeError:` (a fallback for an old torch)."""
        for anc in self.ancestors(node):
            if isinstance(anc, cst.ExceptHandler) and anc.type is not None:
                types = anc.type.elements if isinstance(anc.type, cst.Tuple) else [anc.type]
                names = {dotted(t.value if isinstance(t, cst.Element) else t) for t in types}
                if names & FALLBACK_ERRORS:
                    return True
        return False

    def in_version_branch(self, node: cst.CSTNode) -> bool:
        """In a branch that picks between torch versions (see the module docstring): the old
        spelling there is the old-torch path, written on purpose."""
        child = node
        for anc in self.ancestors(node):
            if isinstance(anc, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                return False
            if isinstance(anc, (cst.If, cst.IfExp)) and child is not anc.test:
                if VERSION_TEST.search(self.code(anc.test)):
                    return True
                other = anc.orelse if child is anc.body else anc.body
                if other is not None and self._uses_modern_api(other):
                    return True
            if isinstance(anc, (cst.IndentedBlock, cst.Module)) and self._after_early_return(anc, child):
                return True
            child = anc
        return False

    def _after_early_return(self, block: cst.CSTNode, stmt: cst.CSTNode) -> bool:
        """`if <version test>: return <torch.amp ...>` earlier in the same block."""
        for prev in block.body:
            if prev is stmt:
                return False
            if isinstance(prev, cst.If) and isinstance(prev.body, cst.IndentedBlock) and prev.body.body:
                last = prev.body.body[-1]
                returns = isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[-1], (cst.Return, cst.Raise))
                if returns and (VERSION_TEST.search(self.code(prev.test)) or self._uses_modern_api(prev.body)):
                    return True
        return False

    def _uses_modern_api(self, subtree: cst.CSTNode) -> bool:
        for n in self.nodes_of(cst.Attribute, cst.Name):
            api = self.api_of(n)
            if api is not None and api.kind in MODERN_KINDS and not api.deprecated and self.is_ancestor(subtree, n):
                return True
        return False
