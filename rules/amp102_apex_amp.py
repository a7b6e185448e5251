"""AMP102 apex-amp: migrate NVIDIA apex.amp training code to native torch.amp.

The migration is one unit, planned by `ampfix.migration_apex`: each apex call is one finding with
its own fix (the summary counts them), all in one fix group, offered only when every apex use in
the file can be migrated; otherwise each finding says what is left to do by hand.
"""

from __future__ import annotations

from typing import Iterator

from ampfix.migration_apex import ApexMigration
from ampfix.rule import UNSAFE, FileContext, Fix, Rule, Violation

MESSAGES = {
    "initialize": 'apex amp.initialize: NVIDIA apex is superseded by native AMP: create a torch.amp.GradScaler("cuda") '
                  "once and run the forward pass in torch.autocast(\"cuda\")",
    "scale_loss": "apex amp.scale_loss: use scaler.scale(loss).backward(), the forward pass in "
                  'torch.autocast("cuda"), and scaler.step(optimizer) + scaler.update()',
    "master_params": "apex amp.master_params: clip the optimizer's parameters after scaler.unscale_(optimizer)",
    "state_dict": "apex amp.state_dict: save scaler.state_dict()",
    "load_state_dict": "apex amp.load_state_dict: load into scaler.load_state_dict()",
    "other": "apex.amp has no native equivalent for this call",
}


class ApexAmp(Rule):
    code = "AMP102"
    name = "apex-amp"
    message = "NVIDIA apex.amp is superseded by native AMP (torch.amp.GradScaler + torch.autocast)"
    triggers = ("apex",)
    fixable = "unsafe"
    fix_note = "unsafe (NVIDIA apex amp to native AMP)"
    docs = """
NVIDIA apex's `amp` (`amp.initialize`, `amp.scale_loss`, `amp.master_params`) is deprecated in
favour of native AMP, which ships with torch and needs no extension build.

The fix (unsafe: it restructures the training loop) migrates the whole file at once:

* `model, optimizer = amp.initialize(model, optimizer, opt_level="O1")` disappears; a
  `torch.amp.GradScaler("cuda")` is created in its place, once (O1 and O2; `loss_scale=128.0`
  becomes `init_scale=128.0`; native AMP always scales dynamically, so a fixed apex scale becomes
  the starting scale; `"dynamic"` is the default);
* `with amp.scale_loss(loss, optimizer) as scaled: scaled.backward()` becomes
  `scaler.scale(loss).backward()`, the statements of the iteration that the loss depends on are
  wrapped in `torch.autocast("cuda")` (the others stay outside), and the following
  `optimizer.step()` becomes `scaler.step(optimizer)` + `scaler.update()`;
* `amp.master_params(optimizer)` becomes the optimizer's parameters, after
  `scaler.unscale_(optimizer)` when it is used between backward and step (gradient clipping);
* `amp.state_dict()` / `amp.load_state_dict(sd)` become the scaler's.

No fix, and a message saying what to do by hand, for: opt_level O0/O3, several
`amp.initialize` calls, a loss computed in another function, `delay_unscale`/`loss_id`/several
optimizers, a scaler that the code using it cannot see, other `apex.amp` functions.

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
            msg = MESSAGES[use.kind]
            reason = use.reason or plan.reason
            if reason:
                yield Violation(use.call, message=f"{msg}; migrate by hand: {reason}")
            else:
                yield Violation(use.call, message=msg, fix=fixes.get(use) or fixes[use.absorbed_by])


__all__ = ["ApexAmp"]
