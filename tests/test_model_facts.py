"""The model of one file, on its own: each fact it answers, without a rule in between.

Every test builds the model of a small snippet and asks one question of it (names, values,
calls, regions, objects, flow, traces, checkpoints, precision), so a change to the model is
seen here before any rule's fixture moves."""

import textwrap
from pathlib import Path

import libcst as cst
import pytest

from ampfix.model import AmpModel
from ampfix.model.events import BACKWARD, GRAD_READ, GRAD_SANITIZE, SCALER_STEP, UNSCALE, UPDATE
from conftest import call_named, model


def name_at(m: AmpModel, call_text: str, index: int = 0) -> cst.BaseExpression:
    return call_named(m, call_text).args[index].value


# ---------------------------------------------------------------------- names


def test_torch_api_whatever_the_import_style():
    m = model("""
        import torch as T
        from torch.cuda import amp
        from torch.amp import GradScaler as GS

        a = T.cuda.amp.autocast()
        b = amp.GradScaler()
        c = GS("cuda")
        """)
    a, b, c = (call_named(m, t) for t in ("T.cuda.amp.autocast()", "amp.GradScaler()", 'GS("cuda")'))
    assert (m.api_of(a).kind, m.api_of(a).device, m.api_of(a).deprecated) == ("autocast", "cuda", True)
    assert m.api_of(b).kind == "GradScaler" and m.api_of(b).deprecated
    assert m.api_of(c).kind == "GradScaler" and not m.api_of(c).deprecated


def test_a_local_binding_shadows_the_import():
    m = model("""
        from torch import autocast

        def f(autocast):
            return autocast()
        """)
    assert m.api_of(call_named(m, "autocast()")) is None


# ---------------------------------------------------------------------- values


def test_values_through_assignments_branches_and_call_sites():
    m = model("""
        import torch

        def build(use_amp):
            scaler = torch.amp.GradScaler("cuda") if use_amp else None
            return scaler

        def train(step_scaler):
            step_scaler.update()

        s = build(True)
        train(s)
        """)
    update = call_named(m, "step_scaler.update()")
    values = m.possible_values(update.func.value)
    texts = sorted(m.code(v) for v in values)
    assert texts == ['None', 'torch.amp.GradScaler("cuda")']


def test_self_attributes_across_methods_and_partial():
    m = model("""
        import functools
        import torch

        class Trainer:
            def __init__(self):
                self.amp_autocast = functools.partial(torch.autocast, "cuda", dtype=torch.float16)

            def step(self, x):
                with self.amp_autocast():
                    return x
        """)
    with_stmt = m.nodes_of(cst.With)[0]
    region = m.with_region(with_stmt)
    assert region is not None and region.dtype == "float16" and region.device == "cuda"


# ---------------------------------------------------------------------- calls


def test_callees_methods_closures_super_and_dunder_call():
    m = model("""
        class Base:
            def hook(self):
                pass

        class T(Base):
            def hook(self):
                super().hook()

            def __call__(self):
                self.hook()

        def outer():
            def inner():
                pass
            inner()
            t = T()
            t()
        """)
    names = {m.code(c): [f.name.value for f in m.callees(c)] for c in m.calls}
    assert names["super().hook()"] == ["hook"] and names["self.hook()"] == ["hook"]
    assert names["inner()"] == ["inner"] and names["t()"] == ["__call__"]



def test_callees_through_values_are_functions_used_as_values():
    # a call reaches a function through values only when the file uses the function as a value
    # (`functions_used_as_values`): the resolution skips the values of calls that cannot
    m = model("""
        import functools

        class Trainer:
            def step(self, loss):
                loss.backward()

            def fit(self, run):
                hook = self.step
                run(hook)

        def train_step(loss):
            loss.backward()

        def loop(cb, data):
            for x in data:
                cb(x)

        fast = functools.partial(train_step)
        loop(fast, [1])
        loop(train_step, [2])
        model.to("cuda").parameters()
        """)
    assert m.functions_used_as_values() == {"step", "train_step"}
    names = {m.code(c): sorted(f.name.value for f in m.callees(c)) for c in m.calls}
    assert names["cb(x)"] == ["train_step"] and names["run(hook)"] == []
    assert names['model.to("cuda").parameters()'] == []
    plain = model("""
        def helper(x):
            return x

        def main(obj):
            obj.save(helper(1))
        """)
    assert plain.functions_used_as_values() == set()
    assert [f.name.value for c in plain.calls for f in plain.callees(c)] == ["helper"]

def test_a_name_or_attribute_that_shares_a_functions_name_is_not_a_use_of_it():
    # a parameter, a keyword, a local variable named like a function, and an attribute named
    # like a function that is no method, name no function: `_resolve_callable` could not reach
    # one through them, so they do not make the file resolve every call's values
    m = model("""
        def test_merge(model_cls, config_cls):
            def config():
                return config_cls(r=8)

            model = wrap(model_cls(), config())
            model.add_adapter("b", config())
            print(model.config, dict(config=1))

        def test_other(config):
            config = config_cls(r=4)
            return build(config)
        """)
    assert m.functions_used_as_values() == set()
    twin = model("""
        class Trainer:
            def hook(self):
                pass

            def fit(self, run):
                run(self.hook)

        def test_merge(config_cls):
            def config():
                return config_cls(r=8)

            make = config
            return make()
        """)
    assert twin.functions_used_as_values() == {"config", "hook"}
    names = {twin.code(c): sorted(f.name.value for f in twin.callees(c)) for c in twin.calls}
    assert names["make()"] == ["config"]


def test_values_are_skipped_only_where_no_call_could_reach_a_function_through_them():
    # with every function counted as used as a value, every call of the fixtures resolves to
    # the same functions as with the names the file really uses so
    root = Path(__file__).resolve().parent.parent / "fixtures"
    shapes = [p for p in sorted(root.rglob("*.py")) if "def " in p.read_text(encoding="utf-8")][1::3]
    assert len(shapes) > 50
    for path in shapes:
        text = path.read_text(encoding="utf-8")
        exact = AmpModel(cst.parse_module(text))
        every = AmpModel(cst.parse_module(text))
        every.__dict__["_used_as_values"] = set(every.functions)
        for a, b in zip(exact.calls, every.calls):
            assert [f.name.value for f in exact.callees(a)] == [f.name.value for f in every.callees(b)], \
                (path, exact.code(a))


def test_callers_of_a_function_are_the_calls_that_resolve_to_it():
    # `callers` resolves only the calls of a function's name unless the function is used as a
    # value or is `__call__`: the same calls, in the same order, as resolving every call
    root = Path(__file__).resolve().parent.parent / "fixtures"
    shapes = [p for p in sorted(root.rglob("*.py")) if "def " in p.read_text(encoding="utf-8")][::3]
    assert len(shapes) > 50
    for path in shapes:
        m = AmpModel(cst.parse_module(path.read_text(encoding="utf-8")))
        every = {}
        for call in m.calls:
            for f in m.callees(call):
                every.setdefault(f, []).append(call)
        for funcs in m.functions.values():
            for f in funcs:
                assert m.callers(f) == every.get(f, []), (path, f.name.value)


# ---------------------------------------------------------------------- objects


def test_scalers_assigned_annotated_and_duck_typed():
    m = model("""
        import torch
        from torch.amp import GradScaler

        scaler = torch.amp.GradScaler("cuda")

        def step(s: GradScaler, loss, opt):
            s.step(opt)

        def duck(grad_scaler, loss, opt):
            grad_scaler.scale(loss).backward()
            grad_scaler.step(opt)
            grad_scaler.update()
        """)
    assert {"scaler", "s", "grad_scaler"} <= m.scalers


def test_a_receiver_named_like_a_scaler_is_one_unless_what_it_holds_is_known_to_be_something_else():
    m = model("""
        import torch
        from fairseq.optim.dynamic_loss_scaler import DynamicLossScaler as FairseqScaler
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        class OwnScaler:
            def scale(self, loss):
                return loss * 4.0

            def unscale_(self, params):
                pass

        def unknown(grad_scaler, loss):
            grad_scaler.scale(loss).backward()

        def own(loss, fp16):
            grad_scaler = OwnScaler() if fp16 else None
            grad_scaler.scale(loss).backward()

        def library(loss):
            loss_scaler = FairseqScaler()
            loss_scaler.scale(loss).backward()

        def sharded(loss):
            amp_scaler = ShardedGradScaler()
            amp_scaler.scale(loss).backward()
        """)
    scale = {fn: call_named(m, f"{name}.scale(loss)") for fn, name in
             (("unknown", "grad_scaler"), ("library", "loss_scaler"), ("sharded", "amp_scaler"))}
    assert m.scale_call_scaler(scale["unknown"]) == "grad_scaler"  # a parameter: a GradScaler by its name
    assert m.scale_call_scaler(scale["library"]) is None  # fairseq's loss scaler is not one
    assert m.scale_call_scaler(scale["sharded"]) == "amp_scaler"  # torch's sharded GradScaler is
    own = [c for c in m.calls if m.code(c) == "grad_scaler.scale(loss)" and m.function_of(c).name.value == "own"]
    assert own and m.scale_call_scaler(own[0]) is None  # an instance of a class of the file that is not one


def test_a_literally_disabled_scaler():
    m = model("""
        import torch

        off = torch.amp.GradScaler("cuda", enabled=False)
        maybe = torch.amp.GradScaler("cuda", enabled=flag)
        off.update()
        maybe.update()
        """)
    assert m.scaler_disabled(call_named(m, "off.update()").func.value)
    assert not m.scaler_disabled(call_named(m, "maybe.update()").func.value)


def test_optimizers_and_schedulers_told_apart():
    m = model("""
        import torch

        opt = torch.optim.AdamW(params)
        sched = torch.optim.lr_scheduler.StepLR(opt, 10)
        opt.step()
        sched.step()
        """)
    assert m.is_optimizer(call_named(m, "opt.step()").func.value)
    assert not m.is_optimizer(call_named(m, "sched.step()").func.value)


# ---------------------------------------------------------------------- flow


def test_exclusive_branches_and_one_stable_decision():
    m = model("""
        def f(use_amp, scaler, opt, loss):
            if use_amp:
                scaler.step(opt)
            else:
                opt.step()
            if not use_amp:
                print("fp32")
        """)
    step, plain, printed = (call_named(m, t) for t in ("scaler.step(opt)", "opt.step()", 'print("fp32")'))
    assert m.exclusive(step, plain) and m.exclusive(step, printed) and not m.exclusive(plain, printed)


def test_the_operands_of_a_conjunction_are_the_decisions_they_name():
    m = model("""
        import torch

        def f(use_amp, clip, opt, loss, params):
            scaler = torch.amp.GradScaler("cuda", enabled=use_amp)
            if use_amp:
                scaler.scale(loss).backward()
            if use_amp and clip > 0:
                scaler.unscale_(opt)
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(params, clip)
            if not use_amp and clip > 0:
                print("fp32 clip")
            if use_amp and clip > 0:
                log("unscaled")
            else:
                log("not unscaled")
        """)
    backward, unscale, clip, fp32, logged, not_logged = (call_named(m, t) for t in (
        "scaler.scale(loss).backward()", "scaler.unscale_(opt)", "torch.nn.utils.clip_grad_norm_(params, clip)",
        'print("fp32 clip")', 'log("unscaled")', 'log("not unscaled")'))
    # `unscale_` runs on every path where the scaled backward and the clip both run
    assert m.exclusive(backward, fp32) and m.exclusive(unscale, fp32) and not m.exclusive(unscale, clip)
    trace = next(t for t in m.traces() if getattr(t.root, "name", None) is not None and t.root.name.value == "f")
    bw = next(e for e in trace.events if e.kind == BACKWARD)
    read = next(e for e in trace.events if e.kind == GRAD_READ)
    assert not m.path_without(trace, bw, read, lambda e: e.kind == UNSCALE)
    # with an `else`, the whole test stays one decision: its two branches exclude each other
    assert m.exclusive(logged, not_logged)


def test_a_conjunction_with_an_else_also_runs_under_its_operands():
    m = model("""
        import torch

        def f(cfg, opt, loss, params):
            scaler = torch.amp.GradScaler("cuda")
            if cfg.amp and cfg.dtype == "float16":
                scaler.scale(loss).backward()
            else:
                loss.backward()
            if cfg.amp and cfg.dtype == "float16":
                scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            if not cfg.amp:
                print("fp32")
        """)
    backward, plain, unscale, fp32 = (call_named(m, t) for t in (
        "scaler.scale(loss).backward()", "loss.backward()", "scaler.unscale_(opt)", 'print("fp32")'))
    # the `if`'s own decision stays (its `else` excludes its body), and each operand holds there
    assert m.exclusive(backward, plain) and m.exclusive(backward, fp32) and not m.exclusive(plain, fp32)
    trace = next(t for t in m.traces() if getattr(t.root, "name", None) is not None and t.root.name.value == "f")
    bw = next(e for e in trace.events if e.kind == BACKWARD)
    read = next(e for e in trace.events if e.kind == GRAD_READ)
    # the `unscale_` under the same conjunction, without an `else`, runs wherever the backward did
    assert not m.path_without(trace, bw, read, lambda e: e.kind == UNSCALE)


# ---------------------------------------------------------------------- traces


# a training loop whose step and update run in a helper
HELPER_STEP = """
    import torch

    def apply_step(s, o):
        s.unscale_(o)
        s.step(o)
        s.update()

    def train(loader, opt):
        scaler = torch.amp.GradScaler("cuda")
        for x in loader:
            scaler.scale(x).backward()
            apply_step(scaler, opt)
    """


def test_a_trace_runs_helpers_in_order_with_the_roots_names():
    m = model(HELPER_STEP)
    train = m.functions["train"][0]
    events = [(e.kind, e.scaler, e.target) for e in m.trace(train).events if e.kind != "scaler_new"]
    assert events == [(BACKWARD, "scaler", "x"), (UNSCALE, "scaler", "opt"), (SCALER_STEP, "scaler", "opt"),
                      (UPDATE, "scaler", None)]


def test_an_iteration_is_a_loop_group_read_through_its_accessors():
    from ampfix.model import group_frame, group_loop

    m = model(HELPER_STEP)
    train = m.functions["train"][0]
    trace = m.trace(train)
    (step,) = trace.of(SCALER_STEP)
    group = m.iteration_of(trace, step)
    loop = group_loop(group)
    assert isinstance(loop, cst.For) and m.function_of(loop) is train
    assert group_frame(group) == ()  # the loop is the root's own code, though the step is in a helper
    assert group_loop(None) is None and group_frame(None) == ()


EARLY_RETURN_STEP = """
    import torch

    def step(scaler, opt, model):
        scaler.unscale_(opt)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if not torch.isfinite(norm):
            scaler.update()
            return False
        scaler.step(opt)
        scaler.update()
        return True

    def train(model, opt, loader):
        scaler = torch.amp.GradScaler("cuda")
        for x in loader:
            scaler.scale(model(x).sum()).backward()
            step(scaler, opt, model)
"""


def test_an_early_return_and_the_code_after_it_are_the_two_arms_of_one_decision():
    # an `update()` in the early-return branch and one after the `if`: every path updates, in
    # the step function alone (its end is past the early return) and inlined in the loop
    m = model(EARLY_RETURN_STEP)
    for root in ("step", "train"):
        trace = m.trace(m.functions[root][0])
        (unscale,) = trace.of(UNSCALE)
        group = m.iteration_of(trace, unscale)

        def updates(e):
            return e.kind == UPDATE

        assert m.leaves_iteration_without(trace, unscale, group, updates) is None, root
    # without the update on the early path, that path is found
    m = model(EARLY_RETURN_STEP.replace("            scaler.update()\n            return False",
                                        "            return False"))
    trace = m.trace(m.functions["train"][0])
    (unscale,) = trace.of(UNSCALE)
    assert m.leaves_iteration_without(trace, unscale, m.iteration_of(trace, unscale),
                                      lambda e: e.kind == UPDATE) is not None


EXIT_GUARD = """
    import torch

    def backward(scaler, opt, loss, clip, step):
        scaler.scale(loss).backward()
        if clip is not None:
            if not step:
                raise ValueError("clip without a step")
            scaler.unscale_(opt)
        if step:
            scaler.step(opt)
            scaler.update()
        else:
            print("no step")
"""


def test_a_guard_that_exits_decides_a_later_test_of_its_condition():
    # after `if not step: raise`, the code runs where `step` holds: a later `if step:` takes its
    # true branch there (one decision), so every path from the unscale_ updates
    variants = {
        "raise": (EXIT_GUARD, True),
        "return": (EXIT_GUARD.replace('raise ValueError("clip without a step")', "return None"), True),
        "an elif after the exit": (EXIT_GUARD.replace(
            'raise ValueError("clip without a step")',
            'raise ValueError("no step")\n            elif clip < 0:\n                print("negative")'), True),
        "the else exits": (EXIT_GUARD.replace(
            '            if not step:\n                raise ValueError("clip without a step")',
            '            if step:\n                print("clip")\n            else:\n                raise ValueError("no")'),
            True),
        "only one arm of the elif exits": (EXIT_GUARD.replace(
            'raise ValueError("clip without a step")',
            'print("a")\n            elif clip < 0:\n                raise ValueError("negative")'), False),
        "a guard that only warns": (EXIT_GUARD.replace('raise ValueError("clip without a step")', 'print("warn")'),
                                    False),
        "the name assigned in between": (EXIT_GUARD.replace("            scaler.unscale_(opt)\n",
                                                            "            scaler.unscale_(opt)\n        step = loss > 0\n"),
                                         False),
    }
    for name, (src, decided) in variants.items():
        m = model(src)
        unscale, printed = call_named(m, "scaler.unscale_(opt)"), call_named(m, 'print("no step")')
        assert m.exclusive(unscale, printed) is decided, name
        assert not m.exclusive(unscale, call_named(m, "scaler.update()")), name
        trace = m.trace(m.functions["backward"][0])
        (ev,) = trace.of(UNSCALE)
        left = m.leaves_iteration_without(trace, ev, m.iteration_of(trace, ev), lambda e: e.kind == UPDATE)
        assert (left is None) is decided, name


LOOP_GUARD = """
    import torch

    def train(scaler, opt, model, loader, accum):
        for i, batch in enumerate(loader):
            scaler.scale(model(batch)).backward()
            boundary = (i + 1) % accum == 0
            if not boundary:
                continue
            scaler.unscale_(opt)
            if boundary:
                scaler.step(opt)
                scaler.update()
            else:
                print("no step")
"""


def test_a_loop_guard_decides_a_later_test_of_its_condition_in_the_same_iteration():
    # after `if not boundary: continue`, the rest of the iteration runs where `boundary` holds:
    # a later `if boundary:` of the same iteration is taken wherever it runs (Flow._loop_forced)
    guard = "            if not boundary:\n                continue\n"
    variants = {
        "continue": (LOOP_GUARD, True),
        "break": (LOOP_GUARD.replace("continue", "break"), True),
        "the else continues": (LOOP_GUARD.replace(guard, "            if boundary:\n                print(i)\n"
                                                  "            else:\n                continue\n"), True),
        "an elif chain that continues or returns": (LOOP_GUARD.replace(
            guard, "            if not boundary:\n                continue\n            elif i < 0:\n"
                   "                return\n"), True),
        "the later test in a with block": (LOOP_GUARD.replace(
            "            if boundary:\n                scaler.step", "            with torch.no_grad():\n"
            "              if boundary:\n                scaler.step").replace(
            "            else:\n                print", "              else:\n                print"), True),
        "only one arm of the elif continues": (LOOP_GUARD.replace(
            guard, "            if not boundary:\n                print(i)\n            elif i < 0:\n"
                   "                continue\n"), False),
        "a guard that only warns": (LOOP_GUARD.replace("                continue\n", "                print(i)\n"), False),
        "the name assigned in between": (LOOP_GUARD.replace(
            "            scaler.unscale_(opt)\n", "            scaler.unscale_(opt)\n            boundary = i > 3\n"),
            False),
        "a continue of a nested loop": (LOOP_GUARD.replace(
            guard, "            for j in range(2):\n                if not boundary:\n                    continue\n"),
            False),
        "the later test in a nested loop": (LOOP_GUARD.replace(
            "            if boundary:\n                scaler.step", "            for j in range(2):\n"
            "              if boundary:\n                scaler.step").replace(
            "            else:\n                print", "              else:\n                print"), False),
        "the guard in a try before the test": (LOOP_GUARD.replace(
            guard, "            try:\n                if not boundary:\n                    continue\n"
                   "            finally:\n                print(i)\n"), False),
    }
    for name, (src, decided) in variants.items():
        m = model(src)
        trace = m.trace(m.functions["train"][0])
        (ev,) = trace.of(UNSCALE)
        left = m.leaves_iteration_without(trace, ev, m.iteration_of(trace, ev), lambda e: e.kind == UPDATE)
        assert (left is None) is decided, name
        update = call_named(m, "scaler.update()")
        # the decision is not a context of the code after the guard: the update runs where the
        # unscale_ runs, and the untaken arm stays under the test (never both in one pass)
        assert not m.exclusive(call_named(m, "scaler.unscale_(opt)"), update), name
        assert m.exclusive(update, call_named(m, 'print("no step")')), name
    # the code after a loop guard is not conditional on it for code after the loop: the
    # unscale_ in a loop over the optimizers that skips some runs before the clip
    m = model(LOOP_GUARD.replace('                print("no step")\n', '                print("no step")\n'
                                 "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"))
    trace = m.trace(m.functions["train"][0])
    (clip,) = [e for e in trace.events if "clip_grad_norm_" in m.code(e.node)]
    assert m.path_avoiding(trace, None, clip, lambda e: e.kind == UNSCALE) is False
    assert m.path_avoiding(trace, None, clip, lambda e: e.kind == UPDATE) is False


NONE_MARKER = """
    import torch

    def check(scaler, opt, params, clip):
        grad_norm = None
        if clip is not None:
            scaler.unscale_(opt)
            grad_norm = torch.nn.utils.clip_grad_norm_(params, clip)
        if grad_norm is not None:
            grad_norm = grad_norm.item()
        else:
            scaler.unscale_(opt.inner)
        return grad_norm
"""


def test_a_local_set_to_none_and_to_a_value_in_one_branch_marks_that_branch():
    m = model(NONE_MARKER)
    first, second, item = (call_named(m, t) for t in ("scaler.unscale_(opt)", "scaler.unscale_(opt.inner)",
                                                       "grad_norm.item()"))
    assert m.exclusive(first, second) and not m.exclusive(first, item)
    # `if grad_norm is None:` (the negative form) and `if not grad_norm is not None:` are the same decision
    for test in ("grad_norm is None", "not grad_norm is not None"):
        m = model(NONE_MARKER.replace("if grad_norm is not None:", f"if {test}:"))
        assert not m.exclusive(call_named(m, "scaler.unscale_(opt)"), call_named(m, "scaler.unscale_(opt.inner)"))
        assert m.exclusive(call_named(m, "scaler.unscale_(opt)"), call_named(m, "grad_norm.item()"))
    # not a marker: a value that may be None, another assignment before the test, a loop
    # target, no `None` right before the `if`
    for src in (NONE_MARKER.replace("torch.nn.utils.clip_grad_norm_(params, clip)", "helper(params)"),
                NONE_MARKER.replace("torch.nn.utils.clip_grad_norm_(params, clip)", "torch.nn.utils.clip_grad_value_(params, clip)"),
                NONE_MARKER.replace("        if grad_norm is not None:", "        grad_norm = opt.norm\n        if grad_norm is not None:"),
                NONE_MARKER.replace("        return grad_norm", "        for grad_norm in params:\n            pass\n        return grad_norm"),
                NONE_MARKER.replace("        grad_norm = None\n", "        grad_norm = None\n        print(clip)\n")):
        m = model(src)
        assert not m.exclusive(call_named(m, "scaler.unscale_(opt)"), call_named(m, "scaler.unscale_(opt.inner)")), src


def test_a_finite_test_of_the_gradients_is_not_one_of_the_loss():
    m = model("""
        import math
        import torch

        def f(norm, grad_norm, total_norm, loss, p):
            if not torch.isfinite(grad_norm):
                pass
            if math.isnan(total_norm) or math.isinf(total_norm):
                pass
            if norm == float("inf"):
                pass
            if torch.isnan(loss):
                pass
            if grad_norm > 1.0:
                pass
            if not torch.isfinite(p.grad).all():
                pass
    """)
    tests = sorted(m.nodes_of(cst.If), key=m.line)
    assert [m.gradient_finite_test(m._decision(t, True)[0]) for t in tests] == [True, True, True, False, False, True]


def test_a_finite_test_is_followed_through_the_names_it_reads():
    m = model("""
        import torch

        def f(model, loss):
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            skip = not torch.isfinite(gn)
            bad = not torch.isfinite(loss)
            valid = True
            for p in model.parameters():
                if not torch.isfinite(p.grad).all():
                    valid = False
            if not torch.isfinite(gn):
                pass
            if skip:
                pass
            if bad:
                pass
            if not valid:
                pass
    """)
    tests = sorted(m.nodes_of(cst.If), key=m.line)[1:]  # (not the per-parameter test itself)
    assert [m.gradient_finite_test(m._decision(t, True)[0]) for t in tests] == [True, True, False, True]


def test_a_frameworks_autocast_is_a_region_in_its_mixed_precision_dtype():
    m = model("""
        from accelerate import Accelerator
        from lightning.fabric import Fabric

        def f(runner, precision):
            a = Accelerator(mixed_precision="fp16")
            b = Accelerator(mixed_precision="no")
            c = Accelerator(mixed_precision=precision)
            d = Fabric(precision="bf16-mixed")
            with a.autocast():
                pass
            with b.autocast():
                pass
            with c.autocast():
                pass
            with d.autocast():
                pass
            with runner.autocast():
                pass
            with a.autocast(cache_enabled=False):
                pass
    """)
    withs = sorted(m.nodes_of(cst.With), key=m.line)
    regions = [m.with_region(w) for w in withs]
    assert [(r.dtype, r.enabled) if r else None for r in regions] == [
        ("float16", True), ("dynamic", False), ("dynamic", None), ("bfloat16", True), None, None]


def test_a_loop_over_epochs_is_named_by_its_target_its_range_or_its_test():
    m = model("""
        def f(loader, epoch, max_epochs, start_epoch, self):
            for epoch in range(epoch + 1, max_epochs + 1):
                pass
            for _ in range(start_epoch, self.num_epochs):
                pass
            while self.epoch < self.n_epochs:
                pass
            for x in tqdm(loader, desc=f"epoch {epoch}"):
                pass
            for step in range(len(loader)):
                pass
            while True:
                pass
    """)
    loops = [n for n in m.nodes_of(cst.For)] + [n for n in m.nodes_of(cst.While)]
    loops.sort(key=lambda n: m.line(n))
    assert [m.iterates_epochs(n) for n in loops] == [True, True, True, False, False, False]
    assert not m.iterates_epochs(m.functions["f"][0])


# ---------------------------------------------------------------------- checkpoints and precision


def _updates_in_optimizer_loops(src: str) -> list:
    m = model(src)
    out = []
    for trace in m.traces():
        for upd in trace.of(UPDATE):
            fact = m.updates.update_misplaced(trace, upd)
            out.append(None if fact is None else fact.place.value)
    return out


def test_an_update_in_a_loop_over_optimizers_unless_the_loop_picks_one():
    """`model.updates`: an update inside `for opt in optimizers:` runs once per optimizer;
    not when the loop's variable restricts the body to one optimizer (a GAN's alternating
    turns), however the test is written; a guard on something else does not restrict it."""
    loop = """
        def step(scaler, optimizers, loss, idx, debug):
            scaler.scale(loss).backward()
            for i, opt in enumerate(optimizers):
                {guard}
                scaler.step(opt)
                scaler.update()
        """
    assert _updates_in_optimizer_loops(loop.format(guard="pass")) == ["optimizer_loop"]
    assert _updates_in_optimizer_loops(loop.format(guard="if debug: continue")) == ["optimizer_loop"]
    assert _updates_in_optimizer_loops(loop.format(guard="if i == idx: continue")) == ["optimizer_loop"]
    for guard in ("if i != idx: continue", "if idx != i:\n                    continue",
                  "if idx is not None and i != idx: continue"):
        assert _updates_in_optimizer_loops(loop.format(guard=guard)) == [None], guard
    picked = """
        def step(scaler, optimizers, loss, turn):
            scaler.scale(loss).backward()
            for i, opt in enumerate(optimizers):
                if i == turn:
                    scaler.step(opt)
                    scaler.update()
        """
    assert _updates_in_optimizer_loops(picked) == [None]


def test_an_accelerator_that_may_prepare_an_optimizer():
    """`FrameworkFacts.may_prepare_optimizer`: what a file shows an Accelerator (or Fabric)
    hand over; an argument not known as a module, a loader or a scheduler may be an optimizer."""
    from ampfix.model.frameworks import frameworks

    def prepares(line: str) -> bool:
        m = model(f"""
            import torch
            from accelerate import Accelerator
            accelerator = Accelerator(mixed_precision="fp16")
            {line}
            """)
        facts = frameworks(m)
        fws = [f for c in m.calls if (f := facts.framework(c)) is not None]
        assert fws
        return facts.may_prepare_optimizer(fws)

    assert not prepares("model = accelerator.prepare(model)")
    assert not prepares("model, loader, sched = accelerator.prepare(model, train_loader, lr_scheduler)")
    assert prepares("model, opt = accelerator.prepare(model, torch.optim.SGD(model.parameters(), 0.1))")
    assert prepares("model, thing = accelerator.prepare(model, thing)")  # not known what it is
    assert prepares("opt = accelerator.prepare_optimizer(opt)")
    assert prepares("objs = accelerator.prepare(*objs)")


def test_saved_states_classify_their_entries():
    m = model("""
        import torch

        scaler = torch.amp.GradScaler("cuda")
        optimizer = torch.optim.SGD(params, lr=0.1)
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 3}, "ckpt.pt")
        """)
    (state,) = m.checkpoints.saved_states()
    assert state.keys == ["model", "optimizer", "epoch"] and len(state.optimizers) == 1 and not state.scaler_state


@pytest.mark.parametrize("expr, dtypes", [
    ("torch.float16", {"float16"}),
    ('{"bf16": torch.bfloat16, "fp16": torch.float16}[name]', {"bfloat16", "float16"}),
    ('getattr(torch, "bfloat16")', {"bfloat16"}),
    ('"bf16"', {"bfloat16"}),
])
def test_dtype_values(expr, dtypes):
    m = model(f"import torch\n\ndtype = {expr}\nuse(dtype)\n")
    assert m.precision.dtype_values(name_at(m, "use(dtype)")) == frozenset(dtypes)


def test_a_dtype_from_an_unknown_place_is_unknown():
    m = model("import torch\n\ndef f(cfg):\n    use(cfg.dtype)\n")
    assert m.precision.dtype_values(name_at(m, "use(cfg.dtype)")) is None


def test_command_line_options_hold_their_default_and_choices_or_anything():
    m = model("""
        import argparse

        parser = argparse.ArgumentParser()
        parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
        parser.add_argument("--name", default="run")
        parser.add_argument("--amp", action="store_true")
        args = parser.parse_args()
        use(args.dtype, args.name, args.amp)
        """)
    call = call_named(m, "use(args.dtype, args.name, args.amp)")
    assert m.precision.dtype_values(call.args[0].value) == frozenset({"bfloat16", "float16"})
    assert any(m.is_synthetic(v) for v in m.possible_values(call.args[1].value))  # anything the user passes
    assert sorted(m.code(v) for v in m.possible_values(call.args[2].value)) == ["False", "True"]


def test_a_scaler_disabled_by_position_is_disabled():
    m = model("""
        import torch

        new = torch.amp.GradScaler("cuda", 65536.0, 2.0, 0.5, 2000, False)
        old = torch.cuda.amp.GradScaler(65536.0, 2.0, 0.5, 2000, False)
        on = torch.amp.GradScaler("cuda", 65536.0, 2.0, 0.5, 2000)
        new.update()
        old.update()
        on.update()
        """)
    for name, disabled in (("new", True), ("old", True), ("on", False)):
        assert m.scaler_disabled(call_named(m, f"{name}.update()").func.value) is disabled, name


def test_a_scaler_that_cannot_be_off():
    m = model("""
        import torch

        on = torch.amp.GradScaler("cuda")
        forced = torch.amp.GradScaler("cuda", enabled=True)
        flag = torch.amp.GradScaler("cuda", enabled=use_amp)
        positional = torch.cuda.amp.GradScaler(65536.0, 2.0, 0.5, 2000, False)
        either = torch.amp.GradScaler("cuda")
        if resume:
            either = None

        def train(passed):
            passed.update()
        """)
    for key, enabled in (("on", True), ("forced", True), ("flag", False), ("positional", False),
                         ("either", False), ("passed", False), (None, False)):
        assert m.scaler_always_enabled(key) is enabled, key


def test_a_scaler_is_judged_by_the_assignments_its_trace_sees():
    m = model("""
        import torch

        class Reference:
            def __init__(self):
                self.scaler = torch.amp.GradScaler("cuda", enabled=False)

            def step(self):
                self.scaler.update()

        class Mixed:
            def __init__(self):
                self.scaler = torch.amp.GradScaler("cuda")

            def step(self):
                self.scaler.update()

        def off():
            scaler = torch.amp.GradScaler("cuda", enabled=False)
            scaler.update()

        def on():
            scaler = torch.amp.GradScaler("cuda")
            scaler.update()

        def passed(scaler):
            scaler.update()
        """)
    roots = {}
    for f in m.nodes_of(cst.FunctionDef):
        cls = m.class_of(f)
        roots[(cls.name.value + "." if cls is not None else "") + f.name.value] = f
    for root, key, disabled, enabled in (("Reference.step", "self.scaler", True, False),
                                         ("Mixed.step", "self.scaler", False, True),
                                         ("off", "scaler", True, False), ("on", "scaler", False, True),
                                         # a parameter: what callers pass, every `scaler` of the file
                                         ("passed", "scaler", False, False)):
        assert m.scaler_always_disabled(key, roots[root]) is disabled, root
        assert m.scaler_always_enabled(key, roots[root]) is enabled, root
    # without a root, the file's every assignment to the key: neither
    assert not m.scaler_always_disabled("scaler") and not m.scaler_always_enabled("scaler")


def test_the_scaled_backward_whose_gradients_an_event_sees():
    m = model("""
        import torch

        def on(model, opt, loss):
            scaler = torch.amp.GradScaler("cuda")
            scaler.scale(loss).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)

        def off(model, opt, loss):
            scaler = torch.amp.GradScaler("cuda", enabled=False)
            scaler.scale(loss).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)

        def plain(model, opt, loss):
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        """)
    for name, found in (("on", True), ("off", False), ("plain", False)):
        trace = next(t for t in m.traces() if getattr(t.root, "name", None) is not None and t.root.name.value == name)
        clip = next(e for e in trace.events if e.kind == GRAD_READ)
        bw = m.scaled_backward_before(trace, clip)
        assert (bw is not None) is found, name
        assert bw is None or (bw.kind == BACKWARD and bw.scaler == "scaler")


def test_replacing_non_finite_gradients_in_place():
    m = model("""
        import torch

        def f(model, scaler, loss):
            scaler.scale(loss).backward()
            for p in model.parameters():
                p.grad.nan_to_num_()
                p.grad.masked_fill_(torch.isnan(p.grad), 0)
                p.grad.masked_fill_(p.grad > 1, 1)
                torch.nan_to_num(p.grad, out=p.grad)
                p.grad = torch.nan_to_num(p.grad, nan=0.0)
                p.grad[torch.isnan(p.grad)] = 0.0
                p.grad[~torch.isfinite(p.grad)] = 0.0
                bad = torch.isnan(p.grad).any()
                fresh = torch.nan_to_num(p.grad)
        """)
    trace = next(t for t in m.traces() if getattr(t.root, "name", None) is not None and t.root.name.value == "f")
    assert [m.code(e.node) for e in trace.of(GRAD_SANITIZE)] == [
        "p.grad.nan_to_num_()", "p.grad.masked_fill_(torch.isnan(p.grad), 0)", "torch.nan_to_num(p.grad, out=p.grad)",
        "torch.nan_to_num(p.grad, nan=0.0)", "torch.isnan(p.grad)", "torch.isfinite(p.grad)"]
    # the mask handed to `masked_fill_` and a test that only reads (`.any()`) are reads; a copy that is not
    # written back (`fresh`) and a fill by another test replace nothing
    assert [m.code(e.node) for e in trace.of(GRAD_READ)] == ["torch.isnan(p.grad)", "torch.isnan(p.grad)"]


def test_the_flag_a_scaler_is_switched_by():
    m = model("""
        import torch

        AMP = True
        shared = torch.amp.GradScaler("cuda", enabled=AMP)

        class Trainer:
            def __init__(self, args, use_amp):
                self.use_amp = args.amp
                self.scaler = torch.amp.GradScaler("cuda", enabled=self.use_amp)
                self.local = torch.amp.GradScaler("cuda", enabled=use_amp)

            def step(self):
                self.scaler.update()
                self.local.update()

        def train(use_amp, args):
            scaler = torch.amp.GradScaler("cuda", enabled=use_amp)
            other = torch.amp.GradScaler("cuda", enabled=args.amp)
            plain = torch.amp.GradScaler("cuda")
            scaler.update()

        def rebound(use_amp):
            scaler = torch.amp.GradScaler("cuda", enabled=use_amp)
            use_amp = False
            scaler.update()

        def uses_shared(x):
            shared.update()

        def shadows(AMP):
            shared.update()
        """)
    roots = {}
    for f in m.nodes_of(cst.FunctionDef):
        cls = m.class_of(f)
        roots[(cls.name.value + "." if cls is not None else "") + f.name.value] = f
    for root, key, flag in (("Trainer.step", "self.scaler", "self.use_amp"),
                            ("Trainer.step", "self.local", None),  # `__init__`'s parameter, not the method's names
                            ("train", "scaler", "use_amp"), ("train", "other", "args.amp"),
                            ("train", "plain", None),  # always on: no flag
                            ("rebound", "scaler", None),  # the flag is rebound after the scaler is built
                            ("uses_shared", "shared", "AMP"),
                            ("shadows", "shared", None)):  # a parameter hides the module's flag
        assert m.scaler_enabled_flag(key, roots[root]) == flag, (root, key)
    assert m.scaler_enabled_flag("scaler") is None  # without a root: not known


def test_a_finiteness_test_of_scaled_gradients_decides_nothing_the_scale_changes():
    m = model("""
        import math
        import torch

        def step(model, scaler, loss, opt):
            scaler.scale(loss).backward()
            if not torch.isfinite(model.w.grad).all():
                pass
            if model.w.grad.isnan().any():
                pass
            if model.w.grad.norm() > 10.0:
                pass
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
            if not math.isfinite(gn.item()):
                pass
            total = torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf)
            if total > 10.0:
                pass
            clipped = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        """)
    df = m.dataflow
    assert not df.feeds_decision(call_named(m, "torch.isfinite(model.w.grad)"))
    assert not df.feeds_decision(call_named(m, "model.w.grad.isnan()"))
    assert df.feeds_decision(call_named(m, "model.w.grad.norm()"))
    inf_clip = call_named(m, 'torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))')
    math_clip = call_named(m, "torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf)")
    real_clip = call_named(m, "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)")
    assert df.measures_only(inf_clip) and df.measures_only(math_clip) and not df.measures_only(real_clip)
    assert not df.feeds_decision(inf_clip)  # only `math.isfinite` reads the norm
    assert df.feeds_decision(math_clip)  # compared with a threshold: scaled, it is 65536x too large


# ---------------------------------------------------------------------- apex outside apex.amp


def apex_roles(m: AmpModel) -> list:
    return [(m.code(u.node), u.role.value) for u in m.apex.uses()]


def test_apex_uses_are_built_type_checked_or_only_named_for_compatibility():
    from ampfix.model import ApexRole

    m = model("""
        import apex
        from apex import amp
        from apex.parallel import DistributedDataParallel as DDP, SyncBatchNorm
        from apex.optimizers import FusedAdam, FusedLAMB

        model = DDP(net)
        opt = FusedLAMB(model.parameters())
        if isinstance(model, DDP):
            model = model.module
        if isinstance(m, SyncBatchNorm):  # built elsewhere: compatibility
            pass
        LEAVES = (SyncBatchNorm, FusedAdam)
        print(apex.__file__)
        model, opt = amp.initialize(model, opt)
        """)
    assert apex_roles(m) == [
        ("apex.__file__", "no_torch"),  # in the order of the imports, then of the text
        ("DDP", "build"), ("DDP", "type"),  # the isinstance check of a class the file builds
        ("SyncBatchNorm", "compatibility"), ("SyncBatchNorm", "compatibility"),  # built elsewhere
        ("FusedAdam", "compatibility"),  # a type tuple
        ("FusedLAMB", "no_torch")]
    assert [u.reported for u in m.apex.uses()] == [False, True, True, False, False, False, False]
    built = m.apex.uses()[1]
    assert built.role is ApexRole.BUILD and built.qualified == "apex.parallel.DistributedDataParallel"
    assert m.code(built.shown) == "DDP(net)" and not built.ambiguous and not built.flagged
    assert {b.name for b in m.apex.bindings()} == {"apex", "DDP", "SyncBatchNorm", "FusedAdam", "FusedLAMB"}


def test_an_apex_class_bound_to_a_called_name_or_wrapped_thinly_is_built_here():
    from ampfix.model import ApexRole

    m = model("""
        import torch
        from apex.normalization import FusedLayerNorm, FusedRMSNorm
        from apex.optimizers import FusedAdam

        LayerNorm = FusedLayerNorm if torch.cuda.is_available() else torch.nn.LayerNorm
        norm = LayerNorm(8)

        class Norm(FusedRMSNorm):
            def forward(self, x):
                return super().forward(x)

        class AdamV2(FusedAdam):  # extends apex's internals: not a migration
            def step(self):
                return self._dummy_overflow_buf

        layer = Norm(8)
        opt = AdamV2(params)
        """)
    assert apex_roles(m) == [("FusedLayerNorm", ApexRole.REBOUND.value), ("FusedRMSNorm", ApexRole.WRAPPED.value),
                             ("FusedAdam", ApexRole.COMPATIBILITY.value)]
    assert m.apex.thin_wrapper(next(c for c in m.nodes_of(cst.ClassDef) if c.name.value == "Norm"))
    assert not m.apex.thin_wrapper(next(c for c in m.nodes_of(cst.ClassDef) if c.name.value == "AdamV2"))


def test_apex_optimizer_factories_are_alternatives_of_one_function():
    m = model("""
        from apex.optimizers import FusedAdam, FusedSGD

        def build(name, params):
            if name == "adam":
                return FusedAdam(params)
            if name == "sgd":
                return FusedSGD(params, 0.1)
            raise ValueError(name)

        def both(params):
            return FusedAdam(params), FusedSGD(params, 0.1)
        """)
    groups = m.apex.factories()
    assert [[m.code(u.shown) for u in g] for g in groups] == [["FusedAdam(params)", "FusedSGD(params, 0.1)"]]
    a, b = (call_named(m, t) for t in ("FusedAdam(params)", "FusedSGD(params, 0.1)"))
    assert m.apex.alternatives(a, b) and m.apex.alternatives(b, a)


def test_apex_optional_imports_with_their_torch_fallback():
    m = model("""
        import torch

        try:
            from apex.normalization import FusedLayerNorm as LayerNorm
        except ImportError:
            LayerNorm = torch.nn.LayerNorm

        try:
            from apex.parallel import SyncBatchNorm
        except ImportError:
            SyncBatchNorm = MySyncBN

        norm = LayerNorm(8, memory_efficient=True)
        bn = SyncBatchNorm(8)
        """)
    first, second = m.apex.optional_imports()
    assert [b.name for b in first.bindings] == ["LayerNorm"] and first.blocker is None
    assert [(m.code(c), [m.code(a) for a in args]) for c, args in first.calls.items()] == [
        ("LayerNorm(8, memory_efficient=True)", ["8,"])]  # memory_efficient goes
    assert m.apex.fallback_targets(first.node) == {"LayerNorm": "torch.nn.LayerNorm"}
    assert m.apex.fallback_targets(second.node) == {"SyncBatchNorm": "?"}  # code of its own
    assert second.blocker is not None and "binds `SyncBatchNorm` to code of its own" in second.blocker
    assert m.apex.uses() == []  # each is handled with its `try:`


def test_apex_imports_next_to_a_flag_star_imports_and_unused_imports():
    m = model("""
        from __future__ import annotations
        import os
        from apex.parallel import *
        from apex.contrib import *
        import apex

        try:
            from apex.parallel import DistributedDataParallel as DDP
            HAS_APEX = True
        except ImportError:
            HAS_APEX = False

        model = DDP(net)
        """)
    (use,) = m.apex.uses()
    assert use.flagged and m.apex.sets_flag(use.binding.stmt)
    tr = m.apex.import_try(use.binding.stmt)
    assert tr is not None and m.apex.try_body_of(use.binding.stmt) is tr
    assert not m.apex.imports_only(tr, {id(use.binding.alias)})
    assert [m.code(n) for n in m.apex.except_names_used(tr)] == []
    assert [mod for _, mod in m.apex.star_imports()] == ["apex.parallel"]  # apex.contrib: nothing torch replaces
    assert [b.name for b in m.apex.unused_imports()] == ["apex"]
    assert m.apex.imports_in_use() == {("apex.parallel.DistributedDataParallel", "DDP")}
    assert m.code(m.apex.first_import()).strip() == "import os"


def test_apex_imports_the_migration_left_unused():
    m = model("""
        import torch
        from apex.parallel import DistributedDataParallel as DDP
        from apex.parallel import SyncBatchNorm

        try:
            from apex.normalization import FusedLayerNorm
        except ImportError:
            pass

        try:
            from apex.optimizers import FusedAdam
        except ImportError:
            HAVE_APEX = False

        if HAVE_APEX:
            print("fused")
        """)
    before = {("apex.parallel.DistributedDataParallel", "DDP"), ("apex.normalization.FusedLayerNorm", "FusedLayerNorm"),
              ("apex.optimizers.FusedAdam", "FusedAdam")}  # SyncBatchNorm was unused already: a probe
    left = m.apex.leftover_imports(before)
    assert [([b.name for b in x.bindings], x.node is not None, x.removable) for x in left] == [
        (["DDP"], False, True), (["FusedLayerNorm"], True, True), (["FusedAdam"], True, False)]
    assert left[2].kept_by is not None and m.line(left[2].kept_by) == 16  # `if HAVE_APEX:`


# ---------------------------------------------------------------------- DataParallel replicas and threads


def test_dataparallel_forwards_and_the_module_they_replicate():
    m = model("""
        import torch.nn as nn
        from torch.nn.parallel import parallel_apply

        class Net(nn.Module):
            def forward(self, x):
                return x

        class MyDP(nn.DataParallel):
            pass

        dp = nn.DataParallel(Net()).cuda()
        sub = MyDP(module=Net())
        bare = nn.DataParallel()
        plain = Net()
        a = dp(x)
        b = dp.forward(x)
        c = sub(x)
        d = plain(x)
        e = parallel_apply(replicas, inputs)
        f = nn.parallel.data_parallel(plain, x)
    """)
    kinds = {text: m.parallel.forward_kind(call_named(m, text))
             for text in ("dp(x)", "dp.forward(x)", "sub(x)", "plain(x)", "parallel_apply(replicas, inputs)",
                          "nn.parallel.data_parallel(plain, x)")}
    assert kinds == {"dp(x)": "DataParallel", "dp.forward(x)": "DataParallel", "sub(x)": "DataParallel",
                     "plain(x)": None, "parallel_apply(replicas, inputs)": "parallel_apply",
                     "nn.parallel.data_parallel(plain, x)": "data_parallel"}
    wrapped = {text: m.parallel.dataparallel_module(call_named(m, text).func)
               for text in ("dp(x)", "sub(x)", "plain(x)")}
    assert m.code(wrapped["dp(x)"]) == "Net()" and m.code(wrapped["sub(x)"]) == "Net()"
    assert wrapped["plain(x)"] is None
    bare = next(n for n in m.nodes_of(cst.Name) if n.value == "bare")
    assert m.code(m.parallel.dataparallel_module(bare)) == "nn.DataParallel()"  # no module given: the call


def test_what_a_thread_runs_and_whether_it_opens_its_own_region():
    m = model("""
        import threading
        from concurrent.futures import ThreadPoolExecutor
        import torch
        import torchvision

        def work():
            with torch.autocast("cuda"):
                run()

        def plain():
            with open("log") as f:
                run()

        @torch.autocast("cuda", dtype=torch.bfloat16)
        def decorated():
            run()

        def disabled():
            with torch.autocast("cuda", enabled=False):
                run()

        t = threading.Thread(target=work)
        pool = ThreadPoolExecutor(2)
        f = pool.submit(plain, 1)
        g = other.submit(plain)
        net = torchvision.models.resnet50().cuda()
        mine = Net()
    """)
    assert m.code(m.parallel.thread_target(call_named(m, "threading.Thread(target=work)"))) == "work"
    assert m.code(m.parallel.thread_target(call_named(m, "pool.submit(plain, 1)"))) == "plain"
    assert m.parallel.thread_target(call_named(m, "other.submit(plain)")) is None  # not a thread pool
    assert m.parallel.thread_target(call_named(m, "Net()")) is None
    enables = {f.name.value: m.parallel.function_enables_autocast(f) for f in m.nodes_of(cst.FunctionDef)}
    assert enables == {"work": True, "plain": False, "decorated": True, "disabled": False}
    net, mine = (next(n for n in m.nodes_of(cst.Name) if n.value == name) for name in ("net", "mine"))
    assert m.parallel.library_module(net, ("torchvision.", "timm."))
    assert not m.parallel.library_module(net, ("timm.",))
    assert not m.parallel.library_module(mine, ("torchvision.",)) and not m.parallel.library_module(None, ("torch.",))


# ---------------------------------------------------------------------- custom autograd Functions


def test_custom_autograd_functions_and_their_amp_decorators():
    m = model("""
        import torch
        from torch.cuda.amp import custom_fwd, custom_bwd

        class Good(torch.autograd.Function):
            @staticmethod
            @custom_fwd(cast_inputs=torch.float32)
            def forward(ctx, x):
                return x

            @staticmethod
            @custom_bwd
            def backward(ctx, g):
                return g

        class Swapped(torch.autograd.Function):
            @staticmethod
            @torch.amp.custom_fwd(device_type="cuda")
            def forward(ctx, x):
                return x

            @staticmethod
            @torch.amp.custom_fwd(device_type="cuda")
            def backward(ctx, g):
                return g

        class ForwardOnly(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x

        class Net(torch.nn.Module):
            @torch.autocast("cuda")
            def forward(self, x):
                return x
    """)
    assert [c.name.value for c in m.autograd.functions()] == ["Good", "Swapped", "ForwardOnly"]
    assert [c.name.value for c in m.autograd.functions_without_custom_bwd()] == ["Swapped"]
    good, swapped, _, net = m.nodes_of(cst.ClassDef)
    assert m.autograd.decorator_kinds(m.method(good, "forward")) == ["custom_fwd"]  # staticmethod is no torch API
    assert m.autograd.decorator_kinds(m.method(net, "forward")) == ["autocast"]
    assert m.autograd.decorator_of(m.method(good, "backward"), "custom_fwd") is None
    assert m.code(m.autograd.decorator_of(m.method(good, "backward"), "custom_bwd").decorator) == "custom_bwd"
    wrong = m.autograd.decorator_of(m.method(swapped, "backward"), "custom_fwd")
    assert m.code(wrong.decorator) == 'torch.amp.custom_fwd(device_type="cuda")'


def test_rules_ask_the_model_and_keep_nothing_on_it():
    """A rule reads the model's public facts: it sets no attribute on it, reads none of its
    private names, and imports no other rule's private function (a fact two rules need
    belongs to the model)."""
    import ast
    from pathlib import Path

    found = []
    for path in sorted((Path(__file__).resolve().parent.parent / "rules").glob("amp*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in ("model", "ctx") and node.attr.startswith("_"):
                found.append(f"{path.name}:{node.lineno}: {node.value.id}.{node.attr}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr") \
                    and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "model":
                found.append(f"{path.name}:{node.lineno}: {node.func.id}(model, ...)")
            if isinstance(node, ast.ImportFrom) and node.module and ".amp" in f".{node.module}":
                private = [a.name for a in node.names if a.name.startswith("_")]
                if private and node.module.rpartition(".")[2] != path.stem:
                    found.append(f"{path.name}:{node.lineno}: from {node.module} import {', '.join(private)}")
    assert not found, "\n".join(found)


def test_the_core_model_shows_only_what_is_asked_of_it():
    """The core model's public names are its query surface: each is asked by a rule, the
    engine, the project layer, a migration, a front end or a model-fact test; an internal step
    of a query is private. Facts that few rules ask live in facets (`model.precision`, ...),
    so their names stay out of the core's."""
    import functools
    import re
    from pathlib import Path

    from ampfix.model import AmpModel

    top = Path(__file__).resolve().parent.parent
    model_dir = top / "ampfix" / "model"
    texts = [p.read_text(encoding="utf-8") for folder in (top / "rules", top / "ampfix", top / "tests")
             for p in folder.rglob("*.py") if model_dir not in p.parents]
    facets = [n for n in dir(AmpModel) if isinstance(getattr(AmpModel, n), functools.cached_property)]
    assert {"precision", "dataflow", "checkpoints", "updates", "training", "apex", "bound", "guards",
            "parallel", "autograd"} <= set(facets)
    unasked = [n for n in dir(AmpModel) if not n.startswith("_") and n not in facets
               and not any(re.search(r"\.%s\b" % n, t) for t in texts)]
    assert unasked == [], "public names of the model nothing outside it asks (make them private): %s" % unasked


def test_a_traces_groups_are_the_same_asked_one_by_one_or_all_at_once():
    # `Trace.members` / `single_branch` find a few groups by a scan each, and index all of them
    # once more are asked: both give each group's events in order and its branches (an
    # unhashable branch value counts as one more)
    from ampfix.model.events import Event, Trace, TraceEvent, _FEW_GROUPS

    node = cst.Name("x")
    groups = [("cond", None, f"c{i}", ()) for i in range(_FEW_GROUPS + 8)]

    def trace() -> Trace:
        t = Trace(node)
        for i in range(200):
            ctx = {g: (i % (j + 2) == 0 or j % 5 == 2) for j, g in enumerate(groups) if (i + j) % 3}
            if i % 7 == 0:
                ctx[groups[1]] = [i]  # unhashable
            t.events.append(TraceEvent(Event(BACKWARD, node), (node,), i, ctx, None))
        return t

    one_by_one, all_at_once = [], trace()
    for g in groups:  # a fresh trace each: never more than one group asked
        t = trace()
        one_by_one.append(([e.order for e in t.members(g)], t.single_branch(g)))
    asked = [([e.order for e in all_at_once.members(g)], all_at_once.single_branch(g)) for g in groups]
    assert asked == one_by_one
    expected = [[i for i, e in enumerate(all_at_once.events) if g in e.ctx] for g in groups]
    assert [m for m, _ in asked] == expected
    assert asked[2][1] and asked[37][1] and not asked[0][1] and not asked[1][1]
    assert all_at_once.members(("cond", None, "none", ())) == []
    assert all_at_once.single_branch(("cond", None, "none", ()))
    all_at_once.events.append(TraceEvent(Event(BACKWARD, node), (node,), 200, {groups[0]: True}, None))
    assert all_at_once.members(groups[0])[-1].order == 200  # asked again once events were added


# ---------------------------------------------------------------------- regions: the other items of a `with`


def test_items_outside_region_are_what_stays_entered():
    m = model("""
        import torch
        from accelerate import Accelerator

        accelerator = Accelerator(mixed_precision="fp16")

        def step(model, x, context, lock):
            with accelerator.autocast(), context():
                loss = model(x)
            with lock, torch.autocast("cuda", dtype=torch.float16), torch.no_grad():
                model(x)
            amp = torch.autocast("cuda")
            with amp:
                model(x)
    """)
    withs = m.nodes_of(cst.With)
    assert [[m.code(i.item) for i in m.items_outside_region(w)] for w in withs] == \
        [["context()"], ["lock", "torch.no_grad()"], []]


def test_backward_in_a_shared_with_names_the_other_context():
    """lucidrains' trainers (voicebox-pytorch, magvit2-pytorch): `with self.accelerator.autocast(),
    context():` holds `accelerator.backward(loss)`; DDP's `no_sync()` (`context`) must stay around
    the backward, so the message asks for the autocast alone to be taken out."""
    from ampfix.api import check_source

    src = textwrap.dedent("""
        import torch

        def step(model, x, optimizer, context):
            with torch.autocast("cuda"), context():
                loss = model(x).sum()
                loss.backward()
            optimizer.step()
    """)
    [d] = [d for d in check_source(src, select=["AMP001"])]
    assert "the `with` on line 5 also enters `context()`: give the autocast a `with` of its own" in d.message
    plain = src.replace(', context():', ':')
    [d] = check_source(plain, select=["AMP001"])
    assert "leave the `with` block first" in d.message


# ---------------------------------------------------------------------- objects: a scaler of another framework


def test_an_object_used_like_a_gradscaler_is_not_torchs_in_a_paddle_file():
    """fastNLP's paddle driver: `self.grad_scaler.scale(loss).backward()`, `.step(opt)`,
    `.update()` on paddle's GradScaler. Duck typing takes such an object for torch's scaler only
    where the file imports no other framework copying torch's AMP API."""
    src = """
        {imports}
        class Driver:
            def __init__(self, make):
                self.grad_scaler = make()

            def backward(self, loss):
                self.grad_scaler.scale(loss).backward()

            def step(self, optimizer):
                self.grad_scaler.step(optimizer)
                self.grad_scaler.update()
    """
    plain = model(src.format(imports="import torch"))
    assert plain.other_frameworks() == set() and "self.grad_scaler" in plain.scalers
    paddle = model(src.format(imports="import torch; from paddle.amp import GradScaler"))
    assert paddle.other_frameworks() == {"paddle"} and "self.grad_scaler" not in paddle.scalers


def test_clip_not_fixed_names_the_exit_of_the_clipping_function_not_a_helpers():
    """tez 0.7.2's `train_one_step`: with gradient accumulation the function returns (its last
    line) without `scaler.update()` on micro-batches; a helper it calls after the update
    (`name_to_metric`) has early `return`s of its own, which go back to the step, not out of it.
    AMP003's "not fixed" reason names the step's own exit."""
    from ampfix.api import check_source

    src = textwrap.dedent("""
        import torch

        class Model(torch.nn.Module):
            def __init__(self, optimizer, scheduler):
                super().__init__()
                self.optimizer, self.scheduler = optimizer, scheduler
                self.scaler = torch.amp.GradScaler("cuda")

            def name_to_metric(self, name):
                if name == "epoch":
                    return self.epoch
                return self.metrics[name]

            def train_one_step(self, data):
                loss = self.model_fn(data) / self.accumulation_steps
                self.scaler.scale(loss).backward()
                torch.nn.utils.clip_grad_norm_(self.parameters(), 1.0)
                if (self.batch_index + 1) % self.accumulation_steps == 0:
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
                    self.scheduler.step(self.name_to_metric("loss"))
                return loss

            def fit(self, loader):
                for self.batch_index, data in enumerate(loader):
                    self.train_one_step(data)
    """)
    [d] = check_source(src, select=["AMP003"], preview=True)  # a preview rule
    last = src.splitlines().index("        return loss") + 1
    assert f"the `return` on line {last} leaves without `scaler.update()`" in d.message, d.message


def test_the_import_a_name_reads_where_several_bind_it():
    """A version shim binds one name by two imports in its branches; a use reads the one before
    it in its own block (or a block around it). Where a loop, a `try` or a nested function could
    have run the other, both stay possible."""
    m = model("""
        import torch

        def shim(**kwargs):
            if torch.__version__ < "2.4":
                from torch.cuda.amp import autocast
                return autocast(**kwargs)
            else:
                from torch.amp import autocast
                return autocast("cuda", **kwargs)

        def fallback():
            try:
                from torch.amp import GradScaler
            except ImportError:
                from torch.cuda.amp import GradScaler
            return GradScaler()

        def in_sequence():
            from torch.cuda.amp import autocast
            from torch.amp import autocast
            return autocast("cuda")

        def looped(batches):
            from torch.amp import autocast
            for b in batches:
                autocast("cuda")
                from torch.cuda.amp import autocast

        def later():
            from torch.amp import autocast
            def inner():
                return autocast("cuda")
            from torch.cuda.amp import autocast
            return inner
        """)
    calls = [c for c in m.calls if m.code(c.func) in ("autocast", "GradScaler")]
    found = [sorted(m.qualnames(c)) for c in calls]
    assert found == [
        ["torch.cuda.amp.autocast"],  # the if branch's own import
        ["torch.amp.autocast"],  # the else branch's
        ["torch.amp.GradScaler", "torch.cuda.amp.GradScaler"],  # the try body may have run either way
        ["torch.amp.autocast"],  # the last of two in sequence
        ["torch.amp.autocast", "torch.cuda.amp.autocast"],  # the loop's next pass rebinds it
        ["torch.amp.autocast", "torch.cuda.amp.autocast"],  # a nested function runs later
    ]


def test_a_parameter_passed_back_to_its_own_function_holds_what_its_callers_pass():
    """fastestimator's `_trace_value(inp, tables)` calls itself 25 times with its own `tables`:
    following each of those back into the function again, six levels deep, took minutes. A
    name whose values are being followed already adds nothing."""
    calls = "\n".join(f"                trace(inp[{i}], tables)" for i in range(12))
    m = model(f"""
        def trace(inp, tables):
            if isinstance(inp, list):
{calls}
            tables.update(inp)

        trace([1, 2], {{}})
        trace([3], dict(a=1))
        """)
    update = call_named(m, "tables.update(inp)")
    assert [m.code(v) for v in m.possible_values(update.func.value)] == ["{}", "dict(a=1)"]


# ---------------------------------------------------------------------- bindings


def test_binding_counts_every_form_of_binding():
    """`readwrite.binding_counts`: every way a function's body binds a name, nested code
    included, counted once per binding (dispatched by node type since the twenty-ninth session:
    the same counts as the `isinstance` chain it replaced)."""
    from ampfix.model.readwrite import binding_counts

    module = cst.parse_module(textwrap.dedent("""
        def train(model, *args, scaler=None, **kw):
            a = b = 1
            (c, [d, *e]) = 2, [3, 4]
            a += 1
            f: int = 0
            for g in range(3):
                pass
            h = [i for i in range(3) if (j := i)]
            del f
            with open("x") as k, open("y") as (l, m):
                pass
            try:
                pass
            except ValueError as n:
                pass
            global o
            nonlocal_holder = lambda p, *q, r=1: p
            import os.path as s, sys
            from torch import amp as t, nn
            def u(v):
                nonlocal a
            class W:
                x = 1
            match model:
                case {"k": y, **z}:
                    pass
                case [aa, *bb]:
                    pass
                case cc if cc:
                    pass
            scaler = scaler or None
        """))
    func = module.body[0]
    counts = binding_counts(func, {})
    assert counts == {
        "a": 3, "b": 1, "c": 1, "d": 1, "e": 1, "f": 2, "g": 1, "h": 1, "i": 1, "j": 1, "k": 1, "l": 1, "m": 1,
        # an alias is counted as a name bound by its `as` and by its import (over-counted on purpose)
        "n": 1, "o": 1, "nonlocal_holder": 1, "p": 1, "q": 1, "r": 1, "s": 2, "sys": 1, "t": 2, "nn": 1,
        "u": 1, "v": 1, "W": 1, "x": 1, "y": 1, "z": 1, "aa": 1, "bb": 1, "cc": 1, "scaler": 1,
    }
    memo: dict = {}
    first = binding_counts(func, memo)
    assert memo[func] is first and binding_counts(func, memo) is first
