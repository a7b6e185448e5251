"""AMP204 deprecated-precision-alias."""

from __future__ import annotations

from typing import Iterator

import libcst as cst

from ampfix.fixes.edits import string
from ampfix.model.frameworks import FABRIC_ALIASES, frameworks
from ampfix.rule import SAFE, FileContext, Fix, Rule, Violation

CLASS = {"fabric": "Fabric", "trainer": "Trainer"}


class DeprecatedPrecisionAlias(Rule):
    code = "AMP204"
    name = "deprecated-precision-alias"
    message = ("`{cls}(precision={old})` is a legacy alias that Lightning warns about "
               "(\"supported for historical reasons but its usage is discouraged\"); write `precision={new!r}`")
    triggers = ("precision=",)
    requires = (("Fabric(", "Trainer("),)
    fixable = "safe"
    fix_note = "safe (`16`/`\"16\"` to `\"16-mixed\"`, `\"bf16\"` to `\"bf16-mixed\"`: the same setting)"
    docs = """
Lightning 2.x names every precision setting explicitly: "16-mixed" (float16 autocast with a
GradScaler) and "16-true" (the weights themselves in float16, no scaler) are different things,
as are "bf16-mixed" and "bf16-true". The 1.x spellings `precision=16`, `"16"` and `"bf16"` are
still accepted by `Fabric` and `Trainer` as aliases of "16-mixed" and "bf16-mixed", with a
warning that they are discouraged; "16" reads as if it might be "16-true". The rewrite to the
explicit name changes nothing at run time (lightning 2.6.6 maps the alias to exactly that
value; the explicit names need lightning >= 2.0). `32`/`64` are accepted without a warning and
are left alone. Only literals written in the call are rewritten (a value passed through a
name may be used elsewhere too). A project whose requirements declare a Lightning before 2.0
(`pytorch-lightning>1.7,<2.0`, `lightning>=1.9`: in `pyproject.toml`, `setup.cfg`, `setup.py` or
`requirements*.txt`, read as for the oldest torch) is not reported: 1.x does not warn about the
aliases, and has no explicit names to rewrite them to.

Bad:
```python
from lightning.fabric import Fabric

fabric = Fabric(accelerator="cuda", precision=16)
```

Good:
```python
from lightning.fabric import Fabric

fabric = Fabric(accelerator="cuda", precision="16-mixed")
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        if ctx.lightning_before_2:
            return  # the aliases are the supported version's own names there
        model = ctx.model
        facts = frameworks(model)
        for call in facts.constructions("fabric", "trainer"):
            for node, text in facts.precision_literals(call):
                new = FABRIC_ALIASES.get(text)
                if new is None:
                    continue
                quote = node.quote[-1] if isinstance(node, cst.SimpleString) else model.quote()
                yield Violation(node, message=self.message.format(
                    cls=CLASS[facts.construction_kind(call)], old=model.code(node), new=new),
                    fix=Fix({node: string(new, quote)}, applicability=SAFE, description=f"precision={new!r}"))
