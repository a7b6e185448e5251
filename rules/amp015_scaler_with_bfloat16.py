"""AMP015 scaler-with-bfloat16."""

from __future__ import annotations

from typing import Iterator, List, Optional

import libcst as cst

from ampfix.fixes.edits import set_keyword
from ampfix.model import AmpModel, Region, dotted, literal_bool
from ampfix.rule import UNSAFE, FileContext, Fix, Rule, Violation


class ScalerWithBfloat16(Rule):
    code = "AMP015"
    name = "scaler-with-bfloat16"
    message = ("this GradScaler is enabled although every autocast region of the file runs in bfloat16: bfloat16 "
               "has float32's range, its gradients do not underflow, and the scaler only adds work (an inf/NaN "
               "check per step); enable it only for float16")
    triggers = ("GradScaler",)
    requires = (("bfloat16", "autocast"),)
    project_requires = (("GradScaler",),)
    fixable = "unsafe"
    fix_note = "unsafe (`enabled=` tied to the autocast dtype, or `enabled=False`)"
    docs = """
Loss scaling exists for float16, whose smallest normal number (6e-5) makes small gradients
underflow to zero. bfloat16 has the exponent range of float32: its gradients do not underflow,
and the PyTorch AMP recipe uses a GradScaler only with float16. A scaler enabled for code whose
autocast regions all run in bfloat16 multiplies the loss by 65536, checks every gradient for
inf/NaN (a device synchronisation per step) and divides again, for nothing; and it tells the
reader that this code runs float16.

Reported when every enabled (or possibly enabled) autocast region of the file provably runs in
bfloat16 (`dtype=torch.bfloat16`, a variable or table whose values are all bfloat16, or CPU
autocast's default) and the scaler's `enabled=` is not tied to float16 (`enabled=use_fp16`,
`enabled=(dtype == torch.float16)` are correct). Also reported when every region takes its dtype
from one variable that the code chooses among bfloat16 and float16 (`torch.bfloat16 if
torch.cuda.is_bf16_supported() else torch.float16`, `{"fp16": torch.float16, "bf16":
torch.bfloat16}[args.precision]`, a test of a setting) and the scaler is enabled whatever it
holds (always, or by an AMP switch that is on under bfloat16 too: `enabled=args.amp`), when the
choice gives bfloat16 where nothing is asked for (on hardware that has it, or by the default of
the command-line option it reads): the default runs scale for nothing. A choice that gives
bfloat16 only when asked for (`--precision bf16` with a float16 default) is left alone. Regions used as decorators (`@torch.autocast(...)` on
`forward`) count like `with` blocks. Silent: any float16 region, a region whose dtype is
unknown or taken from another variable, a scaler built under a test of the dtype (`GradScaler()
if dtype == torch.float16 else None`).

The fix (unsafe: a disabled scaler saves an empty state and takes a plain `optimizer.step()`)
sets `enabled=<dtype> == torch.float16` when every region takes its dtype from one variable that
the scaler's code can read, else `enabled=False`; when that variable may be float16 only the
first is offered (with `enabled=` an AMP switch: `(<switch>) and <dtype> == torch.float16`), and
no fix when it cannot be read there or may hold strings.

The results do not change: multiplying by a power of two is exact and bfloat16 gradients have
float32's range, so they overflow no more than float32 ones and the scale stays where it is.
The scaler costs time only: a multiply, an inf/NaN check and an unscale of every gradient, each
step.

Bad:
```python
import torch

scaler = torch.amp.GradScaler("cuda")
with torch.autocast("cuda", dtype=torch.bfloat16):
    loss = model(x).sum()
scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update()
```

Good:
```python
import torch

amp_dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
scaler = torch.amp.GradScaler("cuda", enabled=amp_dtype == torch.float16)
with torch.autocast("cuda", dtype=amp_dtype):
    loss = model(x).sum()
scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update()
```
"""

    configured_message = ("this GradScaler is enabled whatever `{dtype}` holds, and the code may choose bfloat16 "
                          "there ({values}): under bfloat16 the scaler only adds work (an inf/NaN check per step); "
                          "enable it only for float16")

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        regions = model.precision.autocast_regions()
        if not regions:
            return
        configured = None
        if any(model.precision.region_dtype(r) != "bfloat16" for r in regions):
            configured = _configured_dtype(model, regions)
            if configured is None:
                return
        scaling = {dotted(c.func.value) for c in model.calls  # type: ignore[attr-defined]
                   if isinstance(c.func, cst.Attribute) and c.func.attr.value == "scale"
                   and model.is_scaler(c.func.value)}
        if not scaling:
            return
        for call in model.calls:
            if not model.is_api(call, "GradScaler"):
                continue
            enabled = model.scaler_enabled(call)
            if enabled is not None and (literal_bool(enabled) is False or model.precision.float16_gated(enabled)):
                continue
            if configured is None:
                yield Violation(call, fix=self._fix(model, call, enabled, regions))
                continue
            if model.precision.built_under_dtype_test(call):
                continue  # `GradScaler() if dtype == torch.float16 else None`
            fix = self._fix(model, call, enabled, regions, tie_only=True)
            values = " or ".join(sorted(configured[1]))
            yield Violation(call, message=self.configured_message.format(dtype=configured[0], values=values), fix=fix)

    @staticmethod
    def _fix(model: AmpModel, call: cst.Call, enabled: Optional[cst.BaseExpression],
             regions: List[Region], tie_only: bool = False) -> Optional[Fix]:
        """`tie_only`: the dtype may be float16 too; only `enabled=<dtype> == torch.float16` keeps
        the scaler where it is needed (a dtype of strings cannot be compared with it)."""
        if any(a.star for a in call.args):
            return None
        texts = {model.code(r.dtype_node) if r.dtype_node is not None else None for r in regions}
        tie = None
        (text,) = texts if len(texts) == 1 else (None,)
        node = regions[0].dtype_node
        if text is not None and node is not None and model.dtype_name(node) == "dynamic" \
                and model.bound.reads_same_at(node, call):
            tie = f"{text} == {model.torch_alias() or 'torch'}.float16"
        if tie_only and (tie is None or not model.precision.torch_dtype_valued(node)):
            return None
        if tie is None:
            value = "False"
        elif enabled is None or literal_bool(enabled) is True:
            value = tie
        else:
            value = f"({model.code(enabled)}) and {tie}"
        new = set_keyword(call, "enabled", cst.parse_expression(value))
        return Fix({call: new}, applicability=UNSAFE,
                   description=f"GradScaler enabled only for float16 (`enabled={value}`)")


def _configured_dtype(model: AmpModel, regions: List[Region]):
    """Every region runs in the dtype of one expression (`dtype=amp_dtype`) that the code
    chooses among bfloat16 and float16 (or float32): a table read by a setting, a test of
    `torch.cuda.is_bf16_supported()`, a flag. (its text, its dtypes), or None."""
    texts = {model.code(r.dtype_node) if r.dtype == "dynamic" and r.dtype_node is not None else None
             for r in regions}
    if len(texts) != 1 or None in texts:
        return None
    values = {model.precision.dtype_values(r.dtype_node) for r in regions}
    if len(values) != 1 or None in values:
        return None
    (dtypes,) = values
    if "bfloat16" not in dtypes or len(dtypes) < 2 or not dtypes <= {"bfloat16", "float16", "float32"}:
        return None
    chosen = model.precision.default_choice(regions[0].dtype_node)
    if chosen is None or model.precision.dtype_values(chosen) != {"bfloat16"}:
        return None  # bfloat16 only when asked for (`--amp-dtype bfloat16`): the default run needs the scaler
    return texts.pop(), dtypes


