"""Model facts: the values a name can hold when every one is known (`known_values`) and the
tests they decide (`test_value`), which make a GradScaler `built_disabled` when its `enabled=`
can never be true."""

import libcst as cst

from tests.conftest import model


def _scalers(m):
    return [c for c in m.calls if m.is_api(c, "GradScaler")]


TRAINER = """
    import argparse
    import torch

    class Trainer:
        def __init__(self, args, model):
            self.args = args
            self.opt = torch.optim.AdamW(model.parameters())
            self.scaler = torch.amp.GradScaler("cuda", enabled=(self.args.dtype == {literal}))

    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("--dtype", type=str, default="bf16", choices={choices})
        args = parser.parse_args()
        Trainer(args, torch.nn.Linear(2, 2))
    """


def test_option_choices_make_a_float16_test_never_true():
    m = model(TRAINER.format(literal='"float16"', choices='["fp16", "bf16", "fp32"]'))
    [built] = _scalers(m)
    enabled = m.scaler_enabled(built)
    assert m.known_values(enabled.left) == ["bf16", "fp16", "fp32"]
    assert m.test_value(enabled) is False and m.built_disabled(built)
    assert m.never_true_reason(enabled) == ("self.args.dtype", ["bf16", "fp16", "fp32"])


def test_a_test_some_value_meets_is_not_decided():
    for literal, choices in (('"fp16"', '["fp16", "bf16", "fp32"]'), ('"float16"', '["float16", "bf16"]')):
        m = model(TRAINER.format(literal=literal, choices=choices))
        [built] = _scalers(m)
        assert m.test_value(m.scaler_enabled(built)) is None and not m.built_disabled(built)


def test_always_true_and_negations():
    m = model("""
        import argparse

        parser = argparse.ArgumentParser()
        parser.add_argument("--dtype", default="fp16", choices=("fp16", "half"))
        args = parser.parse_args()
        a = args.dtype in ("fp16", "half")
        b = args.dtype != "bf16"
        c = not args.dtype == "bf16"
        d = args.dtype == "bf16" or args.dtype == "fp16"
        e = args.dtype not in ["fp16", "half"]
        """)
    values = {n.targets[0].target.value: n.value for n in m.nodes_of(cst.Assign)}
    assert [m.test_value(values[k]) for k in "abcde"] == [True, True, True, None, False]


def test_unknown_sources_keep_it_unknown():
    m = model("""
        import argparse
        import yaml
        import torch

        def from_yaml(path):
            cfg = yaml.safe_load(open(path))
            return torch.amp.GradScaler("cuda", enabled=(cfg["dtype"] == "float16"))

        def from_parameter(dtype):
            return torch.amp.GradScaler("cuda", enabled=(dtype == "float16"))

        def from_option():
            parser = argparse.ArgumentParser()
            parser.add_argument("--dtype", default="bf16")
            args = parser.parse_args()
            return torch.amp.GradScaler("cuda", enabled=(args.dtype == "float16"))

        def from_lowered_option():
            parser = argparse.ArgumentParser()
            parser.add_argument("--dtype", type=str.lower, default="bf16", choices=["fp16", "bf16"])
            args = parser.parse_args()
            return torch.amp.GradScaler("cuda", enabled=(args.dtype == "float16"))

        def from_kwargs(**kwargs):
            dtype = kwargs.get("dtype", "bf16")
            return torch.amp.GradScaler("cuda", enabled=(dtype == "float16"))
        """)
    assert [m.test_value(m.scaler_enabled(c)) for c in _scalers(m)] == [None] * 5
    assert not any(m.built_disabled(c) for c in _scalers(m))


def test_parameter_values_from_every_call():
    src = """
        import torch

        def build(dtype="bf16"):
            return torch.amp.GradScaler("cuda", enabled=(dtype == "float16"))

        build("fp32")
        build()
        {extra}
        """
    m = model(src.format(extra=""))
    [built] = _scalers(m)
    assert m.known_values(m.scaler_enabled(built).left) == ["fp32", "bf16"] and m.built_disabled(built)
    for extra in ('build("float16")', "build(*sys.argv[1:])", "hooks = [build]"):
        m = model(src.format(extra=extra))
        [built] = _scalers(m)
        assert not m.built_disabled(built), extra


def test_a_name_rebound_by_a_loop_or_an_option_written_is_unknown():
    m = model("""
        import argparse
        import torch

        parser = argparse.ArgumentParser()
        parser.add_argument("--dtype", default="bf16", choices=["fp16", "bf16"])
        args = parser.parse_args()
        if args.fp16:
            args.dtype = "float16"
        s1 = torch.amp.GradScaler("cuda", enabled=(args.dtype == "float16"))
        for dtype in ("bf16", "float16"):
            pass
        dtype = "bf16"
        s2 = torch.amp.GradScaler("cuda", enabled=(dtype == "float16"))
        """)
    assert [m.built_disabled(c) for c in _scalers(m)] == [False, False]


def test_keys_of_a_table_read_before():
    src = """
        import torch

        class Trainer:
            def __init__(self, configs):
                self.configs = configs

            def train_step(self, batch):
                precision = {{"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}}[self.configs.dtype]
                {between}
                scaler = torch.GradScaler("cuda", enabled=(self.configs.dtype == "float16"))
                return precision, scaler
        """
    m = model(src.format(between="pass"))
    [built] = _scalers(m)
    assert m.known_values(m.scaler_enabled(built).left) == ["fp32", "bf16", "fp16"] and m.built_disabled(built)
    for between in ("self.configs = load()", "self.reconfigure()\n\n            def reconfigure(self):\n                pass"):
        m = model(src.format(between=between))
        [built] = _scalers(m)
        assert not m.built_disabled(built), between


def test_table_read_in_a_try_or_after_the_test_does_not_decide():
    m = model("""
        import torch

        def step(cfg):
            try:
                p = {"fp16": torch.float16, "bf16": torch.bfloat16}[cfg.dtype]
            except KeyError:
                p = torch.float32
            s1 = torch.GradScaler("cuda", enabled=(cfg.dtype == "float16"))
            s2 = torch.GradScaler("cuda", enabled=(cfg.precision == "float16"))
            q = {"fp16": torch.float16, "bf16": torch.bfloat16}[cfg.precision]
            return p, q, s1, s2
        """)
    assert [m.built_disabled(c) for c in _scalers(m)] == [False, False]


def test_autocast_region_with_a_never_true_enabled_is_disabled():
    m = model("""
        import argparse
        import torch

        parser = argparse.ArgumentParser()
        parser.add_argument("--dtype", default="bf16", choices=["fp16", "bf16", "fp32"])
        args = parser.parse_args()
        with torch.autocast("cuda", dtype=torch.float16, enabled=(args.dtype == "float16")):
            pass
        with torch.autocast("cuda", dtype=torch.float16, enabled=(args.dtype == "fp16")):
            pass
        """)
    [never, maybe] = [m.with_region(w) for w in m.nodes_of(cst.With)]
    assert never.enabled is False and maybe.enabled is None
