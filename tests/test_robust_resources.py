"""Issue 22, resources: positions without a pass over the whole file (identical to LibCST's
provider; ampfix/model/tree.py), a memory bound per file estimated before parsing, and memory
that grows linearly with the file.

Memory is measured as the peak RSS of a real `python -m ampfix check` subprocess (os.wait4);
no test measures time."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from ampfix.engine import budget
from tests.conftest import FIXTURES, ROOT
from tests.test_robust_check import TRAINER


def _short_lines(n):
    return TRAINER + "".join(f"a{i % 10} = {i}\n" for i in range(n))


SHAPES = [
    "# header comment\n\n#!x\nimport torch\n\n\nclass A:\n    def f(self):\n        x = (1,\n             2)\n\n# c\n"
    "@dec\ndef g():\n    pass\nif x:\n    y = 1\nelse:\n    z = '''a\nb'''\nw = 1",
    "", "\n\n", "x=1", "# only a comment\n", "if a:\n    pass\n# trailing\n\n", "a; b; c\nd = [\n  1,\n]\n",
    "\ufeffx = 'é'; y = '😀'\n", "def f():\n\tif x:\n\t\treturn 1\n",
]


def _tree(module, text):
    from ampfix.model.tree import Tree

    tree = Tree()
    tree._init_tree(module)
    tree.source_text = text  # as ampfix.engine.analyze gives it
    return tree


@pytest.mark.parametrize("text", SHAPES + [p.read_text(encoding="utf-8") for p in sorted(FIXTURES.rglob("*.py"))[:60]],
                         ids=lambda t: str(len(t)))
def test_positions_are_the_providers(text):
    try:
        module = cst.parse_module(text)
    except cst.ParserSyntaxError:
        pytest.skip("not Python")
    tree = _tree(module, text)
    whole = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    nodes = list(tree._index.nodes)
    random.Random(len(text)).shuffle(nodes)  # any order of questions gives the same answers
    assert [tree.position(n) for n in nodes] == [whole[n] for n in nodes]


def _rendered(monkeypatch, text):
    """A tree of `text`, and the list of the nodes its position passes will render."""
    from ampfix.model import tree as tree_mod

    tree = _tree(cst.parse_module(text), text)
    hooked = []
    real = tree_mod._PositionState.before_codegen

    def count(self, node):
        hooked.append(node)
        return real(self, node)

    monkeypatch.setattr(tree_mod._PositionState, "before_codegen", count)
    return tree, hooked


def test_positions_of_a_late_node_render_one_statement(monkeypatch):
    """The position of a node in the last statement renders that statement with the hook,
    not the 5000 statements before it (ampfix/model/tree.py: `Tree.position`)."""
    text = _short_lines(5000) + "scaler.step(optimizer)\n"
    tree, hooked = _rendered(monkeypatch, text)
    call = [n for n in tree._index.nodes if isinstance(n, cst.Call)][-1]
    pos = tree.position(call)
    assert (pos.start.line, pos.start.column) == (text.count("\n"), 0)
    assert len(hooked) < 20


def test_positions_in_a_method_render_that_method_not_its_class(monkeypatch):
    """A node of one method of a 3000-method class renders that method (and a header comment
    its line), not the whole class (nor the module)."""
    methods = "".join(f"    def m{i}(self):\n        return {i}\n\n" for i in range(3000))
    text = "# header\nimport torch\n\n\nclass Big:\n" + methods + "    def last(self):\n        scaler.step(opt)\n"
    tree, hooked = _rendered(monkeypatch, text)
    call = [n for n in tree._index.nodes if isinstance(n, cst.Call)][-1]
    pos = tree.position(call)
    assert (pos.start.line, pos.start.column) == (text.count("\n"), 8)
    assert len(hooked) < 40
    comment = next(n for n in tree._index.nodes if isinstance(n, cst.Comment))
    assert tree.position(comment).start.line == 1
    assert len(hooked) < 50


# runs the CLI and writes its peak RSS (VmHWM, which starts afresh at exec) to a file at exit:
# a child's ru_maxrss would start from the RSS of the process that forked it (pytest's)
_MEASURED = """import atexit, runpy, sys
out = sys.argv.pop(1)

def peak():
    with open("/proc/self/status") as fh:
        kb = [line.split()[1] for line in fh if line.startswith("VmHWM:")][0]
    with open(out, "w") as fh:
        fh.write(kb)

atexit.register(peak)
sys.argv[0] = "ampfix"
runpy.run_module("ampfix", run_name="__main__", alter_sys=True)
"""


def _peak_mib(args, cwd, env=None):
    out_file = Path(cwd) / ".peak_kb"
    proc = subprocess.run([sys.executable, "-c", _MEASURED, str(out_file), *args], cwd=cwd, capture_output=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})), timeout=600)
    peak = int(out_file.read_text()) / 1024
    out_file.unlink()
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode(), peak


def test_a_file_over_the_memory_bound_is_skipped_before_it_is_parsed(tmp_path):
    text = _short_lines(250_000)  # 2.8 MB, under max-file-size: 750k tokens, ~2.4 GiB to analyse
    (tmp_path / "generated.py").write_text(text)
    (tmp_path / "train.py").write_text(TRAINER)
    code, out, err, peak = _peak_mib(["check", "--preview", "--no-cache", "."], tmp_path)
    assert code == 1, err
    assert "train.py:9:9: AMP007" in out and "generated.py" not in out
    tokens = budget.tokens(text)
    assert err.splitlines() == [
        f"generated.py: warning: skipped, not analysed: analysing it would take about "
        f"{budget.estimate(text) / 1024 ** 3:.1f} GiB of memory ({tokens} tokens), over max-file-memory "
        "(1.0 GiB; set `max-file-memory` in [tool.ampfix] to check it)"]
    assert peak < 400  # never parsed (its parse alone would take gigabytes)


def test_the_bound_is_configurable_and_applies_to_rewrite_and_stdin(tmp_path):
    text = _short_lines(20_000)
    (tmp_path / "pyproject.toml").write_text('[tool.ampfix]\nmax-file-memory = "50MB"\n')
    (tmp_path / "gen.py").write_text(text)
    code, out, err, _ = _peak_mib(["rewrite", "--preview", "--unsafe-fixes", "gen.py"], tmp_path)
    assert code == 0 and "gen.py: warning: skipped, not analysed: analysing it would take about" in err
    assert (tmp_path / "gen.py").read_text() == text
    proc = subprocess.run([sys.executable, "-m", "ampfix", "check", "--preview", "-", "--stdin-filename",
                           "gen.py"], cwd=tmp_path, input=text.encode(), capture_output=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0 and b"over max-file-memory (47.7 MiB;" in proc.stderr
    (tmp_path / "pyproject.toml").write_text('[tool.ampfix]\nmax-file-memory = "1GB"\n')
    code, out, err, _ = _peak_mib(["check", "--preview", "--no-cache", "gen.py"], tmp_path)
    assert code == 1 and "gen.py:9:9: AMP007" in out and err == ""


@pytest.mark.parametrize("value", ["true", '"lots"', "0", '"-1MB"'])
def test_a_bad_memory_bound_is_a_configuration_error(tmp_path, value):
    (tmp_path / "pyproject.toml").write_text(f"[tool.ampfix]\nmax-file-memory = {value}\n")
    (tmp_path / "train.py").write_text(TRAINER)
    code, out, err, _ = _peak_mib(["check", "train.py"], tmp_path)
    assert code == 2 and "`max-file-memory` must be a positive number of bytes" in err


def test_memory_grows_linearly_and_stays_under_the_estimate(tmp_path):
    """Peak memory over the interpreter's own: four times the lines, about four times the
    memory (quadratic growth would be sixteen; the parser's buffers grow by doubling, so it is
    not exactly four); and never more than the estimate the bound is checked against."""
    sizes = {}
    for n in (0, 10_000, 40_000):
        text = _short_lines(n)
        path = tmp_path / f"gen_{n}.py"
        path.write_text(text)
        code, out, err, peak = _peak_mib(["check", "--preview", "--no-cache", "-j", "1", path.name], tmp_path)
        assert code == 1 and "AMP007" in out, err
        sizes[n] = (peak, budget.estimate(text) / 2 ** 20)
    base = sizes[0][0]
    one, four = sizes[10_000][0] - base, sizes[40_000][0] - base
    assert 2.5 < four / one < 6, sizes
    for n in (10_000, 40_000):
        assert sizes[n][0] - base <= sizes[n][1], sizes
