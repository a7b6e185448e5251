"""What else a migration must change or be refused for: the other modules that use apex amp,
and the checkpoint entries that held `amp.state_dict()`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Optional

import libcst as cst

from ampfix.model import literal_string

if TYPE_CHECKING:
    from ampfix.migrations.apex.plan import ApexMigration


def elsewhere(m: "ApexMigration") -> Optional[str]:
    """The one place to refuse a migration because of other modules: another module of the
    project that still uses apex amp (a `scale_loss` in an optimizer hook, an `amp.state_dict`
    in a checkpoint helper) would lose fp16 training or crash once this module no longer calls
    `amp.initialize`. A migration is project-wide or it is not applied: the project model, when
    the run has one, puts the other modules' apex amp uses in `ctx.extra["apex_amp_elsewhere"]`
    as ("path", line) pairs."""
    others = m.ctx.extra.get("apex_amp_elsewhere") or ()
    if not others:
        return None
    path, line = others[0]
    more = f" and {len(others) - 1} more" if len(others) > 1 else ""
    return (f"apex amp is also used in {path}:{line}{more}: a migration changes every module that uses apex amp "
            "or none; migrate them together")


def checkpoint_readers(m: "ApexMigration") -> Optional[str]:
    """A checkpoint entry that held `amp.state_dict()` holds the GradScaler's state after the
    migration: every place in the file that reads that entry back must be a load the migration
    changes too (an `amp.load_state_dict`), or the migration is not applied."""
    model = m.model
    saved: Dict[str, cst.CSTNode] = {}
    for state in model.checkpoints.saved_states():
        node = state.dict_node
        if not isinstance(node, cst.Dict):
            continue
        for el in node.elements:
            if isinstance(el, cst.DictElement) and isinstance(el.value, cst.Call) \
                    and any(u.call is el.value and u.kind == "state_dict" for u in m.uses):
                key = literal_string(el.key)
                if key is not None:
                    saved.setdefault(key, el)
    if not saved:
        return None
    migrated = [u.call for u in m.uses if u.kind == "load_state_dict"]
    for node in model.nodes_of(cst.Subscript, cst.Call):
        key = loaded_key(m, node)
        if key not in saved or any(model.is_ancestor(c, node) for c in migrated):
            continue
        return (f"the checkpoint entry {key!r} saved on line {m.line(saved[key])} would hold the GradScaler's "
                f"state, but line {m.line(node)} reads it back with code the migration does not change: "
                "migrate that load too (`scaler.load_state_dict(...)`), then migrate")
    return None


def loaded_key(m: "ApexMigration", node: cst.CSTNode) -> Optional[str]:
    """For `ckpt["key"]` / `ckpt.get("key")` on a `torch.load` result: the key."""
    model = m.model
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
