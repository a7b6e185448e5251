"""model/bound.py: what a name or `self.` attribute may be at a point, on every path. The query
fixes ask before they insert code (`insertion_problem`, `replacement_problem`)."""

import libcst as cst
import pytest

from ampfix.model import AmpModel


def _model(src: str) -> AmpModel:
    return AmpModel(cst.parse_module(src))


def _stmt(model: AmpModel, starts: str) -> cst.CSTNode:
    found = [s for s in model.nodes_of(cst.SimpleStatementLine, cst.If, cst.For, cst.While, cst.With, cst.Try)
             if model.code(s).startswith(starts)]
    assert len(found) == 1, (starts, found)
    return found[0]


def problem(src: str, at: str, code: str, after: bool = False):
    model = _model(src)
    new = [cst.parse_statement(c + "\n") for c in code.split("\n\n")]
    return model.bound.insertion_problem(new, _stmt(model, at), after)


RESUME = '''
import torch
def main(args):
    model = Net()
    opt = torch.optim.SGD(model.parameters())
    if args.resume:
        ckpt = torch.load(args.resume)
        opt.load_state_dict(ckpt["optimizer"])
    scaler = torch.amp.GradScaler("cuda")
    train(model, opt, scaler)
'''


def test_a_local_assigned_later_is_not_bound_before():
    why = problem(RESUME, "opt.load_state_dict", 'scaler.load_state_dict(ckpt["scaler"])', after=True)
    assert why == "`scaler` is not assigned yet at line 8 (it is assigned later in `main`)"


def test_a_local_assigned_in_one_branch_only():
    why = problem(RESUME, "scaler = torch", 'scaler.load_state_dict(ckpt["scaler"])', after=True)
    assert why == "`ckpt` is not assigned on every path that reaches line 9"


def test_the_same_stable_test_proves_the_branch_assignment():
    # `if args.resume:` again (as a guard, or the left of `and`): `ckpt` is assigned there
    assert problem(RESUME, "scaler = torch", 'if args.resume:\n    scaler.load_state_dict(ckpt["scaler"])',
                   after=True) is None
    assert problem(RESUME, "scaler = torch",
                   'if args.resume and "scaler" in ckpt:\n    scaler.load_state_dict(ckpt["scaler"])',
                   after=True) is None


def test_a_reassigned_test_is_not_the_same_decision():
    src = RESUME.replace('    scaler = torch.amp.GradScaler("cuda")\n',
                         '    args = parse()\n    scaler = torch.amp.GradScaler("cuda")\n')
    assert problem(src, "scaler = torch", 'if args.resume:\n    scaler.load_state_dict(ckpt["scaler"])',
                   after=True) is not None


TRAINER = '''
import torch
class Trainer:
    def __init__(self, model, use_amp):
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        self.scaler = torch.amp.GradScaler("cuda") if use_amp else None

    def step(self, loss, clip):
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
'''


def test_an_attribute_that_may_be_none():
    why = problem(TRAINER, "torch.nn.utils", "self.scaler.unscale_(self.optimizer)")
    assert why == "`self.scaler` may be None at line 15 (line 7)"


def test_a_none_test_proves_it():
    assert problem(TRAINER, "torch.nn.utils",
                   "if self.scaler is not None:\n    self.scaler.unscale_(self.optimizer)") is None
    assert problem(TRAINER, "torch.nn.utils", "if self.scaler:\n    self.scaler.unscale_(self.optimizer)") is None


def test_a_dereference_on_every_path_proves_it():
    assert problem(TRAINER, "self.scaler.scale", "self.scaler.unscale_(self.optimizer)", after=True) is None


def test_in_the_none_branch_it_is_none():
    src = TRAINER.replace("        if clip:\n", "        if self.scaler is None:\n")
    why = problem(src, "torch.nn.utils", "self.scaler.step(self.optimizer)")
    assert why is not None and why.startswith("`self.scaler` may be None")


def test_a_flag_that_chose_none_excludes_it():
    src = '''
import torch
class Trainer:
    def __init__(self, model, amp):
        self.amp = amp
        self.optimizer = torch.optim.SGD(model.parameters())
        self.scaler = torch.amp.GradScaler("cuda") if self.amp else None

    def step(self, loss):
        if self.amp:
            self.scaler.scale(loss).backward()
        loss.detach()
'''
    assert problem(src, "loss.detach", "self.scaler.unscale_(self.optimizer)") is not None
    assert problem(src, "loss.detach", "if self.amp:\n    self.scaler.unscale_(self.optimizer)") is None


def test_self_attributes_come_from_init_or_the_class():
    src = '''
class T(Base):
    steps = 0

    def __init__(self):
        self.a = 1

    def setup(self):
        self.b = 2

    def run(self):
        print(self.steps)
'''
    assert problem(src, "print(self.steps)", "self.a.bit_length()") is None
    assert problem(src, "print(self.steps)", "self.steps.bit_length()") is None
    why = problem(src, "print(self.steps)", "self.b.bit_length()")
    assert why.startswith("`self.b` is not assigned in `__init__` or the class body of `T`")
    # a method of the class or of a base class (maybe another module's) is not an attribute to prove
    assert problem(src, "print(self.steps)", "self.manual_backward(1)") is None


def test_an_attribute_set_to_none_in_another_method():
    src = '''
class T:
    def __init__(self):
        self.scaler = make()

    def reset(self):
        self.scaler = None

    def run(self):
        print(1)
'''
    assert problem(src, "print(1)", "self.scaler.update()") == "`self.scaler` may be None at line 10 (line 7)"


def test_try_except_and_loops():
    src = '''
import torch
def f(path, data):
    try:
        ckpt = torch.load(path)
    except FileNotFoundError:
        ckpt = None
    for i, x in enumerate(data):
        if i == 0:
            s = x
        print(s)
    print(ckpt)
'''
    assert problem(src, "print(ckpt)", 'ckpt.get("x")') == "`ckpt` may be None at line 12 (line 7)"
    assert problem(src, "print(ckpt)", "if ckpt is not None:\n    ckpt.get('x')") is None
    # `s` is assigned in a later iteration only on some paths, and the loop may not run at all
    assert problem(src, "print(ckpt)", "s.bit_length()") is not None
    # but the original `print(s)` reads it anyway: code before it fails nowhere it would not
    assert problem(src, "print(s)", "s.bit_length()") is None


def test_early_return_and_assert():
    src = '''
def f(scaler=None):
    if scaler is None:
        return
    print(1)

def g(scaler=None):
    assert scaler is not None
    print(2)

def h(scaler=None):
    print(3)
'''
    assert problem(src, "print(1)", "scaler.update()") is None
    assert problem(src, "print(2)", "scaler.update()") is None
    assert problem(src, "print(3)", "scaler.update()") == "`scaler` may be None at line 12 (line 11)"


def test_globals_builtins_and_names_never_assigned():
    src = '''
import torch
SCALE = 2.0
amp = None
try:
    from apex import amp
except ImportError:
    pass

def f():
    print(0)
'''
    assert problem(src, "print(0)", "torch.ones(SCALE)") is None
    assert problem(src, "print(0)", "len([])") is None
    assert problem(src, "print(0)", "undefined_name.x()") is not None
    assert problem(src, "print(0)", "amp.scale_loss()") is not None  # None when apex is missing


def test_replacement_is_judged_against_what_it_replaces():
    model = _model(TRAINER)
    step = _stmt(model, "self.optimizer.step()")
    naive = [cst.parse_statement("self.scaler.step(self.optimizer)\n")]
    assert model.bound.replacement_problem(step, naive).startswith("`self.scaler` may be None")
    guarded = [cst.parse_statement("if self.scaler is not None:\n    self.scaler.step(self.optimizer)\n"
                                   "else:\n    self.optimizer.step()\n")]
    assert model.bound.replacement_problem(step, guarded) is None


@pytest.mark.parametrize("stmt", ["for x in []:\n    pass", "while cond():\n    break", "with f() as g:\n    pass",
                                  "match v:\n    case 1:\n        pass\n    case _:\n        pass"])
def test_every_statement_kind_is_walked(stmt):
    src = "def f(v):\n    s = None\n" + "".join("    " + line + "\n" for line in stmt.split("\n")) + "    print(1)\n"
    assert problem(src, "print(1)", "s.x()") == "`s` may be None at line " + str(src.count("\n")) + " (line 2)"
