"""AMP201 backward-bypasses-framework."""

from __future__ import annotations

from typing import Iterator, List, Optional

import libcst as cst

from ampfix.model.frameworks import Prepared, frameworks
from ampfix.model.syntax import get_arg
from ampfix.rule import SAFE, UNSAFE, FileContext, Fix, Rule, Violation


class BackwardBypassesFramework(Rule):
    code = "AMP201"
    name = "backward-bypasses-framework"
    message = "`{loss}.backward()` on a model set up by {fw}: it bypasses {fw}'s precision handling ({harm}); call `{call}` instead"
    harm = "with fp16 the loss is never scaled, yet the wrapped optimizer's step unscales it"
    triggers = ("fabric", "Fabric", "accelerator", "Accelerator", "automatic_optimization")
    requires = ((".backward(",), (".setup(", ".setup_module(", ".setup_optimizers(", ".prepare(", ".prepare_model(",
                                  ".prepare_optimizer(", "automatic_optimization"))
    fixable = "sometimes"
    fix_note = "safe (`fabric.backward(loss)` / `accelerator.backward(loss)`); unsafe with Accelerate gradient accumulation"
    docs = """
A model and optimizer set up by Lightning Fabric (`fabric.setup`, `setup_module`,
`setup_optimizers`) or prepared by Hugging Face Accelerate (`accelerator.prepare`,
`prepare_model`, `prepare_optimizer`) hand the backward to the framework:
`fabric.backward(loss)` / `accelerator.backward(loss)` scale the loss when the precision
uses a GradScaler ("16-mixed" / "fp16") and run the strategy's backward (DeepSpeed, ...).
A plain `loss.backward()` skips that: with fp16 the gradients are never scaled (small ones
underflow), while the wrapped optimizer's `step()` still unscales them, dividing every update by
the scale (65536 at first). Fabric refuses it at run time with a mixed-precision plugin
("requires you to call `fabric.backward(loss)`"); Accelerate trains on, silently wrong.

Not reported where the precision is known to need nothing from the framework's backward
(Fabric "32-true"/"64-true"; Accelerate "no", "bf16", "fp8"), nor where the Accelerator
prepares modules only (a test of `join_uneven_inputs`: no wrapped optimizer unscales the
gradients); reported where it is not known
statically (no argument, or a computed one: `accelerate launch --mixed_precision fp16` and
`fabric run --precision` set it from outside). Reported only when the backward's loss is computed by calling a set-up model, or the optimizer
stepped after it in the same function was set up, and the framework object is reachable where
the backward is (the same function, a module global, or `self.` of the same class); the
framework's own `backward` is never reported. The same mistake in a LightningModule with manual
optimization (`self.automatic_optimization = False`): a `loss.backward()` in its `training_step`
(or a closure there) instead of `self.manual_backward(loss)` skips the Trainer's precision
plugin; the fix calls `self.manual_backward(loss, ...)`, which passes its arguments on to
`loss.backward`. Checked against lightning 2.6.6 and accelerate 1.15.0.

The fix is safe: `fabric.backward(loss, *args, **kwargs)` passes its arguments on and
`accelerator.backward(loss, **kwargs)` calls `loss.backward(**kwargs)` when nothing needs
scaling. Accelerate's backward also divides the loss by `gradient_accumulation_steps`, so with
gradient accumulation configured on the Accelerator the fix is unsafe (a loss the loop already
divides would be divided twice). `accelerate launch` sets the accumulation from outside
(`ACCELERATE_GRADIENT_ACCUMULATION_STEPS`) only for DeepSpeed, where `loss.backward()` bypasses
the engine anyway.

Bad:
```python
import torch
from lightning.fabric import Fabric

fabric = Fabric(precision="16-mixed")
model, optimizer = fabric.setup(model, optimizer)
loss = torch.nn.functional.cross_entropy(model(x), y)
loss.backward()
optimizer.step()
```

Good:
```python
import torch
from lightning.fabric import Fabric

fabric = Fabric(precision="16-mixed")
model, optimizer = fabric.setup(model, optimizer)
loss = torch.nn.functional.cross_entropy(model(x), y)
fabric.backward(loss)
optimizer.step()
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        facts = frameworks(model)
        for bw in model.backward_calls:
            call = bw.call
            if bw.kind != "tensor" or not isinstance(call.func, cst.Attribute):
                continue
            loss = call.func.value
            if facts.frameworks_of(loss):
                continue  # fabric.backward(loss) itself
            if facts.manual_lightning_module(call) is not None and model.self_class(call) is not None:
                yield Violation(call, message=(
                    f"`{model.code(loss)}.backward()` in a LightningModule's manual-optimization `training_step`: it "
                    "bypasses the Trainer's precision plugin (with \"16-mixed\" the loss is never scaled, yet "
                    f"`optimizer.step()` unscales it); call `self.manual_backward({model.code(loss)})`"),
                    fix=self._manual_fix(model, call, loss))
                continue
            tied = facts.derives_from_prepared_module(loss) or self._stepped_after(model, facts, call)
            site = next(((p, key) for p in tied if (key := facts.framework_key_at(p, call))), None)
            if site is None:
                continue
            prepared, key = site
            fw = prepared.frameworks[0]
            if all(f.precisions is not None and not f.scales and (f.kind == "accelerate" or set(f.precisions) <=
                                                                  {"32-true", "64-true"}) for f in prepared.frameworks):
                continue  # a precision known to need nothing from the framework's backward
            if all(f.kind == "accelerate" for f in prepared.frameworks) and \
                    not facts.may_prepare_optimizer(prepared.frameworks):
                continue  # no wrapped optimizer unscales what was not scaled (a model prepared alone)
            harm = self.harm if fw.precisions is not None else "its precision is chosen at launch; " + self.harm
            if fw.precisions is not None and not fw.scales:
                harm = f"with {fw.describe()} Fabric raises at run time"
            message = self.message.format(loss=model.code(loss), fw=fw.name, call=f"{key}.backward({model.code(loss)})",
                                          harm=harm)
            yield Violation(call, message=message, fix=self._fix(model, facts, call, loss, key, prepared))

    @staticmethod
    def _manual_fix(model, call: cst.Call, loss: cst.BaseExpression) -> Fix:
        new = cst.Call(func=cst.parse_expression("self.manual_backward"),
                       args=[cst.Arg(loss, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")) if call.args
                                     else cst.MaybeSentinel.DEFAULT), *call.args])
        return Fix({call: new}, applicability=SAFE, description=f"`self.manual_backward({model.code(loss)})`")

    @staticmethod
    def _stepped_after(model, facts, call: cst.Call) -> List[Prepared]:
        """Set-up optimizers whose `.step()` follows the backward in its function."""
        scope = model.scope_of(call)
        out: List[Prepared] = []
        for c in model.calls:
            if model.scope_of(c) is scope and isinstance(c.func, cst.Attribute) and c.func.attr.value == "step" \
                    and model.before(call, c):
                out.extend(p for p in facts.prepared_by(c.func.value) if p.role == "optimizer")
        return out

    @staticmethod
    def _fix(model, facts, call: cst.Call, loss: cst.BaseExpression, key: str, prepared: Prepared) -> Optional[Fix]:
        kinds = {f.kind for f in prepared.frameworks}
        if len(kinds) != 1:
            return None
        applicability = SAFE
        if kinds == {"accelerate"}:
            if any(a.keyword is None for a in call.args):
                return None  # accelerator.backward(loss, **kwargs) takes no positional arguments
            for fw in prepared.frameworks:
                steps = get_arg(fw.call, 3, "gradient_accumulation_steps")
                if get_arg(fw.call, None, "gradient_accumulation_plugin") is not None or (
                        steps is not None and not (isinstance(steps.value, cst.Integer) and steps.value.value == "1")):
                    applicability = UNSAFE
        new = cst.Call(func=cst.parse_expression(f"{key}.backward"),
                       args=[cst.Arg(loss, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")) if call.args
                                     else cst.MaybeSentinel.DEFAULT), *call.args])
        return Fix({call: new}, applicability=applicability, description=f"`{key}.backward({model.code(loss)})`")
