"""AMP017 fp16-without-loss-scaling."""

from __future__ import annotations

import os
from typing import Iterator, List, Optional

import libcst as cst

from ampfix.fixes.edits import in_block, insert_after, insert_before, replace_statement, with_regions_dtype
from ampfix.model import AmpModel, NeverTrue, Region, Trace, TraceEvent, is_expression_statement_of
from ampfix.model.events import BACKWARD, GRAD_READ, OPT_STEP, SCALER_STEP
from ampfix.model.frameworks import frameworks
from ampfix.rule import UNSAFE, FileContext, Fix, Rule, Violation


class Fp16WithoutLossScaling(Rule):
    code = "AMP017"
    name = "fp16-without-loss-scaling"
    message = ("`backward()` of a loss computed under float16 autocast{where}, {scaler}: gradients below "
               "float16's range (6e-8) flush to zero, silently; scale the loss with `torch.amp.GradScaler`, or use "
               "bfloat16 where the hardware has it")
    triggers = ("autocast",)
    requires = (("backward",),)
    project_requires = (("autocast", ".backward("),)
    fixable = "unsafe"
    fix_note = "unsafe (a GradScaler around backward/step/update when all are in the function; else `dtype=torch.bfloat16`)"
    docs = """
float16's smallest subnormal is 6e-8 and its smallest normal 6e-5: gradients smaller than that,
common in the backward of a deep network, flush to zero in a float16 autocast region. Loss
scaling is what makes float16 training work: `scaler.scale(loss).backward()` multiplies the loss
(65536 at first) so that the gradients stay in range, and `scaler.step(optimizer)` divides them
again before the update, skipping steps whose gradients overflowed. A backward of a loss computed
under `autocast(dtype=torch.float16)` (or CUDA autocast without `dtype=`, which is float16) with
no GradScaler trains on gradients that are silently zero where they should be small.

Reported when the loss of a `backward()` followed by an optimizer step is computed in an autocast
region known to run float16 (its `dtype=`, the CUDA default, or a dtype chosen from
configuration that is float16 on every path), also through helpers and other modules of the
project, and nothing on that path scales it, also where the code holds a GradScaler that this
path does not use (a method that trains a second network without the class's scaler), and
where its only GradScaler is never enabled: built with `enabled=False`, or with an `enabled=` test
that can never be true because every value of what it compares is known (`enabled=(args.dtype ==
"float16")` where `--dtype` has `choices=["fp16", "bf16", "fp32"]`, or after a `{"fp16": ...,
"bf16": ..., "fp32": ...}[dtype]` table that raises for any other key); with such a test naming
float16, an autocast whose dtype is float16 for one of those values counts (the fp16 choice then
trains unscaled). A test whose values come from a configuration file, an option without
`choices=` or a caller not seen may be true: not reported. Not reported: bfloat16 (float32's
range: it needs no scaling; CPU autocast defaults to it), a dtype that may be bfloat16, any
GradScaler that may be enabled in the training step (`scaler.scale(loss)`, also through
helpers; `GradScaler(enabled=use_fp16)`), a framework that scales (Accelerate
`mixed_precision="fp16"` with `accelerator.backward`, Fabric and Lightning "16-mixed",
DeepSpeed's `engine.backward(loss)`, apex's `amp.scale_loss`),
evaluation under `torch.no_grad()` and inference without backward.

The fix is unsafe (it changes training), and there is none where the code holds a GradScaler
(which one to use is the author's choice; for one never enabled, which test was meant is too).
When the backward, the optimizer's only `step()` and its construction are in this file, it adds
a GradScaler: `scaler = torch.amp.GradScaler("cuda")` after the optimizer is built, `scaler.scale(loss).backward()`, `scaler.step(optimizer)` and
`scaler.update()`; this works on every GPU. Otherwise, when the region is a `with` of this file
whose dtype is written there, it switches the region to `dtype=torch.bfloat16`, which needs no
scaling but needs hardware with bfloat16 (Ampere and newer; on older GPUs use a GradScaler).

float16 autocast exists on the CPU too (torch 2.13), so `ampfix verify` can show the harm without
a GPU: a loss small enough that its float16 gradients flush to zero stalls, and with the
GradScaler the run tracks float32.

Bad:
```python
import torch

optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    optimizer.zero_grad()
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
```

Good:
```python
import torch

optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cuda")
for x, y in loader:
    optimizer.zero_grad()
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        if frameworks(model).constructions("fabric", "accelerate", "trainer"):
            return  # their backward scales (AMP201 reports a backward that bypasses it)
        reported = set()
        for trace in model.traces():
            if model.enabled_scaler_in(trace):
                continue  # a GradScaler (or what may be one) in this training step: AMP008 judges the rest
            for bw in trace.of(BACKWARD):
                scale = model.disabled_scale(bw)  # `scaler.scale(loss)` of a scaler that is never enabled
                loss = model.unscaled_loss(bw) if scale is None else model.argument_at(bw, scale.args[0].value)
                if loss is None or model.scales_unseen(bw):
                    continue
                gate = model.never_true_float16_gate(scale) if scale is not None else None
                if model.precision.value_dtypes(loss) != {"float16"} and not (gate and model.precision.may_be_float16(loss)):
                    continue  # (a scaler gated on float16 that is never on: the float16 choice is unscaled)
                regions, foreign = model.precision.computing_regions(loss)
                step = model.first_after(trace, bw, lambda e: e.kind == OPT_STEP or scale is not None and e.kind == SCALER_STEP)
                if step is None or frameworks(model).derives_from_prepared_module(loss):
                    continue
                shown = model.anchor(bw, step)[0]
                for node in bw.path:  # where the loss is passed on: `backward_and_step(loss, opt)`
                    if node is shown or model.scope_of(node) is model.scope_of(loss):
                        shown = node
                        break
                if id(shown) in reported:
                    continue
                reported.add(id(shown))
                related = tuple((f.path, f.line, 1, f"float16 autocast region in `{f.function}`")
                                for f in sorted(foreign))
                first = min(foreign) if foreign else None
                where = f" (line {model.line(regions[0].node)})" if regions else \
                    f" (in `{first.function}`, {_rel(model, first.path)}:{first.line})" if first else ""
                held = model.checkpoints.scalers_at(bw.node)  # a scaler this path could use, and does not
                scaler = _never_enabled(model, scale, gate) if scale is not None else \
                    f"not scaled by the GradScaler `{held[0]}` it could use" if held else "with no GradScaler"
                message = self.message.format(where=where, scaler=scaler) + model.where(bw, shown)
                yield Violation(shown, message=message, related=related, fix=None if foreign or held or scale
                                else _fix(model, trace, bw, step, loss, regions))


def _fix(model: AmpModel, trace: Trace, bw: TraceEvent, step: TraceEvent, loss: cst.BaseExpression,
         regions: List[Region]) -> Optional[Fix]:
    if model.foreign_among(bw, step) or bw.event.detail != "tensor":
        return None
    return _scaler_fix(model, trace, bw, step, regions) or _bf16_fix(model, regions)


def _scaler_fix(model: AmpModel, trace: Trace, bw: TraceEvent, step: TraceEvent,
                regions: List[Region]) -> Optional[Fix]:
    """A GradScaler built after the optimizer, around backward, the step (and a clip) and update:
    when the backward, the function's one `opt.step()` and the optimizer's one construction
    are all readable from one another."""
    func, opt = model.scope_of(bw.node), step.event.target
    reads = trace.between(bw, step, GRAD_READ)
    stmt = model.statement_of(step.node)
    if opt is None or bw.via != step.via or step.node.args or len(reads) > 1 or not in_block(model, stmt) \
            or not is_expression_statement_of(stmt, step.node) or not isinstance(stmt.body[0], cst.Expr) \
            or [e.node for e in trace.of(OPT_STEP, BACKWARD) if model.scope_of(e.node) is func] != [bw.node, step.node]:
        return None
    built = [n for n, v in model.assignments_to(opt) if isinstance(v, cst.Call) and model.builds_optimizer(v)]
    made = model.statement_of(built[0]) if len(built) == 1 == len(model.assignments_to(opt)) else None
    if made is None or not in_block(model, made) or not frameworks(model).usable_at(opt, made, bw.node):
        return None
    own = opt.startswith("self.")
    name = next((n for n in ("scaler", "grad_scaler") if not any(
        (a.attr.value if own else a.value) == n for a in model.nodes_of(cst.Attribute if own else cst.Name))), None)
    device, torch_name = model.precision.region_device_code(regions, made), model.torch_alias()
    if name is None or device is None or torch_name is None:
        return None
    name = "self." + name if own else name
    written = model.code(step.node.func.value)  # type: ignore[attr-defined]
    edits = dict(insert_after(model.module, made, [f"{name} = {torch_name}.amp.GradScaler({device})"]))
    edits.update(replace_statement(model.module, stmt, [f"{name}.step({written})", f"{name}.update()"]))
    if reads:  # `clip_grad_norm_` in between: unscale first
        clip = model.statement_of(reads[0].node)
        if reads[0].via != bw.via or not in_block(model, clip):
            return None
        edits.update(insert_before(model.module, clip, [f"{name}.unscale_({written})"]))
    receiver = bw.node.func.value  # type: ignore[attr-defined]
    edits[receiver] = cst.parse_expression(f"{name}.scale({model.code(receiver)})")
    return Fix(edits, applicability=UNSAFE, description=(
        f"GradScaler added: `{name}.scale(...).backward()`, `{name}.step({written})`, `{name}.update()` (float16 "
        "needs loss scaling; this works on every GPU)"))


def _bf16_fix(model: AmpModel, regions: List[Region]) -> Optional[Fix]:
    """The region switched to bfloat16 (needs no scaling; needs bfloat16 hardware)."""
    torch_name = model.torch_alias()
    edits = with_regions_dtype(regions, f"{torch_name}.bfloat16", replace_float16=True) if torch_name else None
    return Fix(edits, applicability=UNSAFE, description=(
        "autocast switched to bfloat16 (float32's range: no loss scaling needed; needs bfloat16 hardware, Ampere "
        "or newer: elsewhere use a GradScaler)")) if edits else None


def _rel(model: AmpModel, path: str) -> str:
    return os.path.relpath(path, os.path.dirname(os.path.abspath(model.path))) if model.path else path


def _never_enabled(model: AmpModel, scale: cst.Call, gate: Optional[NeverTrue]) -> str:
    """Why the scaler of `scale` scales nothing: its `enabled=` test can never be true (with the
    values of what it compares), or it is a literal False."""
    scaler = model.code(scale.func.value)  # type: ignore[attr-defined]
    if gate is None:
        return f"and its GradScaler `{scaler}` is built with `enabled=False`"
    values = ", ".join(repr(v) for v in gate.values)
    return (f"and its GradScaler `{scaler}` is never enabled: `enabled={model.code(gate.test)}` can never be true "
            f"(`{gate.compared}` is one of {values})")
