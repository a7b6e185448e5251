"""The dependencies a cached result records (`Project.begin`/`end`, the import graph's stamp):
the same whichever file of the run asked a question first, and a change on disk that changes an
answer is noticed on a warm run."""

import os
import shutil
import textwrap
from pathlib import Path

import pytest

from ampfix.model.foreign import ForeignClass, ForeignFunction
from ampfix.project import Project
from ampfix.project.layout import clear_caches
from conftest import HELPER_CALLER


def tree(root: Path, files: dict) -> Path:
    clear_caches()
    for name, text in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text), encoding="utf-8")
    return root


TRAIN_THROUGH_API = """\
    # do_step runs the backward pass
    import torch
    from pkg.api import do_step


    def train(model, opt, data):
        for x in data:
            with torch.autocast("cuda"):
                loss = model(x).sum()
                do_step(loss)
            opt.step()
    """


def test_a_second_file_depends_on_the_re_export_the_first_one_resolved(tmp_path):
    # a.py and b.py both import do_step from pkg/api.py, which re-exports it from
    # pkg/helpers.py. One process checks a.py, then b.py: b.py's resolution of the import is
    # answered by the project's memo, yet b.py's result depends on pkg/api.py as much as
    # a.py's does. Once pkg/api.py re-exports another do_step (one that runs a backward inside
    # the autocast region: AMP001), the warm run must report it in both files.
    from conftest import run_ampfix

    tree(tmp_path, {
        "pyproject.toml": "",
        "pkg/__init__.py": "",
        "pkg/api.py": "from pkg.helpers import do_step\n",
        "pkg/helpers.py": "def do_step(loss):\n    return loss\n",
        "pkg/other.py": "def do_step(loss):\n    loss.backward()\n",
        "a.py": TRAIN_THROUGH_API,
        "b.py": TRAIN_THROUGH_API,
    })
    env = {"AMPFIX_CACHE_DIR": str(tmp_path / "cache")}
    args = ("check", "-q", "-j", "1", "a.py", "b.py")
    first = run_ampfix(*args, cwd=tmp_path, env=env)
    assert (first.returncode, first.stdout) == (0, b""), first.stdout.decode() + first.stderr.decode()
    (tmp_path / "pkg" / "api.py").write_text("from pkg.other import do_step\n", encoding="utf-8")
    again = run_ampfix(*args, cwd=tmp_path, env=env)
    fresh = run_ampfix(*args[:-2], "--no-cache", "a.py", "b.py", cwd=tmp_path)
    assert "a.py:10:13: AMP001" in fresh.stdout.decode() and "b.py:10:13: AMP001" in fresh.stdout.decode()
    assert (again.returncode, again.stdout) == (fresh.returncode, fresh.stdout)


LAYERED = {
    "pyproject.toml": "",
    "pkg/__init__.py": "from .api import *\n",
    "pkg/api.py": "from pkg.impl import step, Trainer\nfrom pkg.base import Base as Root\n",
    "pkg/base.py": """\
        import torch


        class Base:
            def __init__(self):
                self.scaler = torch.amp.GradScaler("cuda")
        """,
    "pkg/impl.py": """\
        import torch
        from pkg.api import Root
        from pkg.util import clip


        def step(loss, opt, scaler):
            scaler.scale(loss).backward()
            clip(opt)
            scaler.step(opt)
            scaler.update()


        class Trainer(Root):
            def fit(self, loss, opt):
                step(loss, opt, self.scaler)
        """,
    "pkg/util.py": "def clip(opt):\n    return opt\n",
    "main.py": """\
        from pkg import step, Trainer


        def run(loss, opt, scaler):
            step(loss, opt, scaler)
            Trainer().fit(loss, opt)
        """,
    "other.py": "from pkg.api import step\n\n\ndef again(loss, opt, scaler):\n    step(loss, opt, scaler)\n",
}


def _questions(project: Project, root: Path, importer: str) -> None:
    """The questions an analysis of `importer` asks the project (`ForeignFacts`, the triggers'
    reach), each answered through the project's memos."""
    path = str(root / importer)
    step = project.resolve(path, "pkg.step")
    trainer = project.resolve(path, "pkg.Trainer")
    assert isinstance(step, ForeignFunction) and isinstance(trainer, ForeignClass)
    project.relevant(step)
    project.bases(trainer)
    project.text_mro(trainer)
    project.lacks_relevant_method(trainer, "fit")
    project.lacks_relevant_classes(trainer)
    project.callers(step.path, "step")
    project.member(project.module(str(root / "pkg" / "api.py")), "step")
    project.reach_bound(path, ("backward", "GradScaler"), ("scaler",))
    project.reach_words(path, ("backward", "GradScaler"), ("scaler",))
    project.reach_held(path, ("backward", "GradScaler"), ("scaler",))
    project.reach_text(path)
    project.related_text(path)


def _deps(project: Project, root: Path, importer: str):
    project.begin()
    _questions(project, root, importer)
    return project.end()


def test_a_memoised_answer_records_what_it_read(tmp_path):
    # the dependencies of a file's analysis are the same when another file asked the same
    # questions first (the project's memos answer them) as in a project of its own
    tree(tmp_path, LAYERED)
    for first, second in (("other.py", "main.py"), ("main.py", "other.py"), ("main.py", "main.py")):
        alone = _deps(Project(tmp_path), tmp_path, second)
        shared = Project(tmp_path)
        _deps(shared, tmp_path, first)
        texts, graph = _deps(shared, tmp_path, second)
        assert set(alone[0]) - set(texts) == set(), (first, second)
        assert set(alone[1]) - set(graph) == set(), (first, second)
        assert str(tmp_path / "pkg" / "impl.py") in texts and str(tmp_path / "pkg" / "api.py") in texts


# the helper imported from the package, which re-exports it
NAMESPACE_CALLER = HELPER_CALLER.replace("from pkg.helpers import", "from pkg import")


def test_a_package_binding_beats_a_folder_of_its_name_and_the_cache_agrees(tmp_path):
    # `from pkg import backward_step` is the function pkg/__init__.py defines (a backward
    # inside the autocast region: AMP001). An empty folder pkg/backward_step/ appearing does
    # not change that: Python reads the package's attribute before it looks for a submodule
    # (`Project._package_attribute`). The warm run, whose graph stamp changed with the folder,
    # agrees with a run without the cache at each step.
    from conftest import run_ampfix

    tree(tmp_path, {"pyproject.toml": "",
                    "pkg/__init__.py": "def backward_step(loss, scaler):\n    scaler.scale(loss).backward()\n",
                    "train.py": NAMESPACE_CALLER})
    env = {"AMPFIX_CACHE_DIR": str(tmp_path / "cache")}
    first = run_ampfix("check", "-q", ".", cwd=tmp_path, env=env)
    assert "train.py:12:17: AMP001" in first.stdout.decode(), first.stdout.decode() + first.stderr.decode()
    (tmp_path / "pkg" / "backward_step").mkdir()
    again = run_ampfix("check", "-q", ".", cwd=tmp_path, env=env)
    fresh = run_ampfix("check", "-q", "--no-cache", ".", cwd=tmp_path)
    assert (fresh.returncode, fresh.stdout) == (first.returncode, first.stdout)
    assert (again.returncode, again.stdout) == (fresh.returncode, fresh.stdout)
    (tmp_path / "pkg" / "backward_step").rmdir()
    gone = run_ampfix("check", "-q", ".", cwd=tmp_path, env=env)
    assert (gone.returncode, gone.stdout) == (first.returncode, first.stdout)


def test_a_package_re_export_of_a_same_named_submodule_is_the_function(tmp_path):
    # `from .backward_step import backward_step` in the package: `from pkg import
    # backward_step` is that function, not the submodule (before, the module: nothing found);
    # `from . import backward_step` binds the submodule itself: calling it says nothing.
    from conftest import run_ampfix

    tree(tmp_path, {"pyproject.toml": "",
                    "pkg/__init__.py": "from .backward_step import backward_step\n",
                    "pkg/backward_step.py": "def backward_step(loss, scaler):\n    scaler.scale(loss).backward()\n",
                    "train.py": NAMESPACE_CALLER})
    found = run_ampfix("check", "-q", "--no-cache", ".", cwd=tmp_path)
    assert "train.py:12:17: AMP001" in found.stdout.decode(), found.stdout.decode() + found.stderr.decode()
    (tmp_path / "pkg" / "__init__.py").write_text("from . import backward_step\n")
    module = run_ampfix("check", "-q", "--no-cache", ".", cwd=tmp_path)
    assert (module.returncode, module.stdout) == (0, b"")


def test_the_graph_stamp_follows_folders_and_files(tmp_path):
    from ampfix.project.graph import ImportGraph

    tree(tmp_path, {"pyproject.toml": "", "pkg/__init__.py": "", "pkg/sub/__init__.py": "", "train.py": ""})
    stamp = ImportGraph(tmp_path).stamp()
    assert ImportGraph(tmp_path).stamp() == stamp  # the same tree, the same stamp
    (tmp_path / "pkg" / "empty").mkdir()
    with_folder = ImportGraph(tmp_path).stamp()
    assert with_folder != stamp
    (tmp_path / "pkg" / "empty").rmdir()
    assert ImportGraph(tmp_path).stamp() == stamp
    (tmp_path / "pkg" / "sub" / "__init__.py").unlink()  # a namespace package now
    unlinked = ImportGraph(tmp_path).stamp()
    assert unlinked not in (stamp, with_folder)
    (tmp_path / "pkg" / "__pycache__").mkdir()  # nothing the graph reads: the same stamp
    (tmp_path / "pkg" / "__pycache__" / "x.pyc").write_bytes(b"")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "notes.txt").write_text("not Python\n")
    assert ImportGraph(tmp_path).stamp() == unlinked
    # a cache kept in the tree under a plain name (AMPFIX_CACHE_DIR=cache) grows folders as it
    # is written: it is tagged (CACHEDIR.TAG), and a tagged folder is not walked
    from ampfix.engine.cache import Summaries

    Summaries(tmp_path / "cache").put(str(tmp_path / "train.py"), "0" * 64, None)  # (None: cannot be summarised)
    tagged = ImportGraph(tmp_path).stamp()
    Summaries(tmp_path / "cache").put(str(tmp_path / "pkg" / "__init__.py"), "1" * 64, None)
    (tmp_path / "cache" / "more" / "x.py").parent.mkdir()
    (tmp_path / "cache" / "more" / "x.py").write_text("")
    assert ImportGraph(tmp_path).stamp() == tagged
    assert str(tmp_path / "cache" / "more" / "x.py") not in ImportGraph(tmp_path).files()


def test_an_answer_cut_short_is_not_kept_for_the_files_that_follow(tmp_path, monkeypatch):
    # a RecursionError deep in one file's questions (the engine then analyses that file alone)
    # must not leave the placeholders of the answers being computed (None: "unknown") in the
    # project's memos: the next file of the process would read them and lose its findings
    import pytest

    tree(tmp_path, LAYERED)
    path = str(tmp_path / "main.py")
    project = Project(tmp_path)
    trainer = project.resolve(path, "pkg.Trainer")
    real = Project._summarize

    def too_deep(self, at, source):
        if at.endswith("impl.py"):
            raise RecursionError("maximum recursion depth exceeded")
        return real(self, at, source)

    monkeypatch.setattr(Project, "_summarize", too_deep)
    with pytest.raises(RecursionError):
        project.bases(trainer)
    monkeypatch.setattr(Project, "_summarize", real)
    fresh = Project(tmp_path)
    names = lambda bases: [(b.path, b.qual) for b in bases]  # noqa: E731
    assert names(project.bases(trainer)) == names(fresh.bases(fresh.resolve(path, "pkg.Trainer"))) != []
    assert project.summary(str(tmp_path / "pkg" / "impl.py")) is not None


def test_a_dependency_digest_is_kept_while_the_file_is_the_same(tmp_path):
    # `dep_digest` hashes a module once per process, and again once its stat changes
    import hashlib
    import os
    import time

    from ampfix.engine.results import dep_digest

    f = tmp_path / "m.py"
    f.write_bytes(b"x = 1\n")
    assert dep_digest(str(f)) == hashlib.sha256(b"x = 1\n").hexdigest()
    f.write_bytes(b"x = 22\n")
    assert dep_digest(str(f)) == hashlib.sha256(b"x = 22\n").hexdigest()
    st = os.stat(f)
    time.sleep(0.05)  # (past the granularity of the file system's clock)
    f.write_bytes(b"x = 33\n")  # the same size, and the same modification time
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert dep_digest(str(f)) == hashlib.sha256(b"x = 33\n").hexdigest()  # (its change time moved)
    f.unlink()
    assert dep_digest(str(f)) is None


def test_a_run_closes_its_projects_and_the_next_one_reads_afresh(tmp_path, monkeypatch):
    # `runner.run` ends with the projects of the process forgotten (their parses freed then,
    # not by the collector at exit); a second run in the same process finds the same
    from ampfix.api import check_paths
    from ampfix.engine import analyze

    tree(tmp_path, LAYERED)
    monkeypatch.chdir(tmp_path)
    first = check_paths(["."], no_cache=True, jobs=1)
    assert analyze._PROJECTS == {}
    second = check_paths(["."], no_cache=True, jobs=1)
    assert analyze._PROJECTS == {}
    assert [(r.path, r.diagnostics) for r in first.results] == [(r.path, r.diagnostics) for r in second.results]
    assert any(r.deps for r in first.results)
    assert [r.deps for r in first.results] == [r.deps for r in second.results]


# ------------------------------------------------------------------ a long-lived project (the language server)
FIXTURE_PROJECTS = Path(__file__).resolve().parent.parent / "fixtures" / "projects"
TWINS = sorted(p.name[4:] for p in FIXTURE_PROJECTS.glob("bad_*") if (FIXTURE_PROJECTS / f"good_{p.name[4:]}").is_dir())


def _analysed(root: Path, texts=None, fresh: bool = False):
    """Every module's findings (code, line, message, related locations), as the language
    server analyses them: one project per root kept between analyses (`refresh` first); or a
    fresh project (`fresh`). `texts`: editor buffers that differ from the files."""
    from ampfix.engine import analyze
    from ampfix.engine.registry import all_rules
    from ampfix.engine.results import Settings

    settings = Settings(project=True)
    rules = list(all_rules().values())
    if fresh:
        analyze._PROJECTS.clear()
    out = {}
    for f in sorted(root.rglob("*.py")):
        analyze.project_for(str(f), settings).refresh()
        text = (texts or {}).get(f) or f.read_text(encoding="utf-8")
        diags, _ = analyze.check_text(text, str(f), rules, settings)
        out[str(f.relative_to(root))] = sorted((d.code, d.line, d.message, repr(d.related)) for d in diags)
    return out


def _write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000))  # a later time, even on a coarse clock


@pytest.mark.parametrize("twin", TWINS)
def test_a_long_lived_project_answers_as_a_fresh_one_after_an_edit(tmp_path, twin):
    """Each fixture project with a mistake, then each of its modules replaced by the correct
    twin's one by one (saved, as the language server sees an edit of another file), then back:
    after every step, the findings of every module with the project kept between analyses are
    those of a fresh project. Then the same edits as unsaved editor buffers of the module being
    analysed (`Project.offer`)."""
    from ampfix.engine import analyze

    bad, good = FIXTURE_PROJECTS / f"bad_{twin}", FIXTURE_PROJECTS / f"good_{twin}"
    root = tmp_path / "p"
    shutil.copytree(bad, root)
    clear_caches()
    analyze._PROJECTS.clear()
    try:
        assert _analysed(root) == _analysed(root, fresh=True)
        changed = [f.relative_to(good) for f in sorted(good.rglob("*.py"))
                   if (bad / f.relative_to(good)).is_file()
                   and (bad / f.relative_to(good)).read_text() != f.read_text()]
        assert changed, twin
        for step in [(good, rel) for rel in changed] + [(bad, rel) for rel in changed]:
            source, rel = step
            _write(root / rel, (source / rel).read_text(encoding="utf-8"))
            warm = _analysed(root)
            assert warm == _analysed(root, fresh=True), step
        for rel in changed:  # unsaved: the buffer of the module analysed differs from its file
            buffers = {root / rel: (good / rel).read_text(encoding="utf-8")}
            warm = _analysed(root, texts=buffers)
            assert warm == _analysed(root, texts=buffers, fresh=True), rel
            assert _analysed(root) == _analysed(root, fresh=True), rel  # the buffer closed unsaved
    finally:
        analyze._PROJECTS.clear()


def test_a_save_keeps_the_summaries_of_the_modules_it_did_not_change(tmp_path):
    """The language server's project after another module is saved: the summary of the
    helper the analysis reads is kept (not parsed again), while the saved module's is read
    anew; a new file still makes it forget everything (an import may resolve to it now)."""
    from ampfix.engine import analyze
    from ampfix.engine.registry import all_rules
    from ampfix.engine.results import Settings

    tree(tmp_path, {"pyproject.toml": "", "pkg/__init__.py": "", "pkg/api.py": """\
        def do_step(loss):
            loss.backward()
        """, "pkg/other.py": """\
        from pkg.api import do_step

        def unrelated(loss):
            do_step(loss)
        """, "train.py": TRAIN_THROUGH_API})
    settings, rules = Settings(project=True), list(all_rules().values())
    train = tmp_path / "train.py"
    analyze._PROJECTS.clear()
    try:
        project = analyze.project_for(str(train), settings)

        def check(path):
            project.refresh()
            return analyze.check_text(path.read_text(), str(path), rules, settings)[0]

        assert [d.code for d in check(train)] == ["AMP001", "AMP017"]
        api = str(tmp_path / "pkg" / "api.py")
        assert project.parsed == [api]
        _write(tmp_path / "pkg" / "other.py", (tmp_path / "pkg" / "other.py").read_text() + "\nX = 1\n")
        check(tmp_path / "pkg" / "other.py")
        assert [d.code for d in check(train)] == ["AMP001", "AMP017"] and project.parsed == [api]
        # the helper changed: no backward called (its name, in code, keeps train.py a candidate:
        # the trigger tests read code, and train.py says "backward" only in a comment)
        _write(tmp_path / "pkg" / "api.py", "def do_step(loss, scaler=None):\n    scaler.update()\n    return loss.backward\n")
        assert check(train) == [] and project.parsed == [api, api]
        (tmp_path / "pkg" / "new.py").write_text("x = 1\n")  # the tree's shape: everything forgotten
        assert check(train) == [] and project.parsed == [api, api, api]
    finally:
        analyze._PROJECTS.clear()


def test_a_long_lived_project_notices_a_subclass_saved_in_a_module_it_read(tmp_path):
    # the language server's project: the trainer's `model: LanguageModel` runs the class's
    # `save_checkpoint` (AMP013) until a module of the project gains a subclass that overrides it
    # (`Project.overridden_below`, whose answers a changed text makes it forget)
    from ampfix.engine import analyze

    root = tmp_path / "p"
    shutil.copytree(FIXTURE_PROJECTS / "bad_checkpoint_method_annotated", root)
    extra = root / "lm" / "models" / "char_model.py"
    _write(extra, "import torch\n\n\nclass CharModel(torch.nn.Module):\n    pass\n")
    clear_caches()
    analyze._PROJECTS.clear()
    try:
        trainer = "lm/trainers/trainer.py"
        assert [d[0] for d in _analysed(root)[trainer]] == ["AMP013"]
        _write(extra, "from lm.models.language_model import LanguageModel\n\n\nclass CharModel(LanguageModel):\n"
                      "    def save_checkpoint(self, file, optimizer, epoch, loss):\n        pass\n")
        warm = _analysed(root)
        assert warm == _analysed(root, fresh=True)
        assert warm[trainer] == []
    finally:
        analyze._PROJECTS.clear()
