"""AMP205 invalid-precision-value."""

from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from ampfix.fixes.edits import string
from ampfix.model.frameworks import ACCELERATE_SUGGEST, ACCELERATE_VALUES, FABRIC_ALIASES, FABRIC_SILENT_ALIASES, \
    FABRIC_SUGGEST, FABRIC_VALUES, frameworks
from ampfix.model.syntax import get_arg, literal_bool
from ampfix.rule import UNSAFE, FileContext, Fix, Rule, Violation

CLASS = {"fabric": ("Fabric", "precision"), "trainer": ("Trainer", "precision"),
         "accelerate": ("Accelerator", "mixed_precision")}


class InvalidPrecisionValue(Rule):
    code = "AMP205"
    name = "invalid-precision-value"
    message = "`{cls}({arg}={old})` is not a precision {lib} accepts (it raises ValueError); {hint}"
    requires = (("Fabric(", "Trainer(", "Accelerator("),)
    triggers = ("precision=", "fp16=")
    fixable = "sometimes"
    fix_note = "unsafe (the accepted spelling of the same setting, where there is one)"
    docs = """
The frameworks spell precision differently, and each rejects the other's spellings when the
object is built: Lightning `Fabric`/`Trainer(precision=...)` (lightning 2.6.6) accept
"16-mixed", "bf16-mixed", "16-true", "bf16-true", "32-true", "64-true", "transformer-engine",
"transformer-engine-float16" and the aliases 16, 32, 64, "16", "32", "64", "bf16";
Accelerate's `Accelerator(mixed_precision=...)` (accelerate 1.15.0) accepts "no", "fp16",
"bf16" and "fp8". Anything else (`Fabric(precision="fp16")`, `Accelerator(mixed_precision=
"16-mixed")`, `"bfloat16"`, `"fp32"`) raises ValueError at start-up, often only on the machine
where that branch runs (`"fp16" if cuda else ...`).

Reported for literals written in the call (or in a branch of a conditional expression there).
The fix writes the other framework's name for the same setting ("fp16" -> "16-mixed",
"16-mixed" -> "fp16", "fp32" -> "32-true" / "no", ...); it is unsafe because the program
raised before and now runs in a precision chosen from the spelling. `Accelerator(fp16=...)`,
deprecated in accelerate 0.x and removed in 1.0 (TypeError), is reported too: the fix writes
`mixed_precision="fp16"` (or `"fp16" if flag else "no"`).

Bad:
```python
from accelerate import Accelerator

accelerator = Accelerator(mixed_precision="16-mixed")
```

Good:
```python
from accelerate import Accelerator

accelerator = Accelerator(mixed_precision="fp16")
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        facts = frameworks(model)
        for call in facts.constructions("fabric", "trainer", "accelerate"):
            kind = facts.construction_kind(call)
            cls, arg = CLASS[kind]
            for node, text in facts.precision_literals(call):
                if kind == "accelerate":
                    ok, new, lib = text in ACCELERATE_VALUES, ACCELERATE_SUGGEST.get(text), "Accelerate"
                    accepted = ", ".join(repr(v) for v in ACCELERATE_VALUES)
                else:
                    ok = text in FABRIC_VALUES or text in FABRIC_ALIASES or text in FABRIC_SILENT_ALIASES
                    new, lib = FABRIC_SUGGEST.get(text), "Lightning"
                    accepted = ", ".join(repr(v) for v in FABRIC_VALUES)
                if ok:
                    continue
                hint = f"write {arg}={new!r}" if new else f"accepted: {accepted}"
                yield Violation(node, message=self.message.format(cls=cls, arg=arg, old=model.code(node), lib=lib,
                                                                  hint=hint),
                                fix=self._fix(model, node, new))
            old_flag = get_arg(call, None, "fp16") if kind == "accelerate" else None
            if old_flag is not None and self.precision_arg_absent(facts, call):
                yield Violation(old_flag, message=(
                    "`Accelerator(fp16=...)` was removed in accelerate 1.0 (TypeError); write "
                    "`mixed_precision=\"fp16\"`"), fix=self._fp16_fix(model, old_flag))

    @staticmethod
    def precision_arg_absent(facts, call: cst.Call) -> bool:
        return facts.precision_arg(call) is None

    @staticmethod
    def _fp16_fix(model, arg: cst.Arg) -> Fix:
        q = model.quote()
        flag = literal_bool(arg.value)
        value = f"{q}fp16{q}" if flag is True else f"{q}no{q}" if flag is False else \
            f"{q}fp16{q} if {model.code(arg.value)} else {q}no{q}"
        new = arg.with_changes(keyword=cst.Name("mixed_precision"), value=cst.parse_expression(value))
        return Fix({arg: new}, applicability=UNSAFE, description="mixed_precision= for the removed fp16=")

    @staticmethod
    def _fix(model, node: cst.CSTNode, new: Optional[str]) -> Optional[Fix]:
        if new is None:
            return None
        quote = node.quote[-1] if isinstance(node, cst.SimpleString) else model.quote()
        return Fix({node: string(new, quote)}, applicability=UNSAFE, description=f"{new!r}")
