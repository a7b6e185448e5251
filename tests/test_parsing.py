"""ampfix's parse (`ampfix.model.parsing.parse_module`) is LibCST's: the same tree, the same
errors; only the re-check of the nodes it builds is left out, and only for those."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import libcst as cst
import pytest
from libcst._nodes.base import CSTNode, CSTValidationError

from ampfix.model import parsing
from ampfix.model.parsing import parse_expression, parse_module, parse_statement

ROOT = Path(__file__).resolve().parent.parent

# code LibCST rejects, some of it only in its nodes' own checks
INVALID = [
    "f(**a, b)\n", "f(a=1, b)\n", "def f(a=1, b): pass\n", "def f(*, **k): pass\n", "def f(*): pass\n",
    "lambda *: 1\n", "x = 1 if 2\n", "x = 0777\n", "x = 1_\n", "x = 1__0\n", "x = 0b2\n",
    "f() = 1\n", "x += y += 1\n", "def f(**k, a): pass\n", "def f(a, /, b, /): pass\n", "def f(/, a): pass\n",
    "@\ndef f(): pass\n", "import a.b as\n", "x = 'abc\n", "x = 1 +\n", "global x = 1\n", "lambda a=1, b: 0\n",
    "def f(*a, *b): pass\n", "f(,)\n", "x = 1 if 2 else\n", "try:\n    pass\n", "x = 0x\n", "x = 09\n",
    "from x import a,\n", "x = `a`\n", "class A(:\n    pass\n", "if x:\npass\n", "\tif x:\n  pass\n",
]


def _sources():
    """A fifth of the fixtures (training scripts, trainer classes, multi-module projects) and the
    rules' own code: a hundred-odd real shapes, in about a second (the corpus test below reads
    more)."""
    yield from sorted((ROOT / "fixtures").rglob("*.py"))[::5]
    yield from sorted((ROOT / "rules").glob("*.py"))


def test_the_fast_parse_is_installed_on_this_libcst():
    # if a LibCST release gives a node class a `__post_init__` of its own (or makes the base one
    # do more than validate), ampfix parses with LibCST's own parse_module, and this says so
    assert parsing.INSTALLED


def test_trees_are_libcsts_on_every_source_file():
    n = 0
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        ours, theirs = parse_module(text), cst.parse_module(text)
        assert ours.deep_equals(theirs), path
        assert ours.code == text, path
        n += 1
    assert n > 100


@pytest.mark.parametrize("text", INVALID)
def test_errors_are_libcsts(text):
    with pytest.raises(Exception) as theirs:
        cst.parse_module(text)
    with pytest.raises(Exception) as ours:
        parse_module(text)
    assert type(ours.value) is type(theirs.value)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("text", ["__param__.scaler", "torch.amp.GradScaler('cuda', enabled=__self__.use_amp)",
                                  "{'model': m.state_dict(), **extra}", "lambda x: x[1:2, ...]", "f'{a!r:>{w}}'"])
def test_expressions_and_statements_are_libcsts(text):
    assert parse_expression(text).deep_equals(cst.parse_expression(text))
    assert parse_statement(text + "\n").deep_equals(cst.parse_statement(text + "\n"))


def _ids(node, out):
    out.append(id(node))
    for child in node.children:
        _ids(child, out)
    return out


def test_a_copy_of_a_tree_is_a_fresh_parse_of_it_made_of_new_nodes():
    # `copied` stands in for a fresh parse of a materialised value (`foreign._adopt`): the same
    # tree, no node shared with the original, and `each` meets every new node with its parent
    from ampfix.model.tree import copied

    n = 0
    for path in list(_sources())[:60]:
        text = path.read_text(encoding="utf-8")
        original = parse_module(text)
        met = {}
        copy = copied(original, set(), lambda node, parent: met.__setitem__(id(node), (node, parent)))
        assert copy is not None and copy.deep_equals(original) and copy.code == text, path
        new_ids = _ids(copy, [])
        assert not set(new_ids) & set(_ids(original, [])), path
        assert sorted(met) == sorted(new_ids), path  # every new node, once
        assert met[id(copy)][1] is None
        for node, parent in met.values():
            assert all(met[id(c)][1] is node for c in node.children)
        n += 1
    assert n >= 50


def test_a_copy_keeps_the_nodes_it_is_told_to_keep_as_they_are():
    from ampfix.model.tree import copied

    arg = cst.parse_expression("model.scaler")
    expr = cst.parse_expression("f(__param__.s, g(x), k=1)")
    expr = expr.with_changes(args=[expr.args[0].with_changes(value=arg), *expr.args[1:]])
    met = []
    copy = copied(expr, {id(arg)}, lambda node, parent: met.append(node))
    assert copy.deep_equals(expr) and copy.args[0].value is arg
    assert all(id(m) not in _ids(arg, []) for m in met)  # nothing inside the kept node is copied
    assert copied(arg, {id(arg)}, lambda node, parent: met.append(node)) is arg


class _Swap(cst.CSTTransformer):
    """A LibCST transformer that puts `swap(node)` where it gives a node."""

    def __init__(self, swap):
        super().__init__()
        self.swap = swap

    def on_leave(self, original_node, updated_node):
        return self.swap(original_node) or updated_node


def test_a_copy_with_replacements_is_what_a_transformer_makes_with_its_checks():
    from ampfix.model.tree import copied

    arg = cst.parse_expression("(a + b)")

    def swap(node):
        return arg if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) \
            and node.value.value == "__param__" and node.attr.value == "x" else None

    expr = cst.parse_expression("g(__param__.x, [__param__.x.y, h], k=__param__.z)")
    met = []
    copy = copied(expr, {id(arg)}, lambda node, parent: met.append(node), swap)
    assert copy.deep_equals(expr.visit(_Swap(swap))) and copy.args[0].value is arg
    assert copy.args[1].value.elements[0].value.value is arg
    # a node rebuilt around a replacement is checked as LibCST's constructors check it
    bad = cst.Name("x")  # `not` then a name with no space between: LibCST rejects the rebuilt node
    expr = cst.parse_expression("not(__param__.x)")
    swap_bad = (lambda node: bad if isinstance(node, cst.Attribute) else None)
    with pytest.raises(Exception) as theirs:
        expr.visit(_Swap(swap_bad))
    with pytest.raises(Exception) as ours:
        copied(expr, {id(bad)}, lambda node, parent: None, swap_bad)
    assert type(ours.value) is type(theirs.value) and str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("text", ["a.", "f(", "1 +", "x = 1", "a b"])
def test_expression_errors_are_libcsts(text):
    with pytest.raises(Exception) as theirs:
        cst.parse_expression(text)
    with pytest.raises(Exception) as ours:
        parse_expression(text)
    assert type(ours.value) is type(theirs.value) and str(ours.value) == str(theirs.value)


def test_the_config_is_passed_on():
    config = cst.PartialParserConfig(python_version="3.8")
    text = "with (open(a) as f, open(b) as g):\n    pass\n"
    assert parse_module(text, config=config).deep_equals(cst.parse_module(text, config=config))


def test_the_parse_leaves_out_the_node_checks_and_nothing_else_does(monkeypatch):
    calls = []
    original = cst.Name._validate
    monkeypatch.setattr(cst.Name, "_validate", lambda self: calls.append(self.value) or original(self))
    parse_module("x = y\n")
    assert calls == []  # the parser's names were not checked again
    cst.parse_module("x = y\n")
    assert calls == ["x", "y"]  # LibCST's own parse checks them
    with pytest.raises(CSTValidationError):
        cst.Name("")  # a node made outside the parse is checked


def test_a_parse_on_another_thread_does_not_turn_the_checks_off_here():
    inside, release = threading.Event(), threading.Event()
    made = []

    def other():  # a thread that stays "inside" ampfix's parse while this one makes a node
        parsing._PARSING.add(threading.get_ident())
        inside.set()
        release.wait(10)
        parsing._PARSING.discard(threading.get_ident())

    t = threading.Thread(target=other)
    t.start()
    try:
        assert inside.wait(10)
        with pytest.raises(CSTValidationError):
            made.append(cst.Name(""))
    finally:
        release.set()
        t.join()
    assert made == []


def test_not_installed_where_a_node_class_has_its_own_post_init():
    assert parsing._can_install()

    class Checked(cst.Name):  # a node class that does more after it is made
        def __post_init__(self) -> None:
            pass

    assert not parsing._can_install()
    del Checked
    import gc

    gc.collect()  # (a class lives in its base's list of subclasses until it is collected)
    assert parsing._can_install()


@pytest.mark.skipif(not os.environ.get("AMPFIX_PARSE_CORPUS"), reason="set AMPFIX_PARSE_CORPUS=DIR (e.g. bench/.cache)")
def test_errors_are_libcsts_on_a_corpus():
    """Every file of a corpus that LibCST rejects, ampfix rejects alike (files it accepts give the
    same tree: the node checks only raise). Slow: a benchmark-sized check, off by default."""
    corpus = os.environ["AMPFIX_PARSE_CORPUS"]
    paths = sorted(Path(d, f) for d, _, fs in os.walk(corpus, followlinks=True) for f in fs if f.endswith(".py"))
    assert paths, corpus
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        try:
            cst.parse_module(text)
            continue
        except Exception as exc:
            theirs = exc
        with pytest.raises(type(theirs)):
            parse_module(text)
    assert CSTNode.__post_init__ is parsing._post_init
