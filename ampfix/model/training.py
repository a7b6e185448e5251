"""Training facts: which models a file trains, and where a model is copied, evaluated, frozen or
rewrapped. Asked by AMP011 (a float16 cast of a trained model under AMP) and open to every rule.
`input_gradient`: a backward that computes an input's gradient (an attack, a saliency map), not a
training step; asked by AMP102 and the apex migration (such a backward needs no loss scaling)."""

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
# calls that make a new tensor, never an `nn.Parameter` (its `.grad` is not a parameter's)
TENSOR_FACTORIES = {f"torch.{n}" for n in (
    "tensor", "from_numpy", "as_tensor", "zeros", "ones", "empty", "full", "rand", "randn", "randint", "arange",
    "linspace", "zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like")}
# numpy arrays (of tensors: `np.empty(n, dtype=object)`), never a parameter themselves
ARRAY_FACTORIES = {f"numpy.{n}" for n in ("empty", "zeros", "array", "asarray")}
# methods that give a new tensor (`detach`, `clone`) or the same one moved or cast
FRESH_METHODS = {"detach", "clone", "to", "cuda", "cpu", "float", "double", "half", "requires_grad_", "contiguous"}
MAX_HELPER_DEPTH = 3  # helpers followed for a `.step()` or a `requires_grad` set


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

    def input_gradient(self, node: cst.CSTNode) -> Optional[str]:
        """The backward at `node` (a `loss.backward()`, or the `amp.scale_loss(...)` of a
        `scaled_loss.backward()`) computes the gradient of an input, not a training step: after it,
        its function reads the `.grad` of a tensor that is no parameter (`x.grad`, `x[i].grad`,
        where `x` is a local bound only to new tensors or arrays: `torch.tensor(...)`,
        `torch.from_numpy(...)`, `x.clone().detach()`, `np.empty(...)`) and that the function made
        require gradients (`x.requires_grad = True`, `x.requires_grad_()`, `requires_grad=True`,
        or a helper of this file it is passed to that does it to its parameter or its items); and
        nothing steps an optimizer: no `.step()` call in the function, in the functions of this file
        it calls or in those that call it. Returns the tensor's text (`x_grad`), else None."""
        model = self.model
        func = model.function_of(node)
        if func is None or self._steps(func, 0) or any(self._steps(model.scope_of(c), 0, after=c)
                                                       for c in model.callers(func)):
            return None
        for attr in model._nodes_in_scope(func, cst.Attribute):
            if attr.attr.value != "grad" or not model.before(node, attr) or self._assigned(attr):
                continue
            tensor = attr.value
            base = tensor.value if isinstance(tensor, cst.Subscript) else tensor
            if isinstance(base, cst.Name) and self._fresh_local(func, base.value) \
                    and self._made_to_require_grad(func, base.value, isinstance(tensor, cst.Subscript)):
                return model.code(tensor)
        return None

    def _assigned(self, attr: cst.Attribute) -> bool:
        """`x.grad = None`: a write, not a read."""
        parent = self.model.parent(attr)
        return isinstance(parent, cst.AssignTarget) or (isinstance(parent, (cst.AugAssign, cst.AnnAssign))
                                                       and parent.target is attr)

    def _steps(self, scope: cst.CSTNode, depth: int, after: Optional[cst.Call] = None) -> bool:
        """A `.step()` call in `scope` or in the functions of this file it calls (conservative: any
        receiver, an unresolved call counts as none); with `after`, only those that may run after
        that call (later in the text, or anywhere in a loop around it)."""
        model = self.model
        loop = model.loop_of(after) if after is not None else None
        for call in model.calls_in_scope(scope):
            if after is not None and not model.before(after, call) \
                    and not (loop is not None and model.is_ancestor(loop, call)):
                continue
            if call_name(call) == "step" and isinstance(call.func, cst.Attribute):
                return True
            if depth < MAX_HELPER_DEPTH and any(f is not scope and self._steps(f, depth + 1)
                                              for f in self.model.callees(call)):
                return True
        return False

    def _fresh_local(self, func: cst.FunctionDef, name: str) -> bool:
        """`name` is a local of `func` (not a parameter) bound only by assignments of a new tensor or
        array (see `input_gradient`)."""
        model = self.model
        if model._is_param(func, name) or name in model._index.declared.get(func, ()):
            return False
        values = []
        for node, target, value in model._index.assignments:
            if isinstance(target, cst.Name) and target.value == name and model.scope_of(node) is func:
                if value is None or not isinstance(node, cst.Assign) or len(node.targets) != 1:
                    return False  # a loop target, `with ... as x`, `x += ...`, `a = x = ...`
                values.append(value)
        return bool(values) and all(self._fresh_value(v) for v in values)

    def _fresh_value(self, value: cst.BaseExpression) -> bool:
        chain = value
        detached = False
        while isinstance(chain, cst.Call) and isinstance(chain.func, cst.Attribute) \
                and chain.func.attr.value in FRESH_METHODS and not self.model.qualnames(chain):
            detached = detached or chain.func.attr.value in ("detach", "clone")
            chain = chain.func.value
        if isinstance(chain, cst.Call) and self.model.qualnames(chain) & (TENSOR_FACTORIES | ARRAY_FACTORIES):
            return True
        return detached

    def _made_to_require_grad(self, func: cst.FunctionDef, name: str, items: bool, depth: int = 0) -> bool:
        """`func` makes `name` (or, with `items`, also its items `name[i]`) require gradients, itself or
        through a helper of this file it passes `name` to."""
        model = self.model

        def is_it(expr: cst.CSTNode) -> bool:
            if items and isinstance(expr, cst.Subscript):
                expr = expr.value
            return isinstance(expr, cst.Name) and expr.value == name

        for node, target, value in model._index.assignments:
            if isinstance(target, cst.Attribute) and target.attr.value == "requires_grad" \
                    and model.scope_of(node) is func and is_it(target.value) and value is not None \
                    and literal_bool(value) is True:
                return True

        def assigned_to_it(call: cst.Call) -> bool:
            """`name = <call>` or `name = <call>.to(device)...`: the call's tensor is bound to it."""
            cur: cst.CSTNode = call
            while True:
                parent = model.parent(cur)
                if isinstance(parent, cst.Attribute) and parent.value is cur \
                        and isinstance(model.parent(parent), cst.Call) and model.parent(parent).func is parent \
                        and parent.attr.value in FRESH_METHODS:
                    cur = model.parent(parent)
                    continue
                return isinstance(parent, cst.Assign) and parent.value is cur and len(parent.targets) == 1 \
                    and is_it(parent.targets[0].target)

        for call in model.calls_in_scope(func):
            if call_name(call) == "requires_grad_" and isinstance(call.func, cst.Attribute) \
                    and (not call.args or literal_bool(call.args[0].value) is True) \
                    and (is_it(call.func.value) or assigned_to_it(call)):
                return True
            arg = next((a for a in call.args if a.keyword is not None and a.keyword.value == "requires_grad"), None)
            if arg is not None and literal_bool(arg.value) is True and assigned_to_it(call):
                return True
            if depth < MAX_HELPER_DEPTH:
                for callee in model.callees(call):
                    for param, given in model.bind_arguments(call, callee).items():
                        if is_it(given) and self._made_to_require_grad(callee, param, items, depth + 1):
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
