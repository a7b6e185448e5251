"""Facts about NVIDIA apex outside `apex.amp`: what each public name is, its torch
replacement, the torch version that replacement needs, and how its arguments map.

Used by AMP103 (apex-to-torch), the model's apex facts (`ampfix/model/apex_uses.py`) and the
apex corpus count (`bench/apex_corpus.py`).
Signatures assumed (apex master, 2023-2024; see AMP103's docs):

* `apex.parallel.DistributedDataParallel(module, message_size=10000000, delay_allreduce=False,
  shared_param=None, allreduce_trigger_params=None, retain_allreduce_buffers=False,
  allreduce_always_fp32=False, num_allreduce_streams=1, allreduce_communicators=None,
  gradient_average=True, gradient_predivide_factor=1.0, gradient_average_split_factor=None,
  prof=False)`
* `apex.parallel.convert_syncbn_model(module, process_group=None, channel_last=False)`
* `apex.parallel.SyncBatchNorm(num_features, eps=1e-5, momentum=0.1, affine=True,
  track_running_stats=True, process_group=None, channel_last=False, fuse_relu=False)`
* `apex.optimizers.FusedAdam(params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999),
  eps=1e-8, adam_w_mode=True, weight_decay=0.0, amsgrad=False, set_grad_none=True,
  capturable=False, master_weights=False)` (older apex had another positional order:
  positional arguments after `lr` are not mapped)
* `apex.optimizers.FusedSGD(params, lr, momentum=0, dampening=0, weight_decay=0,
  nesterov=False, wd_after_momentum=False, materialize_master_grads=True, set_grad_none=False)`
* `apex.normalization.FusedLayerNorm / FusedRMSNorm(normalized_shape, eps=1e-5,
  elementwise_affine=True, memory_efficient=False)`
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import libcst as cst


if TYPE_CHECKING:  # the model imports this module (ampfix/model/apex_uses.py)
    from ampfix.model import AmpModel

# keyword -> what to do with it: "keep", "drop" (any value), ("drop-if", literal) (dropped when it
# is that literal, reported otherwise), ("note", text) (dropped, and the fix title says why)
KwPlan = object


@dataclass(frozen=True)
class ApexApi:
    kind: str  # "ddp", "convert_syncbn", "syncbn", "adam", "sgd", "layernorm", "rmsnorm", or "report"
    target: str  # the torch replacement, from the torch root ("nn.parallel.DistributedDataParallel")
    min_torch: Tuple[int, int] = (1, 0)
    positional: int = 1  # how many leading positional arguments keep their meaning in the target
    keywords: Dict[str, KwPlan] = field(default_factory=dict)
    why: str = ""  # the behaviour difference the fix title states (every AMP103 fix is unsafe)
    category: str = "other"  # for the corpus count: "parallel", "optimizers", "normalization", "other"
    apex_params: Tuple[str, ...] = ()  # apex's own parameter order (the signatures above; tests compare to torch's)


DDP_WHY = ("torch DDP reduces gradients in 25 MB buckets during backward and broadcasts rank 0's buffers "
           "(BatchNorm running stats) at every forward, apex DDP never did: rank 0 is unchanged; parameters "
           "that get no gradient need find_unused_parameters=True")

APIS: Dict[str, ApexApi] = {
    "parallel.DistributedDataParallel": ApexApi(
        "ddp", "nn.parallel.DistributedDataParallel", (1, 0), 1, {
            "message_size": ("note", "message_size dropped (torch: bucket_cap_mb, a performance knob)"),
            "delay_allreduce": ("note", "delay_allreduce dropped"),
            "shared_param": ("note", "shared_param dropped"),
            "num_allreduce_streams": "drop", "prof": "drop",
            "gradient_predivide_factor": ("note", "gradient_predivide_factor dropped (torch divides once by the "
                                                  "world size: the same mean, rounded differently)"),
            "gradient_average_split_factor": ("note", "gradient_average_split_factor dropped"),
            "gradient_average": ("drop-if", "True"), "allreduce_always_fp32": ("drop-if", "False"),
            "retain_allreduce_buffers": ("drop-if", "False"), "allreduce_trigger_params": ("drop-if", "None"),
            "allreduce_communicators": ("drop-if", "None"),
        }, DDP_WHY, "parallel", ("module",)),
    "parallel.convert_syncbn_model": ApexApi(
        "convert_syncbn", "nn.SyncBatchNorm.convert_sync_batchnorm", (1, 2), 2,
        {"process_group": "keep", "channel_last": ("drop-if", "False")},
        "torch's SyncBatchNorm kernels: the same statistics up to rounding", "parallel", ("module", "process_group")),
    "parallel.SyncBatchNorm": ApexApi(
        "syncbn", "nn.SyncBatchNorm", (1, 1), 6,
        {k: "keep" for k in ("eps", "momentum", "affine", "track_running_stats", "process_group")}
        | {"channel_last": ("drop-if", "False"), "fuse_relu": ("drop-if", "False")},
        "torch's SyncBatchNorm kernels: the same statistics up to rounding", "parallel",
        ("num_features", "eps", "momentum", "affine", "track_running_stats", "process_group")),
    "optimizers.FusedAdam": ApexApi(
        "adam", "optim.AdamW", (2, 0), 2,
        {k: "keep" for k in ("lr", "betas", "eps", "weight_decay", "amsgrad", "capturable")}
        | {"bias_correction": ("drop-if", "True"), "set_grad_none": "drop", "master_weights": ("drop-if", "False"),
           "adam_w_mode": "special"},
        "the same update up to rounding; optimizer state saved by apex FusedAdam does not load (torch keeps "
        "`step` per parameter)", "optimizers", ("params", "lr")),
    "optimizers.FusedSGD": ApexApi(
        "sgd", "optim.SGD", (2, 3), 6,
        {k: "keep" for k in ("lr", "momentum", "dampening", "weight_decay", "nesterov")}
        | {"wd_after_momentum": ("drop-if", "False"), "materialize_master_grads": "drop", "set_grad_none": "drop"},
        "the same update up to rounding (fused kernel)", "optimizers",
        ("params", "lr", "momentum", "dampening", "weight_decay", "nesterov")),
    "normalization.FusedLayerNorm": ApexApi(
        "layernorm", "nn.LayerNorm", (1, 0), 3,
        {"eps": "keep", "elementwise_affine": "keep", "memory_efficient": "drop"},
        "torch's kernel: the same result up to rounding (same `weight`/`bias`: checkpoints load)", "normalization",
        ("normalized_shape", "eps", "elementwise_affine")),
    "normalization.FusedRMSNorm": ApexApi(
        "rmsnorm", "nn.RMSNorm", (2, 4), 3,
        {"eps": "keep", "elementwise_affine": "keep", "memory_efficient": "drop"},
        "torch's kernel: the same result up to rounding (same `weight`: checkpoints load)", "normalization",
        ("normalized_shape", "eps", "elementwise_affine")),
}

# apex features torch has no replacement for: nothing to migrate to, so AMP103 does not report them
NO_EQUIVALENT = {
    "optimizers.FusedLAMB": "torch has no LAMB optimizer",
    "optimizers.FusedMixedPrecisionLamb": "torch has no LAMB optimizer",
    "optimizers.FusedNovoGrad": "torch has no NovoGrad optimizer",
    "normalization.MixedFusedLayerNorm": "it keeps fp32 parameters and returns the input's dtype; torch.nn.LayerNorm "
                                         "under autocast returns fp32",
    "normalization.MixedFusedRMSNorm": "it keeps fp32 parameters and returns the input's dtype",
    "parallel.LARC": "torch has no LARC wrapper",
    "parallel.create_syncbn_process_group": "torch has no helper that splits the world into SyncBatchNorm groups",
    "contrib.FastLayerNorm": "torch has no layer norm kernel of its kind",
    "normalization.fused_layer_norm": "torch has no functional fused layer norm of apex's signature",
    "normalization.fused_layer_norm_affine": "torch has no functional fused layer norm of apex's signature",
    "normalization.fused_rms_norm": "torch has no functional fused RMS norm of apex's signature",
    "normalization.fused_rms_norm_affine": "torch has no functional fused RMS norm of apex's signature",
}
# a torch replacement exists, but it is not a rewrite of the call: the finding says what to use
BY_HAND = {
    "optimizers.FusedAdagrad": "use `torch.optim.Adagrad` (it has no fused CUDA kernel)",
}
# apex's manual mixed precision from before apex.amp (fp16 model copies, FP16_Optimizer): native
# AMP, `torch.amp.autocast` with `torch.amp.GradScaler`, replaces it
LEGACY_MIXED_PRECISION = "apex's manual fp16 training (before apex.amp): use `torch.amp.autocast` and `torch.amp.GradScaler`"
CATEGORY = {"parallel": "parallel", "optimizers": "optimizers", "normalization": "normalization"}
# the kinds whose classes map one to one: an isinstance check or annotation of them migrates too
ONE_TO_ONE = ("ddp", "syncbn", "layernorm", "rmsnorm")


def is_apex_rest(qualified: str) -> bool:
    """An apex name outside `apex.amp` (which is AMP102's): `apex`, `apex.parallel...`."""
    q = qualified
    return (q == "apex" or q.startswith("apex.")) and not (q == "apex.amp" or q.startswith("apex.amp."))


def canonical(qualified: str) -> Optional[str]:
    """`apex.parallel.distributed.DistributedDataParallel` -> `parallel.DistributedDataParallel`;
    None for names outside apex and for apex.amp (AMP102's)."""
    parts = qualified.split(".")
    if parts[0] != "apex" or len(parts) < 2 or parts[1] == "amp":
        return None
    if len(parts) == 2:
        return parts[1]
    return f"{parts[1]}.{parts[-1]}"


def lookup(qualified: str) -> Tuple[Optional[ApexApi], str]:
    """(the mapping, or None with the reason there is none) for a qualified apex name."""
    key = canonical(qualified) or ""
    if key in APIS:
        return APIS[key], ""
    if key in BY_HAND:
        return None, BY_HAND[key]
    if is_legacy_mixed_precision(qualified):
        return None, LEGACY_MIXED_PRECISION
    if key in NO_EQUIVALENT:
        return None, NO_EQUIVALENT[key]
    return None, f"`{qualified}` has no torch equivalent ampfix knows of"


def actionable(qualified: str) -> bool:
    """A use of this apex name can be acted on: torch has a replacement for it (a rewrite, a
    class to use by hand, or native AMP for apex's old fp16 utilities). apex features torch
    cannot replace (LAMB, NovoGrad, LARC, fused layer-norm kernels and functions, SyncBatchNorm
    group helpers) and names ampfix does not know (`apex.__file__`, `apex.contrib...`) are not."""
    key = canonical(qualified) or ""
    return key in APIS or key in BY_HAND or is_legacy_mixed_precision(qualified)


def star_actionable(module: str) -> bool:
    """`from <module> import *` brings apex names with a torch replacement."""
    key = canonical(module) or ""
    return is_legacy_mixed_precision(module) or any(k.split(".")[0] == key for k in APIS)


def is_legacy_mixed_precision(qualified: str) -> bool:
    """`apex.fp16_utils...` or an `FP16_Optimizer` (apex.optimizers, apex.contrib.optimizers)."""
    parts = qualified.split(".")
    return parts[0] == "apex" and (parts[1:2] == ["fp16_utils"] or parts[-1] == "FP16_Optimizer")


def target_for(model: AmpModel, call: Optional[cst.Call], api: ApexApi) -> str:
    """The torch replacement, from the torch root, for this use: FusedAdam is `optim.AdamW` by
    default (`adam_w_mode=True`), `optim.Adam` with `adam_w_mode=False`, and either when
    `adam_w_mode` is not a literal."""
    if api.kind == "adam" and call is not None:
        for a in call.args:
            if a.keyword is not None and a.keyword.value == "adam_w_mode":
                value = model.code(a.value).strip()
                if value == "False":
                    return "optim.Adam"
                if value != "True":
                    return "optim.AdamW"  # callers say it is not known (see `mode_unknown`)
    return api.target


def adam_mode_unknown(model: AmpModel, call: Optional[cst.Call], api: ApexApi) -> Optional[str]:
    """For FusedAdam with a non-literal `adam_w_mode=`: its text; else None."""
    if api.kind != "adam" or call is None:
        return None
    for a in call.args:
        if a.keyword is not None and a.keyword.value == "adam_w_mode":
            value = model.code(a.value).strip()
            return None if value in ("True", "False") else value
    return None


def category(qualified: str) -> str:
    key = canonical(qualified) or ""
    return CATEGORY.get(key.split(".")[0], "other")


# ----------------------------------------------------------------------------- arguments


def map_args(model: AmpModel, call: cst.Call, api: ApexApi) -> Tuple[Optional[List[cst.Arg]], str, List[str]]:
    """(the torch arguments, the torch target, notes), or (None, why not, [])."""
    out: List[cst.Arg] = []
    notes: List[str] = []
    target = api.target
    pos = 0
    given = set()
    for a in call.args:
        if a.star:
            return None, "it passes `*args`/`**kwargs`, which ampfix cannot map keyword by keyword", []
        if a.keyword is None:
            if pos >= api.positional:
                return None, (f"positional argument {pos + 1} means different things in apex and torch "
                              "(and across apex versions): pass it by keyword"), []
            pos += 1
            out.append(a)
            continue
        k, value = a.keyword.value, model.code(a.value).strip()
        given.add(k)
        plan = api.keywords.get(k)
        if plan is None:
            return None, f"`{k}=` has no torch equivalent", []
        if plan == "keep":
            out.append(a)
        elif plan == "special":  # FusedAdam(adam_w_mode=...): AdamW (the apex default) or Adam
            if value not in ("True", "False"):
                return None, "adam_w_mode is not a literal True/False (AdamW or Adam?)", []
            target = "optim.AdamW" if value == "True" else "optim.Adam"
        elif isinstance(plan, tuple) and plan[0] == "drop-if" and value != plan[1]:
            return None, f"`{k}={value}` has no torch equivalent", []
        elif isinstance(plan, tuple) and plan[0] == "note":
            notes.append(plan[1])
    # (the edits layer imports the model, whose apex facts import this module: imported here, where
    # it is used, so that either can be imported first)
    from ampfix.fixes.edits import keyword_arg

    if api.kind == "adam" and target == "optim.AdamW" and "weight_decay" not in given:
        out.append(keyword_arg("weight_decay", cst.Float("0.0")))  # apex's default; AdamW's is 0.01
    if api.kind == "rmsnorm" and "eps" not in given and pos < 2:
        out.append(keyword_arg("eps", cst.Float("1e-5")))  # apex's default; torch's is finfo(dtype).eps
    if api.kind in ("adam", "sgd"):
        out.append(keyword_arg("fused", cst.Name("True")))
    return out, target, notes
