"""AMP203 amp-stacked-on-framework."""

from __future__ import annotations

from typing import Iterator, List

import libcst as cst

from ampfix.model.frameworks import Framework, frameworks
from ampfix.model.syntax import get_arg, literal_bool
from ampfix.rule import FileContext, Rule, Violation

DEFAULT_DTYPE = {"cuda": "float16", "cpu": "bfloat16"}


class AmpStackedOnFramework(Rule):
    code = "AMP203"
    name = "amp-stacked-on-framework"
    message = ("a hand-made GradScaler on a model set up by {fw}, which already runs mixed precision ({prec}): "
               "{why}; leave scaling to `{key}.backward(loss)`")
    triggers = ("GradScaler", "autocast")
    requires = (("Fabric(", "Accelerator("), (".setup(", ".setup_module(", ".setup_optimizers(", ".prepare(", ".prepare_model(", ".prepare_optimizer("))
    fixable = "none"
    fix_note = "none (remove the hand-made scaler / region: the framework's precision setting is the one switch)"
    docs = """
Fabric (`precision="16-mixed"`/`"bf16-mixed"`) and Accelerate (`mixed_precision="fp16"`/`"bf16"`)
run AMP themselves: autocast around the set-up model's forward, and for fp16 their own
GradScaler in `fabric.backward` / `accelerator.backward` and the wrapped optimizer's step. A
second, hand-made layer on top is a mistake:

* a `torch.amp.GradScaler` whose `scale(loss)` feeds the framework's backward, or whose
  `step()` drives a set-up optimizer: with fp16 the loss is scaled twice (by the product of
  both scales, 65536 x 65536 at first, which float16 activation gradients cannot hold, so steps
  are skipped while the scalers back off);
  with bf16 the framework uses no scaler on purpose, and this one only adds a scale to undo;
* a `torch.autocast` region around a set-up model with another dtype than the framework's:
  the model's forward still runs in the framework's dtype (its autocast is the inner one), and
  everything else in the region (the loss, extra heads) in the region's dtype, e.g. float16
  with no scaler under `bf16-mixed`. A region with the framework's own dtype changes nothing
  and is not reported, nor is `autocast(enabled=False)`.

Reported only when the framework's precision is a literal mixed setting (lightning 2.6.6,
accelerate 1.15.0). No fix: what to remove is the user's choice.

Bad:
```python
import torch
from lightning.fabric import Fabric

fabric = Fabric(precision="16-mixed")
model, optimizer = fabric.setup(model, optimizer)
scaler = torch.amp.GradScaler("cuda")
fabric.backward(scaler.scale(loss))
scaler.step(optimizer)
scaler.update()
```

Good:
```python
import torch
from lightning.fabric import Fabric

fabric = Fabric(precision="16-mixed")
model, optimizer = fabric.setup(model, optimizer)
fabric.backward(loss)
optimizer.step()
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        facts = frameworks(model)
        reported = set()
        for call in model.calls:
            fws: List[Framework] = []
            method = call.func.attr.value if isinstance(call.func, cst.Attribute) else None
            scaler = model.scaler_key(call.func.value) if method in ("step", "scale") else None
            if scaler is None or model.scaler_disabled(call.func.value):
                continue  # not a scaler, or one built with enabled=False: it scales nothing
            if method == "step" and call.args:
                fws = [f for p in facts.prepared_by(call.args[0].value) if p.role == "optimizer" for f in p.frameworks]
            if method == "scale":
                outer = model.parent(model.parent(call))
                if isinstance(outer, cst.Call) and outer.func is not call and isinstance(outer.func, cst.Attribute) \
                        and outer.func.attr.value == "backward":
                    fws = facts.frameworks_of(outer.func.value)
            fws = [f for f in fws if f.mixed_dtypes]
            if not fws:
                continue
            fw = fws[0]
            built = [v for v in model.possible_values(call.func.value) if isinstance(v, cst.Call)
                     and model.is_api(v, "GradScaler") and literal_bool((get_arg(v, None, "enabled") or
                                                                          cst.Arg(cst.Name("True"))).value) is not False]
            where = built[0] if built else call
            if id(where) in reported:
                continue
            reported.add(id(where))
            why = ("the loss is scaled twice (the framework's GradScaler and this one)" if fw.scales else
                   "bf16 needs no loss scaling, and the framework uses none")
            key = "fabric" if fw.kind == "fabric" else "accelerator"
            yield Violation(where, message=self.message.format(fw=fw.name, prec=fw.describe(), why=why, key=key))
        yield from self._regions(model, facts)

    @staticmethod
    def _regions(model, facts) -> Iterator[Violation]:
        for w in model.nodes_of(cst.With):
            r = model.with_region(w)
            if r is None or r.enabled is False:
                continue
            dtype = r.dtype if r.dtype in ("float16", "bfloat16") else DEFAULT_DTYPE.get(r.effective_device or "") \
                if r.dtype is None else None
            if dtype is None:
                continue
            for call in model.calls:
                if not model.is_ancestor(w.body, call) or not isinstance(call.func, (cst.Name, cst.Attribute)):
                    continue
                fws = [f for p in facts.prepared_modules(call.func) for f in p.frameworks if f.mixed_dtypes]
                fw = next((f for f in fws if dtype not in f.mixed_dtypes), None)
                if fw is not None:
                    yield Violation(r.call or w, message=(
                        f"an autocast({dtype}) region around a model set up by {fw.name} with {fw.describe()}: the "
                        f"model still runs in {fw.mixed_dtypes[0]} (the framework's autocast is inside), the rest of the "
                        f"region in {dtype}; drop the region and let the framework's precision decide"))
                    break
