"""Names a module takes from `from <project module> import *`: what the star import binds
(`Project.star_names`: the module's `__all__` when it is a literal, else its public top-level
names, through its own star imports), and how a file's model resolves them (`Names`: a local
binding shadows them, the last import before a use wins, a library's star import stays
unknown)."""

import textwrap
from pathlib import Path

import libcst as cst

from ampfix.model import AmpModel
from ampfix.project import Project
from ampfix.project.layout import clear_caches
from ampfix.project.project import dunder_all


def tree(root: Path, files: dict) -> Path:
    clear_caches()
    for name, text in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text), encoding="utf-8")
    return root


def names_in(project: Project, path: Path, code: str) -> set:
    """The qualified names of the expression `code` (its first occurrence in the file's text)."""
    model = AmpModel(cst.parse_module(path.read_text()), foreign=project, path=str(path))
    node = next(n for n in (*model.nodes_of(cst.Attribute), *model.nodes_of(cst.Name))
                if model.code(n) == code and not model.in_import(n))
    return model.qualnames(node)


UTILS = """
    import torch
    from torch import nn
    if HAS_APEX:
        from apex import amp
    from torch.cuda.amp import autocast

    def helper():
        pass

    class Trainer:
        pass

    _private = 1
    """


def test_star_names_are_the_public_top_level_names(tmp_path):
    tree(tmp_path, {"pyproject.toml": "", "pkg/__init__.py": "", "pkg/utils.py": UTILS, "pkg/train.py": ""})
    p = Project(tmp_path)
    train = str(tmp_path / "pkg" / "train.py")
    assert p.star_names(train, ".utils") == {"torch", "nn", "amp", "autocast", "helper", "Trainer"}
    assert p.star_names(train, "pkg.utils") == p.star_names(train, ".utils")
    assert p.star_names(train, "torch.cuda.amp") is None  # a library's: not known
    assert p.star_names(train, ".missing") is None


def test_dunder_all_restricts_and_a_computed_one_is_unknown(tmp_path):
    tree(tmp_path, {
        "pyproject.toml": "", "pkg/__init__.py": "", "pkg/train.py": "",
        "pkg/listed.py": UTILS + '\n__all__ = ["helper", "_private",  # kept\n           "Trainer"]\n',
        "pkg/computed.py": UTILS + '\n__all__ = ["helper"]\n__all__ += ["Trainer"]\n',
        "pkg/summed.py": UTILS + '\n__all__ = ["helper"] + ["Trainer"]\n',
    })
    p = Project(tmp_path)
    train = str(tmp_path / "pkg" / "train.py")
    assert p.star_names(train, ".listed") == {"helper", "_private", "Trainer"}
    assert p.star_names(train, ".computed") is None
    assert p.star_names(train, ".summed") is None
    assert dunder_all("__all__: tuple = ('a', 'b')\n") == {"a", "b"}
    assert dunder_all("__all__ = [name for name in dir()]\n") is None
    assert dunder_all("def f():\n    __all__ = ['a']\n") is None


def test_star_names_follow_a_chain_and_stop_at_a_cycle(tmp_path):
    tree(tmp_path, {
        "pyproject.toml": "", "pkg/__init__.py": "", "pkg/train.py": "",
        "pkg/a.py": "from numpy import *\nfrom .b import *\n\ndef in_a():\n    pass\n",
        "pkg/d.py": "from .b import *\nfrom numpy import *\n\ndef in_d():\n    pass\n",
        "pkg/b.py": "from .c import *\n\ndef in_b():\n    pass\n",
        "pkg/c.py": "import torch\nfrom .a import *\n\ndef in_c():\n    pass\n",
    })
    p = Project(tmp_path)
    train = str(tmp_path / "pkg" / "train.py")
    assert p.star_names(train, ".a") == {"in_a", "in_b", "in_c", "torch"}  # numpy's: not known, not claimed
    assert p.star_names(train, ".c") == {"in_c", "torch", "in_a", "in_b"}
    assert p.star_names(train, ".d") == {"in_d"}  # numpy's star import may bind any name b's did
    assert p.library_name(train, ".d.torch") is None
    # the name resolves through the chain to the library module it is
    assert p.library_name(train, ".a.torch") == "torch"
    assert p.library_name(train, ".a.torch.cuda.amp") == "torch.cuda.amp"


def test_a_star_imported_name_resolves_as_the_module_binds_it(tmp_path):
    tree(tmp_path, {
        "pyproject.toml": "", "pkg/__init__.py": "", "pkg/utils.py": UTILS,
        "pkg/mid.py": "from .utils import *\n",
        "pkg/train.py": """
            from .mid import *

            def step(model, optimizer, loss):
                model, optimizer = amp.initialize(model, optimizer)
                with torch.cuda.amp.autocast():
                    helper()
                with autocast():
                    pass
            """,
    })
    p = Project(tmp_path)
    train = tmp_path / "pkg" / "train.py"
    assert names_in(p, train, "amp.initialize") == {"apex.amp.initialize"}  # `from apex import amp`: a module
    assert names_in(p, train, "torch.cuda.amp.autocast") == {"torch.cuda.amp.autocast"}
    assert names_in(p, train, "helper") == {".mid.helper"}  # the project's own, as `from .mid import helper` reads
    # a library's function re-exported is its import's to report, as for `from .mid import autocast`
    assert names_in(p, train, "autocast") == {".mid.autocast"}


def test_a_local_binding_or_a_later_import_comes_first(tmp_path):
    tree(tmp_path, {
        "pyproject.toml": "", "pkg/__init__.py": "", "pkg/utils.py": UTILS,
        "pkg/shadowed.py": """
            from .utils import *

            class torch:
                pass

            def f():
                return torch.cuda.amp.autocast()
            """,
        "pkg/later.py": """
            from .utils import *
            import numpy as torch

            torch.cuda.amp.autocast()
            """,
        "pkg/earlier.py": """
            import numpy as torch
            from .utils import *

            torch.cuda.amp.autocast()
            """,
        "pkg/inner.py": """
            from .utils import *

            def f(torch):
                return torch.cuda.amp.autocast()
            """,
    })
    p = Project(tmp_path)
    pkg = tmp_path / "pkg"
    assert names_in(p, pkg / "shadowed.py", "torch.cuda.amp.autocast") == set()  # the local class
    assert names_in(p, pkg / "later.py", "torch.cuda.amp.autocast") == {"numpy.cuda.amp.autocast"}
    assert names_in(p, pkg / "earlier.py", "torch.cuda.amp.autocast") == {"torch.cuda.amp.autocast"}
    assert names_in(p, pkg / "inner.py", "torch.cuda.amp.autocast") == set()  # the parameter


def test_names_not_exported_or_from_a_library_stay_unknown(tmp_path):
    tree(tmp_path, {
        "pyproject.toml": "", "pkg/__init__.py": "",
        "pkg/utils.py": UTILS + '\n__all__ = ["helper"]\n',
        "pkg/restricted.py": "from .utils import *\n\ntorch.cuda.amp.autocast()\nhelper()\n",
        "pkg/library.py": "from torch.cuda.amp import *\n\nautocast()\n",
        "pkg/after.py": "from .mid import *\nfrom numpy import *\n\ntorch.cuda.amp.autocast()\n",
        "pkg/before.py": "from numpy import *\nfrom .mid import *\n\ntorch.cuda.amp.autocast()\n",
        "pkg/mid.py": "import torch\n",
        "pkg/underscore.py": "from .private import *\n\n_hidden()\nshown()\n",
        "pkg/private.py": "def _hidden():\n    pass\n\ndef shown():\n    pass\n",
    })
    p = Project(tmp_path)
    pkg = tmp_path / "pkg"
    assert names_in(p, pkg / "restricted.py", "torch.cuda.amp.autocast") == set()  # not in `__all__`
    assert names_in(p, pkg / "restricted.py", "helper") == {".utils.helper"}
    assert names_in(p, pkg / "library.py", "autocast") == set()  # as today: a library's names are not known
    assert names_in(p, pkg / "after.py", "torch.cuda.amp.autocast") == set()  # numpy's star may bind it
    assert names_in(p, pkg / "before.py", "torch.cuda.amp.autocast") == {"torch.cuda.amp.autocast"}
    assert names_in(p, pkg / "underscore.py", "_hidden") == set()
    assert names_in(p, pkg / "underscore.py", "shown") == {".private.shown"}


def test_apex_amp_trigger_without_the_word_only_where_amp_comes_from_another_module():
    # AMP102 reads a module that does not name apex only when it takes `amp` (or every name) from
    # another module: the model then tells whether that `amp` is apex's (the fixture projects)
    from ampfix.engine.registry import all_rules

    rule = all_rules()["AMP102"]
    use = "with amp.scale_loss(loss, opt) as s:\n    s.backward()\n"
    for head in ("from .utils import *\n", "from .utils import amp\n", "from pkg.utils import batch_to, amp\n",
                 "from apex import amp\n", "from .utils import (\n    batch_to,\n    amp,\n)\n"):
        text = head + use
        assert rule.triggered_by(text, text.lower()), head
    for head in ("import torch\n", "from .utils import batch_to\n", "# from .utils import *\n"):
        text = head + use
        assert not rule.triggered_by(text, text.lower()), head
