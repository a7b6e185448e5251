"""The torch.cuda.amp migration's collection of one file (AMP101's, `ampfix.migrations.torch_amp`):
every imported name and every use to migrate, of all three kinds (`file_uses`: through an
imported name, fully qualified, an autocast state function; the old torch's path of a shim
marked `fallback`), and the renaming of a state function imported from torch
(`renamed_state_imports`), on their own, without the rule."""

from ampfix.migrations.bindings import settle
from ampfix.migrations.torch_amp import file_uses, renamed_state_imports
from ampfix.rule import FileContext
from conftest import model


def _collected(src: str):
    m = model(src)
    ctx = FileContext(path="t.py", source=m.module.code, model=m)
    bindings, uses = file_uses(m, ctx)
    settle(ctx, "AMP101", bindings, uses)
    return m, bindings, uses


def test_uses_of_every_kind_and_the_fallback_of_a_shim():
    m, bindings, uses = _collected("""
        import torch
        from torch.cuda.amp import GradScaler

        try:
            from torch.amp import autocast
        except ImportError:
            from torch.cuda.amp import autocast

        scaler = GradScaler()
        with torch.cuda.amp.autocast():
            dtype = torch.get_autocast_gpu_dtype()
        try:
            s = torch.amp.GradScaler("cuda")
        except AttributeError:
            s = GradScaler()
        """)
    assert [b.name for b in bindings] == ["GradScaler"]  # the `except ImportError:` import is left alone
    got = sorted((m.line(u.node), u.kind, u.device, u.fallback) for u in uses)
    assert got == [(10, "GradScaler", "cuda", False), (11, "autocast", "cuda", False),
                   (12, "get_autocast_gpu_dtype", "cuda", False), (16, "GradScaler", "cuda", True)]
    assert bindings[0].blocked is not None  # its fallback use keeps the old name
    assert all(u.replacements for u in uses if u.binding is None)


def test_a_state_function_imported_from_torch_is_renamed_with_its_uses():
    m, bindings, uses = _collected("""
        from torch import get_autocast_gpu_dtype as g, set_autocast_cpu_enabled

        a = g()
        set_autocast_cpu_enabled(True)
        """)
    renamed = [(b.name, new, [m.code(v) for v in edit.values()]) for b, new, edit in renamed_state_imports(bindings)]
    assert renamed == [("g", "get_autocast_dtype", ["get_autocast_dtype as g,"]),
                       ("set_autocast_cpu_enabled", "set_autocast_enabled", ["set_autocast_enabled"])]
    calls = sorted(m.code(v) for u in uses for v in u.replacements.values())
    assert calls == ['g("cuda")', 'set_autocast_enabled("cpu", True)']


def test_no_rename_for_a_blocked_or_unused_import():
    _, bindings, _ = _collected("""
        from torch import get_autocast_gpu_dtype, is_autocast_cpu_enabled

        f = get_autocast_gpu_dtype
        """)
    assert [b.name for b in bindings] == ["get_autocast_gpu_dtype", "is_autocast_cpu_enabled"]
    assert bindings[0].blocked is not None and not bindings[1].pending
    assert list(renamed_state_imports(bindings)) == []
