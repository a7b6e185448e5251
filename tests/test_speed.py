"""Issue 21: what makes ampfix fast must not change what it finds. Timings live in bench/
(SPEED.md); these tests check the mechanisms: the index walk and the positions against LibCST's
own visit and PositionProvider, the shipped table of rule facts against the rules, and that a
file without AMP code is checked without importing LibCST or the rules, even with --no-cache."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from ampfix.engine import registry, rulemeta
from ampfix.engine.analyze import Analysis, Settings, fix_suggestions
from ampfix.model.tree import Index, positions

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = sorted((ROOT / "fixtures").rglob("*.py"))


def fixture_and_engine_texts():
    """The text of every fixture and of every module of `ampfix/` (the corpus the exactness
    tests of the speed cuts compare old and new forms on)."""
    return [p.read_text(encoding="utf-8", errors="replace") for p in FIXTURES + sorted((ROOT / "ampfix").rglob("*.py"))]
SAMPLES = [p for p in FIXTURES if p.stat().st_size > 0][::7] + [ROOT / "ampfix" / "model" / "events.py",
                                                                ROOT / "ampfix" / "model" / "bound.py"]

# odd layouts: CR and CRLF line breaks, tabs, form feeds, a file without a final newline,
# f-strings with format specs, star imports, decorators, walrus, global/nonlocal, lambdas
ODD = [
    "import torch\r\nfrom torch.cuda.amp import *\r\nx = 1\r\n",
    "def f(a, *b, c=1, **d):\r    global g\r    return lambda y: (z := y)\r",
    "class A:\n\tdef m(self):\n\t\tnonlocal_ = f'{self!r:>{10}}'\n\f\ndef g(): pass",
    "@dec\nasync def h():\n    async with a as (b, c):\n        async for i in j:\n            yield i\n",
    "try:\n    pass\nexcept E as e:\n    pass\nwith open(p) as f, g() as h: pass\nx: int = [i for i in y if i]",
]


class _Visit(cst.CSTVisitor):
    def __init__(self):
        super().__init__()
        self.pre, self.post, self.parents, self.stack = [], [], {}, []

    def on_visit(self, node):
        if self.stack:
            self.parents[node] = self.stack[-1]
        self.pre.append(node)
        self.stack.append(node)
        return True

    def on_leave(self, node):
        self.post.append(node)
        self.stack.pop()


def _modules():
    for p in SAMPLES:
        yield p.name, cst.parse_module(p.read_bytes())
    for i, text in enumerate(ODD):
        yield f"odd{i}", cst.parse_module(text)


@pytest.mark.parametrize("name,module", list(_modules()), ids=lambda v: v if isinstance(v, str) else "")
def test_index_walks_the_tree_as_libcst_visits_it(name, module):
    index = Index.of(module)
    seen = _Visit()
    module.visit(seen)
    assert index.nodes == seen.pre and len({id(n) for n in seen.pre}) == len(seen.pre)
    assert [index.order_of(n) for n in seen.pre] == list(range(len(seen.pre)))
    assert sorted(seen.pre, key=index.post_of) == seen.post
    assert [index.post_of(n) for n in seen.post] == list(range(len(seen.post)))
    assert {n: index.parent(n) for n in seen.pre if index.parent(n) is not None} == seen.parents
    assert index.parent(module) is None and index.scope_of(module) is None
    # the (slower) visitor form of the index records the same facts
    slow = Index()
    module.visit(slow)
    for attr in ("nodes", "parent_at", "scope_at", "post_at", "calls", "functions", "classes", "imports",
                 "local_names", "declared", "assignments"):
        assert getattr(slow, attr) == getattr(index, attr), attr
    assert {t: v for t, v in slow.by_type.items()} == index.by_type
    # scopes: each node's innermost function, lambda, class or module (the module's own: none)
    scopes = {}
    for n in seen.pre:
        parent = seen.parents.get(n)
        if parent is not None:
            scopes[n] = parent if isinstance(parent, (cst.FunctionDef, cst.Lambda, cst.ClassDef, cst.Module)) \
                else scopes.get(parent)
    assert all(index.scope_of(n) is scopes.get(n) for n in seen.pre)


@pytest.mark.parametrize("name,module", list(_modules()), ids=lambda v: v if isinstance(v, str) else "")
def test_child_nodes_are_libcsts_children(name, module):
    from ampfix.model.tree import child_nodes

    for node in Index.of(module).nodes:
        ours, theirs = child_nodes(node), node.children
        assert len(ours) == len(theirs) and all(a is b for a, b in zip(ours, theirs)), type(node).__name__


def test_node_type_sets_are_isinstance():
    """`type(n) in node_types(...)`, the hot paths' type test, answers as `isinstance` for every
    LibCST node class, ABC bases included, and for what is not a node."""
    import inspect

    from ampfix.model import flow, regions, summarize, tree, values
    from ampfix.model.tree import node_types

    classes = [c for _, c in inspect.getmembers(cst, inspect.isclass) if issubclass(c, cst.CSTNode)]
    groups = [flow._STABLE_NODES, (cst.SimpleStatementLine, cst.BaseCompoundStatement), (cst.BaseExpression,),
              (cst.FunctionDef, cst.Lambda, cst.ClassDef), tree.COMPREHENSIONS, tree.LOOP_TYPES]
    for group in groups:
        types = node_types(*group)
        assert [c for c in classes if (c in types) != issubclass(c, group)] == []
        assert type(None) not in types and type(cst.MaybeSentinel.DEFAULT) not in types
    # the sets the model uses are built from the classes their names say
    assert flow._STABLE_TYPES == node_types(*flow._STABLE_NODES)
    assert tree._STATEMENTS == node_types(cst.SimpleStatementLine, cst.BaseCompoundStatement)
    assert regions._LAMBDA_OR_CLASS == {cst.Lambda, cst.ClassDef}
    assert values._MODULE_OR_CLASS == {cst.Module, cst.ClassDef}
    # a class the hot paths test with `type(n) is C` has no subclass, so that is `isinstance` too
    for single in (cst.With, cst.Call, cst.Attribute, cst.Name, cst.FunctionDef, cst.ClassDef, cst.Lambda,
                   cst.BooleanOperation, cst.ExceptHandler, cst.MatchCase, cst.IndentedBlock):
        assert node_types(single) == {single}
    assert summarize._NUMBER_OR_STRING == {cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString}


@pytest.mark.parametrize("name,module", list(_modules()), ids=lambda v: v if isinstance(v, str) else "")
def test_positions_are_libcsts(name, module):
    theirs = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    ours = positions(module)
    assert ours == {n: ((r.start.line, r.start.column), (r.end.line, r.end.column)) for n, r in theirs.items()}


ODD_PLACES = [
    "# header\n\n@dec(1)\n@dec2\ndef f():\n    return 1\n\n\nclass C(B):  # c\n    x = 1\n",
    "def \\\n  g():\n    pass\nx = 1; y = 2\nif x:\n    pass\nelse:\n    pass\n# footer\n",
    "import os\r\nasync def h():\r\n    async with a as b:\r\n        pass\r\nz = [\r\n 1,\r\n]",
    "x = 1\rdef k(a,\r      b):\r    return a\r",
    "try:\n    pass\nexcept E:\n    pass\nwhile 1:\n    break\nmatch x:\n    case 1:\n        pass\n",
    # statements of a top-level class's or function's body, placed alone (`Tree._raw_position`)
    "class A(B):\n    '''doc'''\n    x = 1; y = 2\n\n    # c\n    @dec\n    def f(self):  # t\n        return 1\n"
    "\n    class Inner:\n        def g(self): pass\n    async def h(self):\n        async with a:\n            pass\n",
    "class T:\n\tdef f(self):\n\t\tif x:\n\t\t\treturn 1\n\tdef \\\n  g(self):\n\t\tpass\n# footer\n",
    "def outer():\n  x = 1\n  def inner():\n    return x\n  return inner\nclass C: x = 1\nclass D:\n  y = 2",
    "class E:\n    def f(self):\n        pass\n    # a comment at the end of the class\n\n\nx = 1\n",
]


@pytest.mark.parametrize("text", [*ODD_PLACES, *ODD, *(p.read_text(encoding="utf-8") for p in SAMPLES[:20])])
def test_model_positions_per_statement_are_libcsts(text):
    """`Tree.position` places each top-level statement by CPython's line for it (checked
    against the text): every node, asked in any order, gets what PositionProvider gives."""
    from ampfix.model.tree import Tree

    module = cst.parse_module(text)
    theirs = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    tree = Tree()
    tree._init_tree(module)
    tree.source_text = text  # as ampfix.engine.analyze gives it
    for node in reversed(tree._index.nodes):
        assert tree.position(node) == theirs[node], type(node).__name__


def test_analysis_answers_as_fix_suggestions():
    """The language server's kept analysis gives the diagnostics and fix edits that
    `fix_suggestions` computes in one go, each fix edit only when asked for."""
    rules = list(registry.all_rules().values())
    checked = 0
    for path in sorted((ROOT / "fixtures" / "rules").rglob("bad_*.py"))[::3]:
        text = path.read_text(encoding="utf-8")
        want = fix_suggestions(text, str(path), rules, Settings())
        analysis = Analysis(text, str(path), rules, Settings())
        assert [(d.code, d.line, d.column, d.message, d.fix) for d in analysis.diagnostics] == \
               [(d.code, d.line, d.column, d.message, d.fix) for d in want]
        assert all(d.fix_edit is None for d in analysis.diagnostics)
        first = analysis.fix_edits(lambda d: d is analysis.diagnostics[0])
        assert all(d.fix_edit is None for d in first[1:])
        got = analysis.fix_edits()
        assert [d.fix_edit for d in got] == [d.fix_edit for d in want]
        checked += bool(want)
    assert checked > 10


def test_shipped_rule_facts_match_the_rules():
    """ampfix/engine/rule_facts_table.py is what the rules say (regenerate it with
    `python -m ampfix.engine.rulemeta` after changing a rule, ampfix/rule.py or the registry)."""
    assert rulemeta.shipped_facts() == registry.rule_facts(), \
        "stale ampfix/engine/rule_facts_table.py: run `python -m ampfix.engine.rulemeta`"


# runs `ampfix` in-process and prints (stderr, last line) which heavy modules were imported
WRAPPER = """
import sys, runpy
sys.argv = ["ampfix"] + sys.argv[1:]
try:
    runpy.run_module("ampfix", run_name="__main__", alter_sys=True)
    code = 0
except SystemExit as exc:
    code = exc.code
heavy = sorted(m for m in sys.modules if m == "libcst" or m.startswith(("libcst.", "ampfix.rules.", "ampfix.engine.analyze",
                                                                    "ampfix.model", "tomllib", "difflib")))
sys.stderr.write("\\nHEAVY=" + ",".join(heavy) + "\\n")
sys.exit(code)
"""


def _heavy(args, cwd):
    env = dict(os.environ, NO_COLOR="1")
    env.pop("AMPFIX_CACHE_DIR", None)
    p = subprocess.run([sys.executable, "-c", WRAPPER, *args], capture_output=True, text=True, env=env, cwd=cwd)
    err, _, heavy = p.stderr.rpartition("\nHEAVY=")
    return p.returncode, p.stdout, err, [m for m in heavy.strip().split(",") if m]


@pytest.mark.parametrize("cache", [["--no-cache"], []], ids=["no-cache", "first-run"])
def test_a_file_without_amp_code_imports_nothing_heavy(tmp_path, cache):
    (tmp_path / "plain.py").write_text("import os\n\ndef f(x):\n    return os.path.join(x, 'y')\n")
    (tmp_path / "mentions.py").write_text("# autocast and backward, in a comment only\nx = 1\n")  # AMP001's triggers
    code, out, err, heavy = _heavy(["check", *cache, "plain.py"], tmp_path)
    assert (code, heavy) == (0, []), err
    assert "All checks passed" in out
    # a file whose text holds a trigger is parsed and analysed as before
    code, out, err, heavy = _heavy(["check", *cache, "plain.py", "mentions.py"], tmp_path)
    assert code == 0 and "libcst" in heavy and "ampfix.engine.analyze" in heavy, err


NOQA_TEXTS = [
    "x = 1  # noqa\ny = '# noqa: AMP003'  # NOQA: AMP001\n",
    's = """\n# noqa inside a string\n"""  # noqa: AMP002\nt = r"\\"# noqa"  # noqa\n',
    "u = f'{a}#noqa' + b'#' + rb'\\'' # noqa:AMP1, AMP2\nv = ('''a\\''' '# noqa')\n    # noqa own line\n",
    "def f():\\\n    pass  # noqa\r\nx = 1  # noqa: AMP005\r\n",
    "a = 1\rb = 2  # noqa\r",  # lone carriage returns: the tokenizer reads them
]


@pytest.mark.parametrize("text", NOQA_TEXTS + [p.read_text(encoding="utf-8") for p in
                                               sorted((ROOT / "ampfix").rglob("*.py")) + FIXTURES])
def test_noqa_comments_are_the_tokenizers(text):
    """`noqa_lines` reads the comments with a regular expression that skips string literals
    (the tokenizer cost 35 ms on accelerate's accelerator.py): the same comments as Python's
    tokenizer finds (checked on 11199 files of this venv's site-packages and bench/.cache)."""
    from ampfix.engine.noqa import comments, noqa_comments

    assert noqa_comments(text) == [c for c in comments(text) if "noqa" in c.text.lower()]


@pytest.mark.parametrize("project", [False, True], ids=["alone", "project"])
def test_a_checked_files_model_and_tree_are_freed_without_a_collection(project):
    """The engine pauses the cyclic collector while it analyses a file (`gc_paused`): the model
    and the tree must then be freed by reference counting when the analysis ends. A reference
    cycle through them (a facet keeping its model, a recursive closure over the index) left
    every file's tree to the next collection, which traversed it: 5-10% of `check` on
    accelerate and peft (bench/SPEED.md). Checked on a project fixture whose analysis reads
    other modules' summaries (their models too)."""
    import gc

    from ampfix.engine.analyze import check_text
    from ampfix.model import AmpModel

    path = ROOT / "fixtures" / "projects" / "bad_base_class_scaler" / "trainers" / "classifier.py"
    rules = [r for r in registry.all_rules().values()]
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        diags, parsed = check_text(path.read_text(encoding="utf-8"), str(path), rules, Settings(project=project))
        assert parsed and (diags or not project)  # (the finding needs the base class of another module)
        gc.collect()
        kept = [o for o in gc.garbage if issubclass(type(o), (cst.CSTNode, AmpModel, Index))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert kept == []


def _cycle() -> object:
    """An object only a reference cycle keeps alive (reference counting cannot free it)."""
    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a
    return a


def test_a_batch_run_freezes_what_each_file_leaves_and_thaws_it():
    """In a batch run (`collector.batch`: `runner.run` and the pool's workers) the end of each
    file's analysis (`collector.paused`) freezes what it left alive, so that the collection the
    file's allocations trigger does not traverse the project layer's memos again; every
    `FREEZE_FILES` files, and when the run ends, it is all unfrozen, and a full collection every
    `FREEZE_FILES` files reclaims the cyclic garbage frozen with it. Outside a batch (the
    language server), nothing is frozen."""
    import gc
    import weakref

    from ampfix.engine import collector

    assert gc.get_freeze_count() == 0
    with collector.paused():  # not in a batch: nothing frozen
        kept = _cycle()
    assert gc.get_freeze_count() == 0
    old_threshold, old_every = gc.get_threshold(), collector.FREEZE_FILES
    collector.FREEZE_FILES = 3
    try:
        with collector.batch():
            assert all(a >= b for a, b in zip(gc.get_threshold(), collector.RUN_GC_THRESHOLD))
            with collector.paused():
                garbage = weakref.ref(_cycle())  # cyclic garbage made while a file is analysed
                kept = _cycle()
            assert gc.get_freeze_count() > 0 and garbage() is not None  # frozen, not collected
            gc.collect()
            assert garbage() is not None  # a frozen cycle survives collections...
            with collector.paused():
                pass
            with collector.paused():  # ... until the FREEZE_FILES-th file's full collection
                pass
            assert garbage() is None and kept.other.other is kept
            assert gc.get_freeze_count() > 0  # (what the last file left is frozen again)
        assert gc.get_freeze_count() == 0 and gc.get_threshold() == old_threshold
        gc.freeze()  # a host that froze its own objects before the run keeps them frozen
        frozen = gc.get_freeze_count()
        with collector.batch():
            with collector.paused():
                kept = _cycle()
            assert gc.get_freeze_count() == frozen
        assert gc.get_freeze_count() == frozen
    finally:
        collector.FREEZE_FILES = old_every
        gc.unfreeze()


def test_a_check_run_leaves_nothing_frozen_and_the_thresholds_as_they_were():
    """`runner.run` is a batch (`collector.batch`): after it, with findings made across modules,
    nothing stays frozen and the collector's thresholds are back."""
    import gc

    from ampfix.engine import runner

    before = gc.get_threshold()
    folder = ROOT / "fixtures" / "projects" / "bad_base_class_scaler"
    run = runner.run(runner.make_plan(runner.Options(paths=[str(folder)], no_cache=True, jobs=1)))
    assert any(r.diagnostics for r in run.results)
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before


def test_leaving_a_batch_collects_nothing():
    """Leaving a batch (`collector.batch`) restores the collector's thresholds without the
    collection of the young generation that grew under the raised ones (tens of milliseconds at
    the end of a pool run's main process): what the run allocated joins the oldest generation,
    uncollected, and nothing stays frozen."""
    import gc

    from ampfix.engine import collector

    assert gc.get_freeze_count() == 0
    started = []

    def note(phase, info):
        if phase == "start":
            started.append(info["generation"])

    before = gc.get_threshold()
    gc.callbacks.append(note)
    try:
        with collector.batch():
            kept = [_cycle() for _ in range(5000)]  # allocations, under the raised thresholds
            assert gc.get_count()[0] >= 5000
            started.clear()
        young = gc.get_count()[0]
        assert started == [] and young < gc.get_threshold()[0]
    finally:
        gc.callbacks.remove(note)
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before and len(kept) == 5000


def test_a_risky_file_runs_in_a_child_whether_or_not_the_run_could_have_used_a_pool(tmp_path, monkeypatch):
    """`guard.risky` decides which files a sequential run parses in a child process
    (`runner.isolated`). A run that may use a pool (-j 2) tests the files only once it knows it
    runs them here (fewer than PARALLEL_MIN_BYTES: `_risky_jobs`), the pool's workers testing
    each before parsing it: the same files go to a child as with -j 1, with the same results."""
    from ampfix.engine import runner

    trainer = ("import torch\nscaler = torch.cuda.amp.GradScaler()\nwith torch.autocast('cuda'):\n"
               "    loss = model(x)\n    loss.backward()\n")
    (tmp_path / "plain.py").write_text(trainer)
    (tmp_path / "long.py").write_text(trainer + "x = [" + ", ".join(str(i) for i in range(400)) + "]\n")
    (tmp_path / "deep.py").write_text(trainer + "y = " + "(" * 120 + "1" + ")" * 120 + "\n")
    seen = []
    real = runner.isolated
    monkeypatch.setattr(runner, "isolated", lambda job: seen.append(os.path.basename(job[0])) or real(job))
    answers = []
    for jobs in (1, 2):
        seen.clear()
        run = runner.run(runner.make_plan(runner.Options(paths=[str(tmp_path)], no_cache=True, jobs=jobs)))
        assert sorted(seen) == ["deep.py", "long.py"], jobs
        answers.append([(r.path, [d.code for d in r.diagnostics]) for r in run.results])
    assert answers[0] == answers[1] and any(codes for _, codes in answers[0])


def test_the_triggers_look_for_each_string_once_and_answer_as_the_rules_do():
    """`triggered` tests the rules that keep `Rule`'s trigger tests through one scan of the text
    for all of them (`Scan`: each string looked for once): on every fixture and rule file, each
    rule's answer is its own `triggered_by` and `project_candidate` on the text's code (comments
    and docstrings masked), or on the text as it is for a rule that reads comments (AMP901)."""
    from ampfix.engine import analyze
    from ampfix.lexemes import masked
    from ampfix.triggers import Scan, project_candidate_test, trigger_test

    rules = list(registry.all_rules().values())
    defaults = analyze._rule_set(rules)
    assert defaults.default_trigger and defaults.default_candidate and len(defaults.default_trigger) < len(rules)
    fired = candidates = 0
    for path in FIXTURES + sorted((ROOT / "rules").glob("*.py")):
        raw = path.read_text(encoding="utf-8", errors="replace")
        text = masked(raw)
        lowered = text.lower()
        held, held_lower = Scan(text), Scan(lowered)
        assert analyze.triggered(rules, raw) == [
            r for r in rules if (r.triggered_by(raw, raw.lower()) if r.reads_comments else r.triggered_by(text, lowered))
        ], path
        for r in defaults.default_trigger:
            assert trigger_test(held, held_lower, r.triggers, r.triggers_lower, r.requires) == \
                r.triggered_by(text, lowered), (path, r.code)
            fired += r.triggered_by(text, lowered)
        for r in defaults.default_candidate:
            answer = r.project_candidate(text, lowered)
            assert project_candidate_test(held, held_lower, r.triggers, r.triggers_lower, r.requires,
                                          r.project_requires) == answer, (path, r.code)
            candidates += answer
    assert fired > 100 and candidates > 100


def test_the_runners_first_trigger_test_looks_for_each_string_once_and_answers_as_each_rule():
    """`rulemeta.first_triggered` (the runner's test of a file's raw text, before any rule is
    imported) looks for each string once (`Scan`) and lower-cases the text only for a rule with
    lower-case triggers: on every fixture and rule file, with the project and without, it names
    the first rule whose own test passes on the text as it is."""
    from ampfix.triggers import Scan

    info = registry.rule_facts()
    codes = sorted(info)
    assert any(info[c].triggers_lower for c in codes)
    answered = 0
    for path in FIXTURES + sorted((ROOT / "rules").glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        for project in (False, True):
            expected = next((c for c in codes if info[c].maybe_triggered(text, text.lower(), project)), None)
            assert rulemeta.first_triggered(codes, text, info, project) == expected, (path, project)
            answered += expected is not None
    assert answered > 100
    lazy = Scan("GradScaler AutoCast", lower=True)
    assert lazy.to_lower and lazy.text == "GradScaler AutoCast"  # not lower-cased before a question
    assert "autocast" in lazy and "gradscaler" in lazy and "Autocast" not in lazy and not lazy.to_lower
    assert lazy.found == {"autocast": True, "gradscaler": True, "Autocast": False}


def test_a_text_is_masked_once_and_the_memo_stays_bounded(monkeypatch):
    """`masked` lexes a text once (the prefilter's masks serve the project's trigger reach, and
    the pool's forks inherit them) and gives what lexing gives; past its bound the memo starts
    again rather than growing."""
    from ampfix import lexemes

    monkeypatch.setattr(lexemes, "_MEMO", {})
    monkeypatch.setattr(lexemes, "_memo_size", 0)
    monkeypatch.setattr(lexemes, "_MEMO_CHARS", 200)
    lexed = []
    real = lexemes._masked
    monkeypatch.setattr(lexemes, "_masked", lambda text: lexed.append(text) or real(text))
    text = 'x = 1  # autocast\n"""backward"""\ny = "a#b"\n'
    first = lexemes.masked(text)
    assert first == real(text) and "autocast" not in first and '"a#b"' in first
    assert lexemes.masked("".join(list(text))) is first and lexed == [text]  # an equal text: no second lexing
    other = "z = 2  # " + "w" * 180 + "\n"
    assert lexemes.masked(other) == real(other)
    assert list(lexemes._MEMO) == [other] and lexemes._memo_size == len(other)
    assert lexemes.masked(text) == first and len(lexed) == 3


@pytest.mark.skipif(sys.version_info < (3, 11), reason="possessive quantifiers need Python 3.11")
def test_the_possessive_reach_patterns_match_as_the_backtracking_ones():
    """`_CALLED_RE` and `_DOTTED_USE_RE` (the project's reach) are possessive on Python 3.11:
    on every fixture and engine file, and on names that are neither called nor dotted, they
    find what the backtracking patterns find."""
    import re

    from ampfix.project import project

    called = re.compile(r"(?<![\w.])([A-Za-z_]\w*(?:\.\w+)*)[ \t]*\(")
    dotted = re.compile(r"(?<![\w.])([A-Za-z_]\w*)((?:\.\w+)+)")
    texts = fixture_and_engine_texts()
    texts.append("a.b.c.d (x) ab.cd.(e) f\t( g  .h k.l.m mm.nn_ .5 x1.y2( __init__.x.__call__ (")
    assert len(texts) > 100
    for text in texts:
        assert project._CALLED_RE.findall(text) == called.findall(text)
        assert project._DOTTED_USE_RE.findall(text) == dotted.findall(text)


def test_the_runner_does_not_test_a_files_triggers_twice():
    """The runner tests each file's triggers with the rules' facts (`rulemeta.first_triggered`)
    before it loads the rules; `_needs_analysis` then tests them with the rules themselves. When
    the first rule that passed keeps `Rule`'s own tests, it passes them again, and the runner
    does not repeat them (a fifth of the main process's serial time on timm): the answer is the
    same as with the tests, on every fixture and every rule file, with a rule that narrows its
    own test (AMP005, AMP011) first or not; but for a file whose first rule's trigger words are
    only in comments or docstrings, which the workers drop before parsing."""
    from ampfix.engine import runner
    from ampfix.engine.results import decode_source

    from ampfix.engine import analyze

    info = rulemeta.rule_info(registry.rule_facts)
    orders = [list(info), ["AMP005", "AMP011", *[c for c in info if c not in ("AMP005", "AMP011")]]]
    seen = prose = 0
    for path in FIXTURES + sorted((ROOT / "rules").glob("*.py")):
        data = path.read_bytes()
        text = decode_source(data, str(path)).text
        for codes in orders:
            for project in (False, True):
                first = rulemeta.first_triggered(codes, text, info, project)
                if first is None:
                    continue
                seen += 1
                risky_known, risky_full = set(), set()
                known = runner._needs_analysis(str(path), data, codes, risky_known, (first, text))
                full = runner._needs_analysis(str(path), data, codes, risky_full)
                if known is None and full is not None:
                    # the first test reads the raw text, the rules' own tests its code (comments and
                    # docstrings masked): a file whose trigger words are only in its prose goes to a
                    # worker, where `check_text`'s `triggered` drops it before parsing it
                    rule = registry.all_rules()[first]
                    assert not full.diagnostics and full.error is None, path
                    assert not analyze._Tests([rule], text).own(rule) and analyze._Tests([rule], text, mask=False).own(rule), path
                    prose += 1
                    continue
                assert (known is None) == (full is None) and risky_known == risky_full, (path, first)
    assert seen > 100 and prose < seen // 10
    assert registry.overrides(registry.all_rules()["AMP005"], "triggered_by")
    assert registry.overrides(registry.all_rules()["AMP011"], "project_candidate")
    assert not any(registry.overrides(registry.all_rules()["AMP001"], t) for t in ("triggered_by", "project_candidate"))


def test_the_exactness_check_compares_findings_traces_dependencies_and_summaries(tmp_path):
    # bench/exactness.py is how a speed change shows it changes nothing: run against this same
    # checkout it finds every comparison the same, and a project where one side differs is DIFF
    project = ROOT / "fixtures" / "projects" / "bad_helper_clip"
    script = ROOT / "bench" / "exactness.py"
    done = subprocess.run([sys.executable, str(script), "--baseline-python", sys.executable, str(project)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[:2] for line in lines] == [["same", "json"], ["same", "traces"], ["same", "deps"],
                                                    ["same", "summaries"]]
    assert all(int(line.split("(")[1].split()[0]) > 1 for line in lines)  # something was compared
    # a baseline that says something else (a python whose ampfix reports nothing): DIFF, exit 1
    fake = tmp_path / "fake"
    (fake / "ampfix").mkdir(parents=True)
    (fake / "ampfix" / "__main__.py").write_text("print('[]')\n")
    (fake / "ampfix" / "__init__.py").write_text("")
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\nexport PYTHONPATH='{fake}'\nexec '{sys.executable}' \"$@\"\n")
    wrapper.chmod(0o755)
    done = subprocess.run([sys.executable, str(script), "--baseline-python", str(wrapper), "--what", "json",
                           str(project)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and done.stdout.startswith("DIFF  json"), done.stdout + done.stderr
    # ... and one whose modules have no summary
    (fake / "ampfix" / "project").mkdir()
    (fake / "ampfix" / "project" / "__init__.py").write_text(
        "class Project:\n    def __init__(self, root):\n        pass\n\n    def summary(self, path):\n        return None\n")
    (fake / "ampfix" / "project" / "layout.py").write_text("def find_root(path):\n    return path.parent\n")
    done = subprocess.run([sys.executable, str(script), "--baseline-python", str(wrapper), "--what", "summaries",
                           str(project)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and done.stdout.startswith("DIFF  summaries"), done.stdout + done.stderr


def test_the_lines_above_an_import_are_read_from_a_window_as_from_the_whole_text(monkeypatch):
    """`module_imports` looks for the top-level line above an indented import in a window
    before it (`_lines_before`), not in all of the text above: the same lines, whatever the
    line breaks (`\\r\\n` cut by the window, `\\r`, form feeds) and the lines' lengths (longer
    than the first window), and the same imports on every fixture and engine file."""
    import random

    from ampfix.project import project

    rng = random.Random(7)
    pieces = ["x = 1\n", "\r\n", "\r", "\n", "\x0c", "if a:\n", "    import os\n", "try:\n", "  from .a import b\n",
              "y" * 5000 + "\n", "z" * 4095 + "\r\n"]
    for _ in range(400):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 40)))
        for end in {0, len(text), *(rng.randint(0, len(text)) for _ in range(6))}:
            for n in (1, 12):
                assert project._lines_before(text, end, n) == text[:end].splitlines()[-n:]

    texts = fixture_and_engine_texts()
    texts.append("try:\n" + "    x = 1\n" * 5 + "    import a\nif b:\n    from . import c\ndef f():\n    import d\n")
    windowed = [project.module_imports(text) for text in texts]
    monkeypatch.setattr(project, "_lines_before", lambda text, end, n: text[:end].splitlines()[-n:])
    assert windowed == [project.module_imports(text) for text in texts]
    assert [len(found) for found in windowed[-1:]] == [2]  # `a` (in the `try`) and `c` (under the `if`)


def test_the_top_level_imports_are_found_at_the_lines_that_hold_import_as_by_a_scan_of_every_line():
    """`module_imports` tries its pattern only at the start of the lines that hold "import"
    (`graph.at_lines_holding`), not at every offset: the same matches as `finditer` on every
    fixture and engine file and on strings made to cross its edges (parenthesised names over
    several lines that hold "import", `;`, comments, `\r`, words that hold "import")."""
    import random

    from ampfix.project import project
    from ampfix.project.graph import at_lines_holding

    def spans(found):
        return [(m.start(), m.end(), m.groups()) for m in found]

    rng = random.Random(11)
    pieces = ["import os\n", "  import a.b as c\n", "from . import (x,\n", "  importer,\n  y)\n", "z = 1\n",
              "from .m import n; import q\n", "# import r\n", "\r", "\n", "try:\n", "importlib = 1\n",
              "from x import y  # z\n", "s = 'import t'\n", "from .import u\n", "\timport v\n", "impor", "t w\n"]
    texts = fixture_and_engine_texts()
    texts += ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 30))) for _ in range(3000)]
    for text in texts:
        assert spans(at_lines_holding(text, project._TOP_IMPORT_RE)) == spans(project._TOP_IMPORT_RE.finditer(text))


def test_the_top_level_names_are_found_after_line_breaks_as_by_the_line_start_pattern():
    """`module_index` finds the top-level definitions and assignments after each line break
    (`top_level_names`), not by trying `^` at every offset: the same offsets and groups as
    `_TOP_RE.finditer` on every fixture and engine file and on strings made to cross its edges
    (a match at the very start, empty lines first, `\r`, annotations, `==`)."""
    import random

    from ampfix.project import project

    rng = random.Random(13)
    pieces = ["def f():\n", "async def g(): pass\n", "class C(B):\n", "x = 1\n", "y: int = 2\n", "z == 3\n",
              "    w = 4\n", "\n", "\r", "if a:\n", "\tv = 5\n", "u: Dict[str, int]\n", "t=6", "s :x= 7\n", "#", " "]
    texts = fixture_and_engine_texts()
    texts += ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 25))) for _ in range(3000)]
    for text in texts:
        assert project.top_level_names(text) == [(m.start(), m.groups()) for m in project._TOP_RE.finditer(text)]


def test_the_trigger_views_literal_scans_remove_what_the_boundary_patterns_remove():
    """The trigger view finds `autocast_...dtype` names and `is_/get_/set_autocast...` queries by
    their literal words, then tests the boundary before (`_without_autocast_values`,
    `_without_autocast_queries`): the same text as `_AUTOCAST_VALUE` and `_AUTOCAST_QUERY`'s
    substitutions, on every fixture and engine file and on strings made to cross their edges
    (a word character before, Unicode letters, runs that join two words)."""
    import random

    from ampfix.project import project

    texts = fixture_and_engine_texts()
    rng = random.Random(3)
    pieces = ["is_autocast", "get_autocast_dtype", "set_autocast_enabled", "_autocast", "xis_autocast", "\u00e9",
              "autocast_dtype", "autocast_enabled", "xautocast_args", "autocast_foo_kwargs", " ", "(", ".", "_", "is",
              "get", "set", "\n", "a1", "autocast_", "torch.is_autocast_enabled()", "\u00e9autocast_dtype",
              "is_autocastis_autocast", "get_autocast", "\u00e9_"]
    texts += ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 12))) for _ in range(5000)]
    changed = 0
    for text in texts:
        values, queries = project._without_autocast_values(text), project._without_autocast_queries(text)
        assert values == project._AUTOCAST_VALUE.sub(project.MASK, text), text
        assert queries == project._AUTOCAST_QUERY.sub("", text), text
        changed += values != text or queries != text
    assert changed > 1000


def test_the_boundaries_tested_behind_a_literal_find_what_the_leading_boundaries_find():
    """`summarize.AMP_TEXT` and `TRACE_TEXT` write `\\bamp` as `a(?<=\\ba)mp`, and
    `Project._lacks_method` writes `\\bdef` as `def(?<=\\bdef)` (a leading `\\b` keeps `re` from
    its literal or first-character search): on every fixture and engine file, searched from
    each definition's start to its end as the project searches them (the boundary at the
    search's start reads the character before it), and on edge strings, they find the same."""
    import re

    from ampfix.model import summarize

    words = summarize._EVENT_WORDS.replace("a(?<=\\ba)mp", "\\bamp")
    assert "\\bamp\\b" in words and "\\bamp_" in words
    old_amp, old_trace = re.compile(words + summarize.AMP_TEXT.pattern[len(summarize._EVENT_WORDS):]), re.compile(words)
    texts = fixture_and_engine_texts()
    texts += ["amp", "xamp", "amp_", "_amp", "camp_x", " amp ", "amp.x", "\u00e9amp", "ampamp", "def f", "xdef f",
              "\u00e9def forward(", "  def forward(self)", "def forwards"]
    for text in texts:
        for a, b in [*summarize.def_spans(text).values(), (0, len(text)), (1, len(text)), (3, len(text))]:
            for old, new in ((old_amp, summarize.AMP_TEXT), (old_trace, summarize.TRACE_TEXT)):
                found, expected = new.search(text, a, b), old.search(text, a, b)
                assert (found and found.span()) == (expected and expected.span()), (text[:80], a, b)
            for name in ("forward", "f", "step"):
                old = re.compile(r"\bdef[ \t]+%s\b" % name)
                new = re.compile(r"def(?<=\bdef)[ \t]+%s\b" % name)
                assert [m.span() for m in new.finditer(text, a, b)] == [m.span() for m in old.finditer(text, a, b)]


def test_a_plain_strings_value_is_read_without_evaluating_it():
    """`literal_string` reads a plain quoted string's value from its text (no prefix, no escape,
    not triple-quoted), and asks LibCST for every other: the value LibCST's `evaluated_value`
    gives, for every string of every fixture and for edge strings."""
    from ampfix.model.syntax import literal_string

    texts = [p.read_text(encoding="utf-8", errors="replace") for p in FIXTURES]
    texts.append("""x = ('', "", 'a"b', "a'b", '''t''', \"\"\"u\"\"\", r'\\\\d', b'x', f'{y}',\n"""
                 """    'caf\u00e9', '\\\\n', u'v', "#")\n""")
    seen = 0
    for text in texts:
        try:
            module = cst.parse_module(text)
        except cst.ParserSyntaxError:
            continue
        for node in Index.of(module).by_type.get(cst.SimpleString, []):
            value = node.evaluated_value
            assert literal_string(node) == (value if isinstance(value, str) else None), node.value
            seen += 1
    assert seen > 1000



def test_the_bracket_screen_keeps_the_brackets_as_the_pattern_does():
    """`guard.brackets` keeps an ASCII text's brackets by deleting its other bytes: the same
    brackets as the pattern's, on every fixture and engine file and on non-ASCII text; the
    screen's answer at its limit (99 nested brackets pass, 100 do not)."""
    from ampfix.engine import guard

    texts = fixture_and_engine_texts()
    edges = ["(" * 99 + ")" * 99, "(" * 100 + ")" * 100, "[" * 60 + "{" * 40 + "}" * 40 + "]" * 60,
             "caf\u00e9(" * 100 + ")" * 100, "x = '\u00e9'\n" + "(" * 50 + ")" * 50, "\x7f(\x80)"]
    for text in texts + edges:
        assert guard.brackets(text) == guard._NOT_BRACKETS.sub("", text), text[:60]
    assert [guard.bracket_depth_over(t) for t in edges] == [False, True, True, True, False, False]
