"""Migrating NVIDIA apex.amp code to native AMP (torch.amp.GradScaler + torch.autocast).

`ApexMigration(ctx).build()` finds every `apex.amp` call and the imports that bind it, and plans
the whole migration as one unit, or says for each call why it cannot be done:

* the bindings: `from apex import amp [as X]`, `import apex` (`apex.amp.*`), `import apex.amp as
  X`, also inside `try: ... except ImportError: amp = None` with availability flags
  (`APEX_AVAILABLE = True/False`); the import, the `try` and the flags go, and every `if` that
  tests apex's availability is simplified (native AMP is always there);
* `amp.initialize` becomes one `torch.amp.GradScaler("cuda", ...)`, created unconditionally where
  the initialize ran (its enclosing `if args.fp16:` becomes `enabled=args.fp16`), as a local, a
  `self.` attribute (initialize in a method, used in methods of its class), a module-level name,
  or one more value returned to the one caller that holds the other uses; never a global
  assigned inside a function (no `global` is injected: the migration is not applied);
* `amp.scale_loss(loss, opt[s], delay_unscale=..., loss_id=...)` becomes
  `scaler.scale(loss).backward()`, the statements the loss depends on run in
  `torch.autocast("cuda")`, every following `opt.step()` becomes `scaler.step(opt)`, with one
  `scaler.update()` after the last step of the iteration;
* `amp.master_params(opt)` the optimizer's parameters, after `scaler.unscale_(opt)`;
* `amp.state_dict()/load_state_dict()` the scaler's (same checkpoint key, with a comment); every
  place in the file that reads that checkpoint entry back changes with it, or nothing does;
* another module of the project that still uses apex amp (`ctx.extra["apex_amp_elsewhere"]`,
  see `checkpoints.elsewhere`) stops the migration: it is project-wide or not applied.

Assumed apex semantics (NVIDIA/apex `apex/amp/frontend.py`, `handle.py`, `scaler.py`): O0 is
fp32 with a static scale of 1 (no AMP); O1 patches torch functions (autocast's job); O2 casts the
model to fp16 with fp32 master weights in the optimizer (native keeps fp32 parameters and
autocasts, which is what `autocast + GradScaler` does); O3 is pure fp16. `loss_scale="dynamic"`
starts at 2**16 and doubles after 2000 clean steps, like GradScaler's defaults; a number is a
static scale that apex never changes (and never skips a step for): it becomes `init_scale`.
`delay_unscale=True` only postpones apex's unscale to a later `scale_loss`; native gradients
stay scaled until `scaler.step`/`unscale_`, so it has nothing to map to. With `num_losses`/
`loss_id` apex keeps one loss scaler per loss; native uses one GradScaler for all of them.

The package: `plan.py` (the migration's state and the order of its parts), `conditions.py`
(imports and availability tests), `scaler.py` (`amp.initialize`), `loop.py` (the training
step), `checkpoints.py` (what else must change with it, or refuses it), `common.py`; and
`rest.py`, apex outside `apex.amp` to torch (AMP103's), one use at a time.
"""

from ampfix.migrations.apex.common import ApexUse
from ampfix.migrations.apex.plan import ApexMigration

__all__ = ["ApexMigration", "ApexUse"]
