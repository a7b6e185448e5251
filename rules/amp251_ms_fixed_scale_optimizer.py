"""AMP251 ms-fixed-scale-optimizer."""

from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from ampfix.fixes.edits import keyword_arg, with_args
from ampfix.model.frameworks import MS_ADAPTIVE, MS_LOSS_SCALE_AT, MS_NO_LOSS_SCALE, frameworks, ms_name, ms_trainings
from ampfix.model.syntax import dotted, get_arg
from ampfix.rule import SAFE, FileContext, Fix, Rule, Violation

DEFAULT_SCALE = "128.0"  # FixedLossScaleManager(loss_scale=128.0, drop_overflow_update=True)


def _number(model, expr: Optional[cst.CSTNode]) -> Optional[float]:
    values = model.possible_values(expr) if expr is not None else []
    nums = {float(v.value.replace("_", "")) for v in values if isinstance(v, (cst.Integer, cst.Float))}
    if len(nums) == 1 and len(values) == len([v for v in values if isinstance(v, (cst.Integer, cst.Float))]):
        return nums.pop()
    return None


def factor(want: Optional[float], have: Optional[float]) -> str:
    return f"{want / (have or 1.0):g}x" if want else "`loss_scale` times"


class MsFixedScaleOptimizer(Rule):
    code = "AMP251"
    name = "ms-fixed-scale-optimizer"
    message = ("`FixedLossScaleManager({scale}, drop_overflow_update=False)` leaves dividing the gradients to the "
               "optimizer, but `{opt}` is built {how}: {effect}; build it with `loss_scale={scale}`")
    triggers = ("FixedLossScaleManager",)
    requires = (("mindspore",),)
    fixable = "sometimes"
    fix_note = "safe (`loss_scale=` the manager's scale on the optimizer); none for optimizers without it"
    docs = """
MindSpore's `FixedLossScaleManager(loss_scale, drop_overflow_update=False)` (given to `Model`
or `amp.build_train_network`) multiplies the loss by `loss_scale` and, unlike the default
`drop_overflow_update=True`, does not divide the gradients back: the MindSpore mixed precision
documentation says the optimizer must then be built with the same `loss_scale`, and divides
by it. An optimizer built without it (its `loss_scale` defaults to 1.0), or with another value,
applies updates multiplied by the scale: with `nn.Momentum` or `nn.SGD` every step is `loss_scale`
times too large (1024x for a scale of 1024) and the loss diverges, to NaN within the first epoch
of a small network; with the optimizer's `loss_scale` equal to the manager's it trains. Adaptive
optimizers (Adam, RMSProp, Adagrad, ...) normalise the gradients' size away, so there the
mistake shows as weight decay and eps acting `loss_scale` times weaker (MindSpore's `Optimizer`
multiplies `weight_decay` by its `loss_scale` to match the scaled gradients).

The fix (safe) adds (or corrects) `loss_scale=` on the optimizer (Momentum, SGD, Adam, LazyAdam,
Adagrad, Adadelta, Adamax, FTRL, ProximalAdagrad, RMSProp) with the manager's scale: the same
name when it names one value at both places, else the literal. Optimizers without a `loss_scale`
argument (`AdamWeightDecay`, `Lamb`, `ASGD`, `Rprop`) are reported with no fix: the article's
remedy is a custom `TrainOneStepCell` that divides the gradients by the scale (and then no loss
scale manager in `Model`). The positive `drop_overflow_update=True` (the default) and
`DynamicLossScaleManager` need nothing from the optimizer.

Bad:
```python
import mindspore as ms
from mindspore import nn

loss_scale_manager = ms.FixedLossScaleManager(1024.0, drop_overflow_update=False)
net_opt = nn.Momentum(network.trainable_params(), learning_rate=0.01, momentum=0.9)
model = ms.Model(network, net_loss, net_opt, amp_level="O2", loss_scale_manager=loss_scale_manager)
```

Good:
```python
import mindspore as ms
from mindspore import nn

loss_scale_manager = ms.FixedLossScaleManager(1024.0, drop_overflow_update=False)
net_opt = nn.Momentum(network.trainable_params(), learning_rate=0.01, momentum=0.9, loss_scale=1024.0)
model = ms.Model(network, net_loss, net_opt, amp_level="O2", loss_scale_manager=loss_scale_manager)
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        seen = set()
        for t in ms_trainings(model):
            opt, mgr = t.optimizer, t.manager
            name = ms_name(model, opt)
            scale_arg = get_arg(mgr, 0, "loss_scale")
            scale = model.code(scale_arg.value) if scale_arg is not None else DEFAULT_SCALE
            want = _number(model, scale_arg.value) if scale_arg is not None else float(DEFAULT_SCALE)
            if name in MS_NO_LOSS_SCALE and id(opt) not in seen:
                seen.add(id(opt))
                yield Violation(opt, message=(
                    f"`FixedLossScaleManager({scale}, drop_overflow_update=False)` leaves dividing the gradients to "
                    f"the optimizer, but `{name}` has no `loss_scale`: every update is applied {factor(want, None)} too large; "
                    "divide the gradients by the scale in a custom TrainOneStepCell (and give `Model` no loss scale "
                    "manager), or use `drop_overflow_update=True`"))
                continue
            if name not in MS_LOSS_SCALE_AT or any(a.star for a in opt.args) or id(opt) in seen:
                continue
            have = get_arg(opt, MS_LOSS_SCALE_AT[name], "loss_scale")
            if have is not None:
                if model.code(have.value) == scale or want is None or _number(model, have.value) in (None, want):
                    continue
            seen.add(id(opt))
            how = "without `loss_scale`" if have is None else f"with `loss_scale={model.code(have.value)}`"
            times = factor(want, have and _number(model, have.value))
            effect = f"every update is applied {times} too large" if name not in MS_ADAPTIVE else (
                f"its gradients arrive {times} too large ({name} normalises their size away, but its weight decay "
                "and eps act that much weaker)")
            message = self.message.format(scale=scale, opt=name, how=how, effect=effect)
            yield Violation(opt, message=message,
                            fix=self._fix(model, frameworks(model), opt, mgr, scale_arg, have))

    @staticmethod
    def _fix(model, facts, opt: cst.Call, mgr: cst.Call, scale_arg, have) -> Optional[Fix]:
        if scale_arg is None:
            value = cst.Float(DEFAULT_SCALE)
        elif isinstance(scale_arg.value, (cst.Integer, cst.Float)):
            value = scale_arg.value
        elif isinstance(scale_arg.value, (cst.Name, cst.Attribute)) and dotted(scale_arg.value) \
                and len(model.values_of(scale_arg.value)) <= 1 and facts.usable_at(dotted(scale_arg.value), mgr, opt):
            value = scale_arg.value
        else:
            n = _number(model, scale_arg.value)
            if n is None:
                return None
            value = cst.Float(repr(n))
        if have is not None:
            new = opt.with_changes(args=[a.with_changes(value=value) if a is have else a for a in opt.args])
        else:
            new = with_args(opt, [*opt.args, keyword_arg("loss_scale", value)])
        return Fix({opt: new}, applicability=SAFE, description=f"loss_scale={model.code(value)} on the optimizer")
