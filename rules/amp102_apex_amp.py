"""AMP102 apex-amp: migrate NVIDIA apex.amp training code to native torch.amp.

The migration is one unit, planned by `ampfix.migrations.apex`: each apex call is one finding with
its own fix (the summary counts them), all in one fix group, offered only when every apex use in
the file can be migrated; otherwise each finding says what is left to do by hand.
"""

from __future__ import annotations

import re
from typing import Iterator

from ampfix.migrations.apex import ApexMigration
from ampfix.rule import UNSAFE, FileContext, Fix, Rule, Violation

MESSAGES = {
    "initialize": 'apex amp.initialize: NVIDIA apex is superseded by native AMP: create a torch.amp.GradScaler("cuda") '
                  "once and run the forward pass in torch.autocast(\"cuda\")",
    "scale_loss": "apex amp.scale_loss: use scaler.scale(loss).backward(), the forward pass in "
                  'torch.autocast("cuda"), and scaler.step(optimizer) + scaler.update()',
    # the backward computes an input's gradient (`model.training.input_gradient`): nothing to scale
    "input_gradient": "apex amp.scale_loss computes the gradient of `{tensor}` and no optimizer steps: native AMP "
                      'is autocast only: the forward pass in torch.autocast("cuda") and an unscaled loss.backward(), '
                      "no GradScaler (a scaled backward leaves `{tensor}.grad` multiplied by the scale)",
    "master_params": "apex amp.master_params: clip the optimizer's parameters after scaler.unscale_(optimizer)",
    "state_dict": "apex amp.state_dict: save scaler.state_dict()",
    "load_state_dict": "apex amp.load_state_dict: load into scaler.load_state_dict()",
    "other": "apex.amp has no native equivalent for this call",
}
# `amp` (or every name) taken from another module, which may bind apex's: `from .utils import *`, `from .utils import amp`
FROM_ELSEWHERE = re.compile(r"^[ \t]*from[ \t]+[\w.]+[ \t]+import[ \t]+(?:\*|\([\w,\s]*\bamp\b|[\w, \t]*\bamp\b)",
                            re.MULTILINE)


class ApexAmp(Rule):
    code = "AMP102"
    name = "apex-amp"
    message = "NVIDIA apex.amp is superseded by native AMP (torch.amp.GradScaler + torch.autocast)"
    # an apex amp call in a module without "apex": its `amp` may come from another module of the project
    triggers = ("apex", "amp.initialize", "amp.scale_loss", "amp.master_params", "amp.state_dict", "amp.load_state_dict")
    fixable = "unsafe"
    fix_note = "unsafe (NVIDIA apex amp to native AMP)"
    docs = """
NVIDIA apex's `amp` (`amp.initialize`, `amp.scale_loss`, `amp.master_params`) is deprecated in
favour of native AMP, which ships with torch and needs no extension build.

The fix (unsafe: it restructures the training loop) migrates the whole file at once:

* the apex import goes, whatever its spelling (`from apex import amp as apex_amp`, `import
  apex` with `apex.amp.*`), and with it an optional import (`try: from apex import amp` /
  `except ImportError: amp = None`, `APEX_AVAILABLE` flags): tests of apex's availability
  are simplified, since native AMP is always there;
* `model, optimizer = amp.initialize(...)` becomes one `torch.amp.GradScaler("cuda")`, created
  where the initialize ran but unconditionally: the condition it ran under (`if args.fp16:`,
  `enabled=`) becomes the scaler's and autocast's `enabled=`. It is a local, a `self.`
  attribute (initialize in a `setup()` method, the loop in another method), returned with the
  model and optimizer (a helper whose one caller holds the loop) or a module global (a helper
  function, the script's `__main__` block), as the code that uses it needs;
* `with amp.scale_loss(loss, opt) as s: s.backward()` (also with `delay_unscale=`, `loss_id=`,
  several optimizers, or under `if args.fp16: ... else: loss.backward()`) becomes
  `scaler.scale(loss).backward()`; the statements the loss depends on run in
  `torch.autocast("cuda")`; each following `opt.step()` becomes `scaler.step(opt)`, with one
  `scaler.update()` after the last step of the iteration (gradient accumulation: on the
  boundary only); a `scale_loss` that only computes an input's gradient (`x.grad` read from a
  new tensor the function made require gradients, no optimizer step in the function or after
  its callers: an attack's `loss_gradient`) becomes `loss.backward()` unscaled, its forward in
  autocast, with no scaler: a scaled backward would leave `x.grad` multiplied by the scale (apex
  left it so too: it unscales the optimizer's parameters only), and a `scaler.step` would
  update the model;
* `amp.master_params(opt)` becomes the optimizer's parameters; gradients clipped between the
  backward and the step (apex unscaled them when `scale_loss` exited) get
  `scaler.unscale_(opt)` first, once per iteration;
* `amp.state_dict()` / `amp.load_state_dict(sd)` become the scaler's, under the same checkpoint
  key, with a comment: a checkpoint saved by apex has another format there, so the load runs
  only `if "scale" in sd:` (old checkpoints still load; the scaler then starts afresh).

opt_level: O0 (fp32) gives a disabled scaler and autocast; O1 autocast + GradScaler; O2 the
same with fp32 parameters (no fp16 model copy, said in the fix title); a non-literal level is
taken from its values in this file (parameter defaults and call sites) or its
`add_argument(default=...)` when those are O1/O2 (the fix title says so). `loss_scale="dynamic"` is
GradScaler's default (apex also starts at 2**16 and doubles after 2000 clean steps); a number
becomes `init_scale` (apex never changed a static scale nor skipped a step; GradScaler does
both). `keep_batchnorm_fp32`, `verbosity`, `num_losses` (one scaler for every loss) and
`cast_model_type=torch.float16` are dropped, as native AMP keeps every parameter fp32.

No fix, and a message saying what to do by hand, for: O3 or O2 with `master_weights=False`
(pure fp16 weights), `min_loss_scale`/`max_loss_scale`/`cast_model_outputs`, an unknown
opt_level, several `amp.initialize` calls, a loss computed in another function, steps in
different branches, a scaler the code using it cannot reach, other `apex.amp` functions (which
are named in those messages, and not reported themselves: apex.amp internals such as
`amp._amp_state` have nothing native to migrate to).
The apex semantics assumed are NVIDIA/apex's `amp/frontend.py`, `handle.py` and `scaler.py`
(see `ampfix/migrations/apex/`).

Bad:
```python
from apex import amp

model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for x, y in loader:
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
```

Good:
```python
scaler = torch.amp.GradScaler("cuda")
for x, y in loader:
    optimizer.zero_grad()
    with torch.autocast("cuda"):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
```
"""

    @classmethod
    def triggered_by(cls, text: str, lowered: str) -> bool:
        # the default test narrowed: without "apex", only a module taking `amp` from another (textbrewer's
        # `from .distiller_utils import *`); the model tells whether that is apex's (`Project.star_names`)
        return "apex" in text or ("amp." in text and super().triggered_by(text, lowered)
                                  and FROM_ELSEWHERE.search(text) is not None)

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        plan = ApexMigration(ctx)
        if not plan.uses:
            return
        plan.build()
        fixes = {}
        for use in plan.uses:
            if use.replacements:
                fixes[use] = Fix(dict(use.replacements), applicability=UNSAFE,  # type: ignore[arg-type]
                                 description=use.description, group="apex-amp")
        for use in plan.uses:
            if use.kind == "other":
                continue  # apex.amp internals (`amp._amp_state`, ...): nothing native to migrate them to; the
                # migration of the file's amp calls says they block it
            tensor = ctx.model.training.input_gradient(use.call) if use.kind == "scale_loss" else None
            msg = MESSAGES["input_gradient"].format(tensor=tensor) if tensor else MESSAGES[use.kind]
            reason = use.reason or plan.reason
            if reason:
                yield Violation(use.call, message=f"{msg}; migrate by hand: {reason}")
            else:
                fix = fixes.get(use) or fixes.get(use.absorbed_by) or next(iter(fixes.values()), None)
                yield Violation(use.call, message=msg, fix=fix)


__all__ = ["ApexAmp"]
