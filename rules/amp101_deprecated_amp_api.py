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

from typing import Dict, Iterator, List, Optional, Set

import libcst as cst

from ampfix.fixes.edits import import_from_elsewhere, remove_import_alias
from ampfix.migrations.bindings import Binding, Use, settle
from ampfix.migrations.torch_amp import file_uses, renamed_state_imports
from ampfix.model import AmpModel, dotted
from ampfix.rule import SAFE, FileContext, Fix, Rule, Violation
from ampfix.knowledge.torch_amp_api import AUTOCAST_STATE, DEP_MODULES, IMPORT_DESCRIPTION, new_spelling, describe, \
    state_spelling


USED_MODULES = "AMP101: deprecated modules in use"  # in the rewrite's memo: set by the first pass
DEP_MODULES_SET = set(DEP_MODULES)


class DeprecatedAmpApi(Rule):
    code = "AMP101"
    name = "deprecated-amp-api"
    message = (
        "torch.cuda.amp / torch.cpu.amp are deprecated (FutureWarning since torch 2.4): use "
        'torch.amp.autocast("cuda", ...), torch.amp.GradScaler("cuda", ...), '
        'torch.amp.custom_fwd/custom_bwd(device_type="cuda")'
    )
    triggers = ("cuda.amp", "cpu.amp", "torch.cuda import", "torch.cpu import",
                "autocast_gpu_", "autocast_cpu_", "autocast_ipu_", "autocast_xla_")
    fixable = "safe"
    fix_note = "safe (`torch.cuda.amp.*` / `torch.cpu.amp.*` to `torch.amp.*`)"
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
left alone (a name imported from torch.cuda.amp that such a fallback uses is not migrated: its
other uses are reported without a fix), and so are uses in a branch that picks between torch versions (`x = torch.amp.GradScaler("cuda")
if TORCH_2_4 else torch.cuda.amp.GradScaler()`, or an `if` whose test names a version), except the
branch every torch from 2.4 on takes where the test reads (the torch version, `torch.__version__`
or `TORCH_VERSION`, maybe in `digit_version()`/`version.parse()`, against a version below 2.4, or
`is_torch_version(">=", "1.10")`): the `else` of `if digit_version(TORCH_VERSION) <
digit_version("1.10.0")` runs, and warns. It is reported, with no fix unless the project declares
the oldest torch it supports (an older torch may take that branch too). A name whose uses cannot all be migrated (passed around as a value, `*args`, a `# noqa` on one
use, or a replacement newer than the oldest torch the project supports: torch.amp.GradScaler
needs 2.3, `device_type=` on custom_fwd/custom_bwd 2.4) is reported without a fix. The oldest
supported torch is `min-torch-version`, else the project's own requirement on torch
(`torch>=1.13` in pyproject.toml, setup.py, setup.cfg or requirements.txt), else 2.4. A shim that
already prefers `torch.amp` and keeps the old name only for an old torch (`if hasattr(torch.amp,
"GradScaler"): ... else: from torch.cuda.amp import GradScaler`, `getattr(torch.amp,
"custom_fwd", None) or torch.cuda.amp.custom_fwd`) is left alone. Nothing is reported where the
project's requirements admit only a torch before 2.4 (`torch>=2.1,<2.3` in setup.py, `torch==1.9.1`):
no torch it runs on warns, and the replacements may not exist there (`--show-settings` says which
requirement, `torch-before-2-4`); raising the pin brings the findings.

The device-specific autocast state functions torch 2.4 deprecated too (each call warns with a
DeprecationWarning, which pytest and `-W error` show) become their device-generic
replacements, which arrived in torch 2.4 and read and set the same state:

| before | after |
|---|---|
| `torch.get_autocast_gpu_dtype()` | `torch.get_autocast_dtype("cuda")` |
| `torch.set_autocast_cpu_dtype(d)` | `torch.set_autocast_dtype("cpu", d)` |
| `torch.is_autocast_cpu_enabled()` | `torch.is_autocast_enabled("cpu")` |
| `torch.set_autocast_xla_enabled(e)` | `torch.set_autocast_enabled("xla", e)` |
| `from torch import get_autocast_gpu_dtype` | `from torch import get_autocast_dtype` (and its uses) |

(and so for every `cpu`, `ipu` and `xla` variant; `torch.is_autocast_enabled()` with no argument
is CUDA's flag and is not deprecated). A name imported from torch is renamed in its import and
its uses together, or, where one of them cannot be (taken as a value, a name already used), not
at all. A call with `*args`, one taken as a value, or a project that supports a torch before 2.4
is reported without a fix; a shim that keeps the old function for an old torch (in `except
AttributeError/TypeError:`, under a version test (not in the branch torch 2.4 takes, as above), or in a function that probes
`getattr(torch, "get_autocast_dtype", None)`) is left alone.

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
        if ctx.torch_before_2_4:
            return  # every torch the project admits is older than the deprecation
        model = ctx.model
        bindings, uses = file_uses(model, ctx)
        settle(ctx, self.code, bindings, uses)

        dq = '"'
        for use in sorted(uses, key=lambda u: model.start(u.node)):
            if use.done or use.fallback:
                continue  # (a use in `except ImportError:` runs only on a torch without torch.amp's)
            blocked = use.blocked or (use.binding.blocked if use.binding is not None else None)
            if use.kind in AUTOCAST_STATE:
                msg = (f"`torch.{use.kind}` is deprecated (DeprecationWarning since torch 2.4): "
                       f"use `{state_spelling(use.kind, use.device, dq)}`")
            else:
                msg = (f"`torch.{use.device}.amp.{use.kind}` is deprecated (FutureWarning since torch 2.4): "
                       f"use `{new_spelling(use.kind, use.device, dq)}`")
            if blocked:
                yield Violation(use.node, message=f"{msg}; not migrated automatically: {blocked}")
            else:
                assert use.replacements is not None
                # a name's uses are migrated all together or not at all (its import changes once)
                group = f"{use.binding.name}@{model.line(use.binding.stmt)}" if use.binding else None
                yield Violation(use.node, message=msg, fix=Fix(dict(use.replacements), applicability=SAFE,
                                                               description=describe(use.kind, use.device), group=group))

        yield from self._import_findings(model, [b for b in bindings if b.kind not in AUTOCAST_STATE], uses, ctx)
        for b, new, edit in renamed_state_imports(bindings):  # its uses call the new name: one fix group
            yield Violation(b.alias, message=f"`{b.name}` is imported from torch: its uses are migrated, import `{new}`",
                            fix=Fix(edit, applicability=SAFE, description=f"from torch import {b.kind} -> {new}",
                                    group=f"{b.name}@{model.line(b.stmt)}"))

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
            if not movable or not any(b.refs for b in bs):
                continue  # nothing uses the names: an availability probe or a dead import (no warning fires)
            fix = self._import_fix(model, stmt, movable)
            if fix is None:
                continue
            devices = sorted({b.device for b in movable})
            old = " / ".join(f"torch.{d}.amp" for d in devices)
            yield Violation(stmt, message=f"import from deprecated {old}: its uses are migrated, import from torch.amp",
                            fix=fix)
        # `import torch.cuda.amp` with no alias: binds `torch`; once nothing uses torch.cuda.amp, import torch
        yield from self._plain_imports(model, uses, ctx)

    @staticmethod
    def _import_fix(model: AmpModel, stmt: cst.CSTNode, movable: List[Binding]) -> Optional[Fix]:
        mod = dotted(stmt.module) or "" if isinstance(stmt, cst.ImportFrom) else ""
        target = "torch" if mod in ("torch.cuda", "torch.cpu") else "torch.amp"
        return Fix(import_from_elsewhere(model, stmt, [b.alias for b in movable], target), applicability=SAFE,
                   description=IMPORT_DESCRIPTION)

    def _plain_imports(self, model: AmpModel, uses: List[Use], ctx: FileContext) -> Iterator[Violation]:
        """`import torch.cuda.amp` once the rewrite migrated every use of torch.cuda.amp: only in a
        later pass of a rewrite, and only when the file used torch.cuda.amp before it (an
        `import torch.cuda.amp` nothing used is an availability probe or a dead import: importing
        warns nothing)."""
        # anything still reached through torch.cuda.amp (a use not migrated yet, torch.cuda.amp.common)?
        still: Set[str] = set()
        text_users = [qn.name for n in model.nodes_of(cst.Attribute) if not model.in_import(n)
                      for qn in model.qualified_names(n)]
        for dev_mod in DEP_MODULES:
            if any(name == dev_mod or name.startswith(dev_mod + ".") for name in text_users):
                still.add(dev_mod)
        memo = ctx.extra.setdefault("rewrite_memo", {})
        if not ctx.extra.get("rewrite_pass"):
            memo[USED_MODULES] = set(still)
            return
        still |= DEP_MODULES_SET - memo.get(USED_MODULES, set())  # never used: not this rewrite's to remove
        plain_torch = model.torch_alias() == "torch"
        for stmt in model.nodes_of(cst.Import):
            for alias in stmt.names:
                name = dotted(alias.name) or ""
                if name in DEP_MODULES and alias.asname is None and name not in still:
                    msg = f"`import {name}` is no longer needed: its uses are migrated to torch.amp; import torch"
                    edit = remove_import_alias(model, stmt, alias) if plain_torch else \
                        import_from_elsewhere(model, stmt, [alias], "torch")
                    yield Violation(stmt, message=msg, fix=Fix(edit, applicability=SAFE, description=IMPORT_DESCRIPTION))
                    break
