"""Facts that AMP103 (apex outside apex.amp to torch) and AMP016 (autocast dtype ignored) ask,
on their own: the migration of one apex use (`ampfix/migrations/apex/rest.py`) and the
region facts (`ampfix/model/regions.py`), each on a small snippet without a rule in between."""

import textwrap

import libcst as cst

from ampfix.model import AmpModel, ApexRole
from ampfix.knowledge.apex_api import lookup
from ampfix.migrations.apex.rest import replace_use, version_text
from ampfix.rule import FileContext
from conftest import model


def context(src: str, min_torch=(2, 4)) -> FileContext:
    text = textwrap.dedent(src)
    return FileContext("t.py", text, AmpModel(cst.parse_module(text)), min_torch_version=min_torch)


def only_use(ctx: FileContext):
    uses = [u for u in ctx.model.apex.uses() if u.reported]
    assert len(uses) == 1, uses
    return uses[0], lookup(uses[0].qualified)[0]


# ---------------------------------------------------------------------- apex use -> torch


def test_version_text():
    assert version_text((2, 0)) == "2.0" and version_text((1, 13, 1)) == "1.13.1"


def test_a_build_becomes_the_torch_call_with_its_arguments_mapped():
    ctx = context("""
        import torch
        from apex.parallel import DistributedDataParallel as DDP

        model = DDP(model, delay_allreduce=True)
        """)
    use, api = only_use(ctx)
    r = replace_use(ctx, use, api)
    assert use.role is ApexRole.BUILD and r.reason == ""
    assert r.target == "nn.parallel.DistributedDataParallel" and r.notes == ["delay_allreduce dropped"]
    assert [ctx.model.code(n) for n in r.edits] == ["DDP(model, delay_allreduce=True)"]
    new = next(iter(r.edits.values()))
    assert cst.Module([]).code_for_node(new) == "torch.nn.parallel.DistributedDataParallel(model)"


def test_fused_adam_maps_to_adam_or_adamw_by_its_mode():
    ctx = context("""
        import torch
        from apex.optimizers import FusedAdam

        opt = FusedAdam(model.parameters(), lr=1e-3, adam_w_mode=False)
        """)
    use, api = only_use(ctx)
    r = replace_use(ctx, use, api)
    assert r.target == "optim.Adam"
    assert cst.Module([]).code_for_node(next(iter(r.edits.values()))) == \
        "torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)"


def test_without_import_torch_it_goes_before_the_first_import():
    ctx = context("""
        from __future__ import annotations
        from apex.normalization import FusedLayerNorm

        ln = FusedLayerNorm(512)
        """)
    use, api = only_use(ctx)
    r = replace_use(ctx, use, api)
    first = ctx.model.apex.first_import()
    assert ctx.model.code(first).strip() == "from apex.normalization import FusedLayerNorm"
    assert isinstance(r.edits[first], cst.FlattenSentinel)
    assert [cst.Module([]).code_for_node(s).strip() for s in r.edits[first].nodes] == \
        ["import torch", "from apex.normalization import FusedLayerNorm"]
    assert cst.Module([]).code_for_node(r.edits[use.call]) == "torch.nn.LayerNorm(512)"


def test_not_migrated_says_why():
    newer = context("""
        import torch
        from apex.normalization import FusedRMSNorm

        ln = FusedRMSNorm(512)
        """, min_torch=(2, 1))
    r = replace_use(newer, *only_use(newer))
    assert r.edits is None and r.target == "nn.RMSNorm"
    assert r.reason == "torch.nn.RMSNorm needs torch >= 2.4 and the oldest supported torch is 2.1 (min-torch-version)"

    unmapped = context("""
        import torch
        from apex.optimizers import FusedAdam

        opt = FusedAdam(params, 1e-3, True)
        """)
    r = replace_use(unmapped, *only_use(unmapped))
    assert r.edits is None and r.reason.startswith("positional argument 3 means different things")

    no_import = context("""
        def build():
            from apex.parallel import SyncBatchNorm
            return SyncBatchNorm(64)
        """)
    r = replace_use(no_import, *only_use(no_import))
    assert r.edits is None and r.reason == "the file has no module-level import before which `import torch` could go"


def test_a_type_check_migrates_only_for_a_class_mapped_one_to_one():
    ctx = context("""
        import torch
        from apex.parallel import DistributedDataParallel as DDP

        model = DDP(model)
        if isinstance(model, DDP):
            model = model.module
        """)
    check = next(u for u in ctx.model.apex.uses() if u.role is ApexRole.TYPE)
    r = replace_use(ctx, check, lookup(check.qualified)[0])
    assert [cst.Module([]).code_for_node(v) for v in r.edits.values()] == ["torch.nn.parallel.DistributedDataParallel"]


# ---------------------------------------------------------------------- regions (AMP016)


def regions_by_line(m: AmpModel):
    return {m.line(r.call): r for r in m.precision.autocast_regions()}


def test_a_region_opened_by_a_decorator():
    m = model("""
        import torch

        @torch.autocast("cuda")
        def f(x):
            return x

        def g(x):
            with torch.autocast("cuda"):
                return x
        """)
    by_line = regions_by_line(m)
    assert by_line[4].opened_by_decorator and not by_line[9].opened_by_decorator


def test_a_region_whose_function_runs_inside_another_region():
    m = model("""
        import torch

        def inner(x):
            with torch.autocast("cuda"):
                return x

        @torch.autocast("cuda")
        def decorated(x):
            return x

        def alone(x):
            with torch.autocast("cuda"):
                return x

        with torch.autocast("cuda", dtype=torch.bfloat16):
            inner(1)
            decorated(2)
        alone(3)
        """)
    by_line = regions_by_line(m)
    assert m.called_from_region(by_line[5]) and m.called_from_region(by_line[8])
    assert not m.called_from_region(by_line[13]) and not m.called_from_region(by_line[16])


def test_dtype_attributes_read_in_a_function():
    m = model("""
        import argparse
        import torch

        parser = argparse.ArgumentParser()
        parser.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16"])
        args = parser.parse_args()

        def train(cfg, model):
            with torch.autocast("cuda"):
                print(cfg.amp_dtype, cfg.amp_dtype, args.dtype, cfg.dtype, model.ptdtype.x, self.amp_dtype)

        def elsewhere(cfg):
            return cfg.autocast_dtype
        """)
    train = next(f for f in m.nodes_of(cst.FunctionDef) if f.name.value == "train")
    found = m.dtype_attributes(train)
    assert list(found) == ["cfg.amp_dtype", "args.dtype", "model.ptdtype"]  # not `cfg.dtype` (no option), nor `self.`
    assert [m.code(v) for v in found["cfg.amp_dtype"]] == ["cfg.amp_dtype"]  # the first read
    assert [m.code(v) for v in found["args.dtype"]] == ['"bfloat16"', '"float16"', '"bfloat16"']  # default, choices
    assert list(m.dtype_attributes(m.module)) == []
