"""Model facts of autocast contexts entered by hand (`model.entered`, AMP021's): which
`X.__enter__()` statements enter an autocast the model knows (a `self.` attribute built in
`__init__`, a local, one built on the spot; not a context of another kind, not a parameter with no
caller, not a value used), whether the code may exit them (`__exit__` anywhere in the file, the
object used otherwise in the entering function) and whether the region caches casts (not
`enabled=False`, float32 or `cache_enabled=False`)."""

from conftest import model

SRC = """
    import contextlib
    import torch

    class Trainer:
        def __init__(self, precision):
            self.amp = torch.amp.autocast(device_type="cuda", dtype=getattr(torch, precision))
            self.fp32 = torch.autocast("cuda", dtype=torch.float32)
            self.off = torch.cuda.amp.autocast(False)
            self.nocache = torch.autocast("cuda", torch.bfloat16, True, False)
            self.left = torch.autocast("cuda")
            self.sync = contextlib.nullcontext()

        def train(self):
            self.amp.__enter__()
            self.fp32.__enter__()
            self.off.__enter__()
            self.nocache.__enter__()
            self.left.__enter__()
            self.sync.__enter__()
            ctx = self.amp.__enter__()

        def end(self):
            self.left.__exit__(None, None, None)

    def loop(given):
        torch.autocast("cpu", dtype=torch.bfloat16).__enter__()
        local = torch.autocast("cuda", dtype=torch.float16)
        local.__enter__()
        handed = torch.autocast("cuda", dtype=torch.float16)
        handed.__enter__()
        stack.push(handed)
        given.__enter__()
"""


def _facts():
    m = model(SRC)
    return m, {(m.line(e.call), e.key): (e.exited, e.caches) for e in m.entered.entries}


def test_entries_are_the_autocast_contexts_entered_as_statements():
    m, facts = _facts()
    assert sorted(facts) == [(15, "self.amp"), (16, "self.fp32"), (17, "self.off"), (18, "self.nocache"),
                             (19, "self.left"), (27, None), (29, "local"), (31, "handed")]
    assert {type(e.scope).__name__ for e in m.entered.entries} == {"FunctionDef"}


def test_exited_and_caching():
    m, facts = _facts()
    assert facts[(15, "self.amp")] == (False, True)  # a dtype chosen at run time may cast
    assert facts[(16, "self.fp32")][1] is False and facts[(17, "self.off")][1] is False
    assert facts[(18, "self.nocache")][1] is False  # cache_enabled, the fourth positional argument
    assert facts[(19, "self.left")][0] is True  # `__exit__` in another method
    assert facts[(27, None)] == (False, True) and facts[(29, "local")] == (False, True)
    assert facts[(31, "handed")][0] is True  # handed to an ExitStack
    assert [(m.line(e.call), e.key) for e in m.entered.left_open()] == [(15, "self.amp"), (27, None), (29, "local")]
