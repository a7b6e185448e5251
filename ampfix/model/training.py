"""Training facts: which models a file trains, and where a model is copied, evaluated, frozen or
rewrapped. Asked by AMP011 (a float16 cast of a trained model under AMP) and open to every rule."""

from __future__ import annotations

import re
from typing import List, Optional

import libcst as cst

from ampfix.model.facet import Facet
from ampfix.model.syntax import call_name, literal_bool
from ampfix.model.tree import child_nodes, dotted
from ampfix.model.values import SAME_OBJECT_METHODS

EVAL_FUNCTION = re.compile(r"eval|export|infer|predict|test|valid|val_|_val$|^val$|bench|sample|generate|demo|onnx|"
                           r"trace|convert|quantiz|deploy|serve|save|load|half|fp16|ema", re.IGNORECASE)
NO_GRAD = ("torch.no_grad", "torch.inference_mode", "torch.autograd.grad_mode.no_grad",
           "torch.autograd.grad_mode.inference_mode")
# calls that hand back the same parameters (a wrapper trains what it wraps)
TRANSPARENT = re.compile(r"^(?:DistributedDataParallel|DDP|DataParallel|FullyShardedDataParallel|FSDP|compile|"
                         r"to|cuda|train)$")
# calls given the model that may freeze its weights and add trainable float32 ones (LoRA, adapters)
FREEZING = re.compile(r"peft|lora|adapter|freeze|prepare_model", re.IGNORECASE)


class Training(Facet):
    """The training facts of a file: `model.training`."""

    def trained_model(self, key: str) -> bool:
        """`key` names a model trained in this file by a torch optimizer: its parameters go to
        `torch.optim.X(...)` (directly or through a name), or the model to an optimizer factory
        (`create_optimizer(model, ...)`). A submodule of such a model (`model.encoder`) is trained with
        it. Optimizers of other libraries may keep their own float32 master weights (apex, fused
        LAMB): not this rule's business."""
        owners = [key] + [key.rsplit(".", i)[0] for i in range(1, key.count(".") + 1)]
        return any(self._trained_exactly(k) for k in owners)

    def _trained_exactly(self, key: str) -> bool:
        for call in self.model.calls:
            name = call_name(call) or ""
            torch_opt = self.model.is_api(call, "optimizer")
            if not torch_opt and not re.search(r"optim", name, re.IGNORECASE):
                continue
            args = [a.value for a in call.args]
            args += [v for a in args if dotted(a) is not None
                     for v in self.model.possible_values(a) if isinstance(v, cst.CSTNode)]
            for arg in args:
                if not torch_opt and key in (dotted(arg), self.model.key(arg)):
                    return True
                for sub in [arg, *calls_under(arg)]:
                    if call_name(sub) in ("parameters", "named_parameters") and isinstance(sub.func, cst.Attribute) \
                            and key in (dotted(sub.func.value), self.model.key(sub.func.value)):
                        return True
        return False

    def copied_model(self, receiver: cst.BaseExpression) -> bool:
        values = [receiver] + ([v for v in self.model.possible_values(receiver)] if dotted(receiver) else [])
        return any(isinstance(v, cst.Call) and (call_name(same_object_base(v)) == "deepcopy" or call_name(v) == "deepcopy")
                   for v in values)

    def evaluation_only(self, call: cst.Call) -> bool:
        """The cast runs under no_grad/inference_mode, or in a function for evaluation or export."""
        child: cst.CSTNode = call
        for anc in self.model.ancestors(call):
            if isinstance(anc, cst.With) and child is anc.body and any(
                    isinstance(i.item, cst.Call) and self.model.qualnames(i.item.func) & set(NO_GRAD) for i in anc.items):
                return True
            if isinstance(anc, cst.FunctionDef):
                if EVAL_FUNCTION.search(anc.name.value) or any(
                        self.model.qualnames(getattr(d.decorator, "func", d.decorator)) & set(NO_GRAD)
                        for d in anc.decorators):
                    return True
                calls = self.model.calls_in_scope(anc)
                names = {call_name(c) for c in calls}
                if "eval" in names and not names & {"backward", "step"}:
                    return True
            child = anc
        return False

    def parameters_loop_owner(self, call: cst.Call, name: str) -> Optional[str]:
        """`p.data = p.data.half()` in `for p in M.parameters():` (or `for n, p in
        M.named_parameters():`): M, when every parameter is cast (no condition in the loop, no
        `requires_grad` read or written there); else None."""
        loop = self.model.loop_of(call)
        if not isinstance(loop, cst.For) or not isinstance(loop.iter, cst.Call) \
                or call_name(loop.iter) not in ("parameters", "named_parameters") \
                or not isinstance(loop.iter.func, cst.Attribute):
            return None
        target = loop.target
        if isinstance(target, cst.Tuple) and call_name(loop.iter) == "named_parameters" and len(target.elements) == 2:
            target = target.elements[1].value
        if dotted(target) != name or "requires_grad" in self.model.code(loop.body):
            return None
        if any(isinstance(a, (cst.If, cst.IfExp, cst.Try)) for a in _between(self.model, call, loop)):
            return None
        return dotted(loop.iter.func.value)

    def freezes_parameters(self) -> bool:
        """The file freezes parameters (`requires_grad_(False)`, `p.requires_grad = False`): then
        which ones are trained, and in which dtype, is not this rule's to tell (LoRA on frozen
        float16 weights trains float32 adapters, correctly)."""
        for call in self.model.calls:
            if call_name(call) == "requires_grad_" and call.args and literal_bool(call.args[0].value) is False:
                return True
        return any(key.endswith(".requires_grad") and any(literal_bool(v) is False for _, v in entries)
                   for key, entries in self.model.assignments.items())

    def rewrapped_after(self, call: cst.Call, key: str) -> bool:
        """After the cast the model goes through a call that may freeze it and add trainable weights
        (`model = get_peft_model(model, config)`, `prepare_model_for_kbit_training(model)`), or is
        replaced by what such a call returns: what is trained is no longer known."""
        for other in self.model.calls:
            if other is call or not self.model.before(call, other):
                continue
            name = call_name(other) or ""
            given = any(dotted(a.value) == key for a in other.args)
            if given and FREEZING.search(name):
                return True
            parent = self.model.parent(other)
            if given and isinstance(parent, cst.Assign) and parent.value is other \
                    and any(dotted(t.target) == key for t in parent.targets) and not TRANSPARENT.match(name):
                return True
        return False

    def after_training(self, call: cst.Call) -> bool:
        """The cast follows every backward/step of its function and runs in no loop of it."""
        scope = self.model.scope_of(call)
        steps = [c for c in self.model.calls_in_scope(scope) if call_name(c) in ("backward", "step")]
        return bool(steps) and all(self.model.before(c, call) for c in steps) and self.model.loop_of(call) is None


def calls_under(node: cst.CSTNode) -> List[cst.Call]:
    out: List[cst.Call] = []
    stack = list(child_nodes(node))
    while stack:
        n = stack.pop()
        if isinstance(n, cst.Call):
            out.append(n)
        stack.extend(child_nodes(n))
    return out


def leaves_untrained(block: cst.CSTNode) -> bool:
    """A branch body that ends in `return`/`raise` and calls no backward or step."""
    body = getattr(block, "body", None)
    if isinstance(block, cst.Else):
        body = getattr(block.body, "body", None)
    if not isinstance(body, (list, tuple)) or not body:
        return False
    last = body[-1]
    if not (isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[-1], (cst.Return, cst.Raise))):
        return False
    return not any(call_name(c) in ("backward", "step") for c in calls_under(block))


def _between(model, node: cst.CSTNode, outer: cst.CSTNode) -> List[cst.CSTNode]:
    out = []
    for anc in model.ancestors(node):
        if anc is outer:
            break
        out.append(anc)
    return out


def same_object_base(expr: cst.BaseExpression) -> cst.BaseExpression:
    """`X.cuda().train()` -> `X`: the object calls that return it unchanged lead back to."""
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) \
            and expr.func.attr.value in SAME_OBJECT_METHODS:
        expr = expr.func.value
    return expr


__all__ = ["EVAL_FUNCTION", "Training", "calls_under", "leaves_untrained", "same_object_base"]
