"""AMP005 unit cases that do not fit a fixture file."""

import textwrap

import pytest

from ampfix.engine.analyze import Settings, check_text, fix_text
from ampfix.engine.registry import select_rules

from ampfix.model.environ import _osa_distance, is_misspelling

RULES = select_rules(["AMP005"], [], preview=True)  # a preview rule since its measure (precision.py)


def findings(src):
    diags, _ = check_text(textwrap.dedent(src), "t.py", RULES, Settings())
    return [(d.line, d.message) for d in diags]


@pytest.mark.parametrize(
    "key,bad",
    [
        ("CUDA_VISIBLE_DEVICES", False),
        ("CUDA_VISIBLE_DEVICE", True),
        ("cuda_visible_devices", True),
        ("CUDA_VISBILE_DEVICES", True),
        ("CUDAVISIBLEDEVICES", True),
        ("CUDA_VISIBLE_DEVICES ", True),
        ("MUSA_VISIBLE_DEVICES", False),
        ("HIP_VISIBLE_DEVICES", False),
        ("NVIDIA_VISIBLE_DEVICES", False),
        ("CUDA_VISIBLE_DEVICES_0", False),
        ("ORIG_CUDA_VISIBLE_DEVICES", False),
        ("CUDA_LAUNCH_BLOCKING", False),
        ("CUDA_DEVICE_ORDER", False),
    ],
)
def test_misspelling(key, bad):
    assert is_misspelling(key) is bad


def test_osa_transposition():
    assert _osa_distance("AB", "BA") == 1
    assert _osa_distance("CUDA_VISBILE_DEVICES", "CUDA_VISIBLE_DEVICES") == 1


def test_set_after_init_is_late_not_rank_index():
    got = findings(
        """
        import os
        import torch

        def setup(rank):
            assert torch.cuda.is_available()
            os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)
            x = torch.zeros(1, device=f"cuda:{rank}")
        """
    )
    assert [line for line, _ in got] == [7]
    assert "after CUDA was initialised" in got[0][1]


def test_set_after_set_device_of_the_same_rank_is_for_the_children():
    # the process picked its GPU itself; the variable, naming the same rank, is for the processes
    # it launches (nequip's conftest): neither late nor a rank index for this process
    src = """
        import os
        import torch

        def setup(rank):
            torch.cuda.set_device(rank)
            os.environ["CUDA_VISIBLE_DEVICES"] = {value}
            x = torch.zeros(1, device=f"cuda:{{rank}}")
        """
    assert findings(src.format(value="str(rank)")) == []
    late = findings(src.format(value='"0,1"'))  # a value that does not name it: late
    assert [line for line, _ in late] == [7] and "set_device" in late[0][1]


def test_device_parameter_is_unknown():
    assert not findings(
        """
        import os
        import torch
        device = "cuda"

        def build(model, device, gpu):
            model.to(device)
            os.environ["CUDA_VISIBLE_DEVICES"] = gpu
        """
    )


def test_conditional_device_is_unknown():
    assert not findings(
        """
        import os
        import torch

        def build(model, args):
            device = "cuda" if args.cuda else "cpu"
            model.to(device)
            os.environ["CUDA_VISIBLE_DEVICES"] = args.gpu
        """
    )


def test_no_move_fix_when_os_imported_after_torch():
    src = "import torch\nimport os\ntorch.cuda.init()\nos.environ['CUDA_VISIBLE_DEVICES'] = '0'\n"
    new, fixed, remaining = fix_text(src, "t.py", RULES, Settings(unsafe_fixes=True))
    assert new == src and not fixed and len(remaining) == 1


def test_move_fix_keeps_future_import_first():
    src = (
        "from __future__ import annotations\nimport os\nimport torch\n\n"
        "torch.cuda.synchronize()\nos.environ['CUDA_VISIBLE_DEVICES'] = '0'\n"
    )
    new, fixed, remaining = fix_text(src, "t.py", RULES, Settings(unsafe_fixes=True))
    assert new == (
        "from __future__ import annotations\nimport os\nos.environ['CUDA_VISIBLE_DEVICES'] = '0'\nimport torch\n\n"
        "torch.cuda.synchronize()\n"
    )
    assert not remaining


def test_comma_list_then_rank_index_is_fine():
    assert not findings(
        """
        import os
        import torch

        def worker(rank, gpus):
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
            torch.cuda.set_device(rank)
        """
    )


def test_log_line_mentioning_rank_is_not_an_index():
    assert not findings(
        """
        import os
        import torch

        def worker(rank):
            os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)
            print(f"worker {rank} runs on cuda:{rank}")
            print("cuda:%d" % 0)
            model = torch.nn.Linear(2, 2).to("cuda:0")
        """
    )


def test_format_index_is_found():
    got = findings(
        """
        import os
        import torch

        def worker(rank):
            os.environ["CUDA_VISIBLE_DEVICES"] = "{}".format(rank)
            return torch.device("cuda:{}".format(rank))
        """
    )
    assert [line for line, _ in got] == [7]


def test_the_message_names_an_initialisation_on_every_path_where_there_is_one():
    # ludwig's initialize_pytorch (read in an unseen project): an optional is_available() first,
    # then one in the test of the branch that sets the variable
    got = findings("""
        import os
        import torch

        def initialize(gpus, allow_parallel_threads=True):
            if not allow_parallel_threads:
                if torch.cuda.is_available():
                    torch.backends.cudnn.deterministic = True
            if gpus == [-1]:
                os.environ["CUDA_VISIBLE_DEVICES"] = ""
            elif torch.cuda.is_available():
                os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    """)
    assert [line for line, _ in got] == [10, 12]
    assert "on line 7 (on the paths that run it):" in got[0][1]
    assert "on line 11:" in got[1][1] and "on the paths" not in got[1][1]
