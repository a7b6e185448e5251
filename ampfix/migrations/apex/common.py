"""What the parts of the apex migration share: the apex calls it migrates (`ApexUse`), what it
inserts, and the exception that refuses one use (`Blocked`)."""


from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import libcst as cst


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


class Blocked(Exception):
    """This use cannot be migrated (the message says why)."""


def statements(block: cst.BaseSuite) -> List[cst.BaseStatement]:
    """The statements of a block; a one-line suite (`if x: a; b`) as one line."""
    if isinstance(block, cst.SimpleStatementSuite):
        return [cst.SimpleStatementLine(body=list(block.body))]
    return list(block.body)


def smalls(block: cst.BaseSuite) -> List[Tuple[cst.CSTNode, Optional[cst.CSTNode]]]:
    """(statement, small statement) pairs of a block; (compound statement, None) for the others."""
    if isinstance(block, cst.SimpleStatementSuite):
        return [(sm, sm) for sm in block.body]
    return [(s, sm) for s in block.body for sm in (s.body if isinstance(s, cst.SimpleStatementLine) else [None])]
