"""`model.guards.modern_torch_takes`: what a test on the torch version is on every torch from 2.4
on, in the usual spellings, where it compares with versions below 2.4; and
`modern_version_test`: the test whose branch that torch takes holds a node (AMP101 reports a
deprecated call there, and holds its fix back: an older torch takes the branch too)."""

import libcst as cst
import pytest

from conftest import call_named, model

HEAD = """
    import torch
    from packaging import version
    from mmengine.utils import digit_version
    from mmengine.utils.dl_utils import TORCH_VERSION
    from accelerate.utils import is_torch_version
"""


@pytest.mark.parametrize("test,value", [
    ("digit_version(TORCH_VERSION) < digit_version('1.10.0')", False),
    ("digit_version('1.5.0') <= digit_version(TORCH_VERSION) < digit_version('1.10.0')", False),
    ("torch.__version__ < '1.10'", False),
    ("torch.__version__ >= '2.3.1'", True),
    ("version.parse(torch.__version__) >= version.parse('1.10')", True),
    ("is_torch_version('>=', '1.10')", True),
    ("TORCH_VERSION >= (1, 6)", True),
    ("TORCH_VERSION >= '1.6'", True),
    ("not torch.__version__ < '1.10'", True),
    ("torch.__version__ >= '1.10' or other", True),
    ("torch.__version__ < '1.10' and other", False),
    # not read: a version at or above 2.4, another operand, types that do not compare as versions
    ("torch.__version__ >= '2.4'", None),
    ("is_torch_version('<', '2.4.0')", None),
    ("torch.__version__ >= '1.10' and other", None),
    ("TORCH_VERSION >= '2.1'", None),  # a plain string compares as text: "2.10" < "2.3"
    ("digit_version(TORCH_VERSION) < '1.10'", None),
    ("TORCH_VERSION >= MIN_VERSION", None),
    ("other_version >= '1.10'", None),
])
def test_modern_torch_takes(test, value):
    m = model(HEAD + f"    flag = {test}\n")
    assign = next(n for n in m.nodes_of(cst.Assign) if m.code(n.targets[0].target) == "flag")
    assert m.guards.modern_torch_takes(assign.value) is value


def test_modern_version_test_names_the_branch_modern_torch_takes():
    m = model("""
        import torch

        def f(dtype=None):
            if torch.__version__ < "1.10":
                a = torch.get_autocast_gpu_dtype()
            else:
                b = torch.get_autocast_gpu_dtype()
            if torch.__version__ < "1.6":
                return None
            c = torch.get_autocast_gpu_dtype()
            if torch.__version__ >= "2.4":
                d = torch.get_autocast_gpu_dtype()
            return a, b, c, d
        """)
    calls = [c for c in m.calls if m.code(c) == "torch.get_autocast_gpu_dtype()"]
    tests = [m.guards.modern_version_test(c) for c in calls]
    # (d: after the early return too, but under a test of 2.4, which does not read: a shim's branch)
    assert [m.line(t) if t is not None else None for t in tests] == [None, 5, 9, 9]
    assert [m.guards.in_version_branch(c) for c in calls] == [True, False, False, True]
    assert call_named(m, "torch.get_autocast_gpu_dtype()") is calls[0]
