"""Model facts of a GradScaler that is never enabled (AMP017's): the `scaler.scale(loss)` a
backward runs on when every scaling of it is by such a scaler (`disabled_scale`), whether a
training step holds a GradScaler that may be enabled (`enabled_scaler_in`), a call on the
backward's path that may scale unseen (`scales_unseen`), the never-true `enabled=` test naming
float16 of the scaler (`never_true_float16_gate`, a `NeverTrue`), every region computing the
loss running float16 for some value of its dtype (`precision.may_be_float16`); and the edit that
switches `with` regions to another dtype (`with_regions_dtype`)."""

import libcst as cst

from ampfix.engine.analyze import _ApplyFixes
from ampfix.fixes.edits import with_regions_dtype
from ampfix.model import NeverTrue
from ampfix.model.events import BACKWARD
from conftest import call_named, model

TRAINER = """
    import argparse
    import torch

    class Trainer:
        def __init__(self, args, model):
            self.args = args
            self.model = model
            self.opt = torch.optim.AdamW(model.parameters())
            self.amp_dtype = {{"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}}[args.dtype]
            self.scaler = torch.amp.GradScaler("cuda", enabled={enabled})

        def train_step(self, x, y):
            with torch.autocast("cuda", dtype={dtype}):
                loss = torch.nn.functional.mse_loss(self.model(x), y)
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()

    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("--dtype", default="bf16", choices=["fp16", "bf16", "fp32"])
        parser.add_argument("--mode", default="train", choices=["train", "eval"])
        args = parser.parse_args()
        Trainer(args, torch.nn.Linear(2, 2)).train_step(torch.ones(2), torch.ones(2))
    """


def trainer(enabled='(self.args.dtype == "float16")', dtype="self.amp_dtype"):
    return model(TRAINER.format(enabled=enabled, dtype=dtype))


def trace_of(m, name: str):
    return next(t for t in m.traces() if getattr(t.root, "name", None) is not None and t.root.name.value == name)


def backward_of(m, name: str):
    trace = trace_of(m, name)
    [bw] = trace.of(BACKWARD)
    return trace, bw


# ---------------------------------------------------------------------- the scale call of a never-enabled scaler


def test_a_scale_of_a_scaler_never_enabled_is_the_disabled_scale():
    for enabled in ("False", '(self.args.dtype == "float16")'):
        m = trainer(enabled)
        trace, bw = backward_of(m, "main")  # (train_step runs in main's trace)
        assert m.code(m.disabled_scale(bw)) == "self.scaler.scale(loss)"
        assert not m.enabled_scaler_in(trace)


def test_a_scaler_that_may_be_enabled_is_no_disabled_scale():
    for enabled in ('(self.args.dtype == "fp16")', "True"):
        m = trainer(enabled)
        trace, bw = backward_of(m, "main")  # (train_step runs in main's trace)
        assert m.disabled_scale(bw) is None and m.enabled_scaler_in(trace)


def test_an_unscaled_backward_has_no_disabled_scale():
    m = model("""
        import torch

        def f(model, opt, x):
            with torch.autocast("cuda"):
                loss = model(x).sum()
            loss.backward()
            opt.step()
        """)
    trace, bw = backward_of(m, "f")
    assert m.disabled_scale(bw) is None and not m.enabled_scaler_in(trace)
    assert not m.scales_unseen(bw)


def test_a_loss_scaler_on_the_path_may_scale_unseen():
    m = model("""
        import torch

        def f(model, opt, x, loss_scaler):
            with torch.autocast("cuda"):
                loss = model(x).sum()
            loss_scaler(loss, opt)
            loss.backward()
            opt.step()

        def g(model, opt, x):
            scaler = torch.amp.GradScaler("cuda", enabled=False)
            with torch.autocast("cuda"):
                loss = model(x).sum()
            scaler.scale(loss).backward()
            scaler.step(opt)
        """)
    assert m.scales_unseen(backward_of(m, "f")[1])
    assert not m.scales_unseen(backward_of(m, "g")[1])  # a GradScaler built disabled scales nothing


def test_only_the_calls_of_the_scopes_on_the_path_count():
    m = model("""
        import torch

        def f(model, opt, x):
            def later(loss):
                return loss_scaler(loss)
            with torch.autocast("cuda"):
                loss = model(x).sum()
            loss.backward()
            opt.step()
        """)
    [f] = [d for d in m.nodes_of(cst.FunctionDef) if d.name.value == "f"]
    assert "loss_scaler(loss)" not in [m.code(c) for c in m.calls_in_scope(f)]  # the nested def's own
    assert not m.scales_unseen(backward_of(m, "f")[1])


# ---------------------------------------------------------------------- the never-true test naming float16


def test_the_never_true_test_naming_float16_with_its_values():
    m = trainer()
    gate = m.never_true_float16_gate(call_named(m, "self.scaler.scale(loss)"))
    assert isinstance(gate, NeverTrue)
    assert (m.code(gate.test), gate.compared, gate.values) == (
        '(self.args.dtype == "float16")', "self.args.dtype", ("bf16", "fp16", "fp32"))


def test_no_gate_for_a_literal_false_a_test_that_may_be_true_or_one_not_naming_float16():
    for enabled, never in (("False", True), ('(self.args.dtype == "fp16")', False), ('(self.args.mode == "debug")', True)):
        m = trainer(enabled)
        [built] = [c for c in m.calls if m.is_api(c, "GradScaler")]
        assert m.built_disabled(built) is never, enabled
        assert m.never_true_float16_gate(call_named(m, "self.scaler.scale(loss)")) is None, enabled


# ---------------------------------------------------------------------- float16 for some value of the dtype


def _loss(m):
    return call_named(m, "self.scaler.scale(loss)").args[0].value


def test_a_region_whose_dtype_is_float16_for_one_value_may_be_float16():
    m = trainer()
    loss = _loss(m)
    assert m.precision.value_dtypes(loss) != {"float16"}  # not float16 on every path
    assert m.precision.may_be_float16(loss)


def test_a_region_never_float16_is_not():
    for dtype in ("torch.bfloat16", '{"bf16": torch.bfloat16, "fp32": torch.float32}[self.args.dtype]'):
        m = trainer(dtype=dtype)
        assert not m.precision.may_be_float16(_loss(m)), dtype


def test_a_value_no_region_computes_is_not():
    m = model("""
        def f(model, x):
            loss = model(x).sum()
            return loss
        """)
    assert not m.precision.may_be_float16(call_named(m, "model(x)"))


# ---------------------------------------------------------------------- the edit: regions switched to a dtype


def test_with_regions_take_the_dtype_a_decorator_does_not():
    m = model("""
        import torch

        def f(model, x):
            with torch.autocast("cuda", dtype=torch.float16):
                a = model(x)
            with torch.autocast("cuda"):
                b = model(a)
            return b

        @torch.autocast("cuda")
        def g(model, x):
            return model(x)
        """)
    regions = m.precision.autocast_regions()
    withs = [r for r in regions if isinstance(r.node, cst.With)]
    assert len(withs) == 2 and len(regions) == 3
    edit = with_regions_dtype(withs, "torch.bfloat16", replace_float16=True)
    text = m.module.visit(_ApplyFixes({id(k): v for k, v in edit.items()})).code
    assert 'torch.autocast("cuda", dtype=torch.bfloat16):\n        a' in text
    assert 'torch.autocast("cuda", dtype=torch.bfloat16):\n        b' in text
    assert with_regions_dtype(withs, "torch.bfloat16") is None  # a float16 dtype is kept unless it is to be replaced
    assert with_regions_dtype(regions, "torch.bfloat16", replace_float16=True) is None  # the decorator
    assert with_regions_dtype([], "torch.bfloat16") == {}
