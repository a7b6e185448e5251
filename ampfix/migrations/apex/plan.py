"""The plan of one file's migration (`ApexMigration`): its state, and the order of its parts
(`conditions`, `scaler`, `loop`, `checkpoints`), each a module of this package."""

from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from ampfix.fixes.rewrites import Rewrites
from ampfix.migrations.apex import checkpoints, conditions, loop, scaler
from ampfix.migrations.apex.common import APEX_CALLS, ApexUse, Blocked


class ApexMigration:
    """One file's migration: `build()` plans every apex use of the file as one unit, or sets
    `reason` (the file's) or a use's `reason` to say why it cannot be done. The parts keep their
    facts here: `conditions` the availability names (`avail`, `none_names`); `scaler` where the
    GradScaler lives (`scaler_name`, `placement`, `anchor`, `init_scope`, `self_name`, `caller`,
    `caller_scope`, `flag`, `caller_flag`, `autocast_off`); `loop` the steps it routed through the
    scaler (`steps`, `stepless`, `stepped`), the autocast regions and backwards it made
    (`regions`, `backwards`) and the optimizers already unscaled (`_unscaled`); every edit goes
    to `rw`, grouped by the use it belongs to."""

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

    def stmt(self, code: str) -> cst.BaseStatement:
        return cst.parse_statement(code + "\n", config=self.model.module.config_for_parsing)

    def code(self, node: cst.CSTNode) -> str:
        return self.model.code(node)

    def line(self, node: cst.CSTNode) -> int:
        return self.model.line(node)

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
            conditions.imports(self)
            scaler.initialize(self, self.init)
        except Blocked as exc:
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
                    loop.migrate_use(self, use)
                except Blocked as exc:
                    use.reason = str(exc)
            for use in self.uses:
                if use.kind == "master_params" and use.reason is None:
                    try:
                        loop.master_params(self, use)
                    except Blocked as exc:
                        use.reason = str(exc)
            try:
                loop.clips(self)
            except Blocked as exc:
                self.init.reason = str(exc)
            for use, key in self.stepless:
                if key not in self.stepped and use.reason is None:
                    use.reason = (f"no `{key[1]}.step()` follows the scaled backward in this function: call "
                                  "scaler.step/update by hand")
            try:
                loop.updates(self)
                conditions.availability_ifs(self)
            except Blocked as exc:
                self.init.reason = str(exc)
        if self.init.reason is None and self.reason is None:
            self.reason = checkpoints.elsewhere(self) or checkpoints.checkpoint_readers(self)
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
