"""The project layer on its own: the project root, import resolution (relative, `src/`,
re-exports, cycles, shadowing, unresolvable), module summaries and their store, and the facts
a file's model takes from other modules."""

import json
import os
import sys
import textwrap
from pathlib import Path

import libcst as cst
import pytest

from ampfix.model import AmpModel
from ampfix.model.foreign import ForeignClass, ForeignConstant, ForeignFunction, ForeignModule
from ampfix.model.summary import UNREADABLE, ModuleSummary
from ampfix.project import Project
from ampfix.project.layout import Layout, clear_caches, find_root
from conftest import HELPER_CALLER
from ampfix.project.graph import import_lines


def tree(root: Path, files: dict) -> Path:
    clear_caches()
    for name, text in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text), encoding="utf-8")
    return root


def model_of(project: Project, path: Path) -> AmpModel:
    return AmpModel(cst.parse_module(path.read_text()), foreign=project, path=str(path))


# ---------------------------------------------------------------------- root and resolution


def fixture_project_files(tmp_path: Path, preview: bool = False):
    """Every module of every fixture project, in a copy under `tmp_path` (each project's copy
    made, and the layout caches cleared, before its modules are given); with `preview`, each
    copy's pyproject.toml turns preview on (`preview = true` in [tool.ampfix]: the preview
    rules, AMP003 among them, whose findings some of the projects are)."""
    import shutil

    for fixture in sorted((Path(__file__).resolve().parents[1] / "fixtures" / "projects").iterdir()):
        copy = tmp_path / fixture.name
        shutil.copytree(fixture, copy)
        if preview:
            config = copy / "pyproject.toml"
            assert "[tool.ampfix]" not in config.read_text(), config
            config.write_text(config.read_text() + "\n[tool.ampfix]\npreview = true\n")
        clear_caches()
        yield from sorted(copy.rglob("*.py"))


def test_root_is_the_nearest_marker(tmp_path):
    tree(tmp_path, {"pyproject.toml": "", "pkg/sub/mod.py": "", "other/setup.cfg": "", "other/x.py": ""})
    assert find_root(tmp_path / "pkg" / "sub" / "mod.py") == tmp_path
    assert find_root(tmp_path / "other" / "x.py") == tmp_path / "other"


def test_root_falls_back_to_the_checked_folder(tmp_path):
    tree(tmp_path, {"a/b.py": ""})
    assert find_root(tmp_path / "a" / "b.py", fallback=tmp_path / "a") in (tmp_path / "a", find_root(tmp_path))


def test_absolute_relative_and_package_imports(tmp_path):
    tree(tmp_path, {
        "pyproject.toml": "",
        "pkg/__init__.py": "",
        "pkg/engine.py": "def step(): pass\n",
        "pkg/utils/__init__.py": "",
        "pkg/utils/clip.py": "def clip(): pass\n",
        "pkg/loop.py": "",
    })
    lay = Layout(tmp_path)
    loop = str(tmp_path / "pkg" / "loop.py")
    assert lay.resolve(loop, "pkg.engine").path == str(tmp_path / "pkg" / "engine.py")
    assert lay.resolve(loop, "pkg.engine.step") == lay.resolve(loop, "pkg.engine.step")
    t = lay.resolve(loop, "pkg.engine.step")
    assert (t.path, t.attr) == (str(tmp_path / "pkg" / "engine.py"), "step")
    assert lay.resolve(loop, ".engine").path.endswith("pkg/engine.py")
    assert lay.resolve(loop, ".utils.clip").path.endswith("pkg/utils/clip.py")
    clip = str(tmp_path / "pkg" / "utils" / "clip.py")
    assert lay.resolve(clip, "..engine.step").attr == "step"
    assert lay.resolve(clip, "...outside") is None  # above the project root


def test_src_layout_and_scripts_importing_siblings(tmp_path):
    tree(tmp_path, {
        "pyproject.toml": "",
        "src/mylib/__init__.py": "",
        "src/mylib/amp.py": "",
        "scripts/train.py": "",
        "scripts/helpers.py": "",
    })
    lay = Layout(tmp_path)
    script = str(tmp_path / "scripts" / "train.py")
    assert lay.resolve(script, "mylib.amp").path == str(tmp_path / "src" / "mylib" / "amp.py")
    assert lay.resolve(script, "helpers").path == str(tmp_path / "scripts" / "helpers.py")


def test_a_folders_listing_rules_out_only_the_names_it_lacks(tmp_path, monkeypatch):
    """A search folder's entries are listed once (`_names_in`): an import whose first name is
    neither an entry nor an entry's `.py` is not probed, and resolves to nothing, as by probing;
    every other import resolves as by probing alone (a module, a package, a namespace folder,
    a name bound in a module); a folder that cannot be listed is probed."""
    from ampfix.project import layout

    tree(tmp_path, {"pyproject.toml": "", "pkg/__init__.py": "", "pkg/mod.py": "", "single.py": "",
                    "space/inner/notes.txt": "", "scripts/train.py": ""})
    script = str(tmp_path / "scripts" / "train.py")
    names = ["torch", "torch.nn.functional", "pkg", "pkg.mod", "pkg.mod.f", "pkg.other", "single", "single.g",
             "space", "space.inner", "space.missing", ".mod", "..pkg.mod", "scripts.train"]
    listed = [Layout(tmp_path).resolve(script, q) for q in names]
    probes = []
    monkeypatch.setattr(layout, "_is_file", lambda p: probes.append(p) or os.path.isfile(p))
    Layout(tmp_path).resolve(script, "torch.nn.functional")
    assert [p for p in probes if "torch" in p] == []  # ruled out by the listings of the search folders
    monkeypatch.setattr(layout, "_names_in", lambda folder: None)  # as if no folder could be listed
    assert [Layout(tmp_path).resolve(script, q) for q in names] == listed
    assert [t is not None for t in listed] == [False, False, True, True, True, True, True, True, True, True, False,
                                               False, True, True]


def test_a_module_added_after_a_resolution_is_found_once_the_caches_are_cleared(tmp_path):
    tree(tmp_path, {"pyproject.toml": "", "train.py": ""})
    train = str(tmp_path / "train.py")
    assert Layout(tmp_path).resolve(train, "helpers") is None
    (tmp_path / "helpers.py").write_text("def f(): pass\n")
    clear_caches()  # what the project does when the tree's files change (`Project.refresh`)
    assert Layout(tmp_path).resolve(train, "helpers").path == str(tmp_path / "helpers.py")


def test_a_runs_project_roots_are_found_once_per_folder_and_forgotten_with_the_run(tmp_path):
    from ampfix.engine import analyze

    tree(tmp_path, {"pyproject.toml": "", "sub/a.py": "", "sub/b.py": ""})
    settings = analyze.Settings(project=True)
    analyze.close_projects()  # (what an earlier test of this process left open: `_ROOTS` is compared whole)
    try:
        first = analyze.project_for(str(tmp_path / "sub" / "a.py"), settings)
        assert analyze.project_for(str(tmp_path / "sub" / "b.py"), settings) is first
        assert analyze._ROOTS == {str(tmp_path / "sub"): str(tmp_path)}
        (tmp_path / "sub" / "setup.py").write_text("")  # a root marker added: the run goes on as it began
        assert analyze.project_for(str(tmp_path / "sub" / "a.py"), settings) is first
        analyze.forget_roots()  # (the language server, before each analysis)
        assert analyze.project_for(str(tmp_path / "sub" / "a.py"), settings).root == str(tmp_path / "sub")
    finally:
        analyze.close_projects()
    assert analyze._ROOTS == {}


def test_a_local_module_shadows_a_library_of_the_same_name(tmp_path):
    tree(tmp_path, {"pyproject.toml": "", "train.py": "import logging\n", "logging.py": "LEVEL = 1\n"})
    lay = Layout(tmp_path)
    assert lay.resolve(str(tmp_path / "train.py"), "logging").path == str(tmp_path / "logging.py")


def test_a_folder_without_init_does_not_hide_a_module_found_later(tmp_path):
    # scripts/utils/ (no `__init__.py`) is only a namespace portion: Python takes the module
    # utils.py of a later path entry (the project root) before it; with none, the folder
    tree(tmp_path, {"pyproject.toml": "", "utils.py": "def f(): pass\n", "scripts/train.py": "",
                    "scripts/utils/notes.txt": "", "scripts/other/notes.txt": ""})
    lay = Layout(tmp_path)
    script = str(tmp_path / "scripts" / "train.py")
    assert lay.resolve(script, "utils").path == str(tmp_path / "utils.py")
    assert lay.resolve(script, "utils.f").attr == "f"
    other = lay.resolve(script, "other")
    assert (other.path, other.folder) == ("", str(tmp_path / "scripts" / "other"))


def test_unresolvable_imports_stay_unknown(tmp_path):
    tree(tmp_path, {"pyproject.toml": "", "train.py": ""})
    p = Project(tmp_path)
    train = str(tmp_path / "train.py")
    assert p.resolve(train, "numpy.float16") is None
    assert p.resolve(train, "apex.amp") is None
    assert p.resolve(train, ".missing.name") is None


def test_re_exports_through_init_and_aliases(tmp_path):
    tree(tmp_path, {
        "pyproject.toml": "",
        "pkg/__init__.py": "from .engine import backward_step as bstep\nfrom .config import *\n",
        "pkg/engine.py": "def backward_step(loss, scaler):\n    scaler.scale(loss).backward()\n",
        "pkg/config.py": "import torch\nAMP_DTYPE = torch.bfloat16\n",
        "main.py": "",
    })
    p = Project(tmp_path)
    main = str(tmp_path / "main.py")
    f = p.resolve(main, "pkg.bstep")
    assert isinstance(f, ForeignFunction) and f.qual == "backward_step" and f.path.endswith("engine.py")
    c = p.resolve(main, "pkg.AMP_DTYPE")  # through `from .config import *`
    assert isinstance(c, ForeignConstant) and [v.text for v in c.values] == ["torch.bfloat16"]
    assert isinstance(p.resolve(main, "pkg"), ForeignModule)
    assert p.resolve(main, "pkg.nothing") is None


def test_import_cycles_terminate(tmp_path):
    tree(tmp_path, {
        "pyproject.toml": "",
        "a.py": "from b import x\n",
        "b.py": "from a import x\n",
        "main.py": "",
    })
    p = Project(tmp_path)
    assert p.resolve(str(tmp_path / "main.py"), "a.x") is None


def test_class_attributes_and_bases_across_modules(tmp_path):
    tree(tmp_path, {
        "pyproject.toml": "",
        "base.py": """
            import torch

            class Base:
                def __init__(self, use_amp):
                    self.scaler = torch.amp.GradScaler("cuda", enabled=use_amp)
            """,
        "mid.py": "from base import Base\n\nclass Mid(Base):\n    pass\n",
        "trainer.py": """
            from mid import Mid

            class Trainer(Mid):
                def step(self, loss):
                    self.scaler.scale(loss).backward()
            """,
    })
    p = Project(tmp_path)
    m = model_of(p, tmp_path / "trainer.py")
    cls = m.classes["Trainer"]
    (mid,) = m.foreign_bases(cls)
    assert isinstance(mid, ForeignClass) and mid.qual == "Mid"
    assert [c.qual for c in m.foreign_mro(mid)] == ["Mid", "Base"]
    values = m.inherited_attribute(cls, "scaler")
    assert len(values) == 1 and m.constructs_scaler(values[0]) and m.is_synthetic(values[0])
    assert "self.scaler" in m.scalers
    assert m.closed_class(cls)


def test_a_base_class_nobody_can_see_leaves_the_class_open(tmp_path):
    tree(tmp_path, {"pyproject.toml": "", "t.py": "from somewhere import Base\n\nclass T(Base):\n    pass\n"})
    p = Project(tmp_path)
    m = model_of(p, tmp_path / "t.py")
    assert not m.closed_class(m.classes["T"])


def test_imports_inside_functions_resolve(tmp_path):
    tree(tmp_path, {
        "pyproject.toml": "",
        "cfg.py": "import torch\nDTYPE = torch.float16\n",
        "t.py": "def f():\n    from cfg import DTYPE as d\n    return d\n",
    })
    p = Project(tmp_path)
    m = model_of(p, tmp_path / "t.py")
    ret = next(iter(m.nodes_of(cst.Return))).value
    assert m.precision.dtype_values(ret) == frozenset({"float16"})


# ---------------------------------------------------------------------- summaries


def test_function_summary_effects_params_returns(tmp_path):
    tree(tmp_path, {
        "pyproject.toml": "",
        "engine.py": """
            import torch

            def step(loss, optimizer, scaler, clip=1.0):
                scaler.scale(loss).backward()
                if clip:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(optimizer.param_groups[0]["params"], clip)
                scaler.step(optimizer)
                scaler.update()

            def make_scaler(enabled):
                return torch.amp.GradScaler("cuda", enabled=enabled)
            """,
    })
    s = Project(tmp_path).summary(str(tmp_path / "engine.py"))
    step = s.functions["step"]
    assert [p.name for p in step.params] == ["loss", "optimizer", "scaler", "clip"]
    assert step.params[3].default.text == "1.0"
    kinds = [e.kind for e in step.effects]
    assert kinds[0] == "backward" and "grad_read" in kinds
    clip = next(e for e in step.effects if e.kind == "grad_read")
    assert clip.ctx and clip.ctx[0][0] == ("cond", "clip")  # a stable test on a parameter: portable
    assert s.functions["make_scaler"].returns[0].text == 'torch.amp.GradScaler("cuda", enabled=__param__.enabled)'


def test_a_returned_local_assigned_in_several_places_is_one_value_per_assignment(tmp_path):
    tree(tmp_path, {
        "pyproject.toml": "",
        "builders.py": """
            from functools import partial
            from torch import nn

            def build_gradient_clipper(cfg):
                clip = None
                if cfg["clip_grad_val"] is not None:
                    clip = partial(nn.utils.clip_grad_value_, clip_value=cfg["clip_grad_val"])
                elif cfg["clip_grad_norm"] is not None:
                    clip = partial(nn.utils.clip_grad_norm_, max_norm=cfg["clip_grad_norm"])
                return clip

            def counter(optimizer, steps):
                n = 0
                for _ in range(steps):
                    optimizer.step()
                    n = n + 1
                return n
            """,
    })
    s = Project(tmp_path).summary(str(tmp_path / "builders.py"))
    assert [v.text for v in s.functions["build_gradient_clipper"].returns] == [
        "None",
        'functools.partial(torch.nn.utils.clip_grad_value_, clip_value=__param__.cfg["clip_grad_val"])',
        'functools.partial(torch.nn.utils.clip_grad_norm_, max_norm=__param__.cfg["clip_grad_norm"])']
    # a variable updated from itself is not split (its values are not alternatives of one another)
    assert [v.text for v in s.functions["counter"].returns] == ["__unknown__"]


def test_a_kwargs_parameter_passed_on_holds_the_callers_keywords(tmp_path):
    """A helper that passes its `**kwargs` on as they came (pypots' `autocast(**kwargs)`, a
    version shim) returns what the caller's keywords make; unknown where it changes them, or
    where the caller passes a `**mapping`."""
    tree(tmp_path, {
        "pyproject.toml": "",
        "helpers.py": """
            import torch

            def autocast(**kwargs):
                return torch.autocast("cuda", **kwargs)

            def autocast_first(**kwargs):
                return torch.autocast(**kwargs, device_type="cuda")

            def autocast_default_dtype(**kwargs):
                kwargs.setdefault("dtype", torch.bfloat16)
                return torch.autocast("cuda", **kwargs)
            """,
        "train.py": """
            import torch
            from helpers import autocast, autocast_first, autocast_default_dtype

            a = autocast(enabled=flag, dtype=torch.bfloat16)
            b = autocast()
            c = autocast(**opts)
            d = autocast_first(enabled=False)
            e = autocast_first()
            f = autocast_default_dtype(enabled=True)
            """,
    })
    project = Project(tmp_path)
    s = project.summary(str(tmp_path / "helpers.py"))
    assert [v.text for v in s.functions["autocast"].returns] == ['torch.autocast("cuda", **__param__.kwargs)']
    assert [v.text for v in s.functions["autocast_first"].returns] == [
        'torch.autocast(**__param__.kwargs, device_type="cuda")']
    assert [v.text for v in s.functions["autocast_default_dtype"].returns] == ["__unknown__"]
    m = model_of(project, tmp_path / "train.py")
    found = {}
    for stmt in m.module.body:
        assign = stmt.body[0]
        if isinstance(assign, cst.Assign):
            found[assign.targets[0].target.value] = [cst.Module([]).code_for_node(v)
                                                     for v in m.possible_values(assign.value)]
    assert found == {
        "a": ['torch.autocast("cuda", enabled=flag, dtype=torch.bfloat16)'],
        "b": ['torch.autocast("cuda")'],
        "c": ["autocast(**opts)"],  # unknown: the call itself
        "d": ['torch.autocast(enabled=False, device_type="cuda")'],
        "e": ['torch.autocast(device_type="cuda")'],
        "f": ["autocast_default_dtype(enabled=True)"],
    }


def test_a_library_module_re_exported_by_a_project_module(tmp_path):
    """thinc's `from ..compat import torch`: the project module binds the name only by
    `import torch` (in a `try`, with `torch = None` in its `except`), so the name is torch's,
    through re-exports of the project's own too. A library's function re-exported, a name bound
    by two different imports, the project's own definitions: not a library name."""
    tree(tmp_path, {
        "pyproject.toml": "",
        "pkg/__init__.py": "from .compat import torch\n",
        "pkg/compat.py": """
            try:
                import torch
                import torch.utils.dlpack
            except ImportError:
                torch = None

            from torch.cuda.amp import autocast

            if torch is not None and hasattr(torch, "amp"):
                from torch.amp import GradScaler
            else:
                from torch.cuda.amp import GradScaler

            def helper():
                pass
            """,
        "pkg/shims/pytorch.py": "from ..compat import torch\n",
    })
    project = Project(tmp_path)
    shim = str(tmp_path / "pkg" / "shims" / "pytorch.py")
    assert project.library_name(shim, "..compat.torch") == "torch"
    assert project.library_name(shim, "..compat.torch.cuda.amp.autocast") == "torch.cuda.amp.autocast"
    assert project.library_name(shim, "pkg.torch") == "torch"  # through the package's re-export
    assert project.library_name(shim, "..compat.autocast") is None  # a function, its import's to report
    assert project.library_name(shim, "..compat.GradScaler") is None  # two different imports
    assert project.library_name(shim, "..compat.helper") is None  # the project's own
    assert project.library_name(shim, "..compat") is None  # a module of the project
    assert project.library_name(shim, "numpy.linalg") is None  # not the project's at all


def test_module_summary_constants_classes_options_and_calls(tmp_path):
    tree(tmp_path, {
        "pyproject.toml": "",
        "config.py": """
            import argparse
            from dataclasses import dataclass, field

            import torch

            PRECISION = "bf16"
            DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

            @dataclass
            class TrainConfig:
                precision: str = "fp16"
                amp: bool = field(default=True)

            def get_args():
                parser = argparse.ArgumentParser()
                parser.add_argument("--amp-dtype", default="bfloat16", choices=["bfloat16", "float16"])
                return parser.parse_args()
            """,
        "main.py": "from config import get_args\nfrom engine import train\n\ntrain(get_args(), lr=0.1)\n",
    })
    p = Project(tmp_path)
    s = p.summary(str(tmp_path / "config.py"))
    assert [v.text for v in s.constants["PRECISION"]] == ["'bf16'".replace("'", '"')]
    assert s.constants["DTYPES"][0].text == '{"bf16": torch.bfloat16, "fp16": torch.float16}'
    cfg = s.classes["TrainConfig"]
    assert [v.text for v in cfg.attributes["precision"]] == ['"fp16"'] and [v.text for v in cfg.attributes["amp"]] == ["True"]
    assert [v.text for v in s.functions["get_args"].options["amp_dtype"]] == ['"bfloat16"', '"bfloat16"', '"float16"']
    main = p.summary(str(tmp_path / "main.py"))
    (call,) = [c for c in main.calls if "train" in c.callee]
    assert call.callee == '__imported__("engine.train")' and call.keywords["lr"].text == "0.1"


def test_summary_json_round_trip_and_strict_reader(tmp_path):
    tree(tmp_path, {"pyproject.toml": "", "m.py": "import torch\n\ndef f(x, scaler):\n    scaler.scale(x).backward()\n"})
    s = Project(tmp_path).summary(str(tmp_path / "m.py"))
    raw = json.loads(s.dumps())
    assert ModuleSummary.from_json(raw) == s
    bad = json.loads(s.dumps())
    bad["functions"]["f"]["effects"][0]["line"] = "x"
    with pytest.raises((TypeError, ValueError, KeyError)):
        ModuleSummary.from_json(bad)
    with pytest.raises((TypeError, ValueError, KeyError)):
        ModuleSummary.from_json({"version": 999})


def test_a_summary_names_a_helpers_locals_the_same_in_every_process_and_apart_from_other_modules(tmp_path):
    # a local of a helper the summarised function runs is keyed `name@<number of that run>`; the
    # number is the summary's own (its module's path, content, and the order the runs are met),
    # not the id of a call node: the same summary in every process, so the cache keeps one, and
    # no `y@<id> is None` test that another module's summary could share once ids are reused
    import subprocess
    import sys

    helper = """\
        import torch

        from helpers import pad


        def _prepare(opt, x):
            y = x * 2
            pad(y)
            if y is None:
                opt.zero_grad()
            return y


        def step(scaler, opt, loss):
            scaler.scale(loss).backward()
            _prepare(opt, loss)
            scaler.step(opt)
            scaler.update()
        """
    tree(tmp_path, {"pyproject.toml": "", "helpers.py": "def pad(t):\n    return t\n", "a.py": helper, "b.py": helper})
    show = ("import re, sys; from pathlib import Path; from ampfix.project import Project; "
            "s = Project(Path(sys.argv[1])).summary(sys.argv[2]); "
            "print(s.dumps()); print(sorted(set(re.findall(r'\\w+@\\d+', s.dumps()))))")
    runs = [subprocess.run([sys.executable, "-c", show, str(tmp_path), str(tmp_path / name)], capture_output=True,
                           text=True, check=True).stdout.splitlines() for name in ("a.py", "a.py", "b.py")]
    assert runs[0] == runs[1]  # two processes, one summary
    (key_a,), (key_b,) = eval(runs[0][1]), eval(runs[2][1])
    assert key_a.startswith("y@") and key_b.startswith("y@") and key_a != key_b  # another module: another number
    # (and nothing else differs but the module's path)
    assert runs[0][0].replace(key_a, "KEY").replace(str(tmp_path / "a.py"), "PATH") \
        == runs[2][0].replace(key_b, "KEY").replace(str(tmp_path / "b.py"), "PATH")


def test_a_summarys_json_is_what_dataclasses_asdict_gives(tmp_path):
    # `ModuleSummary.to_json` walks the summary itself (asdict's deep copy of every leaf took 86 ms
    # on a large module): the same values, on every part a summary has, the fixtures' projects
    # included (effects with contexts, arguments and frames, checkpoints, options, classes)
    from dataclasses import asdict

    seen = 0
    fixtures = Path(__file__).resolve().parent.parent / "fixtures"
    for folder in [*sorted((fixtures / "projects").glob("*/")), fixtures / "train", fixtures / "rules"]:
        project = Project(folder)
        for path in sorted(folder.rglob("*.py")):
            s = project.summary(str(path))
            if s is None:
                continue
            seen += 1
            assert s.to_json() == asdict(s) and s.dumps() == json.dumps(asdict(s), separators=(",", ":")), path
            assert ModuleSummary.from_json(s.to_json()) == s
    assert seen > 50


class MemoryStore:
    def __init__(self):
        self.data = {}

    def get(self, path, digest):
        return self.data.get((path, digest))

    def put(self, path, digest, summary):  # (None: the module cannot be summarised)
        self.data[(path, digest)] = UNREADABLE if summary is None else summary


def test_summaries_come_from_the_store_without_a_parse(tmp_path):
    tree(tmp_path, {"pyproject.toml": "", "m.py": "def f(scaler, loss):\n    scaler.scale(loss).backward()\n"})
    store = MemoryStore()
    first = Project(tmp_path, store=store)
    s1 = first.summary(str(tmp_path / "m.py"))
    assert first.parsed == [str(tmp_path / "m.py")] and store.data
    second = Project(tmp_path, store=store)
    assert second.summary(str(tmp_path / "m.py")) == s1 and second.parsed == []
    (tmp_path / "m.py").write_text("def f():\n    pass\n")  # changed: a new digest, a new parse
    third = Project(tmp_path, store=store)
    assert third.summary(str(tmp_path / "m.py")).functions["f"].effects == [] and third.parsed


def test_a_summary_asked_deep_in_a_query_is_the_same_as_from_the_top(tmp_path):
    """A summary asked at the bottom of a deep query (the recursion limit nearly reached) is
    computed on a fresh stack: it does not end in a RecursionError that a shallower caller
    would not meet, which the store would keep as "unreadable" for that content, for every
    later run. Asked with 10 to 200 frames left: each call either stops before it reaches the
    summary (a RecursionError of the query itself) or gives the real summary."""
    import inspect
    import sys

    tree(tmp_path, {"pyproject.toml": "", "m.py": "def f(scaler, loss):\n    scaler.scale(loss).backward()\n"})
    store = MemoryStore()
    expected = Project(tmp_path).summary(str(tmp_path / "m.py"))
    reached = 0
    for left in range(10, 200, 5):
        project = Project(tmp_path, store=store)

        def deep(n):
            return deep(n + 1) if n < sys.getrecursionlimit() - left else project.summary(str(tmp_path / "m.py"))

        try:
            summary = deep(len(inspect.stack()))
        except RecursionError:
            continue
        reached += 1
        assert summary == expected, left
        assert not any(v is UNREADABLE for v in store.data.values()), left
    assert reached


def test_a_module_offered_by_the_engine_is_not_parsed_again(tmp_path):
    tree(tmp_path, {"pyproject.toml": "", "m.py": "def f():\n    pass\n"})
    p = Project(tmp_path)
    text = (tmp_path / "m.py").read_text()
    p.offer(str(tmp_path / "m.py"), text, cst.parse_module(text))
    assert p.summary(str(tmp_path / "m.py")) is not None and p.parsed == []


def test_an_unparsable_module_is_unknown(tmp_path):
    tree(tmp_path, {"pyproject.toml": "", "bad.py": "def (:\n", "t.py": "from bad import f\n"})
    p = Project(tmp_path)
    assert p.summary(str(tmp_path / "bad.py")) is None
    assert p.resolve(str(tmp_path / "t.py"), "bad.f") is None


def test_import_lines_are_read_without_a_parse():
    text = "import a.b as c, d\nfrom . import x\nfrom ..pkg import (y,\n    z as w)\nfrom m import *\n"
    assert set(import_lines(text)) >= {"a.b", "d", ".x", "..pkg.y", "..pkg.z", "m"}


def test_callers_in_other_modules_bind_arguments(tmp_path):
    tree(tmp_path, {
        "pyproject.toml": "",
        "engine.py": "def train(model, scaler):\n    scaler.step(model)\n",
        "main.py": "import torch\nfrom engine import train\n\ntrain(None, torch.amp.GradScaler('cuda', enabled=False))\n",
    })
    p = Project(tmp_path)
    m = model_of(p, tmp_path / "engine.py")
    func = m.functions["train"][0]
    (value,) = m.foreign_argument_values(func, "scaler")
    assert m.is_synthetic(value) and m.built_disabled(value)


def test_an_apex_migration_is_project_wide_or_not_applied(tmp_path):
    """A module migrated to native AMP while a module it imports still calls apex amp would lose
    fp16 training there (nothing initialises apex any more): the migration is refused with the
    other module named; an unrelated script using apex on its own does not stop it."""
    from conftest import FIXTURES, run_ampfix

    script = (FIXTURES / "rules" / "AMP102" / "bad_basic.py").read_text()
    script = script.replace("from apex import amp\n", "from apex import amp\n\nimport hooks\n", 1)
    hook = "from apex import amp\n\n\ndef backward(loss, optimizer):\n" \
           "    with amp.scale_loss(loss, optimizer) as scaled:\n        scaled.backward()\n"
    tree(tmp_path, {"pyproject.toml": "", "train.py": script, "hooks.py": hook})
    run_ampfix("rewrite", "--preview", "--unsafe-fixes", "--no-cache", "train.py", cwd=tmp_path)
    assert (tmp_path / "train.py").read_text() == script
    check = run_ampfix("check", "--preview", "--no-cache", "--output-format", "full", "train.py", cwd=tmp_path)
    shown = check.stdout.decode() if isinstance(check.stdout, bytes) else check.stdout
    assert "apex amp is also used in hooks.py:5" in shown, shown
    # the same apex helper in a script train.py does not import: independent of it
    (tmp_path / "hooks.py").write_text("def backward(loss, optimizer):\n    loss.backward()\n")
    (tmp_path / "other_example.py").write_text(hook)
    run_ampfix("rewrite", "--preview", "--unsafe-fixes", "--no-cache", "train.py", cwd=tmp_path)
    assert "GradScaler" in (tmp_path / "train.py").read_text()


# ---------------------------------------------------------------------- reading texts before summaries


def test_reach_text_is_the_code_the_file_uses_not_whole_modules(tmp_path):
    tree(tmp_path, {
        "pyproject.toml": "",
        "pkg/__init__.py": "from .steps import backward_step, evaluate\nfrom .base import Base\n",
        "pkg/steps.py": """\
            def backward_step(loss):
                helper(loss)

            def helper(loss):
                loss.backward()

            def evaluate(model):
                with torch.autocast("cuda"):
                    return model()
            """,
        "pkg/base.py": """\
            class Base:
                def fit(self):
                    self.scaler.step(self.opt)
            """,
        "pkg/models.py": """\
            from .base import Base
            class Net(Base):
                def forward(self):
                    return 1
            """,
        "train.py": """\
            from pkg import backward_step
            from pkg.models import Net
            net = Net()
            """,
    })
    project = Project(tmp_path)
    reach = project.reach_text(str(tmp_path / "train.py"))
    assert "loss.backward()" in reach  # backward_step -> helper, through the package's re-export
    assert "self.scaler.step" in reach  # Net -> its base class of another (related) module
    assert "autocast" not in reach  # `evaluate` is in a module the file uses, but it does not call it
    assert "autocast" in project.related_text(str(tmp_path / "train.py"))
    # the module that imports a file: only its code that uses the file's names
    steps = project.reach_text(str(tmp_path / "pkg" / "base.py"))
    assert "class Net(Base)" in steps and "backward_step" not in steps

    # the memoised bound (`reach_words`) never holds fewer of the words than reach_text
    words = ("autocast", "backward", "scaler", "GradScaler", "Net")
    for name in ("train.py", "pkg/base.py", "pkg/models.py", "pkg/steps.py"):
        path = str(tmp_path / name)
        held, _ = project.reach_words(path, words, ())
        assert {w for w in words if w in project.reach_text(path)} <= held, name
    held, _ = project.reach_words(str(tmp_path / "train.py"), words, ())
    assert "backward" in held and "autocast" not in held  # as narrow as the code used, here
    # nor does the related modules' bound (`reach_bound`), which holds all of their strings
    for name in ("train.py", "pkg/base.py", "pkg/models.py", "pkg/steps.py"):
        path = str(tmp_path / name)
        held, _ = project.reach_bound(path, words, ())
        assert {w for w in words if w in project.reach_text(path)} <= held, name
    assert "autocast" in project.reach_bound(str(tmp_path / "train.py"), words, ())[0]


def test_reach_text_reads_the_importers_code_that_uses_the_files_names_only(tmp_path):
    # an importer's mention of a name it imports from the file (`backward_step(...)`) brings the
    # function around it into the file's reach; the same letters as an attribute of another
    # object (`runner.backward_step`), inside a longer name (`my_backward_step`) or in the import
    # itself do not
    tree(tmp_path, {
        "pyproject.toml": "",
        "steps.py": "def backward_step(loss):\n    loss.backward()\n",
        "train.py": """\
            from steps import backward_step

            def fit(loss):
                backward_step(loss)
                amp_marker_fit = 1

            def attribute(runner, loss):
                runner.backward_step(loss)
                amp_marker_attribute = 1

            def longer(loss):
                my_backward_step(loss)
                amp_marker_longer = 1
            """,
    })
    reach = Project(tmp_path).reach_text(str(tmp_path / "steps.py"))
    assert "amp_marker_fit" in reach
    assert "amp_marker_attribute" not in reach and "amp_marker_longer" not in reach


def test_reach_text_holds_what_the_imports_of_the_names_the_reached_code_uses_name(tmp_path):
    # a reached definition's `ac()` and an importer's `with region(...)` say what they are only
    # by the top-level import that binds the name (an alias of autocast): the reach reads what
    # that import names (`Project._import_pieces_of`: module, name, alias), for that name only
    # (not the other names of the same statement), and not an import written in a docstring
    tree(tmp_path, {
        "pyproject.toml": "",
        "helpers.py": """\
            \"\"\"Helpers.
            from torch import autocast as fake
            \"\"\"
            from torch.cuda.amp import autocast as ac, custom_fwd
            from contextlib import nullcontext as quiet
            import numpy as np

            def amp_ctx():
                return ac()

            def plain_ctx():
                return quiet(custom_fwd, np.ac, fake())
            """,
        "steps.py": "def train_step(model, x):\n    loss = model(x).sum()\n    loss.backward()\n",
        "run.py": """\
            from torch import autocast as region
            from steps import train_step

            def fit(model, x):
                with region("cuda"):
                    train_step(model, x)
            """,
        "train.py": "from helpers import amp_ctx\n\ndef fit(loss):\n    with amp_ctx():\n        loss.backward()\n",
        "twin.py": "from helpers import plain_ctx\n\ndef fit(loss):\n    with plain_ctx():\n        loss.backward()\n",
    })
    project = Project(tmp_path)
    reach = project.reach_text(str(tmp_path / "train.py"))
    assert "torch.cuda.amp\nautocast\nac" in reach, reach
    assert "custom_fwd" not in reach and "nullcontext" not in reach and "numpy" not in reach, reach
    twin = project.reach_text(str(tmp_path / "twin.py"))  # `np.ac` is an attribute, not the alias
    assert "contextlib\nnullcontext\nquiet" in twin and "torch.cuda.amp\ncustom_fwd" in twin, twin
    assert "numpy\nnp" in twin and "autocast" not in twin, twin
    assert "torch\nautocast\nregion" in project.reach_text(str(tmp_path / "steps.py"))
    words = ("autocast", "backward", "nullcontext", "numpy", "custom_fwd")
    for name in ("train.py", "twin.py", "steps.py", "run.py", "helpers.py"):
        path = str(tmp_path / name)
        text = project.reach_text(path)
        held = project.reach_held(path, words, ())
        assert held is None or {w for w in words if w in text} == held[0], name
        for bound in (project.reach_words(path, words, ()), project.reach_bound(path, words, ())):
            assert bound is None or {w for w in words if w in text} <= bound[0], name


# a helper whose trigger view (an autocast query and a region turned off, removed) holds strings
# its text does not: `.half()`, `torch.half`
_VIEW_STEP = """\
import torch

def step(model, x):
    y = model(x).half(is_autocast_enabled)
    return torch.autocast("cuda", enabled=False)half(y)
"""


def test_reach_bound_holds_what_the_trigger_view_makes(tmp_path):
    # the trigger view removes an autocast query and an autocast region turned off: what is
    # left may hold a string the module's text does not (`.half()`, `torch.half`), which
    # `reach_held` reads; the related modules' bound (`reach_bound`) holds it all the same
    tree(tmp_path, {
        "pyproject.toml": "",
        "pkg/__init__.py": "",
        "pkg/steps.py": _VIEW_STEP + "\nz = 1\n# a comment line\n",
        "train.py": """\
            from pkg.steps import step

            def train(model, x):
                return step(model, x)
            """,
    })
    words = (".half()", "torch.half", "autocast", "backward", "z = 1")
    project = Project(tmp_path)
    path = str(tmp_path / "train.py")
    reach, _ = project.reach_held(path, words, ())
    assert {".half()", "torch.half"} <= reach and "autocast" not in reach
    assert not {".half()", "torch.half"} & {w for w in words if w in (tmp_path / "pkg" / "steps.py").read_text()}
    held, _ = project.reach_bound(path, words, ())
    assert reach <= held and "z = 1" in held and "backward" not in held
    # a module with no autocast in it: the strings of its text (its parts are pieces of it)
    lower = ("z = 1", "step(")
    assert project.reach_bound(str(tmp_path / "pkg" / "steps.py"), lower, ())[0] == {"step("}


def test_a_module_whose_view_only_masks_is_bounded_by_its_text(tmp_path):
    # `enabled` with an autocast setting's name (peft's `autocast_adapter_dtype`) but no
    # `autocast(`: nothing the view removes, so the module's text bounds every part
    # (`_text_words`' third element); with `autocast(` and `enabled` it may not
    from ampfix.project.project import _AUTOCAST_OFF, trigger_view

    settings = "def wrap(model, autocast_adapter_dtype=True, enabled=True):\n    return model\n"
    region = "def run(model, x):\n    with torch.autocast('cuda', enabled=False):\n        return model(x)\n"
    tree(tmp_path, {"pyproject.toml": "", "settings.py": settings, "region.py": region})
    project = Project(tmp_path)
    words = ("autocast", "enabled")
    assert project._text_words(str(tmp_path / "settings.py"), words, ())[2] is False
    assert project._text_words(str(tmp_path / "region.py"), words, ())[2] is True
    assert trigger_view(settings).replace("~", "") == settings.replace("autocast_adapter_dtype", "")
    assert not _AUTOCAST_OFF.search(settings) and _AUTOCAST_OFF.search(region)


def test_a_part_is_read_for_the_strings_its_module_holds_with_the_same_answer(tmp_path):
    # `_held_by` scans a part of a module only for the strings the module's whole text holds
    # (`_text_words`), and reads the trigger view for all of them where the view may join what
    # was apart: the same strings as a scan of the part for every one
    from ampfix.project.project import _words_in

    tree(tmp_path, {
        "pyproject.toml": "",
        "pkg/__init__.py": "",
        "pkg/steps.py": _VIEW_STEP + """
class Runner:
    def run(self, scaler, loss):
        scaler.scale(loss).backward()  # GradScaler

z = 1
# a comment line: backward
""",
        "pkg/plain.py": "def f(scaler):\n    # scaler.step(opt)\n    return scaler\nZ = 2\n",
    })
    sets = [((".half()", "torch.half", "autocast", "backward", "z = 1"), ()),
            (("backward", "GradScaler", "nothing"), ("scaler", "gradscaler")),
            (("scaler.step", "return scaler", "Z = 2"), ("z = 2",))]
    for words, lower in sets:
        project = Project(tmp_path)
        for name in ("pkg/steps.py", "pkg/plain.py"):
            path = str(tmp_path / name)
            keys = [path, (path, None), *((path, q) for q in project._def_spans(path))]
            for key in keys:
                assert project._held_by([key], words, lower) == _words_in(project._key_code(key), words, lower), key


def test_text_mro_and_methods_without_a_summary(tmp_path):
    tree(tmp_path, {
        "pyproject.toml": "",
        "pkg/__init__.py": "",
        "pkg/base.py": """\
            import torch
            class Base(torch.nn.Module):
                def __init__(self, dim, dtype=None):
                    self.dim = dim
            class WithScaler:
                def __init__(self):
                    self.scaler = torch.amp.GradScaler()
            """,
        "pkg/layers.py": """\
            from .base import Base, WithScaler
            from .other import *
            class Layer(Base):
                pass
            class Trainer(WithScaler):
                pass
            class Starred(Unknown):
                pass
            class Generic(Base[int]):
                pass
            """,
        "pkg/other.py": "class Unknown: pass\n",
    })
    project = Project(tmp_path)
    layers = project.module(str(tmp_path / "pkg" / "layers.py"))
    layer = ForeignClass(layers, "Layer")
    assert [c.qual for c in project.text_mro(layer)] == ["Layer", "Base"]
    assert project.lacks_relevant_method(layer, "__init__")  # `dtype=` alone is not AMP code
    assert project.lacks_relevant_attributes(layer) and project.lacks_relevant_classes(layer)
    trainer = ForeignClass(layers, "Trainer")
    assert not project.lacks_relevant_classes(trainer)  # its base builds a GradScaler
    assert not project.lacks_relevant_method(trainer, "__init__")  # builds a GradScaler
    assert not project.lacks_relevant_attributes(trainer)
    assert project.text_mro(ForeignClass(layers, "Starred")) is None  # a star import may bind the base
    assert project.text_mro(ForeignClass(layers, "Generic")) is None  # not a plain name: not sure
    assert project.parsed == []  # all of it read from the texts


def test_amp_words_in_docstrings_and_comments_make_nothing_relevant(tmp_path):
    """A class or function whose only AMP word is in a docstring or a comment ("optimization",
    "# optimizer") holds no AMP code: its module is not parsed for its attributes or effects
    (timm's `Eva`, read for one attribute because its docstring says "optimization"). A string
    in code counts (`getattr(torch, "float16")` chooses a dtype), and so does a span that does
    not lex."""
    from ampfix.model.summarize import AMP_TEXT
    from ampfix.project.project import _in_code

    tree(tmp_path, {
        "pyproject.toml": "",
        "models.py": """\
            import torch


            class Eva(torch.nn.Module):
                '''A vision transformer.'''

                def __init__(self, dim):
                    self.dim = dim  # the optimizer sees these

                def group_matcher(self):
                    '''Create layer groupings for optimization.'''
                    return {"stem": r"^cls_token"}


            class Cast(torch.nn.Module):
                def __init__(self):
                    self.dtype = getattr(torch, "float16")


            def helper(x):
                '''Runs after `optimizer.step()`.'''
                return x
            """,
    })
    project = Project(tmp_path)
    models = project.module(str(tmp_path / "models.py"))
    eva = ForeignClass(models, "Eva")
    assert not project.relevant(eva) and project.lacks_relevant_attributes(eva)
    assert not project.relevant_to_traces(ForeignFunction(models, "helper"))
    assert project.relevant(ForeignClass(models, "Cast"))
    assert project.parsed == []  # all of it read from the text
    assert not _in_code(AMP_TEXT, "x = 1  # optimizer\n", 0, 19)
    assert _in_code(AMP_TEXT, "s = '# a'; opt.step()\n", 0, 22)  # a `#` in a string starts no comment
    unlexed = "x = 'unclosed\n# optimizer\n"
    assert _in_code(AMP_TEXT, unlexed, 0, len(unlexed))  # does not lex: counted


def test_a_class_is_taken_for_a_dataclass_by_its_own_decorators(tmp_path):
    """A class whose instances' attributes are asked for is read from its module's summary when
    it may be a dataclass (its fields are the constructor's parameters): when its decorators
    mention `dataclass`, not when the module only imports `pkg.dataclasses` (accelerate's
    `RegressionModel`, whose module was parsed for that word)."""
    tree(tmp_path, {
        "pyproject.toml": "",
        "pkg/__init__.py": "",
        "pkg/dataclasses.py": "class Kind:\n    pass\n",
        "pkg/models.py": """\
            import dataclasses

            import torch

            from pkg.dataclasses import Kind


            class Regression(torch.nn.Module):
                def __init__(self, a=0):
                    self.a = a


            @dataclasses.dataclass(
                frozen=True,
            )
            # the configuration
            class Config:
                lr: float = 1e-3
            """,
    })
    project = Project(tmp_path)
    models = project.module(str(tmp_path / "pkg" / "models.py"))
    assert project.lacks_relevant_attributes(ForeignClass(models, "Regression"))
    assert not project.lacks_relevant_attributes(ForeignClass(models, "Config"))
    assert project.parsed == []


def test_a_cached_result_follows_the_code_the_file_reaches(tmp_path):
    # train.py alone holds no `backward`: AMP001 runs on it only through the helper it calls.
    # Checked once (helper without backward: nothing), then the helper gains one: the cached
    # result of train.py depends on the helper, so the finding appears, as without a cache.
    from conftest import run_ampfix

    tree(tmp_path, {
        "pyproject.toml": "",
        "pkg/__init__.py": "",
        "pkg/helpers.py": "def do_step(loss):\n    return loss\n",
        "pkg/other.py": "from pkg.helpers import do_step\n\ndef unrelated(x):\n    return do_step(x)\n",
        "train.py": """\
            import torch
            from pkg.helpers import do_step

            def train(model, opt, data):
                for x in data:
                    with torch.autocast("cuda"):
                        loss = model(x).sum()
                        do_step(loss)
                    opt.step()
            """,
    })
    env = {"AMPFIX_CACHE_DIR": str(tmp_path / "cache")}
    first = run_ampfix("check", "-q", "pkg/other.py", "train.py", cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stdout.decode() + first.stderr.decode()
    (tmp_path / "pkg" / "helpers.py").write_text("def do_step(loss):\n    loss.backward()\n")
    again = run_ampfix("check", "-q", "pkg/other.py", "train.py", cwd=tmp_path, env=env)
    fresh = run_ampfix("check", "-q", "--no-cache", "pkg/other.py", "train.py", cwd=tmp_path)
    assert again.returncode == 1 and "train.py:8:13: AMP001" in again.stdout.decode()
    assert again.stdout == fresh.stdout


STEP = "def step(loss, opt, scaler):\n    loss.backward()\n    scaler.step(opt)\n    scaler.update()\n"
TRAIN = """\
    import torch
    from pkg.steps import step


    def main(model, opt, data):
        scaler = torch.amp.GradScaler("cuda")
        for x in data:
            with torch.autocast("cuda"):
                loss = model(x).sum()
            step(loss, opt, scaler)
    """


@pytest.mark.parametrize("importer", ["train.py", "other.py"])
def test_a_cached_result_follows_the_files_that_import_it(tmp_path, importer):
    # pkg/steps.py alone holds no GradScaler: AMP008 runs on it only through the code of a
    # module that imports it, and reports the unscaled backward in pkg/steps.py itself. Checked
    # once with no importer (nothing), then a new file (or an unrelated one, edited) imports it:
    # the cached result of pkg/steps.py depends on its importers, so the finding appears, as
    # without a cache.
    from conftest import run_ampfix

    tree(tmp_path, {"pyproject.toml": "", "pkg/__init__.py": "", "pkg/steps.py": STEP,
                    "other.py": "def unrelated(x):\n    return x\n"})
    env = {"AMPFIX_CACHE_DIR": str(tmp_path / "cache")}
    first = run_ampfix("check", "-q", ".", cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stdout.decode() + first.stderr.decode()
    (tmp_path / importer).write_text(textwrap.dedent(TRAIN), encoding="utf-8")
    again = run_ampfix("check", "-q", ".", cwd=tmp_path, env=env)
    fresh = run_ampfix("check", "-q", "--no-cache", ".", cwd=tmp_path)
    assert "pkg/steps.py:2:5: AMP008" in fresh.stdout.decode()
    assert (again.returncode, again.stdout) == (fresh.returncode, fresh.stdout)
    warm = run_ampfix("check", "-q", ".", cwd=tmp_path, env=env)  # and kept so
    assert (warm.returncode, warm.stdout) == (fresh.returncode, fresh.stdout)


def test_the_import_graph_finds_importers_through_a_package_re_export(tmp_path):
    from ampfix.project.graph import ImportGraph, importers_dep

    tree(tmp_path, {
        "pyproject.toml": "",
        "pkg/__init__.py": "from .steps import step\n",
        "pkg/steps.py": "def step(loss):\n    loss.backward()\n",
        "train.py": "from pkg import step\n",
        "pkg/direct.py": "from . import steps\n",
        "build/ignored.py": "from pkg.steps import step\n",
    })
    steps = str(tmp_path / "pkg" / "steps.py")
    graph = ImportGraph(tmp_path)
    assert sorted(graph.importers_of(steps)) == [str(tmp_path / "pkg" / "__init__.py"),
                                                 str(tmp_path / "pkg" / "direct.py"), str(tmp_path / "train.py")]
    before = graph.importers_digest(steps)
    assert before == ImportGraph(tmp_path).importers_digest(steps)  # a digest of the files, not of a run
    stamp = graph.stamp()
    (tmp_path / "eval.py").write_text("import pkg.steps\n")
    assert ImportGraph(tmp_path).importers_digest(steps) != before
    assert ImportGraph(tmp_path).stamp() != stamp  # the cache keeps the digests under it
    # the project asks the same graph, and records the question as a dependency of the result
    project = Project(tmp_path)
    project.begin()
    assert project.importers_of(steps) == ImportGraph(tmp_path).importers_of(steps)
    texts, graph_deps = project.end()
    assert graph_deps == {importers_dep(steps): ImportGraph(tmp_path).importers_digest(steps)}


SCALED_STEPS = """\
    import torch


    def make_scaler():
        return torch.amp.GradScaler("cuda")


    def train_one_epoch(model, optimizer, loader, scaler):
        for x, y in loader:
            with torch.autocast("cuda", dtype=torch.float16):
                loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
    """
CALLER = """\
    import torch

    from pkg.steps import train_one_epoch


    def main(model, loader, epochs):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler("cuda")
        for _ in range(epochs):
            train_one_epoch(model, optimizer, loader, scaler)
    """


@pytest.mark.parametrize("before", [None, "from pkg.steps import train_one_epoch\n\n\ndef main(model):\n    return model\n"])
def test_a_cached_result_follows_the_files_that_call_its_functions(tmp_path, before):
    # pkg/steps.py names a GradScaler itself, so AMP008 runs on it with no other module read
    # (no importers asked); what its `scaler` parameter holds comes from the callers of
    # train_one_epoch (`Project.callers`). A new file calling it, or an importer that starts
    # calling it, changes the finding: the cached result depends on the callers' text scan.
    from conftest import run_ampfix

    files = {"pyproject.toml": "", "pkg/__init__.py": "", "pkg/steps.py": SCALED_STEPS}
    if before is not None:
        files["main.py"] = before
    tree(tmp_path, files)
    env = {"AMPFIX_CACHE_DIR": str(tmp_path / "cache")}
    args = ("check", "-q", "--select", "AMP008", ".")
    first = run_ampfix(*args, cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stdout.decode() + first.stderr.decode()
    (tmp_path / "main.py").write_text(textwrap.dedent(CALLER), encoding="utf-8")
    again = run_ampfix(*args, cwd=tmp_path, env=env)
    fresh = run_ampfix(*args[:-1], "--no-cache", ".", cwd=tmp_path)
    assert "pkg/steps.py:12:9: AMP008" in fresh.stdout.decode()
    assert (again.returncode, again.stdout) == (fresh.returncode, fresh.stdout)
    warm = run_ampfix(*args, cwd=tmp_path, env=env)  # and kept so
    assert (warm.returncode, warm.stdout) == (fresh.returncode, fresh.stdout)
    (tmp_path / "main.py").unlink()  # and gone again
    gone = run_ampfix(*args, cwd=tmp_path, env=env)
    assert (gone.returncode, gone.stdout) == (0, b"")


def test_a_cached_result_follows_what_its_imports_resolve_to(tmp_path):
    # train.py imports pkg.helpers before the module exists (unresolved: nothing known of
    # backward_step); once pkg/helpers.py is written, the call runs a backward inside the
    # autocast region (AMP001 in train.py). train.py did not change, nor did the set of
    # files importing it: its cached result depends on what its imports resolve to.
    from conftest import run_ampfix

    tree(tmp_path, {"pyproject.toml": "", "pkg/__init__.py": "", "train.py": HELPER_CALLER})
    env = {"AMPFIX_CACHE_DIR": str(tmp_path / "cache")}
    first = run_ampfix("check", "-q", ".", cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stdout.decode() + first.stderr.decode()
    (tmp_path / "pkg" / "helpers.py").write_text("def backward_step(loss, scaler):\n"
                                                 "    scaler.scale(loss).backward()\n", encoding="utf-8")
    again = run_ampfix("check", "-q", ".", cwd=tmp_path, env=env)
    fresh = run_ampfix("check", "-q", "--no-cache", ".", cwd=tmp_path)
    assert "train.py:12:17: AMP001" in fresh.stdout.decode()
    assert (again.returncode, again.stdout) == (fresh.returncode, fresh.stdout)
    warm = run_ampfix("check", "-q", ".", cwd=tmp_path, env=env)
    assert (warm.returncode, warm.stdout) == (fresh.returncode, fresh.stdout)
    (tmp_path / "pkg" / "helpers.py").unlink()  # unresolved again: the finding goes
    gone = run_ampfix("check", "-q", ".", cwd=tmp_path, env=env)
    assert (gone.returncode, gone.stdout) == (0, b"")


def test_the_graph_scans_for_callers_and_resolves_imports(tmp_path):
    from ampfix.project.graph import (ImportGraph, callers_dep, digest_of_paths, imports_dep,
                                      split_dep)

    tree(tmp_path, {
        "pyproject.toml": "",
        "pkg/__init__.py": "",
        "pkg/steps.py": "def step(loss):\n    loss.backward()\n",
        "train.py": "from pkg.steps import step\nfrom pkg.helpers import clip\n\nstep(loss)\n",
        "note.py": "# step( is documented in the steps module\n",
        "other.py": "step(1)\n",  # no `steps` in it: not a candidate
        "build/ignored.py": "from pkg import steps\nsteps.step(1)\n",
    })
    steps = str(tmp_path / "pkg" / "steps.py")
    train = str(tmp_path / "train.py")
    graph = ImportGraph(tmp_path)
    # the text scan, before any parse: the file holds `step(` and the module's name
    assert graph.caller_candidates(steps, "step") == [str(tmp_path / "note.py"), train]
    assert graph.callers_digest(steps, "step") == digest_of_paths([str(tmp_path / "note.py"), train])
    assert split_dep(callers_dep(steps, "step")) == ("callers:", steps, "step")
    assert split_dep(callers_dep("/a:b/c.py", "f")) == ("callers:", "/a:b/c.py", "f")
    assert split_dep(imports_dep(train)) == ("imports:", train, None)
    assert split_dep(steps) is None  # a module's content
    # what the import lines of train.py resolve to: pkg.helpers does not exist yet
    before = graph.imports_digest(train)
    init = str(tmp_path / "pkg" / "__init__.py")
    assert graph.resolved_imports(train) == [f"pkg.helpers\t{init}\thelpers", "pkg.helpers.clip\t?",
                                             f"pkg.steps\t{steps}", f"pkg.steps.step\t{steps}\tstep"]
    (tmp_path / "pkg" / "helpers.py").write_text("def clip(x):\n    return x\n")
    clear_caches()
    after = ImportGraph(tmp_path)
    assert after.imports_digest(train) != before
    assert after.direct_imports(train) == [steps, str(tmp_path / "pkg" / "helpers.py")]
    digests = after.digests()  # what the cache keeps under the stamp: importers and imports
    assert digests[imports_dep(train)] == after.imports_digest(train)
    assert digests["importers:" + steps] == after.importers_digest(steps)
    # a new caller changes the scan's digest
    (tmp_path / "eval.py").write_text("from pkg import steps\nsteps.step(x)\n")
    assert ImportGraph(tmp_path).callers_digest(steps, "step") != graph.callers_digest(steps, "step")
    # the project asks the same scan, and records the question and the imports it read
    project = Project(tmp_path)
    project.begin()
    project.callers(steps, "step")
    project.resolve(train, "pkg.helpers.clip")
    texts, graph_deps = project.end()
    fresh = ImportGraph(tmp_path)
    evaluate = str(tmp_path / "eval.py")  # its call was resolved, through its imports
    assert graph_deps == {callers_dep(steps, "step"): fresh.callers_digest(steps, "step"),
                          imports_dep(train): fresh.imports_digest(train),
                          imports_dep(evaluate): fresh.imports_digest(evaluate)}
    assert {evaluate, train} <= set(texts)  # the callers the scan selected


def test_pool_workers_share_summaries_when_the_run_keeps_none(tmp_path):
    # `--no-cache -j N`: the workers keep the summaries in the pool's own folder, so a module one
    # of them summarised is read by the others; a run with a cache keeps its own store.
    from ampfix.engine.results import Settings
    from ampfix.engine.runner import _sharing

    from ampfix.engine.analyze import close_projects, project_for
    from ampfix.engine.cache import Summaries
    from ampfix.engine.share import SharedSummaries

    job = ("a.py", ("AMP001",), Settings(project=True), False, b"")
    shared = _sharing(job, str(tmp_path))
    assert shared[2].share_folder == str(tmp_path / "summaries") and shared[2].project
    assert shared[2].cache_folder is None  # not a cache: nothing of it outlives the run
    kept = ("a.py", ("AMP001",), Settings(project=True, cache_folder="/c"), False, b"")
    assert _sharing(kept, str(tmp_path)) is kept
    alone = ("a.py", ("AMP001",), Settings(project=False), False, b"")
    assert _sharing(alone, str(tmp_path)) is alone
    tree(tmp_path, {"pyproject.toml": "", "a.py": ""})
    try:
        assert isinstance(project_for(str(tmp_path / "a.py"), shared[2]).store, SharedSummaries)
        assert isinstance(project_for(str(tmp_path / "a.py"), kept[2]).store, Summaries)
        assert project_for(str(tmp_path / "a.py"), Settings(project=True)).store is None
    finally:
        close_projects()


def _helper_clip_jobs(folder):
    """fixtures/projects/bad_helper_clip copied into `folder`, and the pool's jobs checking its
    `train.py` (first) and `utils.py` for AMP003 with the project read."""
    from ampfix.engine.results import Settings

    for f in (Path(__file__).resolve().parent.parent / "fixtures" / "projects" / "bad_helper_clip").iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    settings = Settings(project=True)
    return [(i, (str(folder / name), ("AMP003",), settings, False, (folder / name).read_bytes()))
            for i, name in enumerate(["train.py", "utils.py"])]


def _claimed_run(tmp_path, monkeypatch, n):
    """fixtures/projects/bad_helper_clip checked for AMP003 by a pool of `n` workers, `train.py`
    first (its analysis reads `utils.py`'s summary), every parse of the workers logged:
    (results, "file:why" of each parse). The job of `utils.py` starts only once `utils.py` is
    claimed (or after 10 s): another worker is then still busy with `train.py`."""
    import time

    import ampfix.engine.analyze as analyze
    from ampfix.engine import share
    from ampfix.engine.runner import _pool

    real_take = share.Claims.take

    def held(self, index):  # inherited by the pool's forks
        if index == 1 and sys._getframe(1).f_code.co_name == "_marked_work":  # the job's start
            deadline = time.monotonic() + 10
            while not self.claimed(1) and time.monotonic() < deadline:
                time.sleep(0.01)
        return real_take(self, index)

    monkeypatch.setattr(share.Claims, "take", held)

    jobs = _helper_clip_jobs(tmp_path)
    log = tmp_path / "parses.log"
    real = analyze.parse_module

    def logged(text, *args, **kwargs):  # inherited by the pool's forks
        frame, why = sys._getframe(1), "analysis"
        while frame is not None:
            why = "summary" if frame.f_code.co_name == "_summarize" else why
            frame = frame.f_back
        with open(log, "a") as fh:
            fh.write(("train.py" if "def train" in text else "utils.py") + f":{why}\n")
        return real(text, *args, **kwargs)

    monkeypatch.setattr(analyze, "parse_module", logged)
    results: dict = {}
    _pool(jobs, n, results)
    return results, sorted(log.read_text().split())


def test_a_module_a_worker_parsed_for_its_summary_is_analysed_by_that_worker_not_parsed_again(tmp_path, monkeypatch):
    # issue 17: no module parsed twice in a run. One worker analyses `train.py`, which needs
    # `utils.py`'s summary: the worker claims `utils.py` (`share.Claims`) before it parses it,
    # analyses it after `train.py` with that parse, and leaves its job when it comes. The
    # results are those of the files checked one by one.
    from ampfix.engine.analyze import close_projects
    from ampfix.engine.runner import _work

    from ampfix.engine.results import Settings

    results, parsed = _claimed_run(tmp_path, monkeypatch, 2)
    assert parsed == ["train.py:analysis", "utils.py:summary"]
    try:
        alone = {i: _work((str(tmp_path / name), ("AMP003",), Settings(project=True), False, (tmp_path / name).read_bytes()))
                 for i, name in enumerate(["train.py", "utils.py"])}
    finally:
        close_projects()
    assert sorted(results) == [0, 1]
    assert [[(d.code, d.line) for d in results[i].diagnostics] for i in (0, 1)] == \
        [[(d.code, d.line) for d in alone[i].diagnostics] for i in (0, 1)]
    assert [(d.code, d.line) for d in results[0].diagnostics] == [("AMP003", 12)]  # clipped while scaled


def test_a_file_claimed_by_a_worker_that_never_analyses_it_is_checked_again_by_a_fresh_pool(tmp_path, monkeypatch):
    # a claim whose analysis never comes back (a worker died, or its results could not be sent)
    # must not cost the file its check: the pool runs what is missing again, without claims
    from ampfix.engine import share

    def claim_and_forget(self, path):
        entry = self.jobs.get(path)
        return entry is not None and self.take(entry[0]) is True and False

    monkeypatch.setattr(share.Claims, "for_summary", claim_and_forget)
    results, parsed = _claimed_run(tmp_path, monkeypatch, 2)
    assert sorted(results) == [0, 1] and all(r.error is None for r in results.values())
    assert [(d.code, d.line) for d in results[0].diagnostics] == [("AMP003", 12)]
    # the summary's parse, then the fresh pool's analysis
    assert parsed == ["train.py:analysis", "utils.py:analysis", "utils.py:summary"]


def test_a_pool_of_spawned_workers_checks_the_files_as_one_of_forks(tmp_path, monkeypatch):
    # where the pool's workers are spawned, not forked (macOS, Windows: `runner._mp_context`),
    # the flags that mark the files being analysed reach them pickled, and there are no claims:
    # the same results as the forks' and as the files checked one by one
    import multiprocessing

    from ampfix.engine import runner

    (tmp_path / "forked").mkdir()
    forked, _ = _claimed_run(tmp_path / "forked", monkeypatch, 2)
    monkeypatch.setattr(runner, "_mp_context", lambda: multiprocessing.get_context("spawn"))
    spawned: dict = {}
    runner._pool(_helper_clip_jobs(tmp_path / "forked"), 2, spawned)
    assert all(r.error is None for r in spawned.values())
    assert {i: [(d.code, d.line) for d in r.diagnostics] for i, r in spawned.items()} == \
        {i: [(d.code, d.line) for d in r.diagnostics] for i, r in forked.items()} == {0: [("AMP003", 12)], 1: []}


def test_a_pool_whose_flags_cannot_be_made_checks_the_files_without_claims(tmp_path, monkeypatch):
    # the pool's shared flags are a file of its folder (`share.Flags`); a folder that cannot
    # hold it (a full disk) costs the claims and the crash marks, not the check
    from ampfix.engine import runner, share

    def refused(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(share, "Flags", refused)
    results: dict = {}
    runner._pool(_helper_clip_jobs(tmp_path), 2, results)
    assert all(r.error is None for r in results.values())
    assert {i: [(d.code, d.line) for d in r.diagnostics] for i, r in results.items()} == {0: [("AMP003", 12)], 1: []}


def test_the_engine_takes_a_summarised_modules_parse_and_its_tree_index_once(tmp_path):
    # a module the project parsed for a summary is analysed with that parse and with the index
    # the summary's model walked (`Project.handed_index`), once; a model given the index of
    # another tree walks its own
    import ampfix.model.tree as tree_mod

    text = "import torch\ndef f(scaler, loss):\n    scaler.scale(loss).backward()\n"
    tree(tmp_path, {"pyproject.toml": "", "m.py": text, "n.py": "x = 1\n"})
    m = str(tmp_path / "m.py")
    project = Project(tmp_path)
    project.summary(m)
    module = project.take_parsed(m, text)
    assert module is not None and project.take_parsed(m, text) is None
    index = project.handed_index(module)
    assert index is not None and index.nodes[0] is module and project.handed_index(module) is None
    walks = []
    real = tree_mod.Index.of.__func__

    def counted(cls, mod):
        walks.append(mod)
        return real(cls, mod)

    tree_mod.Index.of = classmethod(counted)
    try:
        model = AmpModel(module, index=index)
        assert walks == [] and model._index is index
        fresh = AmpModel(module)
        other = AmpModel(cst.parse_module("x = 1\n"), index=index)
    finally:
        tree_mod.Index.of = classmethod(real)
    assert len(walks) == 2 and other._index is not index and other._index.nodes[0] is other.module
    assert [model.code(c) for c in model.calls] == [fresh.code(c) for c in fresh.calls] == \
        ["scaler.scale(loss).backward()", "scaler.scale(loss)"]
    assert model.scalers == fresh.scalers


def test_the_pools_shared_summaries_give_back_what_was_put_and_nothing_else(tmp_path):
    # the pool's store (engine/share.py) pickles: what a worker reads back equals what the other
    # put, an unreadable module stays unreadable, and an entry of another module or content, cut
    # short, or not a pickle at all is a miss (the module is summarised again), never an error
    from ampfix.engine.share import SharedSummaries
    from ampfix.model.summary import UNREADABLE

    tree(tmp_path, {"pyproject.toml": "", "m.py": "import torch\ndef f(scaler, loss):\n    scaler.scale(loss).backward()\n"})
    m = str(tmp_path / "m.py")
    summary = Project(tmp_path).summary(m)
    store = SharedSummaries(tmp_path / "share")
    assert store.get(m, summary.digest) is None
    store.put(m, summary.digest, summary)
    assert store.get(m, summary.digest) == summary and store.get(m, "0" * 64) is None
    assert store.get(str(tmp_path / "other.py"), summary.digest) is None
    store.put(m, "1" * 64, None)
    assert store.get(m, "1" * 64) is UNREADABLE
    # an entry under another module's name (renamed), cut short, or garbage: misses
    entry = store._entry(m, summary.digest)
    entry.rename(store._entry(m, "2" * 64))
    assert store.get(m, "2" * 64) is None and store.get(m, summary.digest) is None
    store._entry(m, "3" * 64).write_bytes(store._entry(m, "2" * 64).read_bytes()[:100])
    store._entry(m, "4" * 64).write_bytes(b"not a pickle")
    assert store.get(m, "3" * 64) is None and store.get(m, "4" * 64) is None
    assert [p.name for p in (tmp_path / "share").iterdir() if p.name.startswith(".tmp-")] == []
    # a project reading the store takes its summary without a parse
    second = Project(tmp_path, store=store)
    store.put(m, summary.digest, summary)
    assert second.summary(m) == summary and second.parsed == [] and second.from_store == 1


def _assert_project_triggers(tmp_path, codes, expected):
    """`triggered` with the project layer on gives each file of `expected` (name, codes) under
    `tmp_path` those codes of the rules `codes`."""
    from ampfix.engine.analyze import triggered
    from ampfix.engine.registry import select_rules
    from ampfix.engine.results import Settings

    rules, settings = select_rules(codes, []), Settings(project=True)
    for name, want in expected:
        path = str(tmp_path / name)
        assert [r.code for r in triggered(rules, (tmp_path / name).read_text(), path, settings)] == want, name


def test_project_triggers_read_other_modules_without_comments_and_autocast_that_opens_no_region(tmp_path):
    # a test file calling `.backward()` through a layer that turns autocast off inside its own
    # forward, asks whether autocast is on, or mentions it in a comment: nothing of autocast
    # reaches it, so AMP001/AMP017 do not analyse it through the project; a helper that returns
    # an autocast context does reach it
    from ampfix.project.project import trigger_view

    assert trigger_view("# autocast here\nwith torch.autocast('cuda', enabled=False):\n    y = f(x)\n") \
        == "~~~~~~~~~~~~~~~\nwith torch.:\n    y = f(x)\n"
    assert "autocast" in trigger_view("with torch.autocast('cuda', enabled=False if cpu else True):\n")
    assert "autocast" not in trigger_view("if torch.is_autocast_enabled(): dt = torch.get_autocast_dtype('cuda')\n")
    tree(tmp_path, {
        "pyproject.toml": "",
        "pkg/__init__.py": "",
        "pkg/layers.py": """\
            import torch
            class Norm(torch.nn.Module):
                def forward(self, x):
                    # keep autocast away from the statistics
                    if torch.is_autocast_enabled():
                        x = x.float()
                    with torch.autocast(device_type=x.device.type, enabled=False):
                        return x * 2
            """,
        "pkg/amp.py": """\
            import torch
            def amp_context():
                return torch.autocast("cuda", dtype=torch.float16)
            """,
        "test_layers.py": """\
            from pkg.layers import Norm
            def test_backward(x):
                with open("log") as fh:
                    Norm()(x).sum().backward()
            """,
        "train.py": """\
            from pkg.amp import amp_context
            def step(model, x):
                with amp_context():
                    loss = model(x)
                loss.backward()
            """,
    })
    _assert_project_triggers(tmp_path, ["AMP001", "AMP017"], (("test_layers.py", []), ("train.py", ["AMP001", "AMP017"])))


def test_masked_text_keeps_offsets_lines_and_code_strings():
    from ampfix.lexemes import MASK, masked as _masked

    text = ('def f(x):\n    """Run under autocast.\n\n    Also .backward()."""\n'
            "    s = '\"\"\"'  # a quote in a string: autocast\n"
            '    return getattr(torch, "autocast")  # r"""\n'
            "'''\nautocast\n'''\n")
    masked = _masked(text)
    assert len(masked) == len(text)
    assert masked.splitlines() == [
        "def f(x):", "    " + MASK * 22, "", MASK * 24,
        "    s = '\"\"\"'  " + MASK * 31, '    return getattr(torch, "autocast")  ' + MASK * 6,
        MASK * 3, MASK * 8, MASK * 3]
    assert _masked("x = 1\n") == "x = 1\n"


def test_masked_text_at_the_edges_of_strings():
    # escapes, a lone or unterminated quote, four quotes, a string right before a docstring: the
    # masks the lexer gave before its strings were matched as runs between escapes (ampfix/lexemes.py)
    from ampfix.lexemes import masked as _masked

    cases = {
        "x = 'a\\'b' # c\n": "x = 'a\\'b' ~~~\n",
        "s = '''open\n": "s = ~''open\n",
        "t = ''''\n'''\n": "t = ~~~~\n~~~\n",
        'u = "a\\\\" # "\n': 'u = "a\\\\" ~~~\n',
        "v = r'\\'' # x\n": "v = r'\\'' ~~~\n",
        'w = "x\nautocast # y\n': 'w = "x\nautocast ~~~\n',
        "a = '' '''b'''\n": "a = '' ~~~~~~~\n",
        'd = """a\\"""" # e\n': 'd = ~~~~~~~~~ ~~~\n',
    }
    assert {text: _masked(text) for text in cases} == cases


def test_no_trigger_string_holds_the_mask():
    # a masked comment or docstring, or a masked name (`_AUTOCAST_VALUE`), cannot make or hold a
    # trigger string: the view holds none that the code does not
    from ampfix.engine.registry import all_rules
    from ampfix.lexemes import MASK

    for r in all_rules().values():
        strings = [*r.triggers, *r.triggers_lower, *(w for g in r.requires for w in g),
                   *(w for g in (r.project_requires or ()) for w in g)]
        assert not [w for w in strings if MASK in w], r.code


def test_project_triggers_read_no_docstring_nor_a_name_for_an_autocast_setting(tmp_path):
    # peft's shape: a test file calls `.backward()` through `get_peft_model`, whose code passes
    # `autocast_adapter_dtype` (a flag) along and whose docstring says "Whether to autocast the
    # adapter dtype": no autocast region reaches the file, which is not analysed through the
    # project for AMP001/AMP017; a helper named for the context it returns still reaches it
    from ampfix.project.project import trigger_view

    assert "autocast" not in trigger_view("def f(m, autocast_adapter_dtype: bool = True, autocast_kwargs=None):\n"
                                          "    return g(m, autocast_adapter_dtype=autocast_adapter_dtype)\n")
    assert "autocast" in trigger_view("with autocast_ctx(enabled=autocast_enabled):\n")
    tree(tmp_path, {
        "pyproject.toml": "",
        "pkg/__init__.py": "",
        "pkg/mapping.py": '''\
            def get_model(model, config, autocast_adapter_dtype=True):
                """Wrap the model.

                autocast_adapter_dtype (bool): Whether to autocast the adapter dtype.
                """
                return _wrap(model, config, autocast_adapter_dtype=autocast_adapter_dtype)


            def _wrap(model, config, autocast_adapter_dtype):
                if autocast_adapter_dtype:
                    model.float()  # autocast the adapters
                return model
            ''',
        "pkg/amp.py": """\
            import torch
            def autocast_ctx():
                return torch.autocast("cuda", dtype=torch.float16)
            """,
        "test_mapping.py": """\
            from pkg.mapping import get_model
            def test_backward(model, x):
                with open("log") as fh:
                    get_model(model, None)(x).sum().backward()
            """,
        "train.py": """\
            from pkg.amp import autocast_ctx
            def step(model, x):
                with autocast_ctx():
                    loss = model(x)
                loss.backward()
            """,
    })
    _assert_project_triggers(tmp_path, ["AMP001", "AMP017"], (("test_mapping.py", []), ("train.py", ["AMP001", "AMP017"])))


def test_summary_places_an_effect_of_an_overloaded_function_in_its_own_definition(tmp_path):
    # `@overload` stubs share the implementation's name: the effect's place was looked for in
    # the text of the first definition, which held the same text in a comment (line 6)
    tree(tmp_path, {
        "pyproject.toml": "",
        "engine.py": """\
            import torch
            from typing import overload


            @overload
            def step(loss: int, scaler) -> None: ...  # calls scaler.scale(loss).backward() for ints
            @overload
            def step(loss: float, scaler) -> None: ...
            def step(loss, scaler):
                scaler.scale(loss).backward()
            """,
    })
    effects = Project(tmp_path).summary(str(tmp_path / "engine.py")).functions["step"].effects
    assert {(e.line, e.col) for e in effects} == {(10, 5)}, effects


SUMMARY_PLACES = '''
import torch
from helpers import log


@log("a")
def first(model, loss, scaler):
    """Calls `scaler.scale(loss).backward()` like:

    >>> scaler.scale(loss).backward()
    """
    # scaler.scale(loss).backward() in a comment
    if loss is None:
        raise ValueError("no loss")
    if scaler is None:
        raise ValueError(
            "no scaler")
    scaler.scale(loss).backward()


@log("b")
def second(loss, scaler):
    log("b")
    scaler.scale(loss).backward()


class Trainer:
    def backward(self, loss):
        self.scaler.scale(loss).backward()

    def step(self):
        self.backward(self.loss)
'''


def test_summary_places_effects_by_the_text_where_it_can_and_right():
    """A summary places its effects by finding their code in the function's text (no position
    pass): the k-th place for the k-th node, leaving out a docstring's or a comment's mention,
    a one-line statement that only starts like a longer one, and a definition's own name; a
    decorator's call, written above the `def` line, gets the position pass (the text of the span
    above it holds the next function's decorators). Every place found is the node's position."""
    from ampfix.model.summarize import Summarizer, def_spans
    from ampfix.project.project import NO_FACTS

    text = SUMMARY_PLACES.lstrip("\n")
    model = AmpModel(cst.parse_module(text), foreign=NO_FACTS, path="m.py")
    model.source_text = text
    s = Summarizer(model)
    s.text, s.spans = text, def_spans(text)
    found = {}
    for node in model.nodes_of(cst.Call, cst.SimpleStatementLine):
        hit = s._find(node)
        if hit is not None:
            assert hit == model.start(node), model.code(node)
            found[node] = hit
    backwards = [n for n in model.nodes_of(cst.Call) if model.code(n) == "scaler.scale(loss).backward()"]
    assert len(backwards) == 2 and all(n in found for n in backwards)
    raises = [n for n in model.nodes_of(cst.SimpleStatementLine) if model.code(n).startswith("raise")]
    assert len(raises) == 2 and all(n in found for n in raises)
    logs = [n for n in model.nodes_of(cst.Call) if model.code(n.func) == "log"]
    assert [n in found for n in logs] == [False, False, True]  # two decorators, then the call in `second`
    assert any(model.code(n) == "self.backward(self.loss)" for n in found)


# ---------------------------------------------------------------------- the language server


def test_the_language_server_reads_the_project_as_check_does(tmp_path, monkeypatch):
    """The language server's analysis of a file (`server._analysis`: `engine.Analysis` with the
    settings `check` would use) finds what `check` finds in every module of every fixture
    project, the findings that only another module shows included (a rule whose trigger is in
    that module: `engine.py`'s AMP008 through the GradScaler `main.py` passes in); and its
    "apply all safe fixes" changes the text as `ampfix rewrite` does."""
    pytest.importorskip("pygls")
    from ampfix.engine import runner
    from ampfix.engine.analyze import Analysis, fix_text
    from ampfix.engine.results import Settings
    from ampfix.frontends import server

    monkeypatch.setenv("AMPFIX_CACHE_DIR", str(tmp_path / "cache"))  # the summaries the server keeps
    through_project = 0
    for path in fixture_project_files(tmp_path, preview=True):
        run = runner.run(runner.make_plan(runner.Options(paths=[str(path)], no_cache=True)))
        expected = [(d.line, d.code) for r in run.results for d in r.diagnostics]
        rules, settings = server._setup(str(path))
        text = path.read_text()
        found = Analysis(text, str(path), rules, settings).diagnostics
        assert [(d.line, d.code) for d in found] == expected, path
        alone = Analysis(text, str(path), rules, Settings(min_torch_version=settings.min_torch_version))
        through_project += len(expected) > len(alone.diagnostics)

        class Doc:
            uri, source = path.as_uri(), text

        done = server._fix_all(Doc())
        rewritten = fix_text(text, str(path), rules, settings)[0]
        assert done is not None and done[0] == rewritten, path
    assert through_project >= 15  # 17 files have a finding only the project shows


def test_the_project_triggers_read_the_text_being_checked(tmp_path):
    """The rules' project triggers read the text they are given for the file (an editor's
    buffer, a rewrite's next pass, a notebook's code), not the file on disk: here the buffer
    imports the helper whose backward runs inside its autocast region, the file on disk does
    not, and AMP001 is triggered for the buffer (and not for the file as it is on disk)."""
    from ampfix.engine import runner
    from ampfix.engine.analyze import close_projects, triggered
    from ampfix.engine.registry import all_rules

    tree(tmp_path, {"pyproject.toml": "", "helpers.py": """\
        def train_step(model, x, optimizer):
            model(x).sum().backward()
            optimizer.step()
        """, "train.py": """\
        import torch


        def main(model, loader, optimizer):
            for x in loader:
                with torch.autocast("cpu"):
                    model(x)
        """})
    path = tmp_path / "train.py"
    buffer = path.read_text().replace("import torch\n", "import torch\n\nfrom helpers import train_step\n") \
        .replace("            model(x)\n", "            train_step(model, x, optimizer)\n")
    assert "train_step(model, x, optimizer)" in buffer
    settings = runner.make_plan(runner.Options(paths=[str(path)], no_cache=True)).settings
    rule = all_rules()["AMP001"]
    try:
        assert rule not in triggered([rule], path.read_text(), str(path), settings)
        assert rule in triggered([rule], buffer, str(path), settings)
        assert rule not in triggered([rule], path.read_text(), str(path), settings)
    finally:
        close_projects()


# ---------------------------------------------------------------------- the verifier


def test_the_verifier_rewrites_a_script_as_rewrite_does(tmp_path):
    """`ampfix verify SCRIPT` runs the script as `ampfix rewrite SCRIPT` fixes it
    (`api.fix_file_report`): every module of every fixture project is fixed as `rewrite --diff`
    fixes it, the fixes that only another module shows included (`train.py`'s AMP001 of
    `bad_autocast_helper`: the autocast region is entered by a helper of `amp.py`), with the
    findings `check` reports. `fix_source_report` (a string, no project) does not see them."""
    from ampfix.api import fix_file_report, fix_source_report
    from ampfix.engine import runner

    through_project = 0
    for path in fixture_project_files(tmp_path, preview=True):
        text = path.read_text()
        check = runner.run(runner.make_plan(runner.Options(paths=[str(path)], no_cache=True)))
        fix = runner.run(runner.make_plan(runner.Options(paths=[str(path)], no_cache=True, fix=True)))
        (checked,), (fixed,) = check.results, fix.results
        expected = fixed.new_source.decode() if fixed.new_source is not None else text
        new, found, applied = fix_file_report(str(path))
        assert (new, applied) == (expected, fixed.fixed), path
        assert [(d.line, d.code) for d in found] == [(d.line, d.code) for d in checked.diagnostics], path
        assert path.read_text() == text  # nothing written
        alone, _, _ = fix_source_report(text, str(path), preview=True)
        through_project += alone != new
    assert through_project >= 4  # the four fixture files whose fix only the project shows


def test_the_verifiers_rewrite_reads_the_projects_configuration_and_says_what_is_wrong(tmp_path):
    """The configuration of the script's project applies (here it ignores AMP001, so nothing
    is rewritten); a script that cannot be parsed, or a configuration that cannot be read, is
    an AmpfixError naming the file and line (verify prints it, exit 2)."""
    import shutil

    from ampfix.api import AmpfixError, fix_file_report

    copy = tmp_path / "p"
    shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "projects" / "bad_autocast_helper", copy)
    clear_caches()
    script = copy / "train.py"
    assert fix_file_report(str(script))[2] == {"AMP001: backward moved out of the autocast region": 1}
    (copy / "pyproject.toml").write_text('[tool.ampfix]\nignore = ["AMP001"]\n')
    clear_caches()
    new, found, applied = fix_file_report(str(script))
    assert (new, found, applied) == (script.read_text(), [], {})
    (copy / "pyproject.toml").write_text("[tool.ampfix]\nselect = 3\n")
    with pytest.raises(AmpfixError, match="pyproject.toml: `select`"):
        fix_file_report(str(script))
    (copy / "pyproject.toml").write_text("")
    script.write_text(script.read_text().replace("scaler.update()", "scaler.update("))
    with pytest.raises(AmpfixError, match=r"train\.py:\d+:\d+: error: syntax error"):
        fix_file_report(str(script))


def test_a_step_re_exported_by_a_module_without_amp_code_reaches_the_file(tmp_path):
    # `from pkg.api import do_step`, where `pkg/api.py` only re-exports `do_step` from
    # `pkg/engine.py` (which calls `.backward()`): the import graph follows a package's
    # `__init__.py` one level, not a plain module's re-export, so the project triggers did not
    # see the backward and the file, with no "backward" of its own, was not analysed (AMP001
    # and AMP017 were missed); its twin importing a step that does no backward stays silent
    from conftest import run_ampfix

    train = """\
        import torch
        from pkg.api import do_step


        def train(model, opt, data):
            for x in data:
                with torch.autocast("cuda"):
                    loss = model(x).sum()
                    do_step(loss)
                opt.step()
        """
    tree(tmp_path, {
        "pyproject.toml": "",
        "pkg/__init__.py": "",
        "pkg/api.py": "from pkg.engine import do_step\nfrom pkg.plain import do_nothing\n",
        "pkg/engine.py": "def do_step(loss):\n    loss.backward()\n",
        "pkg/plain.py": "def do_nothing(loss):\n    return loss\n",
        "train.py": train,
        "train_twin.py": train.replace("do_step", "do_nothing"),
    })
    found = run_ampfix("check", "-q", "--no-cache", "train.py", "train_twin.py", cwd=tmp_path).stdout.decode()
    assert "train.py:9:13: AMP001" in found and "train.py:9:13: AMP017" in found, found
    assert "train_twin.py" not in found, found


def test_the_trigger_tests_read_the_checked_files_code_not_its_comments(tmp_path):
    # "backward" in "for backwards compatibility" and "autocast" in a docstring trigger nothing
    # (peft's `tuners/adalora/gptq.py` was parsed with three of its imports' summaries for it);
    # the same words in code do, and AMP901 still reads noqa comments
    from ampfix.engine.analyze import triggered, worth_analysing
    from ampfix.engine.registry import select_rules

    rules = select_rules(["AMP001", "AMP017", "AMP901"], [])
    prose = ('def f(model, x):\n    """Runs under autocast when enabled."""\n'
             '    # for backwards compatibility\n    return model(x)\n')
    assert triggered(rules, prose) == [] and not worth_analysing(rules, prose)
    code = "def f(model, x, loss):\n    with torch.autocast('cuda'):\n        loss.backward()\n"
    assert [r.code for r in triggered(rules, code)] == ["AMP001", "AMP017"]
    noqa = "x = 1  # " + "noqa: AMP001\n"  # (split: not a directive of this file)
    assert [r.code for r in triggered(rules, noqa)] == ["AMP901"]


def test_an_autocast_aliased_at_a_helper_modules_top_reaches_the_file(tmp_path):
    # `helpers.py` imports `autocast as ac` at its top and `amp_ctx()` returns `ac()`: the
    # definition's part says nothing of autocast, but the import that binds its `ac` does
    # (`Project._with_imports`), so `train.py` (backward inside `with amp_ctx():`) is
    # analysed for AMP001. Before, only a comment naming autocast in train.py made it analysed
    from conftest import run_ampfix

    tree(tmp_path, {
        "pyproject.toml": "",
        "helpers.py": "from torch.cuda.amp import autocast as ac\n\n\ndef amp_ctx():\n    return ac()\n",
        "train.py": """\
            # amp_ctx enters autocast
            from helpers import amp_ctx


            def train(model, x):
                with amp_ctx():
                    loss = model(x).sum()
                    loss.backward()
            """,
        # the twin: the same names, `ac` a nullcontext
        "quiet.py": "from contextlib import nullcontext as ac\n\n\ndef amp_ctx():\n    return ac()\n",
        "twin.py": "from quiet import amp_ctx\n\n\ndef train(model, x):\n    with amp_ctx():\n"
                   "        loss = model(x).sum()\n        loss.backward()\n",
    })
    found = run_ampfix("check", "-q", "--no-cache", "--select", "AMP001", "train.py", "twin.py",
                       cwd=tmp_path).stdout.decode()
    assert "train.py:8:9: AMP001" in found and "twin.py" not in found, found


_ANNOTATED_LM = """
    import torch


    class LanguageModel(torch.nn.Module):
        def save_checkpoint(self, file, optimizer, epoch):
            state = {"state_dict": self.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
            torch.save(state, file)
"""
_ANNOTATED_TRAINER = """
    from typing import Optional

    import torch
    from torch import nn

    from pkg.lm import LanguageModel


    class Trainer:
        def __init__(self, model{ann}):
            self.model{attr} = model

        def train(self, loader, path):
            optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
            scaler = torch.amp.GradScaler("cuda")
            for x in loader:
                with torch.autocast("cuda"):
                    loss = self.model(x)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            self.model.save_checkpoint(path, optimizer, 0)
"""


@pytest.mark.parametrize("ann, attr, found", [
    (": LanguageModel", "", True), ("", ": LanguageModel", True), ("", "", False),
    (": Optional[LanguageModel]", "", False), (': "LanguageModel"', "", False), (": nn.Module", "", False),
    (": nn.Module", ": LanguageModel", False)])
def test_a_parameter_annotated_with_a_class_of_another_module_holds_an_instance_of_it(tmp_path, ann, attr, found):
    # flair's LanguageModelTrainer: `def __init__(self, model: LanguageModel)`, then
    # `self.model.save_checkpoint(path, optimizer, ...)` runs the method of the annotated class,
    # whose checkpoint leaves the scaler out. Any other annotation (optional, a string, a
    # third-party class) says nothing ampfix can follow: unknown. Where the parameter has no
    # annotation, the attribute's (`self.model: LanguageModel = model`) says it; where the two
    # disagree, the parameter's is what the caller passes
    root = tree(tmp_path, {"pyproject.toml": "", "pkg/__init__.py": "", "pkg/lm.py": _ANNOTATED_LM,
                           "pkg/trainer.py": _ANNOTATED_TRAINER.format(ann=ann, attr=attr)})
    model = model_of(Project(root), root / "pkg" / "trainer.py")
    states = [s for s in model.checkpoints.saved_states() if s.written_in is not None]
    got = [(os.path.basename(s.written_in[0]), s.written_in[1], s.written_in[2], len(s.optimizers)) for s in states]
    assert got == ([("lm.py", 8, "LanguageModel.save_checkpoint", 1)] if found else [])


def test_a_summary_says_what_a_function_restores_from_a_checkpoint(tmp_path):
    # `FunctionSummary.loads`: each `X.load_state_dict(...)` of a `torch.load` result, X's kind and
    # canonical text; a call of the function binds them to its arguments
    # (`Checkpoints.restored_through_helpers`)
    root = tree(tmp_path, {"pyproject.toml": "", "ckpt.py": """
        import torch


        def load(path, model, optimizer, scaler=None):
            state = torch.load(path)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            if scaler is not None:
                scaler.load_state_dict(state["scaler"])
            return state["epoch"]
        """, "train.py": """
        import torch
        from ckpt import load


        def run(model, path):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            scaler = torch.amp.GradScaler("cuda")
            load(path, model, optimizer)
            load(path, model, optimizer, scaler=scaler)
        """})
    project = Project(root)
    loads = project.summary(str(root / "ckpt.py")).functions["load"].loads
    assert [(e["kind"], e["receiver"], e["line"]) for e in loads] == [
        ("other", "__param__.model", 7), ("optimizer", "__param__.optimizer", 8), ("scaler", "__param__.scaler", 10)]
    model = model_of(project, root / "train.py")
    got = [(model.code(r.call), [model.code(o) for o in r.optimizers], r.scaler, r.written_in[1:])
           for r in model.checkpoints.restored_through_helpers()]
    # what the summary says, whatever the arguments: the rule skips a call that hands a scaler over
    assert got == [("load(path, model, optimizer)", ["optimizer"], True, (8, "load")),
                   ("load(path, model, optimizer, scaler=scaler)", ["optimizer"], True, (8, "load"))]


@pytest.mark.parametrize("subclass, found", [
    ("", True),
    ("class Char(LanguageModel):\n    pass\n", True),
    ("class Char(LanguageModel):\n    def save_checkpoint(self, file, optimizer, epoch):\n        pass\n", False),
    ("class Char(lm.LanguageModel):\n    pass\n\n\nclass Byte(Char):\n"
     "    def save_checkpoint(self, file, optimizer, epoch):\n        pass\n", False),
])
def test_a_method_a_subclass_of_the_project_overrides_is_unknown_through_an_annotation(tmp_path, subclass, found):
    # `model: LanguageModel` may hold a subclass: where one of the project (a child or a
    # grandchild, whatever it imports the base as) defines `save_checkpoint` too, the call may
    # run that one, and nothing is said (dynamic dispatch: unknown)
    files = {"pyproject.toml": "", "pkg/__init__.py": "", "pkg/lm.py": _ANNOTATED_LM,
             "pkg/trainer.py": _ANNOTATED_TRAINER.format(ann=": LanguageModel", attr="")}
    if subclass:
        files["pkg/char.py"] = "from pkg import lm\nfrom pkg.lm import LanguageModel\n\n\n" + subclass
    root = tree(tmp_path, files)
    project = Project(root)
    project.begin()
    model = model_of(project, root / "pkg" / "trainer.py")
    states = [s for s in model.checkpoints.saved_states() if s.written_in is not None]
    assert bool(states) is found
    texts, deps = project.end()
    # the scan for subclasses is a dependency of the result: a new file that overrides the
    # method changes it
    assert any(k.startswith("subclasses:") and k.endswith(":LanguageModel") for k in deps), deps


def test_a_subclass_that_appears_later_silences_the_cached_finding(tmp_path):
    # the warm run, after a file with a subclass overriding the checkpoint method appears,
    # agrees with a run without the cache (`subclasses:` dependency of the cached result)
    from conftest import run_ampfix

    tree(tmp_path, {"pyproject.toml": "", "pkg/__init__.py": "", "pkg/lm.py": _ANNOTATED_LM,
                    "pkg/trainer.py": _ANNOTATED_TRAINER.format(ann=": LanguageModel", attr="")})
    env = {"AMPFIX_CACHE_DIR": str(tmp_path / "cache")}
    first = run_ampfix("check", "-q", "--preview", "--select", "AMP013", ".", cwd=tmp_path, env=env)
    assert "AMP013" in first.stdout.decode(), first.stdout.decode() + first.stderr.decode()
    (tmp_path / "pkg" / "char.py").write_text(
        "from pkg.lm import LanguageModel\n\n\nclass Char(LanguageModel):\n"
        "    def save_checkpoint(self, file, optimizer, epoch):\n        pass\n")
    again = run_ampfix("check", "-q", "--preview", "--select", "AMP013", ".", cwd=tmp_path, env=env)
    fresh = run_ampfix("check", "-q", "--preview", "--select", "AMP013", "--no-cache", ".", cwd=tmp_path)
    assert fresh.returncode == 0 and b"AMP013" not in fresh.stdout, fresh.stdout
    assert (again.returncode, again.stdout) == (fresh.returncode, fresh.stdout)


_MODEL_STEPS = """
    import torch

    from wrappers import Wrapper


    class Net(torch.nn.Module):
        def backward_step(self, loss, grad_scaler):
            {rebind}
            grad_scaler.scale(loss).backward({gradient})

        def optimization_step(self, optimizer, grad_scaler):
            grad_scaler.step(optimizer)
    """

_MODEL_STEPS_TRAINER = """
    import torch

    from models.net import Net


    class Trainer:
        def __init__(self, amp):
            self.model = Net()
            self.scaler = torch.amp.GradScaler("cuda", enabled={enabled})

        def train(self, loss, optimizer, other):
            self.model.backward_step(loss, {passed})
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.model.optimization_step(optimizer, self.scaler)
            self.scaler.update()
    """


@pytest.mark.parametrize("passed, rebind, gradient, enabled, scaled", [
    ("grad_scaler=self.scaler", "", "", "amp", "self.scaler"),
    ("self.scaler", "", "", "amp", "self.scaler"),
    ("other", "", "", "amp", None),  # a parameter nothing binds: not known to be a GradScaler
    ("self.scaler", "", "torch.ones(())", "amp", None),  # an explicit gradient: the summary's scale source is unknown
    ("self.scaler", "", "", "False", "self.scaler"),  # scaled by a scaler built disabled: it scales nothing
    # the parameter rebound (on some path) before the backward: what scales is not what the caller passed
    ("self.scaler", "grad_scaler = Wrapper(grad_scaler)", "", "amp", None),
    ("self.scaler", "if loss is None: grad_scaler = Wrapper(grad_scaler)", "", "amp", None),
])
def test_a_backward_of_a_received_objects_scale_is_scaled_by_the_gradscaler_the_caller_passes(
        tmp_path, passed, rebind, gradient, enabled, scaled):
    # clinicadl's shape with the model's class known by construction: `self.model.backward_step(
    # loss, grad_scaler=...)` runs `grad_scaler.scale(loss).backward()` in another module, which
    # does not know `grad_scaler` is a GradScaler; the caller does, so the backward is a scaled
    # one, keyed by the caller's scaler (as the step `_method_on_bound_object` finds is)
    root = tree(tmp_path, {"pyproject.toml": "", "models/__init__.py": "",
                           "models/net.py": _MODEL_STEPS.format(gradient=gradient, rebind=rebind or "pass"),
                           "trainer.py": _MODEL_STEPS_TRAINER.format(passed=passed, enabled=enabled)})
    model = model_of(Project(root), root / "trainer.py")
    trace = next(t for t in model.traces() if getattr(t.root, "name", None) and t.root.name.value == "train")
    (bw,) = trace.of("backward")
    assert bw.event.origin is not None and bw.event.origin.line == 10
    (clip,) = trace.of("grad_read")
    assert [s.scaler for s in trace.of("scaler_step")] == ["self.scaler"]
    if scaled is None:
        assert (bw.event.detail, bw.scaler) == ("tensor", None)
        assert model.scaled_backward_before(trace, clip) is None
        return
    assert (bw.event.detail, bw.scaler, bw.event.scaler, bw.target) == ("scaled", scaled, scaled, "loss")
    # a scaler built with `enabled=False` scales nothing: no scaled gradients to clip
    assert (model.scaled_backward_before(trace, clip) is bw) is (enabled != "False")


_RECEIVED_STEP_HELPERS = """
    from wrappers import Wrapper


    def _step(s, optimizer):
        {inner}
        s.step(optimizer)


    def train_step(grad_scaler, optimizer, flag):
        {rebind}
        {call}
    """

_RECEIVED_STEP_TRAINER = """
    import torch

    from helpers import train_step


    def train(loss, optimizer):
        scaler = torch.amp.GradScaler("cuda")
        scaler.scale(loss).backward()
        train_step(scaler, optimizer, True)
        scaler.update()
    """

_NESTED = "\n        ".join(["def wrap():", "    nonlocal grad_scaler", "    grad_scaler = Wrapper(grad_scaler)", "wrap()"])


@pytest.mark.parametrize("rebind, inner, call, untouched", [
    ("", "", "grad_scaler.step(optimizer)", True),
    ("", "", "_step(grad_scaler, optimizer)", True),  # through a helper of the module: `s` is `grad_scaler`
    ("grad_scaler = Wrapper(grad_scaler)", "", "grad_scaler.step(optimizer)", False),
    ("if flag: grad_scaler = Wrapper(grad_scaler)", "", "grad_scaler.step(optimizer)", False),  # on some path
    ("for grad_scaler in [grad_scaler]: pass", "", "grad_scaler.step(optimizer)", False),
    ("with Wrapper(grad_scaler) as grad_scaler: pass", "", "grad_scaler.step(optimizer)", False),
    ("print(grad_scaler := Wrapper(grad_scaler))", "", "grad_scaler.step(optimizer)", False),
    (_NESTED, "", "grad_scaler.step(optimizer)", False),  # a nested function's `nonlocal`
    ("", "", "grad_scaler.step(optimizer); grad_scaler = Wrapper(grad_scaler)", False),  # any other binding, after too
    ("", "s = Wrapper(s)", "_step(grad_scaler, optimizer)", False),  # rebound in the helper of the module
    ("if flag: grad_scaler = Wrapper(grad_scaler)", "", "_step(grad_scaler, optimizer)", False),  # before the helper
])
def test_a_step_on_a_received_object_names_the_parameter_only_when_it_is_never_rebound(
        tmp_path, rebind, inner, call, untouched):
    # the summary's `value:__param__.grad_scaler.step` effect says whether `grad_scaler` is the
    # parameter as received (Effect.owner_param); only then is it a step of the GradScaler the
    # caller passes (`Events._method_on_bound_object`): after `grad_scaler = Wrapper(grad_scaler)`
    # the step is on an object nothing is known of
    root = tree(tmp_path, {"pyproject.toml": "",
                           "helpers.py": _RECEIVED_STEP_HELPERS.format(rebind=rebind or "pass", inner=inner or "pass",
                                                                       call=call),
                           "trainer.py": _RECEIVED_STEP_TRAINER})
    project = Project(root)
    summary = project.summary(str(root / "helpers.py"))
    (step,) = [e for e in summary.functions["train_step"].effects if (e.callee or "").endswith(".step")]
    assert dict(step.args)["owner"] == "grad_scaler"
    assert step.owner_param == ("grad_scaler" if untouched else None)
    assert ModuleSummary.from_json(json.loads(summary.dumps())) == summary
    model = model_of(project, root / "trainer.py")
    (trace,) = [t for t in model.traces() if getattr(t.root, "name", None) and t.root.name.value == "train"]
    assert [(s.scaler, s.target) for s in trace.of("scaler_step")] == ([("scaler", "optimizer")] if untouched else [])


def test_a_step_on_self_in_a_method_of_another_module_names_self(tmp_path):
    root = tree(tmp_path, {"pyproject.toml": "", "stepper.py": """
        class Stepper:
            def step(self, optimizer):
                self.scaler.step(optimizer)

            def rebound(self, optimizer):
                self = self.inner
                self.scaler.step(optimizer)
        """})
    methods = Project(root).summary(str(root / "stepper.py")).classes["Stepper"].methods
    assert [e.owner_param for e in methods["step"].effects] == ["self"]
    assert [e.owner_param for e in methods["rebound"].effects if (e.callee or "").endswith(".step")] == [None]


_MAY_TOUCH_HELPERS = """
    def forward_update(optimizer, scaler=None, default=None):
        scaler = scaler or default
        scaler.step(optimizer)
        scaler.update()


    def plain_update(scaler):
        scaler.update()


    def other_rebound(optimizer, scaler, default=None):
        default = default or scaler
        scaler.step(optimizer)


    def reads_only(scaler=None, default=None):
        scaler = scaler or default
        print(scaler.get_scale())


    def _update(s):
        s = s or None
        s.update()


    def through_helper(scaler):
        _update(scaler)


    class Stepper:
        def step(self, optimizer, scaler=None):
            scaler = scaler or self.default
            scaler.unscale_(optimizer)
    """


def test_a_function_that_rebinds_a_parameter_before_stepping_it_may_touch_it_unlisted(tmp_path):
    # summarize.touched_unlisted: the parameters whose object a `step`/`unscale_`/`update` call
    # may reach though the summary cannot name it (the name rebound: `Effect.owner_param` None);
    # a parameter stepped as received is listed (the caller's events), one only read is not
    from ampfix.model.summarize import touched_unlisted
    root = tree(tmp_path, {"pyproject.toml": "", "helpers.py": _MAY_TOUCH_HELPERS})
    summary = Project(root).summary(str(root / "helpers.py"))
    got = {name: touched_unlisted(f) for name, f in summary.functions.items()}
    assert got == {"forward_update": {"scaler"}, "plain_update": set(), "other_rebound": set(),
                   "reads_only": set(), "_update": {"s"}, "through_helper": {"scaler"}}
    assert touched_unlisted(summary.classes["Stepper"].methods["step"]) == {"scaler"}
    # read back from JSON, the same
    again = ModuleSummary.from_json(json.loads(summary.dumps()))
    assert {name: touched_unlisted(f) for name, f in again.functions.items()} == got


def test_every_fixture_module_is_summarised(tmp_path):
    """The model summarises every module of every fixture project: a summary that fails (an
    exception the project catches, `Project.unsummarised`) leaves that module's facts unknown and
    silences what depends on them without a word; it is a bug of the model, not of the code
    (4237bb4's first version raised AttributeError on a dict handed to a save helper, and the
    checkpoint it was built for went unreported)."""
    projects = {}
    for path in fixture_project_files(tmp_path):
        root = path.relative_to(tmp_path).parts[0]
        project = projects.setdefault(root, Project(tmp_path / root))
        module = project.module(str(path))
        assert module is not None and module.summary is not None, path
    failed = [u for p in projects.values() for u in p.unsummarised]
    assert failed == [] and len(projects) > 60


def test_stats_name_the_modules_not_summarised(tmp_path):
    tree(tmp_path, {"pyproject.toml": "", "helper.py": "def save(model, optimizer):\n    pass\n",
                    "train.py": "from helper import save\n"})
    project = Project(tmp_path)
    project.unsummarised.append((str(tmp_path / "helper.py"), "AttributeError"))  # as _summarize records one
    from ampfix.engine import analyze, runner

    analyze._PROJECTS[("test", None)] = project  # type: ignore[index]
    try:
        import contextlib
        import io

        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            runner._print_stats()
    finally:
        del analyze._PROJECTS[("test", None)]  # type: ignore[arg-type]
    lines = err.getvalue().splitlines()
    assert lines[0].endswith("summaries failed 1") and lines[0].startswith("ampfix stats:")
    assert lines[1] == f"ampfix stats, no summary of {tmp_path / 'helper.py'}: AttributeError"
