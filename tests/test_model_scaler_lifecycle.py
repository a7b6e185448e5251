"""The model's facts of a GradScaler's life cycle, each asked on its own: the update a step
leaves its iteration without, where that update goes, the calls that run twice on one optimizer
before it, an update before the iteration's step (`model.updates`, AMP009's facts); the scaler
calls that move under an accumulation boundary (AMP010's); where a scaler built in every
iteration or step can be built once (`model.construction`, AMP006's); and the edits that do it."""


import libcst as cst

from ampfix.model import AmpModel
from ampfix.engine.analyze import _ApplyFixes
from ampfix.fixes.edits import build_in_init, hoist_or_drop, insert_method_call_after
from ampfix.model.construction import assigned_target, calls_in_args, hoist_site, init_home
from ampfix.model.events import SCALER_NEW, SCALER_STEP, UNSCALE, UPDATE
from ampfix.model.updates import RAISES
from conftest import model


def applied(m: AmpModel, edit) -> str:
    """The file's text with the replacements `edit` applied, as the engine applies a fix's."""
    return m.module.visit(_ApplyFixes({id(k): v for k, v in edit.items()})).code


def trace_of(m: AmpModel, name: str):
    """The trace of the function `name` (of the module for "")."""
    if not name:
        return next(t for t in m.traces() if isinstance(t.root, cst.Module))
    return next(t for t in m.traces() if getattr(t.root, "name", None) is not None and t.root.name.value == name)


# ---------------------------------------------------------------------- a step without an update


def test_missing_update_of_a_step_with_none_in_its_loop():
    m = model("""
        import torch

        def f(loader, model, opt):
            scaler = torch.amp.GradScaler("cuda")
            for x in loader:
                scaler.scale(model(x)).backward()
                scaler.step(opt)
                opt.zero_grad()
        """)
    trace = trace_of(m, "f")
    [step] = trace.of(SCALER_STEP)
    missing = m.updates.missing_update(trace, step, [])
    assert missing is not None and missing.event is step and missing.updates == () and missing.later is None
    assert missing.group == m.iteration_of(trace, step) and missing.end.kind == "end"
    site = m.updates.update_site(trace, step, missing.group)
    assert m.code(site).strip() == "scaler.step(opt)"


def test_missing_update_none_when_every_path_updates():
    m = model("""
        import torch

        def f(loader, model, opt):
            scaler = torch.amp.GradScaler("cuda")
            for x in loader:
                scaler.scale(model(x)).backward()
                scaler.unscale_(opt)
                scaler.step(opt)
                scaler.update()
        """)
    trace = trace_of(m, "f")
    assert all(m.updates.missing_update(trace, e, []) is None for e in trace.of(SCALER_STEP, UNSCALE))
    assert m.updates.misplaced_updates(trace) == []


def test_missing_update_on_some_paths_names_the_updates():
    m = model("""
        import torch

        def f(loader, model, opt, flag):
            scaler = torch.amp.GradScaler("cuda")
            for x in loader:
                scaler.scale(model(x)).backward()
                scaler.step(opt)
                if flag:
                    scaler.update()
        """)
    trace = trace_of(m, "f")
    [step], [upd] = trace.of(SCALER_STEP), trace.of(UPDATE)
    missing = m.updates.missing_update(trace, step, [])
    assert missing is not None and missing.updates == (upd,) and missing.later is None


def test_missing_update_once_per_epoch_is_the_later_update():
    m = model("""
        import torch

        def f(epochs, loader, model, opt):
            scaler = torch.amp.GradScaler("cuda")
            for epoch in range(epochs):
                for x in loader:
                    scaler.scale(model(x)).backward()
                    scaler.step(opt)
                scaler.update()
        """)
    trace = trace_of(m, "f")
    [step], [upd] = trace.of(SCALER_STEP), trace.of(UPDATE)
    missing = m.updates.missing_update(trace, step, [])
    assert missing is not None and missing.later is upd and missing.updates == ()


def test_missing_update_left_to_a_misplaced_update_it_may_reach():
    m = model("""
        import torch

        def f(loader, model, opts):
            scaler = torch.amp.GradScaler("cuda")
            for x in loader:
                scaler.scale(model(x)).backward()
                for opt in opts:
                    scaler.step(opt)
                    scaler.update()
        """)
    trace = trace_of(m, "f")
    theirs = m.updates.misplaced_updates(trace)
    assert theirs == trace.of(UPDATE)
    [step] = trace.of(SCALER_STEP)
    assert m.updates.missing_update(trace, step, theirs) is None


def test_missing_update_of_a_step_method_left_to_what_else_updates_its_scaler():
    src = """
        import torch

        class Trainer:
            def __init__(self, opt):
                self.opt = opt
                self.scaler = torch.amp.GradScaler("cuda")

            def train_step(self, loss):
                self.scaler.scale(loss).backward()
                self.scaler.step(self.opt)
        """
    alone = model(src)
    trace = trace_of(alone, "train_step")
    [step] = trace.of(SCALER_STEP)
    missing = alone.updates.missing_update(trace, step, [])
    assert missing is not None and missing.group is None and missing.end.kind == "end"
    elsewhere = model(src + """
            def after_step(self):
                self.scaler.update()
        """)
    trace = trace_of(elsewhere, "train_step")
    assert elsewhere.updates.missing_update(trace, trace.of(SCALER_STEP)[0], []) is None


def test_update_site_out_of_the_loop_over_optimizers():
    m = model("""
        import torch

        def f(loader, model, opts):
            scaler = torch.amp.GradScaler("cuda")
            for x in loader:
                scaler.scale(model(x)).backward()
                for opt in opts:
                    scaler.step(opt)
        """)
    trace = trace_of(m, "f")
    [step] = trace.of(SCALER_STEP)
    site = m.updates.update_site(trace, step, m.iteration_of(trace, step))
    assert isinstance(site, cst.For) and m.code(site.iter) == "opts"


def test_update_site_none_for_an_unscale_a_step_in_an_expression_or_not_the_last():
    m = model("""
        import torch

        def f(loader, model, opt, opt2):
            scaler = torch.amp.GradScaler("cuda")
            for x in loader:
                scaler.scale(model(x)).backward()
                scaler.unscale_(opt)
                done = scaler.step(opt)
                scaler.step(opt2)
        """)
    trace = trace_of(m, "f")
    unscale = trace.of(UNSCALE)[0]
    first, second = trace.of(SCALER_STEP)
    group = m.iteration_of(trace, first)
    assert m.updates.update_site(trace, unscale, group) is None
    assert m.updates.update_site(trace, first, group) is None  # `done = ...`, and not the last step
    assert m.code(m.updates.update_site(trace, second, group)).strip() == "scaler.step(opt2)"


def test_insert_method_call_after_under_the_test_the_call_runs_under():
    m = model("""
        import torch

        def train(models, optimizers, batches, scaler=None):
            for x in batches:
                for model in models:
                    loss = model(x).pow(2).mean()
                    if scaler is not None:
                        scaler.scale(loss).backward()
                    else:
                        loss.backward()
                for opt in optimizers:
                    if scaler is not None:
                        scaler.step(opt)
                    else:
                        opt.step()
                    opt.zero_grad()

        scaler = torch.amp.GradScaler("cuda")
        train([], [], [], scaler)
        """)
    trace = trace_of(m, "")  # the module's call runs it
    [step] = trace.of(SCALER_STEP)
    site = m.updates.update_site(trace, step, m.iteration_of(trace, step))
    assert isinstance(site, cst.For) and m.code(site.iter) == "optimizers"
    edit, problem, tests = insert_method_call_after(m, site, step.node, "update")
    assert problem is None and tests
    fixed = applied(m, edit)
    assert "        if scaler is not None:\n            scaler.update()\n" in fixed



# ---------------------------------------------------------------------- twice before update; update first


def test_raising_pairs_unscale_twice_and_after_step():
    m = model("""
        import torch

        def f(loader, model, opt):
            scaler = torch.amp.GradScaler("cuda")
            for x in loader:
                scaler.scale(model(x)).backward()
                scaler.unscale_(opt)
                scaler.unscale_(opt)
                scaler.step(opt)
                scaler.unscale_(opt)
                scaler.update()
        """)
    trace = trace_of(m, "f")
    pairs = [(a.kind, m.line(a.node), b.kind, m.line(b.node)) for a, b in m.updates.raising_pairs(trace, set())]
    assert pairs == [(UNSCALE, 8, UNSCALE, 9), (SCALER_STEP, 10, UNSCALE, 11)]
    assert all((a, b) in RAISES for a, _, b, _ in pairs)
    # left out: the events whose ids are skipped
    skipped = {id(e) for e in trace.of(UNSCALE)}
    assert list(m.updates.raising_pairs(trace, skipped)) == []


def test_raising_pairs_none_with_an_update_between_or_a_disabled_scaler():
    m = model("""
        import torch

        def f(loader, model, opt):
            scaler = torch.amp.GradScaler("cuda")
            off = torch.amp.GradScaler("cuda", enabled=False)
            for x in loader:
                scaler.scale(model(x)).backward()
                scaler.step(opt)
                scaler.update()
                scaler.step(opt)
                scaler.update()
                off.step(opt)
                off.step(opt)
        """)
    assert list(m.updates.raising_pairs(trace_of(m, "f"), set())) == []


def test_step_after_update_before_the_iterations_step():
    m = model("""
        import torch

        def f(loader, model, opt):
            scaler = torch.amp.GradScaler("cuda")
            for x in loader:
                scaler.update()
                scaler.update(1024.0)
                scaler.scale(model(x)).backward()
                scaler.step(opt)
        """)
    trace = trace_of(m, "f")
    plain, explicit = trace.of(UPDATE)
    [step] = trace.of(SCALER_STEP)
    assert m.updates.step_after_update(trace, plain) is step
    assert m.updates.step_after_update(trace, explicit) is None  # update(new_scale) sets the scale


def test_step_after_update_none_after_the_step():
    m = model("""
        import torch

        def f(loader, model, opt):
            scaler = torch.amp.GradScaler("cuda")
            for x in loader:
                scaler.scale(model(x)).backward()
                scaler.step(opt)
                scaler.update()
        """)
    trace = trace_of(m, "f")
    assert m.updates.step_after_update(trace, trace.of(UPDATE)[0]) is None


# ---------------------------------------------------------------------- moves under an accumulation boundary


ACCUMULATE = """
    import torch

    def train(model, optimizer, scaler, loader, accum, clip):
        for i, (x, y) in enumerate(loader):
            loss = model(x).mean() / accum
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            {between}
            if (i + 1) % accum == 0:
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
    """


def test_boundary_move_takes_the_unscale_and_the_clipping_between():
    m = model(ACCUMULATE.format(between="pass"))
    trace = trace_of(m, "train")
    ms = m.accumulation_misplaced(trace)
    assert [mis.event.kind for mis in ms] == [UNSCALE]
    assert m.boundary_move(trace, ms) is None  # `pass` lies in between: its order would change
    m = model(ACCUMULATE.replace("            {between}\n", ""))
    trace = trace_of(m, "train")
    if_node, before, after = m.boundary_move(trace, m.accumulation_misplaced(trace))
    assert m.code(if_node.test) == "(i + 1) % accum == 0" and after == []
    assert [m.code(s).strip() for s in before] == [
        "scaler.unscale_(optimizer)", "torch.nn.utils.clip_grad_norm_(model.parameters(), clip)"]
    assert [m.clips_gradients(s) for s in before] == [False, True]
    assert all(m.only_scaler_or_clip(s) for s in before)


def test_boundary_move_none_when_a_moved_statement_binds_what_code_outside_reads():
    m = model("""
        import torch

        def train(model, optimizer, scaler, loader, accum):
            for i, x in enumerate(loader):
                scaler.scale(model(x).mean() / accum).backward()
                scaler.unscale_(optimizer)
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                if (i + 1) % accum == 0:
                    scaler.step(optimizer)
                    scaler.update()
                    optimizer.zero_grad()
                print(norm)
        """)
    trace = trace_of(m, "train")
    assert m.boundary_move(trace, m.accumulation_misplaced(trace)) is None


def test_only_scaler_or_clip_statements():
    m = model("""
        import torch

        def f(model, scaler, opt, clip):
            scaler.unscale_(opt); scaler.step(opt)
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            elif opt:
                scaler.update()
            else:
                scaler.update()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            if clip:
                print(clip)
            scaler.scale(model.loss).backward()
        """)
    scaler_line, branches, assigned, printing, backward = m.nodes_of(cst.FunctionDef)[0].body.body
    assert m.only_scaler_or_clip(scaler_line) and m.only_scaler_or_clip(branches)
    assert not m.only_scaler_or_clip(assigned) and m.clips_gradients(assigned)
    assert not m.only_scaler_or_clip(printing) and not m.clips_gradients(printing)
    assert not m.only_scaler_or_clip(backward)


# ---------------------------------------------------------------------- a scaler built too often (model.construction)


def scaler_new(m: AmpModel, trace):
    [new] = trace.of(SCALER_NEW)
    return new, m.statement_of(new.node)


def test_assigned_target_and_calls_in_args():
    m = model("""
        import torch
        a = torch.amp.GradScaler("cuda")
        b: object = torch.amp.GradScaler("cuda") if flag else None
        c = d = torch.amp.GradScaler(init_scale=scale())
        e = [torch.amp.GradScaler()]
        """)
    stmts = m.module.body[1:]
    calls = [n for n in m.calls if m.code(n.func) == "torch.amp.GradScaler"]
    assert [m.code(t) if t is not None else None for t in map(assigned_target, stmts, calls)] == ["a", "b", None, None]
    assert [calls_in_args(c) for c in calls] == [False, False, True, False]


def test_hoist_site_the_outer_loop_and_the_edit():
    m = model("""
        import torch

        def train(epochs, loader, model, opt):
            for epoch in range(epochs):
                for x in loader:
                    scaler = torch.amp.GradScaler("cuda")
                    scaler.scale(model(x)).backward()
                    scaler.step(opt)
                    scaler.update()
        """)
    trace = trace_of(m, "train")
    new, stmt = scaler_new(m, trace)
    outer = hoist_site(m, new, stmt, list(new.loops()))
    assert isinstance(outer, cst.For) and m.code(outer.iter) == "range(epochs)"
    edit, removed = hoist_or_drop(m, stmt, outer)
    fixed = applied(m, edit)
    assert not removed and '    scaler = torch.amp.GradScaler("cuda")\n    for epoch in range(epochs):' in fixed


def test_hoist_site_none_where_the_arguments_read_what_the_loop_binds():
    m = model("""
        import torch

        def train(loader, model, opt):
            for scale in loader:
                scaler = torch.amp.GradScaler("cuda", init_scale=scale)
                scaler.scale(model(scale)).backward()
                scaler.step(opt)
                scaler.update()
        """)
    trace = trace_of(m, "train")
    new, stmt = scaler_new(m, trace)
    assert hoist_site(m, new, stmt, list(new.loops())) is None


def test_hoist_or_drop_removes_a_copy_of_the_statement_before_the_loop():
    m = model("""
        import torch

        def train(loader, model, opt):
            scaler = torch.amp.GradScaler("cuda")
            for x in loader:
                scaler = torch.amp.GradScaler("cuda")
                scaler.scale(model(x)).backward()
        """)
    loop = m.nodes_of(cst.For)[0]
    stmt = loop.body.body[0]
    edit, removed = hoist_or_drop(m, stmt, loop)
    assert removed and applied(m, edit).count("GradScaler") == 1


def test_init_home_and_build_in_init():
    m = model("""
        import torch

        class SR:
            def __init__(self, opt):
                self.opt = opt

            def optimize_parameters(self, loss):
                scaler = torch.amp.GradScaler("cuda")
                scaler.scale(loss).backward()
                scaler.step(self.opt)
                scaler.update()

            def train_step(self, loss, scale):
                scaler = torch.amp.GradScaler("cuda", init_scale=scale)
                scaler.scale(loss).backward()
                scaler.step(self.opt)
                scaler.update()
        """)
    trace = trace_of(m, "optimize_parameters")
    new, stmt = scaler_new(m, trace)
    init, name, attr = init_home(m, trace, new, stmt, assigned_target(stmt, new.node))
    assert (init.name.value, name, attr) == ("__init__", "scaler", "self.scaler")
    edit = build_in_init(m, stmt, init, name, attr)
    fixed = applied(m, edit)
    assert '        self.opt = opt\n        self.scaler = torch.amp.GradScaler("cuda")\n' in fixed
    assert "        scaler = self.scaler\n" in fixed
    trace = trace_of(m, "train_step")  # reads the method's parameter
    new, stmt = scaler_new(m, trace)
    assert init_home(m, trace, new, stmt, assigned_target(stmt, new.node)) is None
