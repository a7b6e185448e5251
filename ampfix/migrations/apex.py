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
  see `_elsewhere`) stops the migration: it is project-wide or not applied.

Assumed apex semantics (NVIDIA/apex `apex/amp/frontend.py`, `handle.py`, `scaler.py`): O0 is
fp32 with a static scale of 1 (no AMP); O1 patches torch functions (autocast's job); O2 casts the
model to fp16 with fp32 master weights in the optimizer (native keeps fp32 parameters and
autocasts, which is what `autocast + GradScaler` does); O3 is pure fp16. `loss_scale="dynamic"`
starts at 2**16 and doubles after 2000 clean steps, like GradScaler's defaults; a number is a
static scale that apex never changes (and never skips a step for): it becomes `init_scale`.
`delay_unscale=True` only postpones apex's unscale to a later `scale_loss`; native gradients
stay scaled until `scaler.step`/`unscale_`, so it has nothing to map to. With `num_losses`/
`loss_id` apex keeps one loss scaler per loss; native uses one GradScaler for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from ampfix.model import dotted, get_arg, literal_bool, literal_string, reads_writes
from ampfix.fixes.rewrites import Rewrites

APEX_CALLS = ("initialize", "scale_loss", "master_params", "state_dict", "load_state_dict")
INIT_KW = {"models", "optimizers", "opt_level", "loss_scale", "keep_batchnorm_fp32", "master_weights",
           "cast_model_type", "verbosity", "enabled", "num_losses", "patch_torch_functions",
           "min_loss_scale", "max_loss_scale", "cast_model_outputs"}
SCALE_KW = {"delay_unscale", "loss_id", "delay_overflow_check", "model"}
SAVE_NOTE = "# ampfix: this entry now holds torch.amp.GradScaler state (apex amp's had another format)"
LOAD_NOTE = "# ampfix: GradScaler state; a checkpoint saved by apex amp has another format here"
GUARD_NOTE = "# ampfix: GradScaler state; apex amp saved another format here (then the scaler starts afresh)"


@dataclass(eq=False)
class ApexUse:
    call: cst.Call
    kind: str  # one of APEX_CALLS, or "other"
    reason: Optional[str] = None
    description: str = ""
    replacements: Dict[cst.CSTNode, object] = field(default_factory=dict)
    absorbed_by: Optional["ApexUse"] = None


class _Blocked(Exception):
    pass


def _statements(block: cst.BaseSuite) -> List[cst.BaseStatement]:
    """The statements of a block; a one-line suite (`if x: a; b`) as one line."""
    if isinstance(block, cst.SimpleStatementSuite):
        return [cst.SimpleStatementLine(body=list(block.body))]
    return list(block.body)


def _smalls(block: cst.BaseSuite) -> List[Tuple[cst.CSTNode, Optional[cst.CSTNode]]]:
    """(statement, small statement) pairs of a block; (compound statement, None) for the others."""
    if isinstance(block, cst.SimpleStatementSuite):
        return [(sm, sm) for sm in block.body]
    return [(s, sm) for s in block.body for sm in (s.body if isinstance(s, cst.SimpleStatementLine) else [None])]


class ApexMigration:
    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.model = model = ctx.model
        self.uses: List[ApexUse] = []
        for call in model.calls:
            for qn in model.qualified_names(call.func):
                if qn.name.startswith("apex.amp."):
                    rest = qn.name[len("apex.amp."):]
                    self.uses.append(ApexUse(call, rest if rest in APEX_CALLS else "other"))
                    break
        self.reason: Optional[str] = None
        self.rw = Rewrites(model)
        self.q = model.quote()
        self.torch = model.torch_alias() or "torch"
        self.flag: Optional[str] = None  # the code of the scaler's enabled=, None: always
        self.caller_flag: Optional[str] = None  # the same, at the one caller of the helper that returns it
        self.avail: Set[str] = set()  # names that say "apex is importable"
        self.none_names: Set[str] = set()  # amp bindings set to None when apex is missing

    # ---------------------------------------------------------------- helpers
    def stmt(self, code: str) -> cst.BaseStatement:
        return cst.parse_statement(code + "\n", config=self.model.module.config_for_parsing)

    def code(self, node: cst.CSTNode) -> str:
        return self.model.code(node)

    def line(self, node: cst.CSTNode) -> int:
        return self.model.line(node)

    # ---------------------------------------------------------------- plan
    def build(self) -> None:
        try:
            self._build()
        except Exception as exc:  # pragma: no cover - a shape the plan did not foresee: report, never crash
            self.reason = f"ampfix could not plan this migration ({type(exc).__name__}): migrate by hand"

    def _build(self) -> None:
        inits = [u for u in self.uses if u.kind == "initialize"]
        if len(inits) != 1:
            if not inits:
                self.reason = ("apex is initialised in another file (no amp.initialize here): replace these calls "
                               "with the GradScaler created where amp.initialize was, by hand")
            else:
                lines = ", ".join(str(self.line(u.call)) for u in inits)
                self.reason = (f"several amp.initialize calls (lines {lines}): create one torch.amp.GradScaler "
                               "and scale each loss with it, by hand")
            return
        self.init = inits[0]
        try:
            self._imports()
            self._initialize(self.init)
        except _Blocked as exc:
            self.init.reason = str(exc)
        if self.init.reason is None:
            self.steps: Dict[cst.CSTNode, str] = {}  # step statement -> optimizer code
            self.regions: Set[cst.CSTNode] = set()
            self.backwards: List[Tuple[cst.With, List[str]]] = []
            self.stepless: List[Tuple[ApexUse, Tuple[int, str]]] = []
            self.stepped: Set[Tuple[int, str]] = set()
            self.with_nodes = [self.model.parent(self.model.parent(u.call))
                               for u in self.uses if u.kind == "scale_loss"]
            for use in self.uses:
                if use is self.init:
                    continue
                try:
                    self._use(use)
                except _Blocked as exc:
                    use.reason = str(exc)
            for use in self.uses:
                if use.kind == "master_params" and use.reason is None:
                    try:
                        self._master_params(use)
                    except _Blocked as exc:
                        use.reason = str(exc)
            try:
                self._clips()
            except _Blocked as exc:
                self.init.reason = str(exc)
            for use, key in self.stepless:
                if key not in self.stepped and use.reason is None:
                    use.reason = (f"no `{key[1]}.step()` follows the scaled backward in this function: call "
                                  "scaler.step/update by hand")
            try:
                self._updates()
                self._availability_ifs()
            except _Blocked as exc:
                self.init.reason = str(exc)
        if self.init.reason is None and self.reason is None:
            self.reason = self._elsewhere() or self._checkpoint_readers()
            if self.reason is not None:
                return
        bad = next((u for u in self.uses if u.reason is not None), None)
        if bad is not None:
            self.reason = f"the apex code on line {self.line(bad.call)} cannot be migrated: {bad.reason}"
            return
        for use in self.uses:
            if self.ctx.is_suppressed(use.call, "AMP102"):
                self.reason = f"an apex use is marked `# noqa` (line {self.line(use.call)}), so the file " \
                              "cannot be migrated as a whole"
                return
        try:
            per_owner, absorbed = self.rw.resolve()
        except Exception as exc:  # pragma: no cover - a shape the plan did not foresee: no fix
            self.reason = f"ampfix could not build this migration ({type(exc).__name__}): migrate by hand"
            return
        for use in self.uses:
            use.replacements = per_owner.get(use, {})
            if not use.replacements:
                use.absorbed_by = absorbed.get(use, self.init)

    # ---------------------------------------------------------------- what else the migration must change
    def _elsewhere(self) -> Optional[str]:
        """The one place to refuse a migration because of other modules: another module of the
        project that still uses apex amp (a `scale_loss` in an optimizer hook, an `amp.state_dict`
        in a checkpoint helper) would lose fp16 training or crash once this module no longer calls
        `amp.initialize`. A migration is project-wide or it is not applied: the project model, when
        the run has one, puts the other modules' apex amp uses in `ctx.extra["apex_amp_elsewhere"]`
        as ("path", line) pairs."""
        others = self.ctx.extra.get("apex_amp_elsewhere") or ()
        if not others:
            return None
        path, line = others[0]
        more = f" and {len(others) - 1} more" if len(others) > 1 else ""
        return (f"apex amp is also used in {path}:{line}{more}: a migration changes every module that uses apex amp "
                "or none; migrate them together")

    def _checkpoint_readers(self) -> Optional[str]:
        """A checkpoint entry that held `amp.state_dict()` holds the GradScaler's state after the
        migration: every place in the file that reads that entry back must be a load the migration
        changes too (an `amp.load_state_dict`), or the migration is not applied."""
        model = self.model
        saved: Dict[str, cst.CSTNode] = {}
        for state in model.checkpoints.saved_states():
            node = state.dict_node
            if not isinstance(node, cst.Dict):
                continue
            for el in node.elements:
                if isinstance(el, cst.DictElement) and isinstance(el.value, cst.Call) \
                        and any(u.call is el.value and u.kind == "state_dict" for u in self.uses):
                    key = literal_string(el.key)
                    if key is not None:
                        saved.setdefault(key, el)
        if not saved:
            return None
        migrated = [u.call for u in self.uses if u.kind == "load_state_dict"]
        for node in model.nodes_of(cst.Subscript, cst.Call):
            key = self._loaded_key(node)
            if key not in saved or any(model.is_ancestor(c, node) for c in migrated):
                continue
            return (f"the checkpoint entry {key!r} saved on line {self.line(saved[key])} would hold the GradScaler's "
                    f"state, but line {self.line(node)} reads it back with code the migration does not change: "
                    "migrate that load too (`scaler.load_state_dict(...)`), then migrate")
        return None

    def _loaded_key(self, node: cst.CSTNode) -> Optional[str]:
        """For `ckpt["key"]` / `ckpt.get("key")` on a `torch.load` result: the key."""
        model = self.model
        if isinstance(node, cst.Subscript) and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
            base, key = node.value, literal_string(node.slice[0].slice.value)
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "get" \
                and node.args:
            base, key = node.func.value, literal_string(node.args[0].value)
        else:
            return None
        if key is None or isinstance(model.parent(node), cst.AssignTarget):
            return None
        while isinstance(base, cst.Subscript):
            base = base.value
        if any(isinstance(v, cst.Call) and model.is_api(v, "load") for v in model.possible_values(base)):
            return key
        return None

    # ---------------------------------------------------------------- imports and availability
    def _imports(self) -> None:
        model = self.model
        use_roots = {id(self._root(u.call.func)) for u in self.uses}
        tries: Dict[cst.Try, List] = {}
        for b in model.import_bindings:
            if not (b.qualified == "apex" or b.qualified.startswith("apex.amp")):
                continue
            if b.qualified not in ("apex", "apex.amp"):
                raise _Blocked(f"`{b.qualified}` is imported by name (line {self.line(b.stmt)}): import apex.amp "
                               "itself, or migrate by hand")
            other = [r for r in b.refs if id(r) not in use_roots and not self._availability_ref(r, b)]
            if b.qualified == "apex" and other:
                continue  # `import apex` still used for apex.parallel & co: AMP103's business
            if other:
                raise _Blocked(f"`{b.name}` is used on line {self.line(other[0])} other than by a call of apex.amp")
            holder = model.parent(b.stmt)
            if isinstance(holder, cst.SimpleStatementLine):
                holder = model.parent(holder)
            holder = model.parent(holder) if isinstance(holder, (cst.IndentedBlock, cst.SimpleStatementSuite)) else None
            if b.qualified == "apex.amp":
                self.none_names.add(b.name)  # `amp is not None` is true once native AMP replaces it
            if isinstance(holder, cst.Try) and model.is_ancestor(holder.body, b.stmt):
                tries.setdefault(holder, []).append(b)
            else:
                self._remove_alias(b.stmt, b.alias)
        for node, bindings in tries.items():
            self._optional_import(node, bindings)
        if model.torch_alias() is None:  # `import torch` goes with the other imports
            first = model.apex.first_import()  # after `from __future__` imports (a line that holds one too)
            if first is None or any(n.value == "torch" and not model.in_import(n) for n in model.nodes_of(cst.Name)):
                raise _Blocked("the file does not `import torch` at module level: add it, then migrate")
            self.rw.insert_before(self.init, first, [self.stmt("import torch")])

    def _root(self, node: cst.CSTNode) -> cst.CSTNode:
        while isinstance(node, cst.Attribute):
            node = node.value
        return node

    def _availability_ref(self, ref: cst.Name, b) -> bool:
        """`amp is None`, `amp is not None` or a bare `amp` in an `if` test."""
        parent = self.model.parent(ref)
        if isinstance(parent, cst.Comparison) and parent.left is ref and len(parent.comparisons) == 1 \
                and isinstance(parent.comparisons[0].operator, (cst.Is, cst.IsNot)) \
                and isinstance(parent.comparisons[0].comparator, cst.Name) \
                and parent.comparisons[0].comparator.value == "None":
            node = parent
        else:
            node = ref
        return self._in_test(node)

    def _in_test(self, node: cst.CSTNode) -> bool:
        cur = node
        for anc in self.model.ancestors(node):
            if isinstance(anc, cst.If):
                return anc.test is cur
            if not isinstance(anc, (cst.BooleanOperation, cst.UnaryOperation, cst.Comparison)):
                return False
            cur = anc
        return False

    def _remove_alias(self, stmt: cst.CSTNode, alias: cst.ImportAlias) -> None:
        names = [a for a in stmt.names if a is not alias]  # type: ignore[attr-defined]
        if names:
            from ampfix.fixes.edits import clean_commas
            self.rw.add(self.init, stmt, lambda cur, n=names: stmt.with_changes(names=clean_commas(n)))
        else:
            line = self.model.parent(stmt)
            if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
                self.rw.remove(self.init, line)
            else:
                self.rw.add(self.init, stmt, lambda cur: cst.RemoveFromParent())

    def _optional_import(self, node: cst.Try, bindings) -> None:
        """`try: from apex import amp; FLAG = True / except ImportError: amp = None; FLAG = False`."""
        model = self.model
        alias_ids = {id(b.alias) for b in bindings}
        flags: Set[str] = set()
        for s, sm in _smalls(node.body):
            if isinstance(sm, (cst.Import, cst.ImportFrom)) and not isinstance(sm.names, cst.ImportStar) \
                    and all(id(a) in alias_ids for a in sm.names):
                continue
            if isinstance(sm, cst.Assign) and literal_bool(sm.value) is True and len(sm.targets) == 1 \
                    and isinstance(sm.targets[0].target, cst.Name):
                flags.add(sm.targets[0].target.value)
                continue
            raise _Blocked(f"the `try` that imports apex (line {self.line(node)}) does more (line {self.line(s)}): "
                           "migrate the rest of it first")
        for h in node.handlers:
            for s, sm in _smalls(h.body):
                if isinstance(sm, (cst.Pass, cst.Raise, cst.Expr)):
                    continue
                if isinstance(sm, cst.Assign) and len(sm.targets) == 1 \
                        and isinstance(sm.targets[0].target, cst.Name):
                    name = sm.targets[0].target.value
                    if name in self.none_names or (name in flags and literal_bool(sm.value) is False):
                        continue
                raise _Blocked(f"the `except` of the apex import (line {self.line(h)}) does more "
                               f"(line {self.line(s)}): migrate it by hand")
        if node.orelse is not None or node.finalbody is not None:
            raise _Blocked(f"the `try` that imports apex (line {self.line(node)}) has else/finally: migrate by hand")
        self.avail |= flags
        self.rw.remove(self.init, node)
        # `FLAG = False` set before the try, and every other read of a flag
        for flag in flags:
            for n in model.nodes_of(cst.Name):
                if n.value != flag or model.is_ancestor(node, n):
                    continue
                parent = model.parent(n)
                if isinstance(parent, cst.AssignTarget):
                    line = model.statement_of(n)
                    assign = model.parent(parent)
                    if literal_bool(assign.value) is False and isinstance(line, cst.SimpleStatementLine) \
                            and len(line.body) == 1:
                        self.rw.remove(self.init, line)
                        continue
                if isinstance(parent, (cst.Global,)) or isinstance(parent, cst.NameItem):
                    continue
                if not self._in_test(n):
                    raise _Blocked(f"the apex availability flag `{flag}` is used on line {self.line(n)}: "
                                   "migrate it by hand")

    def _simplify(self, expr: cst.BaseExpression):
        """The test with apex available: True, False, or the residual expression (which must not
        mention apex any more)."""
        value = self._simplify_(expr)
        names = self.avail | self.none_names
        if not isinstance(value, bool) and any(n.value in names for n in self._names(value)):
            raise _Blocked(f"the test `{self.code(expr)}` uses apex in a way ampfix does not simplify: migrate by hand")
        return value

    def _simplify_(self, expr: cst.BaseExpression):
        if isinstance(expr, cst.Name) and (expr.value in self.avail or expr.value in self.none_names):
            return True
        if isinstance(expr, cst.Comparison) and len(expr.comparisons) == 1 and isinstance(expr.left, cst.Name) \
                and expr.left.value in self.none_names and isinstance(expr.comparisons[0].comparator, cst.Name) \
                and expr.comparisons[0].comparator.value == "None":
            return isinstance(expr.comparisons[0].operator, cst.IsNot)
        if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not):
            inner = self._simplify_(expr.expression)
            if isinstance(inner, bool):
                return not inner
            return expr if inner is expr.expression else expr.with_changes(expression=inner)
        if isinstance(expr, cst.BooleanOperation):
            left, right = self._simplify_(expr.left), self._simplify_(expr.right)
            is_and = isinstance(expr.operator, cst.And)
            for a, b in ((left, right), (right, left)):
                if isinstance(a, bool):
                    if a is not is_and:  # False and x / True or x
                        return a
                    return b
            if left is expr.left and right is expr.right:
                return expr
            return expr.with_changes(left=left, right=right)
        return expr

    def _availability_ifs(self) -> None:
        """Every `if` that tests apex's availability, simplified (apex is gone, native AMP is there)."""
        names = self.avail | self.none_names
        if not names:
            return
        for node in self.model.nodes_of(cst.If):
            if self.rw.claimed(node):
                continue
            if not any(isinstance(n, cst.Name) and n.value in names for n in self._names(node.test)):
                continue
            value = self._simplify(node.test)
            parent = self.model.parent(node)
            if isinstance(parent, cst.If):
                raise _Blocked(f"an `elif` tests apex's availability (line {self.line(node)}): migrate it by hand")
            self.rw.add(self.init, node, lambda cur, v=value: self._settle_if(cur, v))

    @staticmethod
    def _names(node: cst.CSTNode) -> List[cst.CSTNode]:
        found: List[cst.CSTNode] = []

        class V(cst.CSTVisitor):  # names that are read: not `x.attr`'s attr, not `f(key=...)`'s key
            def visit_Name(self, n: cst.Name) -> None:
                found.append(n)

            def visit_Attribute(self, n: cst.Attribute) -> bool:
                n.value.visit(self)
                return False

            def visit_Arg(self, n: cst.Arg) -> bool:
                n.value.visit(self)
                return False
        node.visit(V())
        return found

    def _settle_if(self, cur: cst.If, value) -> object:
        if value is True:
            body = _statements(cur.body)
            body[0] = body[0].with_changes(leading_lines=[*cur.leading_lines, *body[0].leading_lines])
            return body
        if value is False:
            if cur.orelse is None:
                return []
            if isinstance(cur.orelse, cst.If):
                return cur.orelse.with_changes(leading_lines=cur.leading_lines)
            body = _statements(cur.orelse.body)
            body[0] = body[0].with_changes(leading_lines=cur.leading_lines)
            return body
        return cur.with_changes(test=value)

    # ---------------------------------------------------------------- initialize
    def _initialize(self, use: ApexUse) -> None:
        model, call = self.model, use.call
        stmt = model.statement_of(call)
        small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
        if isinstance(small, cst.Assign) and small.value is call and len(small.targets) == 1:
            targets: Optional[str] = self.code(small.targets[0].target)
        elif isinstance(small, cst.Expr) and small.value is call:
            targets = None
        else:
            raise _Blocked("amp.initialize is not a plain `model, optimizer = amp.initialize(...)` statement")
        if model.loop_of(stmt) is not None:
            raise _Blocked("amp.initialize runs in a loop")
        if any(a.star for a in call.args):
            raise _Blocked("amp.initialize(*args/**kwargs)")
        unknown = [a.keyword.value for a in call.args if a.keyword is not None and a.keyword.value not in INIT_KW]
        if unknown:
            raise _Blocked(f"amp.initialize option {unknown[0]}= is unknown")
        kw = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
        positional = [a.value for a in call.args if a.keyword is None]
        sources = positional[:2] + [kw[k] for k in ("models", "optimizers") if k in kw]
        if len(sources) < 2:
            raise _Blocked("amp.initialize without an optimizer (inference): run the forward pass in "
                           "torch.autocast by hand")
        level_node = kw.get("opt_level")
        level = "O1" if level_node is None else literal_string(level_node)
        notes = []
        if level is None and level_node is not None and not isinstance(level_node, cst.Attribute):
            values = {literal_string(v) for v in model.possible_values(level_node)}
            func = model.function_of(call)
            params = func.params if func is not None else None
            for p in [*params.params, *params.kwonly_params] if params is not None else []:
                if isinstance(level_node, cst.Name) and p.name.value == level_node.value and p.default is not None:
                    values.add(literal_string(p.default))  # the default, for the calls that leave it out
            if values and values <= {"O1", "O2"}:  # every value it gets in this file
                level = max(values)
                notes.append(f"opt_level `{self.code(level_node)}` is {' or '.join(sorted(values))} in this file")
        if level is None and level_node is not None:
            level = self._argparse_default(level_node)
            if level in ("O1", "O2"):
                notes.append(f"opt_level `{self.code(level_node)}` taken as its argparse default {level}; "
                             "native AMP has no O3")
            else:
                level = None
        if level is None:
            raise _Blocked(f"opt_level is `{self.code(level_node)}`, not a literal: O1/O2 migrate to autocast + "
                           "GradScaler, O0 to plain fp32, O3 (pure fp16) has no native equivalent; write the level")
        if level == "O3":
            raise _Blocked("opt_level O3 is pure fp16 training (fp16 model, no fp32 master weights); native AMP keeps "
                           "an fp32 model and autocasts: remove the .half() casts, then use torch.autocast + "
                           "GradScaler by hand")
        if level not in ("O0", "O1", "O2"):
            raise _Blocked(f"opt_level {level!r} is not one of apex's O0-O3")
        if literal_bool(kw.get("master_weights")) is False and level == "O2":
            raise _Blocked("O2 with master_weights=False steps fp16 weights without an fp32 copy (like O3): no "
                           "native equivalent")
        cast = kw.get("cast_model_type")
        if cast is not None and literal_bool(cast) is not False and not model.is_api(cast, "dtype.float32"):
            if not model.is_api(cast, "dtype.float16") or level == "O0":
                raise _Blocked(f"cast_model_type={self.code(cast)} has no native equivalent here")
            if level == "O1" and literal_bool(kw.get("master_weights")) is not True:
                raise _Blocked("O1 with cast_model_type=torch.float16 and no master weights trains pure fp16 "
                               "weights (like O3): no native equivalent")
            notes.append("cast_model_type (fp16 model) dropped: parameters stay fp32")
        for name in ("min_loss_scale", "max_loss_scale", "cast_model_outputs"):
            if name in kw and self.code(kw[name]) != "None":
                raise _Blocked(f"amp.initialize {name}= has no GradScaler equivalent")
        if "patch_torch_functions" in kw and literal_bool(kw["patch_torch_functions"]) is False and level == "O1":
            raise _Blocked("O1 with patch_torch_functions=False has no native equivalent")
        keep_bn = kw.get("keep_batchnorm_fp32")
        if literal_bool(keep_bn) is False or literal_string(keep_bn) == "False":
            notes.append("keep_batchnorm_fp32=False dropped: BatchNorm parameters stay fp32")
        scaler_args = [f"{self.q}cuda{self.q}"]
        scale = kw.get("loss_scale")
        if scale is not None and literal_string(scale) != "dynamic" and level != "O0":
            init = self.code(scale)
            if isinstance(scale, cst.IfExp) and "dynamic" in (literal_string(scale.body), literal_string(scale.orelse)):
                # `"dynamic" if args.loss_scale == 0 else args.loss_scale`: apex's dynamic scale starts at 2**16
                other = scale.orelse if literal_string(scale.body) == "dynamic" else scale.body
                if isinstance(other, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)):
                    raise _Blocked(f"loss_scale is `{init}`, neither \"dynamic\" nor a number")
                init = self.code(scale.with_changes(
                    body=cst.Float("65536.0") if literal_string(scale.body) == "dynamic" else scale.body,
                    orelse=cst.Float("65536.0") if literal_string(scale.orelse) == "dynamic" else scale.orelse))
            elif not isinstance(scale, (cst.Integer, cst.Float)):
                raise _Blocked(f"loss_scale is `{init}`, neither \"dynamic\" nor a number")
            scaler_args.append(f"init_scale={init}")
            notes.append(f"static loss_scale {self.code(scale)} -> init_scale (native scaling is dynamic)")
        # the condition amp.initialize runs under becomes enabled=
        conds: List[cst.BaseExpression] = []
        anchor: cst.CSTNode = stmt
        child: cst.CSTNode = stmt
        for anc in model.ancestors(stmt):
            if isinstance(anc, (cst.FunctionDef, cst.ClassDef, cst.Module)):
                break
            if isinstance(anc, cst.If) and self.code(anc.test).replace("'", '"') == '__name__ == "__main__"':
                break  # the script's main block: the scaler is created in it
            if isinstance(anc, cst.If):
                if child is not anc.body:
                    raise _Blocked("amp.initialize is in an `else`/`elif` branch (native AMP chosen by another "
                                   "branch?): migrate by hand")
                value = self._simplify(anc.test)
                if value is False:
                    raise _Blocked("amp.initialize is in an `if` that native AMP never runs")
                if value is not True:
                    conds.insert(0, value)
                anchor = anc
            elif isinstance(anc, (cst.Try, cst.With)):
                anchor = anc
            elif not isinstance(anc, (cst.IndentedBlock, cst.SimpleStatementLine)):
                break
            child = anc
        if anchor is not stmt:
            written = reads_writes(anchor)[1]
            needed = set().union(*(reads_writes(c)[0] for c in conds)) if conds else set()
            if written & needed:
                raise _Blocked(f"the condition amp.initialize runs under reads `{sorted(written & needed)[0]}`, set in "
                               f"the `if` that holds it (line {self.line(anchor)}): migrate by hand")
        texts = [self.code(c) for c in conds]
        if len(texts) > 1:
            texts = [f"({t})" if isinstance(c, cst.BooleanOperation) else t for c, t in zip(conds, texts)]
        conds = texts  # type: ignore[assignment]
        if level == "O0":
            conds = ["False"]
            notes.insert(0, "O0 is fp32: autocast and GradScaler disabled")
        enabled = kw.get("enabled")
        if enabled is not None and literal_bool(enabled) is not True:
            conds.append(self.code(enabled) if literal_bool(enabled) is None else "False")
        self.flag = " and ".join(conds) if conds else None
        if self.flag:
            scaler_args.append(f"enabled={self.flag}")
        # where the scaler lives
        self.init_scope = model.scope_of(call)
        self.anchor = anchor
        others = [u for u in self.uses if u is not use]
        func = model.function_of(call)
        cls = model.class_of(func) if func is not None else None
        name = model.free_name(("scaler", "grad_scaler", "amp_scaler", "native_scaler"))
        if name is None:
            raise _Blocked("no free name for the scaler")
        self.scaler_name = name
        self.self_name: Optional[str] = None
        if func is None:
            self.placement = "module"
        elif all(model.function_of(u.call) is func for u in others):
            self.placement = "local"
        elif cls is not None and func.params.params and all(
                self._method_self(u.call, cls) is not None for u in others):
            self.placement = "self"
            self.self_name = func.params.params[0].name.value
        elif self._returned(func, others):
            self.placement = "returned"
        else:
            # no `global` is injected: a module global set inside one function and read in
            # another is unassigned wherever that function has not run yet
            where = func.name.value
            raise _Blocked(f"the scaler would have to be a module global assigned inside `{where}` and used in other "
                           f"functions: create it where all of them can reach it (at module level, or return it from "
                           f"`{where}`), then migrate")
        ref = self.scaler_ref(call)
        create = self.stmt(f"{ref} = {self.torch}.amp.GradScaler({', '.join(scaler_args)})")
        new = [create]
        keep = None
        if targets is not None and not isinstance(small.targets[0].target, (cst.Tuple, cst.List)):
            raise _Blocked("the result of amp.initialize is kept whole (apex returns the model alone when the "
                           "optimizer is None): unpack it as `model, optimizer = ...`, then migrate")
        if targets is not None and sources:
            src = ", ".join(self.code(s) for s in sources)
            if targets.replace(" ", "") != src.replace(" ", ""):
                keep = self.stmt(f"{targets} = {src}")
        if anchor is stmt:
            self.rw.replace(use, stmt, [*([keep] if keep else []), *new])
        else:
            if keep is not None:
                self.rw.replace(use, stmt, [keep])
            else:
                self.rw.remove(use, stmt)
            self.rw.insert_before(use, anchor, new)
            for anc in model.ancestors(stmt):
                if anc is anchor:
                    break
                if isinstance(anc, cst.If):
                    self.rw.add(use, anc, self._prune_if(anc))
            if isinstance(anchor, cst.If):
                self.rw.add(use, anchor, self._prune_if(anchor))
                # the edit above runs after insert_before's: keep the order prune -> insert
                self.rw.edits[anchor].reverse()
        what = {"O0": "apex amp.initialize O0 (fp32) -> a disabled torch.amp.GradScaler",
                "O1": f'apex amp.initialize -> torch.amp.GradScaler({self.q}cuda{self.q}), created once',
                "O2": f'apex amp.initialize O2 -> torch.amp.GradScaler({self.q}cuda{self.q}) and autocast, '
                      "with fp32 parameters (no fp16 model copy)"}[level]
        use.description = what + (f" ({'; '.join(notes)})" if notes else "")
        self.autocast_off = level == "O0"

    def _argparse_default(self, node: cst.CSTNode) -> Optional[str]:
        """`args.opt_level` -> the literal default of its `add_argument` (one in the file), if any."""
        if not isinstance(node, cst.Attribute):
            return None
        dest = node.attr.value
        found = []
        for call in self.model.calls:
            if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "add_argument"):
                continue
            flags = [literal_string(a.value) for a in call.args if a.keyword is None]
            dest_arg = get_arg(call, None, "dest")
            names = {literal_string(dest_arg.value)} if dest_arg is not None else \
                {f.lstrip("-").replace("-", "_") for f in flags if f and f.startswith("--")}
            if dest in names:
                default = get_arg(call, None, "default")
                found.append(literal_string(default.value) if default is not None else None)
        return found[0] if len(found) == 1 else None

    def _prune_if(self, node: cst.If):
        """The `if` around amp.initialize once it is gone: its test simplified, gone if it is empty."""
        value = self._simplify(node.test)

        def edit(cur):
            if isinstance(cur, list):
                return cur
            body = [s for s in cur.body.body
                    if not (isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1
                            and isinstance(s.body[0], cst.Pass))]
            if not body and cur.orelse is None:
                return []
            if value is True:
                return self._settle_if(cur, True)
            return cur if value is node.test else cur.with_changes(test=value)
        return edit

    def _returned(self, func: cst.FunctionDef, others: List[ApexUse]) -> bool:
        """The function that calls amp.initialize returns the model/optimizer to one caller,
        `a, b = setup(...)`, which holds every other use: it returns the scaler too."""
        model = self.model
        if model.class_of(func) is not None or not isinstance(func.body, cst.IndentedBlock):
            return False
        last = func.body.body[-1]
        ret = last.body[0] if isinstance(last, cst.SimpleStatementLine) and len(last.body) == 1 else None
        if not isinstance(ret, cst.Return) or ret.value is None:
            return False
        returns = [n for n in model.nodes_of(cst.Return) if model.function_of(n) is func]
        calls = [c for c in model.calls if func in model.callees(c)]
        if returns != [ret] or len(calls) != 1:
            return False
        caller = calls[0]
        line = model.statement_of(caller)
        assign = line.body[0] if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else None
        if not (isinstance(assign, cst.Assign) and assign.value is caller and len(assign.targets) == 1):
            return False
        target = assign.targets[0].target
        value = ret.value
        if isinstance(value, cst.Tuple) != isinstance(target, (cst.Tuple, cst.List)):
            return False
        if not all(model.scope_of(u.call) is model.scope_of(caller) and model.before(caller, u.call) for u in others):
            return False

        def extend(node):
            items = [self.code(e.value) for e in node.elements] if isinstance(node, (cst.Tuple, cst.List)) \
                else [self.code(node)]
            return ", ".join([*items, self.scaler_name])
        self.rw.add(self.init, ret, lambda cur: cur.with_changes(value=cst.parse_expression(extend(value))))
        self.rw.add(self.init, assign, lambda cur: cur.with_changes(
            targets=[cst.AssignTarget(target=cst.parse_expression(extend(target)))]))
        self.caller_scope, self.caller = model.scope_of(caller), caller
        bound = model.bind_arguments(caller, func)
        if self.flag in bound:  # `if use_fp16:` in the helper is `args.fp16` at its caller
            self.caller_flag = self.code(bound[self.flag])
        return True

    def _method_self(self, node: cst.CSTNode, cls: cst.ClassDef) -> Optional[str]:
        func = self.model.function_of(node)
        while func is not None and self.model.class_of(func) is None:
            func = self.model.function_of(func)
        if func is None or self.model.class_of(func) is not cls or not func.params.params:
            return None
        return func.params.params[0].name.value

    def scaler_ref(self, node: cst.CSTNode) -> str:
        """How code at `node` reaches the scaler (raises when it cannot)."""
        model = self.model
        if self.placement == "self":
            owner = self._method_self(node, model.class_of(model.function_of(self.init.call)))
            if owner is None:
                raise _Blocked("the scaler (a `self.` attribute of the class that calls amp.initialize) is not "
                               "visible here")
            return f"{owner}.{self.scaler_name}"
        scope = model.scope_of(node)
        if scope is self.init_scope:
            if node is not self.init.call and not model.before(self.anchor, node):
                raise _Blocked("this runs before amp.initialize")
            return self.scaler_name
        if self.placement == "module" and model.function_of(node) is not None:
            return self.scaler_name
        if self.placement == "returned" and scope is self.caller_scope and model.before(self.caller, node):
            return self.scaler_name
        raise _Blocked(f"the scaler created in place of amp.initialize (line {self.line(self.init.call)}) is not "
                       "visible here")

    # ---------------------------------------------------------------- the other calls
    def _use(self, use: ApexUse) -> None:
        if use.kind == "other":
            raise _Blocked(f"`{dotted(use.call.func) or 'this call'}` has no native AMP equivalent")
        if use.kind == "scale_loss":
            self._scale_loss(use)
        elif use.kind in ("state_dict", "load_state_dict"):
            ref = self.scaler_ref(use.call)
            stmt = self.model.statement_of(use.call)
            call = use.call
            new_call = call.with_changes(func=cst.parse_expression(f"{ref}.{use.kind}"))
            note = SAVE_NOTE if use.kind == "state_dict" else LOAD_NOTE
            comment = cst.EmptyLine(comment=cst.Comment(note))
            self.rw.add(use, call, lambda cur, f=new_call.func: cur.with_changes(func=f))
            arg = call.args[0].value if len(call.args) == 1 and call.args[0].keyword is None else None
            if use.kind == "load_state_dict" and arg is not None and self._pure(arg) and \
                    isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and \
                    isinstance(stmt.body[0], cst.Expr) and stmt.body[0].value is call:
                # old checkpoints still load: the apex entry ({"loss_scaler0": ...}) is skipped
                test = cst.parse_expression(f"{self.q}scale{self.q} in {self.code(arg)}")
                guard = cst.EmptyLine(comment=cst.Comment(GUARD_NOTE))
                self.rw.add(use, stmt, lambda cur, t=test, g=guard: cst.If(
                    test=t, body=cst.IndentedBlock(body=[cur.with_changes(leading_lines=())]),
                    leading_lines=[*cur.leading_lines, g]))
            else:
                self.rw.add(use, stmt, lambda cur, c=comment: cur.with_changes(leading_lines=[*cur.leading_lines, c]))
            use.description = f"apex amp.{use.kind} -> scaler.{use.kind}"
        # master_params: after every scale_loss (it needs their steps)

    def _pure(self, node: cst.CSTNode) -> bool:
        """Names, attributes and subscripts by literals: evaluating it twice changes nothing."""
        if isinstance(node, cst.Name):
            return True
        if isinstance(node, cst.Attribute):
            return self._pure(node.value)
        if isinstance(node, cst.Subscript) and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
            key = node.slice[0].slice.value
            return isinstance(key, (cst.SimpleString, cst.Integer, cst.Name)) and self._pure(node.value)
        return False

    def _scale_loss(self, use: ApexUse) -> None:
        model, call = self.model, use.call
        item = model.parent(call)
        with_node = model.parent(item) if isinstance(item, cst.WithItem) else None
        if not isinstance(with_node, cst.With) or len(with_node.items) != 1 or with_node.asynchronous:
            raise _Blocked("amp.scale_loss is not the only item of a `with` statement")
        as_name = item.asname.name if item.asname is not None else None
        body = with_node.body
        inner = body.body[0] if isinstance(body, cst.IndentedBlock) and len(body.body) == 1 else None
        bw = inner.body[0].value if isinstance(inner, cst.SimpleStatementLine) and len(inner.body) == 1 \
            and isinstance(inner.body[0], cst.Expr) else None
        if not (isinstance(as_name, cst.Name) and isinstance(bw, cst.Call) and isinstance(bw.func, cst.Attribute)
                and bw.func.attr.value == "backward" and isinstance(bw.func.value, cst.Name)
                and bw.func.value.value == as_name.value):
            raise _Blocked("the scale_loss block does more than `scaled_loss.backward()`")
        if any(a.star for a in call.args):
            raise _Blocked("amp.scale_loss(*args/**kwargs)")
        kws = [a.keyword.value for a in call.args if a.keyword is not None]
        bad_kw = [k for k in kws if k not in SCALE_KW | {"loss", "optimizers"}]
        if bad_kw:
            raise _Blocked(f"amp.scale_loss option {bad_kw[0]}= is unknown")
        positional = [a.value for a in call.args if a.keyword is None]
        loss_arg = get_arg(call, None, "loss")
        loss = positional[0] if positional else loss_arg.value if loss_arg is not None else None
        opt = positional[1] if len(positional) > 1 else (get_arg(call, None, "optimizers").value
                                                         if get_arg(call, None, "optimizers") else None)
        if loss is None or opt is None:
            raise _Blocked("amp.scale_loss without a loss and an optimizer")
        opts = [e.value for e in opt.elements] if isinstance(opt, (cst.List, cst.Tuple)) else [opt]
        opt_names = [dotted(o) for o in opts]
        if any(n is None for n in opt_names):
            raise _Blocked("the optimizer of amp.scale_loss is not a name or attribute")
        ref = self.scaler_ref(call)
        loss_code = self.code(loss)
        bw_args = self.code(bw)[len(self.code(bw.func)):]
        scaled = self.stmt(f"{ref}.scale({loss_code}).backward{bw_args}")
        # `if args.fp16: <scale_loss> else: loss.backward()` -> one scaled backward
        target: cst.CSTNode = with_node
        flag = None
        guard = model.parent(model.parent(with_node))
        if isinstance(guard, cst.If) and guard.body is model.parent(with_node) and len(guard.body.body) == 1 \
                and isinstance(guard.orelse, cst.Else) and len(guard.orelse.body.body) == 1:
            other = guard.orelse.body.body[0]
            if isinstance(other, cst.SimpleStatementLine) and len(other.body) == 1 \
                    and self.code(other.body[0]).replace(" ", "") == f"{loss_code}.backward{bw_args}".replace(" ", ""):
                value = self._simplify(guard.test)
                if value is False:
                    raise _Blocked("amp.scale_loss runs only when apex is missing")
                if value is not True:
                    flag = self.code(value)
                    if flag not in (self.flag, self.caller_flag):
                        raise _Blocked(f"amp.scale_loss runs when `{flag}` but amp.initialize when "
                                       f"`{self.flag or 'always'}`: make them the same flag, then migrate")
                target = guard
        if flag is None and self.flag is not None:
            flag = self.flag if model.scope_of(call) is self.init_scope else f"{ref}.is_enabled()"
        if self.autocast_off:
            flag = "False"
        self.rw.replace(use, target, [scaled])
        self._forward(use, target, loss, flag)
        self._steps(use, with_node, opt_names)
        self.backwards.append((with_node, opt_names))
        use.description = ("apex amp.scale_loss -> scaler.scale(loss).backward(), forward in torch.autocast(\"cuda\"), "
                           "optimizer.step() -> scaler.step + scaler.update")

    def _forward(self, use: ApexUse, stmt: cst.CSTNode, loss: cst.BaseExpression, flag: Optional[str]) -> None:
        """Wrap the statements the loss depends on (in the first enclosing block that computes it)."""
        model = self.model
        needed = set(reads_writes(loss)[0])
        cur = stmt
        while True:
            block = model.block_of(cur)
            if block is None:
                raise _Blocked("the scale_loss block is not a statement of a block")
            stmts = list(block.body)
            idx = next(i for i, s in enumerate(stmts) if s is cur)
            deps: List[int] = []
            need = set(needed)
            for i in range(idx - 1, -1, -1):
                if any(stmts[i] is w or model.is_ancestor(stmts[i], w) for w in self.with_nodes):
                    break  # the forward of this loss starts after the previous scaled backward
                if isinstance(stmts[i], (cst.FunctionDef, cst.ClassDef)):
                    continue
                reads, writes = reads_writes(stmts[i])
                if writes & need:
                    deps.append(i)
                    need |= reads
            if deps:
                break
            holder = model.parent(block)
            if not isinstance(holder, (cst.If, cst.Else, cst.With, cst.Try)):
                raise _Blocked("the loss is not computed in the block of the scale_loss `with` (it comes from another "
                               "function or an outer block): run that forward pass in torch.autocast(\"cuda\") by hand")
            cur = holder if isinstance(holder, (cst.If, cst.With, cst.Try)) else model.parent(holder)
            while isinstance(model.parent(cur), cst.If) and model.parent(cur).orelse is cur:  # elif
                cur = model.parent(cur)
        deps.sort()
        first, last = deps[0], deps[-1]
        if stmts[first] in self.regions:
            return  # another scale_loss of this loss wrapped it already
        if any(stmts[i] in self.regions for i in range(first, last + 1)):
            raise _Blocked("the forward passes of two scaled losses overlap: wrap them in torch.autocast by hand")
        self.regions.update(stmts[first:last + 1])
        names = {i: reads_writes(stmts[i]) for i in range(first, last + 1)}
        before: List[cst.BaseStatement] = []
        after: List[cst.BaseStatement] = []
        for i in range(first, last + 1):
            if i in deps:
                continue
            r, w = names[i]
            earlier = [names[j] for j in deps if j < i]
            later = [names[j] for j in deps if j > i]
            if not any(r & ew or w & (er | ew) for er, ew in earlier):
                before.append(stmts[i])
            elif not any(w & (lr | lw) or r & lw for lr, lw in later):
                after.append(stmts[i])
            else:
                raise _Blocked(f"line {self.line(stmts[i])} is interleaved with the forward pass: wrap the forward "
                               "in torch.autocast(\"cuda\") by hand")
        inside = stmts[first:last + 1]
        if any(model.is_ancestor(st, u.call) or st is model.statement_of(u.call) for st in inside for u in self.uses) \
                or any(isinstance(n, cst.Name) and n.value in self.avail | self.none_names
                       for st in inside for n in self._names(st)):
            raise _Blocked("the forward pass of the scaled loss holds other apex code: migrate by hand")
        # every statement keeps its own comment lines (the first one's blank lines go to what
        # now comes first); the statements moved from later lines are dropped there, not removed
        # with their comments handed on (they come back here with them)
        body = [stmts[i] for i in deps]
        lead = stmts[first].leading_lines
        body[0] = body[0].with_changes(leading_lines=())
        enabled = f", enabled={flag}" if flag else ""
        region = cst.With(items=[cst.WithItem(item=cst.parse_expression(
            f"{self.torch}.autocast({self.q}cuda{self.q}{enabled})"))], body=cst.IndentedBlock(body=body))
        seq: List[cst.BaseStatement] = [*before, region, *after]
        own = [] if seq[0] is region else list(seq[0].leading_lines)
        while own and own[0].comment is None:
            own.pop(0)  # its blank lines: `lead` has the first statement's
        seq[0] = seq[0].with_changes(leading_lines=[*lead, *own])
        self.rw.add(use, stmts[first], lambda cur, seq=seq: seq)
        for i in range(first + 1, last + 1):
            self.rw.add(use, stmts[i], lambda cur: [])

    def _steps(self, use: ApexUse, with_node: cst.With, opt_names: List[str]) -> None:
        model = self.model
        loop = model.loop_of(with_node)
        scope = model.scope_of(with_node)
        for opt_name in opt_names:
            found = []
            for c in model.calls:
                if not (isinstance(c.func, cst.Attribute) and c.func.attr.value == "step"
                        and dotted(c.func.value) == opt_name and model.scope_of(c) is scope
                        and model.before(with_node, c)):
                    continue
                if loop is not None and not model.is_ancestor(loop, c) or model.exclusive(with_node, c):
                    continue  # another iteration's, or the step of the `else:` without apex
                found.append(c)
            key = (id(loop or scope), opt_name)
            if not found:  # a micro-batch of gradient accumulation, when another scale_loss steps it
                self.stepless.append((use, key))
            else:
                self.stepped.add(key)
            for c in found:
                stmt = model.statement_of(c)
                if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
                        and isinstance(stmt.body[0], cst.Expr) and stmt.body[0].value is c) or c.args:
                    raise _Blocked(f"`{opt_name}.step(...)` on line {self.line(c)} is not a plain statement")
                if stmt not in self.steps:
                    self.steps[stmt] = opt_name
                    ref = self.scaler_ref(c)
                    self.rw.add(use, stmt, lambda cur, r=ref, o=opt_name: cur.with_changes(
                        body=[self.stmt(f"{r}.step({o})").body[0]]))

    def _updates(self) -> None:
        """One scaler.update() per iteration: after the last step of each block that steps."""
        by_loop: Dict[int, List[cst.CSTNode]] = {}
        model = self.model
        for stmt in self.steps:
            key = model.loop_of(stmt) or model.scope_of(stmt)
            by_loop.setdefault(id(key), []).append(stmt)
        for stmts in by_loop.values():
            blocks = {id(model.block_of(s)) for s in stmts}
            if len(blocks) > 1 and all(model.exclusive(a, b) for i, a in enumerate(stmts) for b in stmts[i + 1:]):
                # `if fp16: ...; opt.step()` / `else: ...; opt.step()`: one of them runs per iteration
                for stmt in stmts:
                    use = next(o for o, _ in self.rw.edits[stmt])
                    self.rw.insert_after(use, stmt, [self.stmt(f"{self.scaler_ref(stmt)}.update()")])
                continue
            if len(blocks) > 1:
                raise _Blocked(f"the optimizer steps on lines {', '.join(str(self.line(s)) for s in stmts)} are in "
                               "different blocks: call scaler.update() once per iteration after the last, by hand")
            last = max(stmts, key=lambda s: model._index.order_of(s))
            use = next(u for u in self.uses if any(last in self.rw.edits and o is u for o, _ in self.rw.edits[last]))
            self.rw.insert_after(use, last, [self.stmt(f"{self.scaler_ref(last)}.update()")])

    def _master_params(self, use: ApexUse) -> None:
        model, call = self.model, use.call
        if len(call.args) != 1 or call.args[0].keyword is not None or call.args[0].star:
            raise _Blocked("amp.master_params is not called with one optimizer")
        opt = self.code(call.args[0].value)
        params = cst.parse_expression(f"[p for group in {opt}.param_groups for p in group[{self.q}params{self.q}]]")
        stmt = model.statement_of(call)
        if stmt is None or model.block_of(stmt) is None:
            raise _Blocked("amp.master_params is not in a statement of a block")
        if any(o is not use and o.kind == "master_params" and model.statement_of(o.call) is stmt for o in self.uses):
            raise _Blocked("amp.master_params twice in one statement")
        self.rw.add(use, call, lambda cur, p=params: p)
        self._unscale_before(use, call, opt)
        use.description = "apex amp.master_params -> the optimizer's params after scaler.unscale_"

    def _unscale_before(self, use: ApexUse, node: cst.CSTNode, opt: str) -> None:
        """Gradients read between a scaled backward of `opt` and its step (clipping): apex had
        unscaled them when scale_loss exited; native AMP needs `scaler.unscale_(opt)` first, once
        per iteration, before the `if` whose branches both read them (`if fp16: ... else: ...`)."""
        model = self.model
        steps = [st for st, o in self.steps.items() if o == opt and model.before(node, st)]
        if not steps or not any(opt in names and model.before(w, node) for w, names in self.backwards):
            return
        stmt = model.statement_of(node)
        step_block = model.block_of(steps[0])
        cur = stmt
        for anc in model.ancestors(stmt):
            if anc is step_block or isinstance(anc, (cst.FunctionDef, cst.ClassDef, cst.For, cst.While)):
                break
            if isinstance(anc, cst.If) and anc.orelse is not None:
                cur = anc
        while isinstance(model.parent(cur), cst.If) and model.parent(cur).orelse is cur:  # an elif
            cur = model.parent(cur)
        key = (opt, id(model.loop_of(stmt) or model.scope_of(stmt)))
        done = getattr(self, "_unscaled", set())
        if key in done:
            return
        done.add(key)
        self._unscaled = done
        if model.block_of(cur) is None:
            raise _Blocked(f"the gradients read on line {self.line(node)} need scaler.unscale_ first: add it by hand")
        self.rw.insert_before(use, cur, [self.stmt(f"{self.scaler_ref(node)}.unscale_({opt})")])

    def _clips(self) -> None:
        """Clipping the model's parameters after a scaled backward (apex unscaled them on exit)."""
        model = self.model
        for with_node, names in self.backwards:
            if len(names) != 1:
                continue
            for call in model.calls:
                if model.is_api(call, "clip_grad") and model.scope_of(call) is model.scope_of(with_node) \
                        and model.before(with_node, call):
                    owner = next(u for u in self.uses if u.kind == "scale_loss"
                                 and model.parent(model.parent(u.call)) is with_node)
                    self._unscale_before(owner, call, names[0])
