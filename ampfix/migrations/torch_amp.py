"""The torch.cuda.amp / torch.cpu.amp -> torch.amp migration of one use (AMP101).

A use through an imported name keeps the name and changes its arguments (`ac("cuda", ...)`);
a fully qualified use is respelled (`torch.amp.autocast("cuda", ...)`); each `Use` says what
replaces it, that it is migrated already, or why it cannot be (`Use.blocked`). `settle`
(`ampfix.migrations.bindings`) then decides, per imported name, whether all its uses migrate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional

import libcst as cst

from ampfix.fixes.edits import keyword_arg, string, with_args
from ampfix.knowledge.torch_amp_api import CLASSES, MIGRATABLE, MIN_TORCH, looks_migrated, new_call_args
from ampfix.migrations.bindings import Binding, Use
from ampfix.model import AmpModel

if TYPE_CHECKING:
    from ampfix.rule import FileContext


def deprecated_refs(model: AmpModel) -> List[cst.CSTNode]:
    return [n for n in model.nodes_of(cst.Attribute)
            if (api := model.api_of(n)) is not None and api.deprecated and not model.in_import(n)]

def _version_block(kind: str, ctx: FileContext) -> Optional[str]:
    need = MIN_TORCH[kind]
    if tuple(ctx.min_torch_version) < need:
        have = ".".join(map(str, ctx.min_torch_version))
        return (f"its replacement needs torch >= {need[0]}.{need[1]} and the oldest supported torch is "
                f"{have} ({ctx.min_torch_source or 'min-torch-version'})")
    return None

def _migrate(model: AmpModel, expr: cst.CSTNode, new_func: Optional[cst.BaseExpression], kind: str,
             device: str, ctx: FileContext, q: str, binding: Optional[Binding]) -> Use:
    """The use of API `kind` at `expr`; `new_func` replaces `expr` (None: the name stays)."""
    how, node = model.reference_role(expr)
    func = new_func if new_func is not None else expr
    report = node if how == "call" else expr
    use = Use(report, kind, device, binding=binding)
    block = _version_block(kind, ctx)
    if how == "call":
        assert isinstance(node, cst.Call)
        if new_func is None and looks_migrated(node, kind):
            use.done = True
            return use
        args, why = new_call_args(node, kind, device, q)
        if args is None:
            use.blocked = why
        else:
            use.replacements = {node: with_args(node.with_changes(func=func), args)}
    elif how == "bare-decorator":
        if kind == "GradScaler":
            use.blocked = "GradScaler is used as a decorator"
        else:
            if kind == "autocast":
                args = [cst.Arg(value=string(device, q))]
            else:
                args = [keyword_arg("device_type", string(device, q))]
            use.replacements = {expr: cst.Call(func=func, args=args)}
    elif how == "type" and kind in CLASSES:
        if new_func is None:
            use.done = True  # the import rewrite migrates it
            return use
        use.replacements = {expr: new_func}
    else:
        use.blocked = (f"`{model.module.code_for_node(expr)}` is used as a value (not called, decorated or in "
                       "a type check); its call sites cannot be followed")
    if use.blocked is None and block is not None:
        use.blocked = block
    return use

def binding_use(model: AmpModel, b: Binding, ref: cst.Name, ctx: FileContext, q: str) -> Use:
    device = b.device
    if len({qn.name for qn in model.qualified_names(ref)}) > 1:
        use = Use(ref, b.kind or "autocast", device, binding=b)
        use.blocked = f"`{b.name}` may also be bound to something else here"
        return use
    if b.kind is not None:
        return _migrate(model, ref, None, b.kind, device, ctx, q, b)
    parent = model.parent(ref)
    if isinstance(parent, cst.Attribute) and parent.value is ref and parent.attr.value in MIGRATABLE[device]:
        return _migrate(model, parent, None, parent.attr.value, device, ctx, q, b)
    use = Use(ref, "autocast", device, binding=b)
    what = f"`{model.module.code_for_node(parent)}`" if isinstance(parent, cst.Attribute) else f"`{b.name}`"
    use.blocked = f"{what} has no torch.amp equivalent or is used as a value"
    # report it as what it is, not as an autocast use
    use.kind = parent.attr.value if isinstance(parent, cst.Attribute) else "autocast"
    return use

def qualified_use(model: AmpModel, node: cst.CSTNode, root: cst.CSTNode, kind: str, device: str,
                   ctx: FileContext, q: str) -> Use:
    torch_root = isinstance(root, cst.Name) and any(qn.name == "torch" for qn in model.qualified_names(root))
    if not torch_root or kind not in MIGRATABLE[device]:
        use = Use(node, kind, device)
        use.blocked = (f"`{model.module.code_for_node(node)}` is reached through a name ampfix cannot "
                       "rewrite; spell it `torch.amp...`")
        return use
    assert isinstance(root, cst.Name)
    new_func = cst.Attribute(value=cst.Attribute(value=root, attr=cst.Name("amp")), attr=cst.Name(kind))
    return _migrate(model, node, new_func, kind, device, ctx, q, None)
