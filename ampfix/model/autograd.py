"""Custom autograd Functions: the `torch.autograd.Function` subclasses a file defines, and the
`custom_fwd`/`custom_bwd` decorators of their `forward` and `backward` (asked by AMP014, a
`custom_fwd` without its `custom_bwd`, and by AMP001, whose fix must not move such a Function's
backward out of its region).

* `functions`: the Function subclasses of this file;
* `decorator_kinds` / `decorator_of`: the torch API kinds of a function's decorators, the
  decorator of one kind;
* `functions_without_custom_bwd`: the Functions whose `backward` lacks `custom_bwd`.
"""

from __future__ import annotations

from typing import List, Optional

import libcst as cst

from ampfix.model.facet import Facet


class CustomFunctions(Facet):
    """Custom autograd Functions and their AMP decorators (`model.autograd`)."""

    def functions(self) -> List[cst.ClassDef]:
        """The `torch.autograd.Function` subclasses defined in this file."""
        return [c for c in self.model.nodes_of(cst.ClassDef)
                if any(self.model.is_api(b.value, "autograd.Function") for b in c.bases)]

    def decorator_kinds(self, func: cst.FunctionDef) -> List[str]:
        """The torch API kinds of a function's decorators ("custom_fwd", "autocast", ...)."""
        out = []
        for d in func.decorators:
            dec = d.decorator
            api = self.model.api_of(dec.func if isinstance(dec, cst.Call) else dec)
            if api is not None:
                out.append(api.kind)
        return out

    def decorator_of(self, func: cst.FunctionDef, kind: str) -> Optional[cst.Decorator]:
        """The decorator of `func` that is the torch API `kind` (called or bare), if any."""
        for d in func.decorators:
            dec = d.decorator
            if self.model.is_api(dec.func if isinstance(dec, cst.Call) else dec, kind):
                return d
        return None

    def functions_without_custom_bwd(self) -> List[cst.ClassDef]:
        """autograd.Function subclasses in this file whose backward lacks custom_bwd."""
        result = []
        for cls in self.functions():
            bwd = self.model.method(cls, "backward")
            if bwd is not None and "custom_bwd" not in self.decorator_kinds(bwd):
                result.append(cls)
        return result
