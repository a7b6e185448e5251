"""AMP101 deprecated-amp-api: torch.cuda.amp.* / torch.cpu.amp.* -> torch.amp.*.

How the migration stays correct whatever the import style:

* a fully qualified use (`torch.cuda.amp.autocast(...)`, `T.cuda.amp.GradScaler(...)`) is
  rewritten on its own to `<torch>.amp.autocast("cuda", ...)`; it needs no import change;
* a use through an imported name (`from torch.cuda.amp import autocast as ac`,
  `from torch.cuda import amp`, `import torch.cuda.amp as amp`) keeps the user's name: only its
  arguments change (`ac("cuda", ...)`, `amp.GradScaler("cuda")`), and the import statement is
  rewritten (`from torch.amp import autocast as ac`) once every use of that name is migrated.
  The engine re-checks after each pass, so the import follows in the next pass; a name with a
  use that cannot be migrated (or is marked `# noqa`) keeps its old import and gets no fix at all,
  so a partly migrated name never exists in the output.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Set, Tuple

import libcst as cst
from libcst.metadata import ScopeProvider

from ampfix.model import AmpModel, dotted
from ampfix.rule import FileContext, Fix, Rule, Violation

DEP_MODULES = {"torch.cuda.amp": "cuda", "torch.cpu.amp": "cpu"}
SUBMODULES = ("autocast_mode", "grad_scaler")
# what torch.amp offers in place of each deprecated module
MIGRATABLE = {"cuda": ("autocast", "GradScaler", "custom_fwd", "custom_bwd"), "cpu": ("autocast", "GradScaler")}
# the oldest torch with the replacement (torch.amp.GradScaler: 2.3; device_type= on custom_fwd/bwd: 2.4)
MIN_TORCH = {"autocast": (1, 10), "GradScaler": (2, 3), "custom_fwd": (2, 4), "custom_bwd": (2, 4)}
AUTOCAST_POSITIONAL = ("enabled", "dtype", "cache_enabled")
CLASSES = ("autocast", "GradScaler")


def _new_spelling(kind: str, device: str, q: str) -> str:
    if kind in ("autocast", "GradScaler"):
        return f"torch.amp.{kind}({q}{device}{q}, ...)"
    return f"torch.amp.{kind}(device_type={q}{device}{q})"


def describe(kind: str, device: str) -> str:
    """The summary line of one migrated use (grouped and counted by the CLI)."""
    new = _new_spelling(kind, device, '"').replace(", ...", "")
    return f"torch.{device}.amp.{kind} -> {new}"


# ----------------------------------------------------------------------------- small CST helpers


def quote_of(source: str) -> str:
    """The quote the file prefers for new string literals."""
    return "'" if source.count("'") > source.count('"') else '"'


def _comma() -> cst.Comma:
    return cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))


def with_args(call: cst.Call, args: List[cst.Arg]) -> cst.Call:
    """`call` with these args; commas normalised (the old last arg's trailing comma is kept)."""
    trailing = call.args[-1].comma if call.args else cst.MaybeSentinel.DEFAULT
    out = []
    for i, a in enumerate(args):
        if i < len(args) - 1:
            if not isinstance(a.comma, cst.Comma):
                a = a.with_changes(comma=_comma())
        else:
            a = a.with_changes(comma=trailing)
        out.append(a)
    return call.with_changes(args=out)


def keyword_arg(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(value=value, keyword=cst.Name(name),
                   equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                         whitespace_after=cst.SimpleWhitespace("")))


def string(value: str, q: str) -> cst.SimpleString:
    return cst.SimpleString(f"{q}{value}{q}")


def literal_str(node: Optional[cst.CSTNode]) -> bool:
    return isinstance(node, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString))


def new_call_args(call: cst.Call, kind: str, device: str, q: str) -> Tuple[Optional[List[cst.Arg]], str]:
    """The migrated argument list of a deprecated call, or (None, why not)."""
    args = list(call.args)
    dev = cst.Arg(value=string(device, q))
    if args and isinstance(call.whitespace_before_args, cst.ParenthesizedWhitespace):
        # one argument a line: the device gets its own line
        pw = call.whitespace_before_args  # keep the line break and indent, not a comment
        dev = dev.with_changes(comma=cst.Comma(whitespace_after=pw.with_changes(
            first_line=cst.TrailingWhitespace(), empty_lines=())))
    if kind == "autocast":
        out = [dev]
        pos = 0
        for a in args:
            if a.star == "*":
                return None, "it passes `*args`, whose meaning changes (torch.amp.autocast takes device_type first)"
            if a.keyword is None and not a.star:
                if pos >= len(AUTOCAST_POSITIONAL):
                    return None, "it has more positional arguments than torch.cuda.amp.autocast accepts"
                out.append(keyword_arg(AUTOCAST_POSITIONAL[pos], a.value).with_changes(comma=a.comma))
                pos += 1
            else:
                out.append(a)
        return out, ""
    if kind == "GradScaler":
        return [dev, *args], ""
    # custom_fwd / custom_bwd: device_type is keyword-only; put it after the positional args
    if any(a.keyword is not None and a.keyword.value == "device_type" for a in args):
        return None, "it already passes device_type"
    n_pos = sum(1 for a in args if a.keyword is None and a.star != "**")
    return [*args[:n_pos], keyword_arg("device_type", string(device, q)), *args[n_pos:]], ""


def looks_migrated(call: cst.Call, kind: str) -> bool:
    """A call through a not-yet-rewritten imported name whose arguments were already migrated
    (the first pass rewrites the uses, the next one the import)."""
    if kind in ("autocast", "GradScaler"):
        return bool(call.args) and call.args[0].keyword is None and not call.args[0].star \
            and literal_str(call.args[0].value)
    return any(a.keyword is not None and a.keyword.value == "device_type" for a in call.args)


FALLBACK_ERRORS = {"ImportError", "ModuleNotFoundError", "AttributeError", "TypeError"}


def in_fallback(model: AmpModel, node: cst.CSTNode) -> bool:
    """Inside `except ImportError/AttributeError/TypeError:`: a fallback for an old torch that
    lacks torch.amp's API (it never runs, so never warns, where torch.amp has it)."""
    for anc in model.ancestors(node):
        if isinstance(anc, cst.ExceptHandler) and anc.type is not None:
            types = anc.type.elements if isinstance(anc.type, cst.Tuple) else [anc.type]
            names = {dotted(t.value if isinstance(t, cst.Element) else t) for t in types}
            if names & FALLBACK_ERRORS:
                return True
    return False


_VERSION_TEST = re.compile(r"version|TORCH_\d|TORCH_(?:GREATER|LESS|GE|LT|AT_LEAST)|_TORCH_\w*\d", re.IGNORECASE)
_MODERN_KINDS = {"autocast", "GradScaler", "custom_fwd", "custom_bwd"}


def in_version_branch(model: AmpModel, node: cst.CSTNode) -> bool:
    """In a branch of an `if` (statement or expression) that picks between torch versions:
    its test names a version (`if TORCH_2_4:`, `if is_torch_version(">=", "2.3"):`) or its other
    branch uses the torch.amp spelling. The deprecated spelling there is the old-torch path,
    written on purpose; rewriting it would break exactly the torch it is for."""
    child = node
    for anc in model.ancestors(node):
        if isinstance(anc, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return False
        if isinstance(anc, (cst.If, cst.IfExp)) and child is not anc.test:
            if _VERSION_TEST.search(model.module.code_for_node(anc.test)):
                return True
            other = anc.orelse if child is anc.body else anc.body
            if other is not None and _uses_modern_api(model, other):
                return True
        if isinstance(anc, (cst.IndentedBlock, cst.Module)) and _after_early_return(model, anc, child):
            return True
        child = anc
    return False


def _after_early_return(model: AmpModel, block: cst.CSTNode, stmt: cst.CSTNode) -> bool:
    """`if <version test>: return <torch.amp ...>` earlier in the same block."""
    for prev in block.body:
        if prev is stmt:
            return False
        if isinstance(prev, cst.If) and isinstance(prev.body, cst.IndentedBlock) and prev.body.body:
            last = prev.body.body[-1]
            returns = isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[-1], (cst.Return, cst.Raise))
            if returns and (_VERSION_TEST.search(model.module.code_for_node(prev.test))
                            or _uses_modern_api(model, prev.body)):
                return True
    return False


def _uses_modern_api(model: AmpModel, subtree: cst.CSTNode) -> bool:
    for n in model.nodes_of(cst.Attribute, cst.Name):
        api = model.api_of(n)
        if api is not None and api.kind in _MODERN_KINDS and not api.deprecated and model.is_ancestor(subtree, n):
            return True
    return False


# ----------------------------------------------------------------------------- bindings


@dataclass
class Binding:
    """A name bound by an import of a deprecated module (or of something in it)."""

    stmt: cst.CSTNode  # the Import / ImportFrom small statement
    alias: cst.ImportAlias
    name: str  # the bound name
    device: str
    kind: Optional[str]  # the API for `from torch.cuda.amp import autocast`; None for a module binding
    refs: List[cst.Name] = field(default_factory=list)
    blocked: Optional[str] = None
    pending: int = 0  # uses with a fix this pass


@dataclass
class Use:
    node: cst.CSTNode  # where the finding is reported
    kind: str
    device: str
    replacements: Optional[Dict[cst.CSTNode, cst.CSTNode]] = None
    blocked: Optional[str] = None
    done: bool = False
    binding: Optional[Binding] = None


def _module_device(module: str) -> Optional[Tuple[str, bool]]:
    """(device, is_exactly_the_amp_module) for torch.cuda.amp[.submodule]."""
    for mod, dev in DEP_MODULES.items():
        if module == mod:
            return dev, True
        if module.startswith(mod + ".") and module[len(mod) + 1:] in SUBMODULES:
            return dev, False
    return None


def _alias_name(alias: cst.ImportAlias) -> str:
    if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
        return alias.asname.name.value
    return dotted(alias.name) or ""


def collect_bindings(model: AmpModel) -> List[Binding]:
    scopes = model.wrapper.resolve(ScopeProvider)
    found: List[Binding] = []
    model_ = model

    class V(cst.CSTVisitor):
        def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
            if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
                return
            mod = dotted(node.module) or ""
            md = _module_device(mod)
            for alias in node.names:
                name = dotted(alias.name) or ""
                if md is not None:
                    kind = name if name in MIGRATABLE[md[0]] else None
                    if kind is not None:
                        found.append(Binding(node, alias, _alias_name(alias), md[0], kind))
                elif mod in ("torch.cuda", "torch.cpu") and name == "amp":
                    found.append(Binding(node, alias, _alias_name(alias), mod.split(".")[1], None))

        def visit_Import(self, node: cst.Import) -> None:
            for alias in node.names:
                name = dotted(alias.name) or ""
                if name in DEP_MODULES and alias.asname is not None:
                    found.append(Binding(node, alias, _alias_name(alias), DEP_MODULES[name], None))

    model.module.visit(V())
    for b in found:
        scope = scopes.get(b.stmt)
        if scope is None:
            b.blocked = "its import could not be resolved"
            continue
        for assignment in scope.assignments[b.name]:
            if getattr(assignment, "node", None) is b.stmt:
                for ref in assignment.references:
                    if isinstance(ref.node, cst.Name):
                        b.refs.append(ref.node)
                    else:  # pragma: no cover - dotted accesses only for `import a.b` without alias
                        b.blocked = "it is used in a way ampfix does not follow"
        b.refs.sort(key=lambda n: model_.start(n))
    return found


# ----------------------------------------------------------------------------- the rule


class DeprecatedAmpApi(Rule):
    code = "AMP101"
    name = "deprecated-amp-api"
    message = (
        "torch.cuda.amp / torch.cpu.amp are deprecated (FutureWarning since torch 2.4): use "
        'torch.amp.autocast("cuda", ...), torch.amp.GradScaler("cuda", ...), '
        'torch.amp.custom_fwd/custom_bwd(device_type="cuda")'
    )
    triggers = ("cuda.amp", "cpu.amp", "torch.cuda import", "torch.cpu import")
    fixable = "safe"
    docs = """
Since torch 2.4 every use of `torch.cuda.amp.autocast`, `torch.cuda.amp.GradScaler`,
`torch.cuda.amp.custom_fwd/custom_bwd` and `torch.cpu.amp.autocast/GradScaler` emits a
FutureWarning; the device-generic `torch.amp` API replaces them.

The fix migrates every spelling, whatever the import style, and keeps the user's names:

| before | after |
|---|---|
| `torch.cuda.amp.autocast(True, torch.float16)` | `torch.amp.autocast("cuda", enabled=True, dtype=torch.float16)` |
| `@torch.cuda.amp.autocast()` / bare `@autocast` | `@torch.amp.autocast("cuda")` / `@autocast("cuda")` |
| `torch.cpu.amp.GradScaler(2.0**10)` | `torch.amp.GradScaler("cpu", 2.0**10)` |
| `x: torch.cuda.amp.GradScaler`, `isinstance(s, torch.cuda.amp.GradScaler)` | `torch.amp.GradScaler` |
| `@torch.cuda.amp.custom_fwd(cast_inputs=torch.float32)` | `@torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)` |
| `@custom_bwd` | `@custom_bwd(device_type="cuda")` |
| `from torch.cuda.amp import autocast as ac` | `from torch.amp import autocast as ac` |
| `from torch.cuda import amp` | `from torch import amp` |
| `import torch.cuda.amp as tamp` | `import torch.amp as tamp` |

Positional arguments of `autocast` become keywords: the old order is
`(enabled, dtype, cache_enabled)`, the new one `(device_type, dtype, enabled, cache_enabled)`.
Uses inside `except ImportError/AttributeError/TypeError:` are fallbacks for an old torch
(`try: torch.amp.GradScaler("cuda") except AttributeError: torch.cuda.amp.GradScaler()`) and are
left alone, and so are uses in a branch that picks between torch versions (`x = torch.amp.GradScaler("cuda")
if TORCH_2_4 else torch.cuda.amp.GradScaler()`, or an `if` whose test names a version). A name whose uses cannot all be migrated (passed around as a value, `*args`, a `# noqa` on one
use, or a replacement newer than `--min-torch-version`: torch.amp.GradScaler needs 2.3,
`device_type=` on custom_fwd/custom_bwd 2.4) is reported without a fix.

Bad:
```python
from torch.cuda.amp import autocast, GradScaler

scaler = GradScaler()
with autocast(dtype=torch.float16):
    loss = loss_fn(model(x), y)
```

Good:
```python
from torch.amp import autocast, GradScaler

scaler = GradScaler("cuda")
with autocast("cuda", dtype=torch.float16):
    loss = loss_fn(model(x), y)
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        q = quote_of(ctx.source)
        bindings = [b for b in collect_bindings(model) if not in_fallback(model, b.stmt)]
        by_ref: Dict[int, Binding] = {id(r): b for b in bindings for r in b.refs}
        uses: List[Use] = []
        seen: Set[int] = set()

        # uses through imported names
        for b in bindings:
            for ref in b.refs:
                use = self._binding_use(model, b, ref, ctx, q)
                uses.append(use)
                seen.add(id(use.node))
        # fully qualified uses: torch.cuda.amp.X / T.cuda.amp.X
        for node in self._deprecated_refs(model):
            root = node
            while isinstance(root, cst.Attribute):
                root = root.value
            if isinstance(root, cst.Name) and id(root) in by_ref:
                continue  # through a binding: handled above
            if in_fallback(model, node) or in_version_branch(model, node):
                continue
            api = model.api_of(node)
            assert api is not None and api.device is not None
            use = self._qualified_use(model, node, root, api.kind, api.device, ctx, q)
            if id(use.node) not in seen:
                uses.append(use)

        self._apply_noqa(ctx, bindings, uses)
        for b in bindings:
            b_uses = [u for u in uses if u.binding is b]
            if b.blocked is None:
                bad = next((u for u in b_uses if u.blocked), None)
                if bad is not None:
                    line = model.start(bad.node)[0]
                    b.blocked = f"`{b.name}` is also used on line {line}, where {bad.blocked}"
            b.pending = sum(1 for u in b_uses if not u.done and u.blocked is None)

        for use in sorted(uses, key=lambda u: model.start(u.node)):
            if use.done:
                continue
            blocked = use.blocked or (use.binding.blocked if use.binding is not None else None)
            new = _new_spelling(use.kind, use.device, '"')
            msg = (f"`torch.{use.device}.amp.{use.kind}` is deprecated (FutureWarning since torch 2.4): "
                   f"use `{new}`")
            if blocked:
                yield Violation(use.node, message=f"{msg}; not migrated automatically: {blocked}")
            else:
                assert use.replacements is not None
                yield Violation(use.node, message=msg,
                                fix=Fix(dict(use.replacements), safe=True, description=describe(use.kind, use.device)))

        yield from self._import_findings(model, bindings, uses, ctx)

    # ------------------------------------------------------------------ uses
    @staticmethod
    def _deprecated_refs(model: AmpModel) -> List[cst.CSTNode]:
        return [n for n in _attributes_outside_imports(model) if (api := model.api_of(n)) is not None and api.deprecated]

    def _context(self, model: AmpModel, expr: cst.CSTNode) -> Tuple[str, Optional[cst.CSTNode]]:
        """How an API reference is used: ("call", call), ("bare-decorator", decorator),
        ("type", None) or ("value", None)."""
        parent = model.parent(expr)
        if isinstance(parent, cst.Call) and parent.func is expr:
            return "call", parent
        if isinstance(parent, cst.Decorator) and parent.decorator is expr:
            return "bare-decorator", parent
        if any(isinstance(a, cst.Annotation) for a in model.ancestors(expr)):
            return "type", None
        node = expr
        if isinstance(parent, cst.Element) and isinstance(model.parent(parent), cst.Tuple):
            node = model.parent(parent)
            parent = model.parent(node)
        if isinstance(parent, cst.Arg):
            call = model.parent(parent)
            if (isinstance(call, cst.Call) and isinstance(call.func, cst.Name)
                    and call.func.value in ("isinstance", "issubclass") and len(call.args) == 2
                    and call.args[1] is parent):
                return "type", None
        return "value", None

    def _version_block(self, kind: str, ctx: FileContext) -> Optional[str]:
        need = MIN_TORCH[kind]
        if tuple(ctx.min_torch_version) < need:
            have = ".".join(map(str, ctx.min_torch_version))
            return (f"its replacement needs torch >= {need[0]}.{need[1]} and the oldest supported torch is "
                    f"{have} (--min-torch-version)")
        return None

    def _migrate(self, model: AmpModel, expr: cst.CSTNode, new_func: Optional[cst.BaseExpression], kind: str,
                 device: str, ctx: FileContext, q: str, binding: Optional[Binding]) -> Use:
        """The use of API `kind` at `expr`; `new_func` replaces `expr` (None: the name stays)."""
        how, node = self._context(model, expr)
        func = new_func if new_func is not None else expr
        report = node if how == "call" else expr
        use = Use(report, kind, device, binding=binding)
        block = self._version_block(kind, ctx)
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

    def _binding_use(self, model: AmpModel, b: Binding, ref: cst.Name, ctx: FileContext, q: str) -> Use:
        device = b.device
        if len({qn.name for qn in model.qualified_names(ref)}) > 1:
            use = Use(ref, b.kind or "autocast", device, binding=b)
            use.blocked = f"`{b.name}` may also be bound to something else here"
            return use
        if b.kind is not None:
            return self._migrate(model, ref, None, b.kind, device, ctx, q, b)
        parent = model.parent(ref)
        if isinstance(parent, cst.Attribute) and parent.value is ref and parent.attr.value in MIGRATABLE[device]:
            return self._migrate(model, parent, None, parent.attr.value, device, ctx, q, b)
        use = Use(ref, "autocast", device, binding=b)
        what = f"`{model.module.code_for_node(parent)}`" if isinstance(parent, cst.Attribute) else f"`{b.name}`"
        use.blocked = f"{what} has no torch.amp equivalent or is used as a value"
        # report it as what it is, not as an autocast use
        use.kind = parent.attr.value if isinstance(parent, cst.Attribute) else "autocast"
        return use

    def _qualified_use(self, model: AmpModel, node: cst.CSTNode, root: cst.CSTNode, kind: str, device: str,
                       ctx: FileContext, q: str) -> Use:
        torch_root = isinstance(root, cst.Name) and any(qn.name == "torch" for qn in model.qualified_names(root))
        if not torch_root or kind not in MIGRATABLE[device]:
            use = Use(node, kind, device)
            use.blocked = (f"`{model.module.code_for_node(node)}` is reached through a name ampfix cannot "
                           "rewrite; spell it `torch.amp...`")
            return use
        assert isinstance(root, cst.Name)
        new_func = cst.Attribute(value=cst.Attribute(value=root, attr=cst.Name("amp")), attr=cst.Name(kind))
        return self._migrate(model, node, new_func, kind, device, ctx, q, None)

    # ------------------------------------------------------------------ noqa
    def _apply_noqa(self, ctx: FileContext, bindings: List[Binding], uses: List[Use]) -> None:
        """A binding one of whose uses (or its import) is suppressed keeps its old import, so
        none of its uses may change: a half-migrated name would call the old API the new way."""
        if "noqa" not in ctx.source:
            return
        from ampfix.engine import noqa_lines, suppressed

        noqa = noqa_lines(ctx.source)
        model = ctx.model

        def lines(node: cst.CSTNode) -> Set[int]:
            out = {model.start(node)[0]}
            stmt = model.statement_of(node)
            if isinstance(stmt, cst.SimpleStatementLine):
                pos = model.position(stmt)
                out.update({pos.start.line, pos.end.line})
            return out

        for b in bindings:
            nodes = [b.stmt] + [u.node for u in uses if u.binding is b and not u.done]
            hit = next((n for n in nodes if suppressed(noqa, self.code, lines(n))), None)
            if hit is not None and b.blocked is None:
                b.blocked = f"`{b.name}` has a use or import marked `# noqa` (line {model.start(hit)[0]})"

    # ------------------------------------------------------------------ imports
    def _import_findings(self, model: AmpModel, bindings: List[Binding], uses: List[Use],
                         ctx: FileContext) -> Iterator[Violation]:
        by_stmt: Dict[int, List[Binding]] = {}
        stmts: Dict[int, cst.CSTNode] = {}
        for b in bindings:
            by_stmt.setdefault(id(b.stmt), []).append(b)
            stmts[id(b.stmt)] = b.stmt
        for key, bs in by_stmt.items():
            stmt = stmts[key]
            if any(b.pending for b in bs if b.blocked is None):
                continue  # uses first; the import follows in the next pass
            movable = [b for b in bs if b.blocked is None]
            if not movable:
                continue
            fix = self._import_fix(model, stmt, movable)
            if fix is None:
                continue
            devices = sorted({b.device for b in movable})
            old = " / ".join(f"torch.{d}.amp" for d in devices)
            yield Violation(stmt, message=f"import from deprecated {old}: its uses are migrated, import from torch.amp",
                            fix=fix)
        # `import torch.cuda.amp` with no alias: binds `torch`; once nothing uses torch.cuda.amp, import torch
        yield from self._plain_imports(model, uses)

    def _import_fix(self, model: AmpModel, stmt: cst.CSTNode, movable: List[Binding]) -> Optional[Fix]:
        moved_ids = {id(b.alias) for b in movable}
        if isinstance(stmt, cst.ImportFrom):
            assert not isinstance(stmt.names, cst.ImportStar)
            mod = dotted(stmt.module) or ""
            new_module = "torch" if mod in ("torch.cuda", "torch.cpu") else "torch.amp"
            moved = [a for a in stmt.names if id(a) in moved_ids]
            kept = [a for a in stmt.names if id(a) not in moved_ids]
            if not kept:
                new_stmt = stmt.with_changes(module=cst.parse_expression(new_module))
                return Fix({stmt: new_stmt}, description="imports of torch.cuda.amp / torch.cpu.amp -> torch.amp")
            fresh = cst.ImportFrom(module=cst.parse_expression(new_module), names=_clean_aliases(moved))
            old = stmt.with_changes(names=_clean_aliases(kept))
            return self._split(model, stmt, old, fresh)
        assert isinstance(stmt, cst.Import)
        names = []
        for a in stmt.names:
            if id(a) in moved_ids:
                a = a.with_changes(name=cst.parse_expression("torch.amp"))
            names.append(a)
        return Fix({stmt: stmt.with_changes(names=names)},
                   description="imports of torch.cuda.amp / torch.cpu.amp -> torch.amp")

    def _split(self, model: AmpModel, stmt: cst.CSTNode, old: cst.BaseSmallStatement,
               fresh: cst.BaseSmallStatement) -> Fix:
        line = model.parent(stmt)
        desc = "imports of torch.cuda.amp / torch.cpu.amp -> torch.amp"
        if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
            return Fix({line: cst.FlattenSentinel([line.with_changes(body=[old]),
                                                   cst.SimpleStatementLine(body=[fresh])])}, description=desc)
        return Fix({stmt: cst.FlattenSentinel([old.with_changes(semicolon=_semi()),
                                               fresh.with_changes(semicolon=getattr(stmt, "semicolon",
                                                                                    cst.MaybeSentinel.DEFAULT))])},
                   description=desc)

    def _plain_imports(self, model: AmpModel, uses: List[Use]) -> Iterator[Violation]:
        # anything still reached through torch.cuda.amp (a use not migrated yet, torch.cuda.amp.common)?
        still: Set[str] = set()
        text_users = [qn.name for n in self._all_attrs(model) for qn in model.qualified_names(n)]
        for dev_mod in DEP_MODULES:
            if any(name == dev_mod or name.startswith(dev_mod + ".") for name in text_users):
                still.add(dev_mod)
        plain_torch = self._has_plain_import_torch(model)
        for stmt in self._imports(model):
            for alias in stmt.names:
                name = dotted(alias.name) or ""
                if name in DEP_MODULES and alias.asname is None and name not in still:
                    desc = "imports of torch.cuda.amp / torch.cpu.amp -> torch.amp"
                    msg = f"`import {name}` is no longer needed: its uses are migrated to torch.amp; import torch"
                    if plain_torch and len(stmt.names) == 1:
                        line = model.parent(stmt)
                        target = line if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else stmt
                        yield Violation(stmt, message=msg, fix=Fix({target: cst.RemoveFromParent()}, description=desc))
                    else:
                        names = [a.with_changes(name=cst.Name("torch")) if a is alias else a for a in stmt.names]
                        yield Violation(stmt, message=msg, fix=Fix({stmt: stmt.with_changes(names=names)},
                                                                   description=desc))
                    break

    @staticmethod
    def _all_attrs(model: AmpModel) -> List[cst.CSTNode]:
        return _attributes_outside_imports(model)

    @staticmethod
    def _imports(model: AmpModel) -> List[cst.Import]:
        out: List[cst.Import] = []

        class V(cst.CSTVisitor):
            def visit_Import(self, node: cst.Import) -> None:
                out.append(node)

        model.module.visit(V())
        return out

    @staticmethod
    def _has_plain_import_torch(model: AmpModel) -> bool:
        for stmt in model.module.body:
            if isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    if isinstance(small, cst.Import) and any(
                            dotted(a.name) == "torch" and a.asname is None for a in small.names):
                        return True
        return False


def _semi() -> cst.Semicolon:
    return cst.Semicolon(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(" "))


def _clean_aliases(aliases: List[cst.ImportAlias]) -> List[cst.ImportAlias]:
    """Aliases with commas between them and none after the last."""
    out = []
    for i, a in enumerate(aliases):
        if i < len(aliases) - 1:
            out.append(a if isinstance(a.comma, cst.Comma) else a.with_changes(comma=_comma()))
        else:
            out.append(a.with_changes(comma=cst.MaybeSentinel.DEFAULT))
    return out


def _attributes_outside_imports(model: AmpModel) -> List[cst.CSTNode]:
    return [n for n in model.nodes_of(cst.Attribute) if not model.in_import(n)]
