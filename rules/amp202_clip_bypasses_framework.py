"""AMP202 clip-bypasses-framework."""

from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from ampfix.fixes.edits import keyword_arg, with_args
from ampfix.model.frameworks import Prepared, frameworks
from ampfix.model.syntax import call_name, get_arg, method_call
from ampfix.rule import SAFE, FileContext, Fix, Rule, Violation

FABRIC_KW = {"clip_grad_norm_": ("max_norm", "norm_type", "error_if_nonfinite"), "clip_grad_value_": ("clip_val",)}
ACCEL_KW = {"clip_grad_norm_": ("parameters", "max_norm", "norm_type"), "clip_grad_value_": ("parameters", "clip_value")}


class ClipBypassesFramework(Rule):
    code = "AMP202"
    name = "clip-bypasses-framework"
    message = ("gradients of a model set up by {fw} with {prec} are clipped by torch while still scaled by its "
               "GradScaler; use `{call}`, which unscales first")
    triggers = ("clip_grad",)
    requires = (("Fabric", "Accelerator"), (".setup(", ".setup_module(", ".setup_optimizers(", ".prepare(", ".prepare_model(", ".prepare_optimizer("))
    project_requires = ((".setup(", ".setup_module(", ".setup_optimizers(", ".prepare(", ".prepare_model(", ".prepare_optimizer("),)
    fixable = "sometimes"
    fix_note = "safe (`fabric.clip_gradients(model, optimizer, ...)` / `accelerator.clip_grad_norm_(...)`)"
    docs = """
With fp16 mixed precision (Fabric `precision="16-mixed"`, Accelerate `mixed_precision="fp16"`)
the framework's GradScaler scales the loss in `fabric.backward` / `accelerator.backward`, so
right after the backward the gradients are multiplied by the scale (65536 at first).
`torch.nn.utils.clip_grad_norm_` / `clip_grad_value_` on them clips the scaled values: the
threshold is effectively divided by the scale and every step is clipped to almost nothing (the
AMP003 mistake, with the scaler inside the framework). `fabric.clip_gradients(model, optimizer,
max_norm=...)` / `accelerator.clip_grad_norm_(parameters, max_norm)` unscale first.

Reported only when the precision is known to scale (a literal "16-mixed", 16, "16", or "fp16",
also as one branch of a conditional expression; not "bf16-mixed"/"bf16", which use no scaler,
not a precision given by the launcher's environment or config, which is not known statically),
the clipped parameters are those of a set-up model, and no `unscale_gradients` precedes the clip
in its function. Checked against lightning 2.6.6 (`Fabric.clip_gradients(module, optimizer,
clip_val=None, max_norm=None, norm_type=2.0, error_if_nonfinite=True)`) and accelerate 1.15.0
(`Accelerator.clip_grad_norm_(parameters, max_norm, norm_type=2)`, `clip_grad_value_(parameters,
clip_value)`).

The fix (safe) calls the framework's method with the same arguments; for Fabric it needs the one
optimizer set up with the model, and passes `error_if_nonfinite=False` (torch's default; Fabric's
is True) unless the call names it. Arguments the framework's method lacks (`foreach=`) leave it
unfixed. So does gradient accumulation (`Accelerator(gradient_accumulation_steps=n)`,
`accelerator.accumulate(model)`, Fabric's `no_backward_sync`) with no `if` on `sync_gradients`
around the clip: the framework's clip unscales on every micro-batch, but the optimizer steps and
the scaler updates only on the last one, so the second micro-batch's unscale would raise
RuntimeError; the message asks for the clip under `if accelerator.sync_gradients:`, as
Accelerate's docs write it.

Bad:
```python
import torch
from accelerate import Accelerator

accelerator = Accelerator(mixed_precision="fp16")
model, optimizer = accelerator.prepare(model, optimizer)
accelerator.backward(loss)
torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
optimizer.step()
```

Good:
```python
import torch
from accelerate import Accelerator

accelerator = Accelerator(mixed_precision="fp16")
model, optimizer = accelerator.prepare(model, optimizer)
accelerator.backward(loss)
accelerator.clip_grad_norm_(model.parameters(), 1.0)
optimizer.step()
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        facts = frameworks(model)
        for call in model.calls:
            api = model.api_of(call)
            kind = (api.qualname.rpartition(".")[2] if api is not None and api.kind == "clip_grad" else "")
            params = get_arg(call, 0, "parameters")
            owner = method_call(params.value, "parameters") if params is not None else None
            if not kind.endswith("_") or owner is None:
                continue
            prepared = [p for p in facts.prepared_modules(owner) if all(f.scales for f in p.frameworks)]
            if not prepared or self._unscaled_before(model, call):
                continue
            p = prepared[0]
            key = facts.framework_key_at(p, call)
            if key is None:
                continue
            fw = p.frameworks[0]
            method = "clip_gradients" if fw.kind == "fabric" else kind
            message = self.message.format(fw=fw.name, prec=fw.describe(scaling_only=True), call=f"{key}.{method}(...)")
            if self._accumulating(model, ctx.source, fw, call):
                when = (f"where `{key}.sync_gradients` is True" if fw.kind == "accelerate"
                        else "on the micro-batches that step")
                yield Violation(call, message=(
                    f"{message}, and only {when} (not fixed: with gradient accumulation the framework's clip "
                    "unscales on every micro-batch, and the second unscale before the optimizer steps raises RuntimeError)"))
                continue
            yield Violation(call, message=message, fix=self._fix(model, facts, call, kind, key, p, owner))

    @staticmethod
    def _accumulating(model, source: str, fw, call: cst.Call) -> bool:
        """The framework accumulates gradients (`Accelerator(gradient_accumulation_steps=n)` with n
        not a literal 1, `accelerator.accumulate(...)`, Fabric's `no_backward_sync(...)`) and no
        `if` around the clip tests `sync_gradients`: the framework's clip would unscale on
        micro-batches whose step it skips (Accelerate's `unscale_gradients` unscales whatever
        `sync_gradients` says, its optimizer steps and updates the scaler only when it holds)."""
        for anc in model.ancestors(call):
            if isinstance(anc, cst.If) and "sync_gradients" in model.code(anc.test):
                return False
        for arg in fw.call.args:
            if arg.keyword is not None and arg.keyword.value in ("gradient_accumulation_steps", "gradient_accumulation_plugin") \
                    and not (isinstance(arg.value, cst.Integer) and arg.value.value == "1"):
                return True
        return ".accumulate(" in source or "no_backward_sync(" in source

    @staticmethod
    def _unscaled_before(model, call: cst.Call) -> bool:
        scope = model.scope_of(call)
        return any(model.scope_of(c) is scope and call_name(c) in ("unscale_gradients", "unscale_")
                   and model.before(c, call) for c in model.calls)

    @staticmethod
    def _fix(model, facts, call: cst.Call, kind: str, key: str, p: Prepared, owner) -> Optional[Fix]:
        if len({f.kind for f in p.frameworks}) != 1 or any(a.star for a in call.args):
            return None
        if p.frameworks[0].kind == "accelerate":
            names = ACCEL_KW[kind]
            if len(call.args) > len(names) or any(a.keyword is not None and a.keyword.value not in names
                                                  for a in call.args):
                return None
            new = call.with_changes(func=cst.parse_expression(f"{key}.{kind}"))
            return Fix({call: new}, applicability=SAFE, description=f"`{key}.{kind}(...)`")
        opts = [k for _, k in facts.prepared_targets(p.call, "optimizer") if facts.usable_at(k, p.call, call)]
        if len(set(opts)) != 1:
            return None
        names = FABRIC_KW[kind]
        args = []
        for i, a in enumerate(call.args[1:]):
            name = a.keyword.value if a.keyword is not None else (names[i] if i < len(names) else None)
            if name == "clip_value":
                name = "clip_val"
            if name not in names:
                return None
            args.append(keyword_arg(name, a.value))
        if kind == "clip_grad_norm_" and not any(a.keyword.value == "error_if_nonfinite" for a in args):
            args.append(keyword_arg("error_if_nonfinite", cst.Name("False")))
        new = with_args(cst.Call(func=cst.parse_expression(f"{key}.clip_gradients")),
                        [cst.Arg(owner), cst.Arg(cst.parse_expression(opts[0])), *args])
        return Fix({call: new}, applicability=SAFE, description=f"`{key}.clip_gradients({model.code(owner)}, ...)`")
