"""The torch.cuda.amp / torch.cpu.amp -> torch.amp migration of one use (AMP101).

A use through an imported name keeps the name and changes its arguments (`ac("cuda", ...)`);
a fully qualified use is respelled (`torch.amp.autocast("cuda", ...)`); each `Use` says what
replaces it, that it is migrated already, or why it cannot be (`Use.blocked`). `settle`
(`ampfix.migrations.bindings`) then decides, per imported name, whether all its uses migrate.
`file_uses` collects the file's imported names and every use, of all three kinds.

The device-specific autocast state functions (`torch.get_autocast_gpu_dtype()`) become the
device-generic ones (`torch.get_autocast_dtype("cuda")`): `state_use`. Their name changes, so a
name imported from torch (`from torch import get_autocast_gpu_dtype`) is renamed in its import
and its uses together, in one pass (the rule's fix group): `renamed_state_imports`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Sequence, Set, Tuple

import libcst as cst

from ampfix.fixes.edits import Replacements, keyword_arg, string, with_args
from ampfix.knowledge.torch_amp_api import AUTOCAST_STATE, AUTOCAST_STATE_NEW, CLASSES, MIGRATABLE, MIN_TORCH, \
    STATE_KIND, collect_bindings, looks_migrated, new_call_args, state_args
from ampfix.model.syntax import literal_string
from ampfix.migrations.bindings import Binding, Use
from ampfix.model import AmpModel

if TYPE_CHECKING:
    from ampfix.rule import FileContext


def deprecated_refs(model: AmpModel, kind: Optional[str] = None) -> List[cst.CSTNode]:
    """Attribute chains that reach the deprecated torch.cuda.amp / torch.cpu.amp API (`kind`
    None), or the deprecated autocast state functions (`kind` STATE_KIND)."""
    return [n for n in model.nodes_of(cst.Attribute)
            if (api := model.api_of(n)) is not None and api.deprecated and not model.in_import(n)
            and (api.kind == STATE_KIND) == (kind == STATE_KIND)]

def _version_block(kind: str, ctx: FileContext) -> Optional[str]:
    need = MIN_TORCH[kind]
    if tuple(ctx.min_torch_version) < need:
        have = ".".join(map(str, ctx.min_torch_version))
        return (f"its replacement needs torch >= {need[0]}.{need[1]} and the oldest supported torch is "
                f"{have} ({ctx.min_torch_source or 'min-torch-version'})")
    return None

def _branch_block(model: AmpModel, node: cst.CSTNode, kind: str, ctx: FileContext) -> Optional[str]:
    """Why a use in the branch of a torch version test that torch 2.4 takes (and an older torch
    too: `else` of `if TORCH_VERSION < "1.10"`) is not migrated: its replacement may not exist on
    that older torch, unless the project says which torch it needs (`min_torch_source`)."""
    test = model.guards.modern_version_test(node)
    need = MIN_TORCH.get(STATE_KIND if kind in AUTOCAST_STATE else kind, (2, 4))
    if test is None or (ctx.min_torch_source and tuple(ctx.min_torch_version) >= need):
        return None
    return (f"the torch version test on line {model.line(test)} may send a torch older than {need[0]}.{need[1]}, "
            "which lacks its replacement, here too: migrate it by hand, or set min-torch-version to the oldest "
            "torch the project supports")


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
    if b.kind in AUTOCAST_STATE:  # `from torch import get_autocast_gpu_dtype [as g]`: the name the import binds next
        new_name = b.name if b.alias.asname is not None else AUTOCAST_STATE[b.kind][0]
        return state_use(model, ref, cst.Name(new_name), b.kind, device, ctx, q, b)
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


def state_use(model: AmpModel, expr: cst.CSTNode, new_func: cst.BaseExpression, old: str, device: str,
              ctx: FileContext, q: str, binding: Optional[Binding]) -> Use:
    """A use of the deprecated autocast state function `old` at `expr`: a call it accepts
    becomes `new_func(device, *args)`; anything else (taken as a value, other arguments) is
    reported without a fix."""
    how, call = model.reference_role(expr)
    use = Use(call if how == "call" else expr, old, device, binding=binding)
    if how != "call":
        use.blocked = (f"`{model.module.code_for_node(expr)}` is used as a value (not called); its call sites "
                       "cannot be followed")
        return use
    assert isinstance(call, cst.Call)
    args, why = state_args(call, old, device, q)
    if args is None:
        use.blocked = why
    else:
        use.replacements = {call: with_args(call.with_changes(func=new_func), args)}
        use.blocked = _version_block(STATE_KIND, ctx)
    return use


def qualified_state_use(model: AmpModel, node: cst.Attribute, ctx: FileContext, q: str) -> Use:
    """`torch.get_autocast_gpu_dtype()` (through any name of torch): the attribute respelled."""
    api = model.api_of(node)
    assert api is not None and api.device is not None
    old = node.attr.value
    if len({qn.name for qn in model.qualified_names(node)}) > 1:
        use = Use(node, old, api.device)
        use.blocked = f"`{model.module.code_for_node(node)}` may also be something else here"
        return use
    new_func = node.with_changes(attr=cst.Name(AUTOCAST_STATE[old][0]))
    return state_use(model, node, new_func, old, api.device, ctx, q, None)


def probes_state_api(model: AmpModel, node: cst.CSTNode) -> bool:
    """The function running `node` (the module's own code, outside any function) asks whether
    this torch has a device-generic autocast state function (`getattr(torch, "get_autocast_dtype",
    None)`, `hasattr(torch, "is_autocast_enabled")`): a version shim, whose device-specific call
    is the old torch's path."""
    func = model.function_of(node)
    for call in model.calls:
        if isinstance(call.func, cst.Name) and call.func.value in ("getattr", "hasattr") and len(call.args) > 1 \
                and literal_string(call.args[1].value) in AUTOCAST_STATE_NEW \
                and model.qualnames(call.args[0].value) & {"torch", "torch._C"} and model.function_of(call) is func:
            return True
    return False


def state_shim(model: AmpModel, node: cst.CSTNode) -> bool:
    """The old torch's path of a shim: in an `except AttributeError/TypeError:`, a branch on
    the torch version, or a function that probes for the device-generic function."""
    return model.guards.in_fallback(node) or model.guards.in_version_branch(node) or probes_state_api(model, node)


def rename_problem(model: AmpModel, b: Binding, bindings: Sequence[Binding]) -> Optional[str]:
    """Why `from torch import get_autocast_gpu_dtype` cannot become `from torch import
    get_autocast_dtype` (its uses renamed with it), if it cannot."""
    new = AUTOCAST_STATE[b.kind][0] if b.kind else ""
    if any(o is not b and o.refs is b.refs for o in bindings):
        return f"`{b.name}` is imported more than once"
    if b.alias.asname is None and any(n.value == new and not (isinstance(p := model.parent(n), cst.Attribute)
                                                              and p.attr is n) for n in model.nodes_of(cst.Name)):
        return f"the name `{new}` is already used in this file"
    if any(literal_string(s) == b.name for s in model.nodes_of(cst.SimpleString)):
        return f"`{b.name}` is named in a string (`__all__`?): other modules may import it from here"
    return None


def renamed_state_imports(bindings: Sequence[Binding]) -> Iterator[Tuple[Binding, str, Replacements]]:
    """`from torch import get_autocast_gpu_dtype [as g]` -> `from torch import get_autocast_dtype
    [as g]`: each such import whose uses this pass migrates (not blocked, some pending), with
    the new name and the edit. Its uses call the new name, so both change in one pass (in the
    fix group of its uses); one blocked or with no use is left alone (importing warns nothing)."""
    for b in bindings:
        if b.kind not in AUTOCAST_STATE or b.blocked is not None or not b.pending:
            continue
        new = AUTOCAST_STATE[b.kind][0]
        yield b, new, {b.alias: b.alias.with_changes(name=cst.Name(new))}


def file_uses(model: AmpModel, ctx: FileContext) -> Tuple[List[Binding], List[Use]]:
    """The file's names imported from the deprecated API (`collect_bindings`), less those of an
    old torch's fallback, of a shim that prefers torch.amp and of a version shim of the autocast
    state functions (a state function's import that cannot be renamed is blocked:
    `rename_problem`), and every use to migrate: through those names (`binding_use`; one in an
    old torch's fallback or the old path of a state shim is a `fallback`, blocked), fully
    qualified (`qualified_use`; none in a fallback or a version branch), and the qualified
    autocast state functions (`qualified_state_use`; none in a shim). `settle` comes next."""
    q = model.quote()
    bindings = [b for b in collect_bindings(model)
                if not model.guards.in_fallback(b.stmt) and not model.guards.has_modern_alternative(b.stmt)
                and not (b.kind in AUTOCAST_STATE and state_shim(model, b.stmt))]
    for b in bindings:
        if b.kind in AUTOCAST_STATE and b.blocked is None:
            b.blocked = rename_problem(model, b, bindings)
        b.blocked = b.blocked or _branch_block(model, b.stmt, b.kind or "", ctx)
    by_ref: Dict[int, Binding] = {id(r): b for b in bindings for r in b.refs}
    uses: List[Use] = []
    seen: Set[int] = set()
    fallbacks: Set[int] = set()  # uses in an old torch's fallback: not reported, they block their name's migration

    # uses through imported names
    for b in bindings:
        for ref in b.refs:
            use = binding_use(model, b, ref, ctx, q)
            if model.guards.in_fallback(ref):
                fallbacks.add(id(use.node))
                use.blocked = use.blocked or "it is a fallback for a torch without torch.amp (in an `except`)"
            elif b.kind in AUTOCAST_STATE and state_shim(model, ref):
                fallbacks.add(id(use.node))
                use.blocked = use.blocked or "it is the old torch's path of a version shim"
            uses.append(use)
            seen.add(id(use.node))
    # fully qualified uses: torch.cuda.amp.X / T.cuda.amp.X
    for node in deprecated_refs(model):
        root = node
        while isinstance(root, cst.Attribute):
            root = root.value
        if isinstance(root, cst.Name) and id(root) in by_ref:
            continue  # through a binding: handled above
        if model.guards.in_fallback(node) or model.guards.in_version_branch(node):
            continue
        api = model.api_of(node)
        assert api is not None and api.device is not None
        use = qualified_use(model, node, root, api.kind, api.device, ctx, q)
        if id(use.node) not in seen:
            uses.append(use)
    # torch.get_autocast_gpu_dtype() / T.set_autocast_cpu_enabled(x): respelled where they are
    for node in deprecated_refs(model, STATE_KIND):
        if isinstance(node.value, cst.Name) and id(node.value) in by_ref:
            continue  # (cannot be: a binding's name is the function itself)
        if not state_shim(model, node):
            uses.append(qualified_state_use(model, node, ctx, q))
    for use in uses:
        use.fallback = id(use.node) in fallbacks
        if not (use.done or use.fallback or use.blocked):
            use.blocked = _branch_block(model, use.node, use.kind, ctx)
    return bindings, uses
