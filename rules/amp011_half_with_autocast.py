"""AMP011 half-with-autocast."""

from __future__ import annotations

import re
from typing import Iterator, List, Optional

import libcst as cst

from ampfix.fixes.edits import remove_statement, with_args
from ampfix.model import AmpModel, call_name, dotted, literal_bool
from ampfix.model.values import SAME_OBJECT_METHODS
from ampfix.rule import UNSAFE, FileContext, Fix, Rule, Violation

EVAL_FUNCTION = re.compile(r"eval|export|infer|predict|test|valid|val_|_val$|^val$|bench|sample|generate|demo|onnx|"
                           r"trace|convert|quantiz|deploy|serve|save|load|half|fp16|ema", re.IGNORECASE)
AMP_FLAG = re.compile(r"\bamp\b|use_amp|autocast|mixed", re.IGNORECASE)
NO_GRAD = ("torch.no_grad", "torch.inference_mode", "torch.autograd.grad_mode.no_grad",
           "torch.autograd.grad_mode.inference_mode")
LOADER_DTYPE = ("torch_dtype", "dtype")  # `from_pretrained(..., torch_dtype=torch.float16)`
# calls that hand back the same parameters (a wrapper trains what it wraps)
TRANSPARENT = re.compile(r"^(?:DistributedDataParallel|DDP|DataParallel|FullyShardedDataParallel|FSDP|compile|"
                         r"to|cuda|train)$")
# calls given the model that may freeze its weights and add trainable float32 ones (LoRA, adapters)
FREEZING = re.compile(r"peft|lora|adapter|freeze|prepare_model", re.IGNORECASE)


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

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        regions = model.autocast_regions()
        scalers = [c for c in model.calls if model.is_api(c, "GradScaler")
                   and literal_bool(model.scaler_enabled(c)) is not False]
        if not regions and not scalers:
            return
        enabled = [*(model.scaler_enabled(c) for c in scalers),
                   *(_enabled_expr(model, r.call) for r in regions if r.call is not None)]
        amp_texts = {model.code(e) for e in enabled if e is not None}
        scaler_texts = {model.code(e) for e in (model.scaler_enabled(c) for c in scalers) if e is not None}
        if _freezes_parameters(model):
            return  # which parameters are trained (float32 adapters on frozen float16 weights?) is unknown
        for call in model.calls:
            dtype_arg = _half_cast(model, call)
            if dtype_arg is False:
                continue
            receiver = _strip(call.func.value)  # type: ignore[attr-defined]
            top, target = _assigned(model, call)
            if _round_trip(model, call, top):
                continue  # `model.half().float()`
            key = target or dotted(receiver)
            if key is not None and key.endswith(".data"):  # `p.data = p.data.half()` for the model's parameters
                key = _parameters_of(model, call, key[:-len(".data")])
            if key is None or not _trained(model, key) or _deepcopy(model, receiver) \
                    or _eval_only(model, call) or not _amp_branch(model, call, amp_texts, scaler_texts) \
                    or _after_training(model, call) or _wrapped_after(model, call, key):
                continue
            yield Violation(call.func.attr, fix=_fix(model, call, dtype_arg, top, target))  # type: ignore[attr-defined]


def _half_cast(model: AmpModel, call: cst.Call):
    """False when `call` is no float16 cast; else the dtype Arg (None for `.half()`)."""
    name = call_name(call)
    if not isinstance(call.func, cst.Attribute):
        return False
    if name == "half" and not call.args:
        return None
    if name == "from_pretrained":  # loaded as float16
        for arg in call.args:
            if arg.keyword is not None and arg.keyword.value in LOADER_DTYPE and _float16(model, arg.value):
                return arg
        return False
    if name == "to":
        for arg in call.args:
            if arg.star or (arg.keyword is not None and arg.keyword.value != "dtype"):
                continue
            if _float16(model, arg.value):
                return arg
    return False


def _float16(model: AmpModel, expr: cst.BaseExpression) -> bool:
    """`expr` is `torch.float16` (or `torch.half`), directly or through names that hold only it."""
    api = model.api_of(expr)
    if api is not None:
        return api.kind == "dtype.float16"
    return isinstance(expr, (cst.Name, cst.Attribute)) and model.torch_dtype_valued(expr) \
        and model.dtype_values(expr) == {"float16"}


def _strip(expr: cst.BaseExpression) -> cst.BaseExpression:
    """`X.cuda().train()` -> `X`."""
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) \
            and expr.func.attr.value in SAME_OBJECT_METHODS:
        expr = expr.func.value
    return expr


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


def _trained(model: AmpModel, key: str) -> bool:
    """`key` names a model trained in this file by a torch optimizer: its parameters go to
    `torch.optim.X(...)` (directly or through a name), or the model to an optimizer factory
    (`create_optimizer(model, ...)`). A submodule of such a model (`model.encoder`) is trained with
    it. Optimizers of other libraries may keep their own float32 master weights (apex, fused
    LAMB): not this rule's business."""
    owners = [key] + [key.rsplit(".", i)[0] for i in range(1, key.count(".") + 1)]
    return any(_trained_exactly(model, k) for k in owners)


def _trained_exactly(model: AmpModel, key: str) -> bool:
    for call in model.calls:
        name = call_name(call) or ""
        torch_opt = model.is_api(call, "optimizer")
        if not torch_opt and not re.search(r"optim", name, re.IGNORECASE):
            continue
        args = [a.value for a in call.args]
        args += [v for a in args if dotted(a) is not None
                 for v in model.possible_values(a) if isinstance(v, cst.CSTNode)]
        for arg in args:
            if not torch_opt and key in (dotted(arg), model.key(arg)):
                return True
            for sub in [arg, *_calls_under(arg)]:
                if call_name(sub) in ("parameters", "named_parameters") and isinstance(sub.func, cst.Attribute) \
                        and key in (dotted(sub.func.value), model.key(sub.func.value)):
                    return True
    return False


def _calls_under(node: cst.CSTNode) -> List[cst.Call]:
    out: List[cst.Call] = []
    stack = list(node.children)
    while stack:
        n = stack.pop()
        if isinstance(n, cst.Call):
            out.append(n)
        stack.extend(n.children)
    return out


def _deepcopy(model: AmpModel, receiver: cst.BaseExpression) -> bool:
    values = [receiver] + ([v for v in model.possible_values(receiver)] if dotted(receiver) else [])
    return any(isinstance(v, cst.Call) and (call_name(_strip(v)) == "deepcopy" or call_name(v) == "deepcopy")
               for v in values)


def _eval_only(model: AmpModel, call: cst.Call) -> bool:
    """The cast runs under no_grad/inference_mode, or in a function for evaluation or export."""
    child: cst.CSTNode = call
    for anc in model.ancestors(call):
        if isinstance(anc, cst.With) and child is anc.body and any(
                isinstance(i.item, cst.Call) and model.qualnames(i.item.func) & set(NO_GRAD) for i in anc.items):
            return True
        if isinstance(anc, cst.FunctionDef):
            if EVAL_FUNCTION.search(anc.name.value) or any(
                    model.qualnames(getattr(d.decorator, "func", d.decorator)) & set(NO_GRAD)
                    for d in anc.decorators):
                return True
            calls = model.calls_in_scope(anc)
            names = {call_name(c) for c in calls}
            if "eval" in names and not names & {"backward", "step"}:
                return True
        child = anc
    return False


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
                    or _leaves_untrained(child):
                return False
            amp_on, unrelated = amp_on or amp, unrelated or not amp
        child = anc
    return amp_on or not unrelated


def _leaves_untrained(block: cst.CSTNode) -> bool:
    """A branch body that ends in `return`/`raise` and calls no backward or step."""
    body = getattr(block, "body", None)
    if isinstance(block, cst.Else):
        body = getattr(block.body, "body", None)
    if not isinstance(body, (list, tuple)) or not body:
        return False
    last = body[-1]
    if not (isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[-1], (cst.Return, cst.Raise))):
        return False
    return not any(call_name(c) in ("backward", "step") for c in _calls_under(block))


def _parameters_of(model: AmpModel, call: cst.Call, name: str) -> Optional[str]:
    """`p.data = p.data.half()` in `for p in M.parameters():` (or `for n, p in
    M.named_parameters():`): M, when every parameter is cast (no condition in the loop, no
    `requires_grad` read or written there); else None."""
    loop = model.loop_of(call)
    if not isinstance(loop, cst.For) or not isinstance(loop.iter, cst.Call) \
            or call_name(loop.iter) not in ("parameters", "named_parameters") \
            or not isinstance(loop.iter.func, cst.Attribute):
        return None
    target = loop.target
    if isinstance(target, cst.Tuple) and call_name(loop.iter) == "named_parameters" and len(target.elements) == 2:
        target = target.elements[1].value
    if dotted(target) != name or "requires_grad" in model.code(loop.body):
        return None
    if any(isinstance(a, (cst.If, cst.IfExp, cst.Try)) for a in _between(model, call, loop)):
        return None
    return dotted(loop.iter.func.value)


def _between(model: AmpModel, node: cst.CSTNode, outer: cst.CSTNode) -> List[cst.CSTNode]:
    out = []
    for anc in model.ancestors(node):
        if anc is outer:
            break
        out.append(anc)
    return out


def _freezes_parameters(model: AmpModel) -> bool:
    """The file freezes parameters (`requires_grad_(False)`, `p.requires_grad = False`): then
    which ones are trained, and in which dtype, is not this rule's to tell (LoRA on frozen
    float16 weights trains float32 adapters, correctly)."""
    for call in model.calls:
        if call_name(call) == "requires_grad_" and call.args and literal_bool(call.args[0].value) is False:
            return True
    return any(key.endswith(".requires_grad") and any(literal_bool(v) is False for _, v in entries)
               for key, entries in model.assignments.items())


def _wrapped_after(model: AmpModel, call: cst.Call, key: str) -> bool:
    """After the cast the model goes through a call that may freeze it and add trainable weights
    (`model = get_peft_model(model, config)`, `prepare_model_for_kbit_training(model)`), or is
    replaced by what such a call returns: what is trained is no longer known."""
    for other in model.calls:
        if other is call or not model.before(call, other):
            continue
        name = call_name(other) or ""
        given = any(dotted(a.value) == key for a in other.args)
        if given and FREEZING.search(name):
            return True
        parent = model.parent(other)
        if given and isinstance(parent, cst.Assign) and parent.value is other \
                and any(dotted(t.target) == key for t in parent.targets) and not TRANSPARENT.match(name):
            return True
    return False


def _after_training(model: AmpModel, call: cst.Call) -> bool:
    """The cast follows every backward/step of its function and runs in no loop of it."""
    scope = model.scope_of(call)
    steps = [c for c in model.calls_in_scope(scope) if call_name(c) in ("backward", "step")]
    return bool(steps) and all(model.before(c, call) for c in steps) and model.loop_of(call) is None


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
