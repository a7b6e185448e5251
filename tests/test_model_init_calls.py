"""model/bound.py: what `__init__` binds on `self` through the methods it calls
(`self.configure_amp()` directly in its body), and what a method `__init__` calls sees of the
attributes `__init__` assigns after the call. Asked as the fixes ask (`bound.usable`); the rules
that read it are tested by their fixtures (AMP013's `*_init_call*`)."""

import libcst as cst

from conftest import model


def usable(src: str, at: str, key: str = "self.scaler", after: bool = False):
    """Why `key` cannot be used at the statement starting with `at` (None: it can)."""
    m = model(src)
    found = [s for s in m.nodes_of(cst.SimpleStatementLine) if m.code(s).startswith(at)]
    assert len(found) == 1, (at, [m.code(s) for s in found])
    return m.bound.usable(key, found[0], after=after)


TRAINER = """
    import torch

    class Trainer:
        def __init__(self, config):
            self.config = config
            self.optimizer = torch.optim.SGD(config.params, lr=0.1)
            self.configure_amp()
            self.load_checkpoint()

        def configure_amp(self):
            if self.config.dtype not in ("float16", "bfloat16"):
                raise ValueError(self.config.dtype)
            self.amp = self.config.amp
            self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp)

        def load_checkpoint(self):
            ckpt = torch.load(self.config.path)
            self.optimizer.load_state_dict(ckpt["optimizer"])

        def save_checkpoint(self):
            torch.save({"optimizer": self.optimizer.state_dict()}, self.config.path)
"""


def test_an_attribute_a_method_called_by_init_assigns_is_bound_after_init():
    assert usable(TRAINER, "torch.save") is None
    assert usable(TRAINER, "self.optimizer.load_state_dict", after=True) is None


def test_in_init_it_is_bound_after_the_call_and_not_before():
    assert usable(TRAINER, "self.load_checkpoint()") is None
    why = usable(TRAINER, "self.configure_amp()")
    assert why is not None and why.startswith("`self.scaler` is not assigned")


def test_the_value_the_method_assigns_is_kept():
    src = TRAINER.replace('self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp)',
                          'self.scaler = torch.amp.GradScaler("cuda") if self.amp else None')
    why = usable(src, "torch.save")
    assert why is not None and why.startswith("`self.scaler` may be None")
    # the method's own test, on an attribute, still names the decision
    assert usable(src.replace('torch.save({"optimizer"', 'assert self.amp\n        torch.save({"optimizer"'),
                  "torch.save") is None


def test_a_conditional_call_leaves_it_unknown():
    src = TRAINER.replace("            self.configure_amp()\n",
                          "            if config.amp:\n                self.configure_amp()\n")
    why = usable(src, "torch.save")
    assert why == ("`self.scaler` is not assigned in `__init__` or the class body of `Trainer` (nor before line 23 "
                   "on every path)")


def test_a_call_in_a_try_or_a_loop_is_not_followed():
    for head in ("try:", "for _ in range(1):", "with ctx:"):
        tail = "\n            except Exception:\n                pass\n" if head == "try:" else "\n"
        src = TRAINER.replace("            self.configure_amp()\n",
                              f"            {head}\n                self.configure_amp(){tail}")
        assert usable(src, "torch.save") is not None, head


def test_a_method_called_before_the_assignment_does_not_see_it():
    # `load_checkpoint` runs inside `__init__` before the scaler exists
    src = TRAINER.replace("            self.configure_amp()\n            self.load_checkpoint()\n",
                          "            self.load_checkpoint()\n            self.configure_amp()\n")
    why = usable(src, "self.optimizer.load_state_dict", after=True)
    assert why == ("`self.scaler` is not assigned yet where `__init__` calls `self.load_checkpoint()` (line 8), "
                   "while the object is built")
    # ... nor does it when `__init__` assigns it itself after the call
    src = TRAINER.replace("            self.configure_amp()\n            self.load_checkpoint()\n",
                          "            self.load_checkpoint()\n"
                          '            self.scaler = torch.amp.GradScaler("cuda")\n')
    why = usable(src, "self.optimizer.load_state_dict", after=True)
    assert why is not None and "calls `self.load_checkpoint()` (line 8)" in why
    # a method `__init__` never calls sees what `__init__` leaves
    assert usable(src, "torch.save") is None


def test_a_method_reached_through_another_sees_the_state_at_the_outer_call():
    src = TRAINER.replace("            self.configure_amp()\n            self.load_checkpoint()\n",
                          "            self.setup()\n            self.configure_amp()\n") + """
        def setup(self):
            self.load_checkpoint()
"""
    why = usable(src, "self.optimizer.load_state_dict", after=True)
    assert why is not None and "calls `self.load_checkpoint()`" in why


def test_calls_are_followed_a_bounded_depth():
    def chain(n):
        methods = "".join(f"\n        def m{i}(self):\n            self.m{i + 1}()\n" for i in range(n))
        return TRAINER.replace("            self.configure_amp()\n", "            self.m0()\n") \
            + methods + f"\n        def m{n}(self):\n            self.configure_amp()\n"
    assert usable(chain(1), "torch.save") is None  # __init__ -> m0 -> m1 -> configure_amp
    assert usable(chain(3), "torch.save") is not None


def test_an_early_return_before_the_assignment_leaves_it_unbound():
    src = TRAINER.replace("            self.amp = self.config.amp\n",
                          "            self.amp = self.config.amp\n            if not self.amp:\n                return\n")
    assert usable(src, "torch.save") is not None


def test_a_method_overridden_by_a_subclass_is_not_followed():
    src = TRAINER + """
    class Plain(Trainer):
        def configure_amp(self):
            self.amp = False
"""
    assert usable(src, "torch.save") is not None


def test_a_method_that_cannot_be_resolved_is_not_followed():
    # defined by a base class of another module
    src = TRAINER.replace("class Trainer:", "class Trainer(Base):").replace("def configure_amp(self):",
                                                                          "def _configure_amp(self):")
    assert usable(src, "torch.save") is not None
    # decorated, a generator, async
    for change in ("@functools.cache\n        def configure_amp(self):",
                   "async def configure_amp(self):"):
        assert usable(TRAINER.replace("def configure_amp(self):", change), "torch.save") is not None, change
    src = TRAINER.replace('enabled=self.amp)\n', 'enabled=self.amp)\n            yield\n')
    assert usable(src, "torch.save") is not None


def test_a_method_of_a_base_class_of_the_file_is_followed():
    src = TRAINER.replace("class Trainer:", "class Base:\n        def configure_amp(self):\n"
                          "            self.scaler = torch.amp.GradScaler('cuda')\n\n    class Trainer(Base):") \
        .replace("def configure_amp(self):\n            if", "def _unused(self):\n            if")
    assert usable(src, "torch.save") is None
