"""AMP011 half-with-autocast."""

from __future__ import annotations

import re
from typing import Iterator, Optional

import libcst as cst

from ampfix.fixes.edits import remove_statement, with_args
from ampfix.model import AmpModel, call_name, dotted, literal_bool
from ampfix.model.training import EVAL_FUNCTION, leaves_untrained, same_object_base
from ampfix.model.values import SAME_OBJECT_METHODS
from ampfix.rule import UNSAFE, FileContext, Fix, Rule, Violation

AMP_FLAG = re.compile(r"\bamp\b|use_amp|autocast|mixed", re.IGNORECASE)
# float16 written in the file: `.half()`, `torch.half`, or `float16` that is not part of `bfloat16`
HALF_TEXT = re.compile(r"\.half\(\)|torch\.half|(?<!b)float16")


class HalfWithAutocast(Rule):
    code = "AMP011"
    name = "half-with-autocast"
    message = ("the model is cast to float16 for training in code that uses autocast/GradScaler: its parameters, "
               "the master weights, become float16 (updates smaller than their precision are lost) and "
               "`GradScaler.unscale_` raises \"Attempting to unscale FP16 gradients.\"; keep the model in float32, "
               "autocast casts per operation")
    triggers = (".half()", "float16", "torch.half")
    requires = (("autocast", "GradScaler"),)
    project_requires = ((".half()", "float16", "torch.half"),)
    fixable = "unsafe"

    fix_note = "unsafe (the cast removed; `from_pretrained` loads float32)"
    docs = """
Mixed precision keeps the parameters in float32 (the master weights) and lets autocast run
each operation in float16 where that is safe. `model.half()` (or `model.to(torch.float16)`)
before training with autocast makes the parameters themselves float16: their gradients are
float16, `GradScaler.unscale_` (called by `scaler.step`) raises `ValueError: Attempting to
unscale FP16 gradients.`, and without a scaler the optimizer updates float16 weights, whose
10-bit mantissa drops updates smaller than 1/1024 of the weight.

Reported for `.half()`, `.to(torch.float16)`, `.to(dtype=torch.float16)`,
`from_pretrained(..., torch_dtype=torch.float16)` (or `dtype=`) and `p.data = p.data.half()` in
`for p in model.parameters():` on a model (or a submodule of one: `model.encoder.half()`) that
is trained in this file (its parameters go to an optimizer), in a file with an autocast region
or an enabled GradScaler. A cast under the flag that enables the GradScaler (`if args.fp16:
model.half()` with `GradScaler(enabled=args.fp16)`) is reported too. Left alone: a cast under
`torch.no_grad()` or `inference_mode`, in a function for evaluation or export (`evaluate`,
`export_onnx`, ... or one that puts the model in `.eval()` and never steps), on a
`copy.deepcopy` of the model, after the training in the same function, under a condition
unrelated to AMP or in the branch where AMP is off (`if args.half: model.half()` as an
alternative to autocast), and casts of tensors. Frozen float16 weights are correct (a frozen
parameter has no gradient to unscale): a file that freezes parameters (`requires_grad_(False)`,
`p.requires_grad = False`), a model given to peft or an adapter helper after the cast (`model =
get_peft_model(model, config)`: LoRA trains float32 adapters on the frozen base), a cast
parameter by parameter under a condition are left alone.

The fix (unsafe: the model's dtype changes) removes the cast; `from_pretrained` is given
`torch_dtype=torch.float32` instead (leaving the argument out may load the checkpoint's dtype).

Bad:
```python
import torch

model = Net().cuda().half()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cuda")
with torch.autocast("cuda", dtype=torch.float16):
    loss = model(x).sum()
scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update()
```

Good:
```python
import copy

import torch

model = Net().cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cuda")
with torch.autocast("cuda", dtype=torch.float16):
    loss = model(x).sum()
scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update()
export = copy.deepcopy(model).half()
```
"""

    # the default tests narrowed: `float16` in the text as part of `bfloat16` is no float16
    @classmethod
    def triggered_by(cls, text: str, lowered: str) -> bool:
        return super().triggered_by(text, lowered) and HALF_TEXT.search(text) is not None

    @classmethod
    def project_candidate(cls, text: str, lowered: Optional[str] = None) -> bool:
        return super().project_candidate(text, lowered) and HALF_TEXT.search(text) is not None

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        regions = model.precision.autocast_regions()
        scalers = [c for c in model.calls if model.is_api(c, "GradScaler")
                   and literal_bool(model.scaler_enabled(c)) is not False]
        if not regions and not scalers:
            return
        enabled = [*(model.scaler_enabled(c) for c in scalers),
                   *(_enabled_expr(model, r.call) for r in regions if r.call is not None)]
        amp_texts = {model.code(e) for e in enabled if e is not None}
        scaler_texts = {model.code(e) for e in (model.scaler_enabled(c) for c in scalers) if e is not None}
        if model.training.freezes_parameters():
            return  # which parameters are trained (float32 adapters on frozen float16 weights?) is unknown
        for call in model.calls:
            dtype_arg = model.precision.float16_cast(call)
            if dtype_arg is False:
                continue
            receiver = same_object_base(call.func.value)  # type: ignore[attr-defined]
            top, target = _assigned(model, call)
            if _round_trip(model, call, top):
                continue  # `model.half().float()`
            key = target or dotted(receiver)
            if key is not None and key.endswith(".data"):  # `p.data = p.data.half()` for the model's parameters
                key = model.training.parameters_loop_owner(call, key[:-len(".data")])
            if key is None or not model.training.trained_model(key) or model.training.copied_model(receiver) \
                    or model.training.evaluation_only(call) or not _amp_branch(model, call, amp_texts, scaler_texts) \
                    or model.training.after_training(call) or model.training.rewrapped_after(call, key):
                continue
            yield Violation(call.func.attr, fix=_fix(model, call, dtype_arg, top, target))  # type: ignore[attr-defined]


def _assigned(model: AmpModel, call: cst.Call):
    """(the outermost call of the method chain, the dotted target it is assigned to or None)."""
    top: cst.CSTNode = call
    while True:
        parent, grand = model.parent(top), model.parent(model.parent(top)) if model.parent(top) else None
        if isinstance(parent, cst.Attribute) and isinstance(grand, cst.Call) and grand.func is parent \
                and parent.attr.value in SAME_OBJECT_METHODS:
            top = grand
            continue
        break
    parent = model.parent(top)
    if isinstance(parent, cst.Assign) and len(parent.targets) == 1 and parent.value is top:
        return top, dotted(parent.targets[0].target)
    return top, None


def _round_trip(model: AmpModel, call: cst.Call, top: cst.CSTNode) -> bool:
    """A later `.float()` in the cast's method chain undoes it."""
    node: cst.CSTNode = call
    while node is not top:
        node = model.parent(model.parent(node))  # type: ignore[arg-type]
        if call_name(node) == "float":
            return True
    return False


def _enabled_expr(model: AmpModel, call: cst.Call) -> Optional[cst.BaseExpression]:
    arg = next((a for a in call.args if a.keyword is not None and a.keyword.value == "enabled"), None)
    return arg.value if arg is not None else None


def _amp_branch(model: AmpModel, call: cst.Call, amp_texts: set, scaler_texts: set) -> bool:
    """The cast runs unconditionally, or under a condition that turns AMP on (not off); not in
    a branch for evaluation (`if mode == "inference":`) or one that leaves the function before
    any training (`... return` with no backward or step). A condition that enables the
    GradScaler (`if args.fp16: model.half()` with `GradScaler(enabled=args.fp16)`) turns AMP on,
    whatever its name says."""
    unrelated = amp_on = False
    child: cst.CSTNode = call
    for anc in model.ancestors(call):
        if isinstance(anc, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            break
        if isinstance(anc, (cst.If, cst.IfExp)) and (child is anc.body or child is anc.orelse):
            test = anc.test
            negated = isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not)
            inner = test.expression if negated else test
            amp = model.code(inner) in amp_texts or bool(AMP_FLAG.search(model.code(inner)))
            on = (child is anc.body) != negated
            scaling = model.code(inner) in scaler_texts
            if (amp and not on) or (on and not scaling and EVAL_FUNCTION.search(model.code(inner))) \
                    or leaves_untrained(child):
                return False
            amp_on, unrelated = amp_on or amp, unrelated or not amp
        child = anc
    return amp_on or not unrelated


def _fix(model: AmpModel, call: cst.Call, dtype_arg, top: cst.CSTNode, target: Optional[str]) -> Optional[Fix]:
    receiver = call.func.value  # type: ignore[attr-defined]
    if call_name(call) == "from_pretrained":  # load float32 (leaving it out may mean "auto": the checkpoint's)
        torch_name = model.torch_alias()
        if torch_name is None:
            return None
        new_arg = dtype_arg.with_changes(value=cst.parse_expression(f"{torch_name}.float32"))
        return Fix({dtype_arg: new_arg}, applicability=UNSAFE, description="loaded as float32")
    if dtype_arg is not None and len([a for a in call.args if not a.star]) > 1:
        new: cst.CSTNode = with_args(call, [a for a in call.args if a is not dtype_arg])
        return Fix({call: new}, applicability=UNSAFE, description="float16 cast removed")
    stmt = model.statement_of(call)
    small = model.small_statement_of(call)
    if isinstance(small, cst.Expr) and small.value is call and isinstance(stmt, cst.SimpleStatementLine) \
            and len(stmt.body) == 1:
        return Fix(remove_statement(model, stmt), applicability=UNSAFE, description="float16 cast removed")
    if isinstance(small, cst.Assign) and small.value is call and target is not None and dotted(receiver) == target \
            and isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        return Fix(remove_statement(model, stmt), applicability=UNSAFE, description="float16 cast removed")
    return Fix({call: receiver}, applicability=UNSAFE, description="float16 cast removed")
