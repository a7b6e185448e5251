"""Uses of NVIDIA apex outside `apex.amp` (apex.parallel, apex.optimizers, apex.normalization,
apex.fp16_utils): which the file acts on, and which only name apex for compatibility.

Asked by AMP103 (apex-to-torch); what each apex name is, and its torch replacement, is static
knowledge (`ampfix/knowledge/apex_api.py`). The facts:

* `bindings`: the imports that bind an apex name outside `apex.amp` (not the fallback of a
  torch import), and `imports_in_use` (those the file refers to);
* `optional_imports`: `try: <apex imports>` / `except ImportError: <the same names bound
  again>`, with what stops replacing the `try` by its fallback (`ApexOptionalImport`);
* `uses`: each reference to such a name (`ApexUse`), with its role (`ApexRole`): built,
  a type check of a class the file builds, the base of a thin wrapper the file builds, bound to a
  name the file calls; or not acted on: named for compatibility with objects built elsewhere, or
  a feature torch has no replacement for;
* `factories`: optimizer factories, the apex optimizers one function builds in branches
  that never both run;
* `star_imports`, `unused_imports`: `from apex... import *` with replaceable names,
  and the imports nothing refers to; `leftover_imports` (`ApexLeftover`): those the
  rewrite's migration left unused, alone or with the `try:` that holds them;
* import helpers: `try_body_of` (the `try:` whose body holds an import), `import_try` (the same,
  when it catches ImportError),
  `sets_flag` (that `try:` also binds an availability flag), `fallback_targets` (what its
  `except` branch binds), `imports_only`, `except_names_used`, `first_import`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from ampfix.knowledge.apex_api import actionable, canonical, category, is_apex_rest, lookup, map_args, \
    star_actionable
from ampfix.model.facet import Facet
from ampfix.model.flow import ends_in_exit
from ampfix.model.names import ImportBinding
from ampfix.model.readwrite import names_bound
from ampfix.model.syntax import get_arg, literal_string


class ApexRole(str, Enum):
    BUILD = "build"  # called: the file builds it (`FusedAdam(params)`)
    TYPE = "type"  # an isinstance check or annotation of a class the file builds
    WRAPPED = "wrapped"  # the base of a thin subclass the file builds (its methods only call `super()`'s)
    REBOUND = "rebound"  # bound to another name the file calls (`LN = FusedLayerNorm if apex else nn.LayerNorm`)
    DECORATOR = "decorator"  # a bare decorator
    COMPATIBILITY = "compatibility"  # named for objects built elsewhere (a type check, a tracer's classes): left
    NO_TORCH = "no_torch"  # torch cannot replace it (LAMB, LARC, ...), or ampfix does not know it: left


REPORTED = (ApexRole.BUILD, ApexRole.TYPE, ApexRole.WRAPPED, ApexRole.REBOUND, ApexRole.DECORATOR)


@dataclass(eq=False)
class ApexUse:
    node: cst.CSTNode  # the reference with the attributes read through it (`apex.parallel.DDP`)
    qualified: str  # the apex name it refers to (the first in order when the name may be several)
    binding: ImportBinding
    role: ApexRole
    call: Optional[cst.Call] = None  # BUILD: the call
    decorator: Optional[cst.Decorator] = None  # DECORATOR: the decorator
    ambiguous: bool = False  # the name may also be bound to something else here (an optional import?)
    flagged: bool = False  # its import sits in a `try:` that also sets an availability flag

    @property
    def reported(self) -> bool:
        return self.role in REPORTED

    @property
    def shown(self) -> cst.CSTNode:
        """Where a finding about it goes: the call, else the reference."""
        return self.call if self.call is not None else self.node


@dataclass(eq=False)
class ApexOptionalImport:
    """`try: from apex... import X` / `except ImportError: X = <torch's class>`."""

    node: cst.Try
    bindings: List[ImportBinding]
    blocker: Optional[str] = None  # why the `try` cannot become its fallback (None: it can)
    calls: Dict[cst.Call, List[cst.Arg]] = field(default_factory=dict)  # calls whose apex-only arguments go


@dataclass(eq=False)
class ApexLeftover:
    """Apex imports the migration of their uses left unused."""

    bindings: List[ImportBinding]  # one, unless `node` is set
    node: Optional[cst.Try] = None  # the `try:` that imports nothing else (None: remove the alias alone)
    kept_by: Optional[cst.Name] = None  # a use of a name the `try`'s `except` branch binds: it stays
    # (as it does when it has an `else`/`finally`; see `removable`)

    @property
    def removable(self) -> bool:
        """The import, or its whole `try:` with the `except ImportError` branch, can go."""
        tr = self.node
        return tr is None or (tr.orelse is None and tr.finalbody is None and self.kept_by is None)


class ApexUses(Facet):
    """Uses of NVIDIA apex outside `apex.amp` (`model.apex`)."""

    # ---------------------------------------------------------------- imports
    def bindings(self) -> List[ImportBinding]:
        """Imports of apex names outside `apex.amp`, except the fallbacks of a torch import."""
        if "_apex_bindings" not in self.__dict__:
            self.__dict__["_apex_bindings"] = [b for b in self.model.import_bindings
                                               if is_apex_rest(b.qualified) and not self.model.guards.in_fallback(b.stmt)]
        return self.__dict__["_apex_bindings"]

    def imports_in_use(self) -> Set[Tuple[str, str]]:
        """(qualified, bound name) of the apex imports the file refers to."""
        return {(b.qualified, b.name) for b in self.bindings() if b.refs}

    def optional_imports(self) -> List[ApexOptionalImport]:
        """`try: <apex imports>` / `except ImportError: <the same names bound again>`, for apex
        names torch replaces, in order; each with what stops keeping only the fallback (the `try`
        does more than import them, its fallback binds a name to something other than the torch
        class AMP103 maps it to, a call of the name cannot be mapped)."""
        if "_apex_optional" in self.__dict__:
            return self.__dict__["_apex_optional"]
        tries: Dict[cst.Try, List[ImportBinding]] = {}
        for b in self.bindings():
            if lookup(b.qualified)[0] is None:
                continue  # `nccl_allocator = None` as the fallback of an apex module torch has nothing for
            tr = self.import_try(b.stmt)
            if tr is not None and b.name in names_bound([s for h in tr.handlers for s in h.body.body]):
                tries.setdefault(tr, []).append(b)
        out = self.__dict__["_apex_optional"] = [self._optional_import(tr, bs) for tr, bs in tries.items()]
        return out

    def _optional_import(self, tr: cst.Try, bs: List[ImportBinding]) -> ApexOptionalImport:
        fallback = self.fallback_targets(tr)
        out = ApexOptionalImport(tr, bs)
        reason = None
        if tr.orelse is not None or tr.finalbody is not None or len(tr.handlers) != 1:
            reason = "the `try` has an `else`/`finally` or several `except` branches"
        elif not self.imports_only(tr, {id(b.alias) for b in bs}):
            reason = "the `try` does more than import these apex names (an availability flag?)"
        for b in bs:
            api, _ = lookup(b.qualified)
            got = fallback.get(b.name)
            if reason is None and (api is None or got != f"torch.{api.target}"):
                reason = (f"the `except ImportError` branch binds `{b.name}` to "
                          f"{'`' + got.replace('builtins.', '') + '`' if got and got != '?' else 'code of its own'}, not to "
                          f"`torch.{api.target if api else '...'}`: keep one of the two by hand")
            for ref in (r for ib in self.model.import_bindings if ib.name == b.name and ib.scope is b.scope
                        for r in ib.refs):
                role, call = self.model.reference_role(ref)
                if reason is None and role == "call" and api is not None:
                    args, target, _ = map_args(self.model, call, api)
                    if args is None or target != api.target:
                        reason = f"the call on line {self.model.line(call)} cannot be mapped: {target}"
                    elif [id(a) for a in args] != [id(a) for a in call.args]:
                        out.calls[call] = args
        out.blocker = reason
        return out

    def _apex_flag_bindings(self) -> Set[int]:
        """ids of the apex bindings handled with their `try:` as a whole: optional imports with a
        torch fallback, and imports next to an availability flag."""
        whole = {id(b) for o in self.optional_imports() for b in o.bindings}
        return whole | {id(b) for b in self.bindings() if id(b) not in whole and self.sets_flag(b.stmt)}

    def star_imports(self) -> List[Tuple[cst.ImportFrom, str]]:
        """`from <apex module> import *` (with its module) that brings apex names torch replaces."""
        out = []
        for imp in self.model.nodes_of(cst.ImportFrom):
            mod = self.model.code(imp.module).strip() if imp.module is not None and not imp.relative else ""
            if isinstance(imp.names, cst.ImportStar) and mod.split(".")[0] == "apex" and star_actionable(mod):
                out.append((imp, mod))
        return out

    def unused_imports(self) -> List[ImportBinding]:
        """The apex imports nothing refers to (an optional import or one next to an availability
        flag is not one of them: its `try:` is handled whole)."""
        whole = self._apex_flag_bindings()
        return [b for b in self.bindings() if not b.refs and id(b) not in whole]

    def leftover_imports(self, used_before: Set[Tuple[str, str]]) -> List[ApexLeftover]:
        """The apex imports nothing refers to that were in use before the rewrite (`used_before`:
        `imports_in_use()` then): each alone, then those of one `try:` together (each alone
        again when the `try` does more than import them)."""
        plain: List[ApexLeftover] = []
        by_try: Dict[int, Tuple[cst.Try, List[ImportBinding]]] = {}
        for b in self.unused_imports():
            if (b.qualified, b.name) not in used_before:
                continue  # unused before (an install check, a probe): there was nothing to migrate
            owner = self.try_body_of(b.stmt)
            if owner is not None:
                by_try.setdefault(id(owner), (owner, []))[1].append(b)
            else:
                plain.append(ApexLeftover([b]))
        for tr, bs in by_try.values():
            if not self.imports_only(tr, {id(b.alias) for b in bs}):  # it keeps other statements (which bind
                plain.extend(ApexLeftover([b]) for b in bs)  # nothing: see `sets_flag`)
                continue
            used = self.except_names_used(tr)
            plain.append(ApexLeftover(bs, tr, used[0] if used else None))
        return plain

    # ---------------------------------------------------------------- uses
    def uses(self) -> List[ApexUse]:
        """Every reference to an apex name outside `apex.amp` (once per attribute chain), in the
        order of the imports, then of the text; optional imports with a torch fallback are left
        to `optional_imports`."""
        if "_apex_uses" in self.__dict__:
            return self.__dict__["_apex_uses"]
        optional = {id(b) for o in self.optional_imports() for b in o.bindings}
        seen: Set[int] = set()
        found: List[Tuple[cst.CSTNode, str, bool, ImportBinding]] = []
        for b in self.bindings():
            if id(b) in optional:
                continue
            for ref in b.refs:
                node = self.outer_reference(ref)
                if id(node) in seen:
                    continue
                seen.add(id(node))
                names = {qn.name for qn in self.model.qualified_names(node)}
                apex = sorted(n for n in names if n.startswith("apex"))
                if not apex or any(n.startswith("apex.amp") or n == "apex" for n in apex):
                    continue  # apex.amp: AMP102's
                found.append((node, apex[0], len(names) > 1, b))
        # classes this file constructs: their isinstance checks and annotations migrate with them
        built = {canonical(q) for node, q, _, _ in found if self.model.reference_role(node)[0] == "call"}
        out = []
        for node, q, ambiguous, b in found:
            role, site = self.model.reference_role(node)
            use = ApexUse(node, q, b, self._apex_role(node, q, role, canonical(q) in built), ambiguous=ambiguous,
                          flagged=self.sets_flag(b.stmt))
            if role == "call":
                use.call = site
            elif role == "bare-decorator":
                use.decorator = site
            out.append(use)
        self.__dict__["_apex_uses"] = out
        return out

    def _apex_role(self, node: cst.CSTNode, qualified: str, role: str, built_here: bool) -> ApexRole:
        if not actionable(qualified):
            return ApexRole.NO_TORCH
        if role == "call":
            return ApexRole.BUILD
        if role == "type":
            return ApexRole.TYPE if built_here else ApexRole.COMPATIBILITY
        if role == "bare-decorator":
            return ApexRole.DECORATOR
        if not self._constructed_elsewhere(node):
            return ApexRole.COMPATIBILITY  # passed as a value (a type tuple, a tracer's leaf classes)
        return ApexRole.WRAPPED if isinstance(self.model.parent(node), cst.Arg) else ApexRole.REBOUND

    def _constructed_elsewhere(self, node: cst.CSTNode) -> bool:
        """An apex class used as a value that this file still builds: bound to a name the file
        calls (`LayerNorm = FusedLayerNorm if has_apex else nn.LayerNorm`, then `LayerNorm(...)`),
        or the base of a thin wrapper the file builds (every method of the subclass calls the
        same method of `super()`: fairseq's FusedLayerNorm). A subclass that does more extends
        apex's internals (fairseq's FusedAdamV2): replacing its base is no migration."""
        parent = self.model.parent(node)
        calls = self.model.calls
        if isinstance(parent, cst.Arg) and isinstance(self.model.parent(parent), cst.ClassDef):
            cls = self.model.parent(parent)
            built = any(isinstance(c.func, cst.Name) and c.func.value == cls.name.value for c in calls)
            return built and self.thin_wrapper(cls)
        value: cst.CSTNode = node
        while isinstance(self.model.parent(value), (cst.IfExp, cst.BooleanOperation)):
            value = self.model.parent(value)
        assign = self.model.parent(value)
        if not isinstance(assign, cst.Assign) or assign.value is not value:
            return False
        names = {t.target.value for t in assign.targets if isinstance(t.target, cst.Name)}
        return any(isinstance(c.func, cst.Name) and c.func.value in names for c in calls)

    def factories(self) -> List[List[ApexUse]]:
        """Optimizer factories: the apex optimizers (two or more) that one function builds in
        branches that never both run (`if name == "fusedadam": ... elif name == "fusedsgd": ...`),
        each group in text order."""
        factories: Dict[int, List[ApexUse]] = {}
        for u in self.uses():
            site = u.call if u.call is not None else u.decorator
            if u.reported and site is not None and category(u.qualified) == "optimizers":
                scope = self.model.function_of(site)
                if scope is not None:
                    factories.setdefault(id(scope), []).append(u)
        out = []
        for members in factories.values():
            sites = [u.call if u.call is not None else u.decorator for u in members]
            if len(members) < 2 or not all(self.alternatives(a, b) for i, a in enumerate(sites) for b in sites[i + 1:]):
                continue
            out.append(sorted(members, key=lambda u: self.model.start(u.shown)))
        return out

    # ---------------------------------------------------------------- shapes
    @staticmethod
    def keeps_master_weights(call: cst.Call) -> bool:
        """amp.initialize with an fp16 model and fp32 master weights: O2 (unless
        master_weights=False), or O3 with master_weights=True."""
        level = get_arg(call, None, "opt_level")
        level_s = literal_string(level.value) if level is not None else "O1"
        mw = get_arg(call, None, "master_weights")
        mw_code = mw.value.value if mw is not None and isinstance(mw.value, cst.Name) else None
        if level_s == "O2":
            return mw is None or mw_code == "True"
        return level_s == "O3" and mw_code == "True"

    def amp_call_in(self, subtree: cst.CSTNode) -> bool:
        """Some call in `subtree` is apex amp's (`amp.scale_loss`, `amp.master_params`, `amp.initialize`)."""
        model = self.model
        return any(model.is_ancestor(subtree, c) and any(q.startswith("apex.amp") for q in model.qualnames(c.func))
                   for c in model.calls)

    def in_scale_loss(self, call: cst.CSTNode) -> bool:
        """A backward inside `with amp.scale_loss(...)` (apex's scaled backward)."""
        for anc in self.model.ancestors(call):
            if isinstance(anc, (cst.FunctionDef, cst.Lambda)):
                return False
            if isinstance(anc, cst.With) and any(
                    isinstance(item.item, cst.Call) and "apex.amp.scale_loss" in self.model.qualnames(item.item.func)
                    for item in anc.items):
                return True
        return False

    def outer_reference(self, ref: cst.CSTNode) -> cst.CSTNode:
        """`ref` with the attributes read through it (`apex.parallel.DistributedDataParallel` for `apex`)."""
        node = ref
        while isinstance(self.model.parent(node), cst.Attribute) and self.model.parent(node).value is node:
            node = self.model.parent(node)
        return node

    def alternatives(self, a: Optional[cst.CSTNode], b: Optional[cst.CSTNode]) -> bool:
        """`a` and `b` never both run in one call of their function: they are in exclusive branches,
        or one is in an `if` branch that ends in `return`/`raise` and the other after that `if`."""
        if a is None or b is None:
            return False
        if self.model.exclusive(a, b):
            return True
        first, second = (a, b) if self.model.before(a, b) else (b, a)
        for anc in self.model.ancestors(first):
            if isinstance(anc, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return False
            if isinstance(anc, cst.If) and self.model.is_ancestor(anc.body, first) \
                    and not self.model.is_ancestor(anc, second) and ends_in_exit(anc.body):
                return True
        return False

    def thin_wrapper(self, cls: cst.ClassDef) -> bool:
        """Every method `cls` defines calls the same method of `super()` (and it defines one)."""
        methods = [f for f in self.model.nodes_of(cst.FunctionDef) if self.model.class_of(f) is cls]
        if not methods:
            return False
        for f in methods:
            name = f.name.value
            if not any(isinstance(c.func, cst.Attribute) and c.func.attr.value == name
                       and isinstance(c.func.value, cst.Call) and isinstance(c.func.value.func, cst.Name)
                       and c.func.value.func.value == "super" and self.model.function_of(c) is f
                       for c in self.model.calls):
                return False
        return True

    def try_body_of(self, stmt: cst.CSTNode) -> Optional[cst.Try]:
        """The `try` whose body holds the small statement `stmt` (an import) directly."""
        line = self.model.parent(stmt)
        block = self.model.block_of(line) if line is not None else None
        tr = self.model.parent(block) if block is not None else None
        return tr if isinstance(tr, cst.Try) and tr.body is block else None

    def import_try(self, stmt: cst.CSTNode) -> Optional[cst.Try]:
        """The `try` whose body holds the import statement `stmt` directly, when it catches ImportError."""
        tr = self.try_body_of(stmt)
        if tr is None:
            return None
        for h in tr.handlers:
            types = h.type.elements if isinstance(h.type, cst.Tuple) else [h.type]
            names = {self.model.code(t.value if isinstance(t, cst.Element) else t).strip()
                     for t in types if t is not None}
            if names & {"ImportError", "ModuleNotFoundError", "Exception"} or h.type is None:
                return tr
        return None

    def sets_flag(self, stmt: cst.CSTNode) -> bool:
        """The import is in a `try: ... except ImportError:` whose body also binds other names (an
        availability flag such as `has_apex = True`)."""
        tr = self.import_try(stmt)
        return tr is not None and bool(names_bound([st for st in tr.body.body if not (
            isinstance(st, cst.SimpleStatementLine) and all(isinstance(x, (cst.Import, cst.ImportFrom)) for x in st.body))]))

    def imports_only(self, tr: cst.Try, aliases: Set[int]) -> bool:
        """The body of `tr` does nothing but import these aliases (ids of `ImportAlias` nodes)."""
        return all(isinstance(st, cst.SimpleStatementLine) and all(
            isinstance(x, (cst.Import, cst.ImportFrom)) and not isinstance(x.names, cst.ImportStar)
            and all(id(a) in aliases for a in x.names) for x in st.body) for st in tr.body.body)

    def except_names_used(self, tr: cst.Try) -> List[cst.Name]:
        """The Names outside `tr` that read or bind a name its `except` branches bind."""
        bound = names_bound([s for h in tr.handlers for s in h.body.body])
        return [n for n in self.model.nodes_of(cst.Name)
                if n.value in bound and not self.model.is_ancestor(tr, n)]

    def fallback_targets(self, tr: cst.Try) -> Dict[str, str]:
        """name -> what the `except` branch binds it to (a qualified name, or "?" for code of its own)."""
        out: Dict[str, str] = {}
        code = self.model.code
        for h in tr.handlers:
            for st in h.body.body:
                for small in (st.body if isinstance(st, cst.SimpleStatementLine) else [st]):
                    if isinstance(small, cst.ImportFrom) and small.module is not None and \
                            not isinstance(small.names, cst.ImportStar) and not small.relative:
                        for a in small.names:
                            name = code(a.asname.name if a.asname else a.name).strip()
                            out[name] = f"{code(small.module).strip()}.{code(a.name).strip()}"
                    elif isinstance(small, cst.Assign) and len(small.targets) == 1 and \
                            isinstance(small.targets[0].target, cst.Name):
                        q = sorted(self.model.qualnames(small.value)) if isinstance(small.value, (cst.Name, cst.Attribute)) \
                            else []
                        out[small.targets[0].target.value] = q[0] if q else "?"
                    else:
                        for name in names_bound([small]):
                            out[name] = "?"
        return out

    def first_import(self) -> Optional[cst.SimpleStatementLine]:
        """The file's first module-level import (after `from __future__` imports), where `import torch` can go."""
        for st in self.model.module.body:
            if isinstance(st, cst.SimpleStatementLine) and isinstance(st.body[0], (cst.Import, cst.ImportFrom)):
                small = st.body[0]
                if isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative \
                        and self.model.code(small.module).strip() == "__future__":
                    continue
                return st
        return None
