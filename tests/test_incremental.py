"""The language server's incremental re-parse (`ampfix/engine/incremental.py`): an edit inside one
statement re-parses that statement only; the tree, and so every diagnostic, is the one a fresh
parse of the whole text gives, and anything it cannot prove so is a full parse."""

import textwrap

import libcst as cst
import pytest

from ampfix.engine.analyze import Analysis, InputError, Settings
from ampfix.engine.incremental import Reparser, common_prefix, common_suffix
from ampfix.engine.registry import select_rules

TRAINER = textwrap.dedent(
    '''\
    import torch


    class Trainer:
        """Trains."""

        def __init__(self, model, optimizer):
            self.model = model
            self.optimizer = optimizer
            self.scaler = torch.cuda.amp.GradScaler()

        # the step
        def step(self, loss):
            self.scaler.scale(loss).backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            if loss is not None:
                self.scaler.step(self.optimizer)
            else:
                pass
            self.scaler.update()
                # a footer line of the method's block

        def evaluate(self, batch):
            with torch.autocast("cuda"):
                out = self.model(batch)
            return out


    def train_step(model, optimizer, scaler, loss):
        scaler.scale(loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
    '''
)


def _edits():
    """(what the edit is, the new text) from TRAINER, applied one after the other."""
    t = TRAINER
    seq = []

    def add(what, new):
        nonlocal t
        assert new != t, what
        seq.append((what, new))
        t = new

    add("typing inside a method", t.replace("self.optimizer = optimizer", "self.optimizer = optimizerx"))
    add("more typing", t.replace("optimizerx", "optimizer_x"))
    add("a comment line at column 0 inside a method", t.replace("        else:", "# typed\n        else:"))
    add("across lines", t.replace("            self.scaler.step(self.optimizer)\n# typed\n        else:\n            pass\n",
                                  "            self.scaler.step(self.optimizer)\n"))
    add("a syntax error", t.replace("out = self.model(batch)", "out = self.model(batch"))
    add("fixed again", t.replace("out = self.model(batch", "out = self.model(batch, 1)"))
    add("a method added", t.replace("    def evaluate(", "    def added(self):\n        return 1\n\n    def evaluate("))
    add("a class added", t + "\n\nclass Other:\n    def f(self):\n        return 2\n")
    add("a deletion", t.replace("        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)\n", ""))
    add("the clip back", t.replace("        self.scaler.scale(loss).backward()\n",
                                   "        self.scaler.scale(loss).backward()\n"
                                   "        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 2.0)\n"))
    add("typing in a top-level function", t.replace("scaler.step(optimizer)", "scaler.step(optimizer)  # go"))
    return seq


def _key(a: Analysis):
    return [(d.code, d.line, d.column, d.end_line, d.end_column, d.message) for d in a.diagnostics]


def test_a_sequence_of_edits_gives_what_a_fresh_analysis_gives(tmp_path):
    rules = select_rules(None, [], preview=True)  # TRAINER's findings are AMP003's, a preview rule
    path = str(tmp_path / "trainer.py")
    reparser = Reparser()
    first = Analysis(TRAINER, path, rules, Settings(), parser=reparser.parse, top_shifts=reparser.top_shifts)
    assert [d.code for d in first.diagnostics].count("AMP003") == 2
    reparser.prepare()  # as the server does while the document rests: every top-level length known
    spliced = 0
    for what, text in _edits():
        try:
            fresh = Analysis(text, path, rules, Settings())
        except InputError:
            with pytest.raises(InputError):
                Analysis(text, path, rules, Settings(), parser=reparser.parse)
            continue
        before = reparser.stats["spliced"]
        incremental = Analysis(text, path, rules, Settings(), parser=reparser.parse, top_shifts=reparser.top_shifts)
        spliced += reparser.stats["spliced"] - before
        if reparser.stats["spliced"] > before:  # the positions came from the kept lengths
            shifts = reparser.top_shifts(reparser.module)
            assert shifts is not None and incremental._model.top_shifts == shifts
            lines = text.split("\n")
            assert [lines[shifts[id(st)]] for st in reparser.module.body][:2] == ["import torch", ""]
        assert _key(incremental) == _key(fresh), what
        assert reparser.module.code == text and reparser.module.deep_equals(cst.parse_module(text)), what
        reparser.prepare()
    # every edit inside a statement was spliced: only the class added at module level was not
    assert spliced == len(_edits()) - 2, reparser.stats


@pytest.mark.parametrize("what, old, new", [
    ("between top-level statements", "\n\nclass Trainer:", "\n\nx = 1\n\nclass Trainer:"),
    ("on a statement's first token", "    def evaluate(self, batch):", "    async def evaluate(self, batch):"),
    ("a deeper comment after a method's last line (its block's footer grows)",
     "        return out\n", "        return out\n            # more\n"),
    ("a method's body indented anew", "        return out\n", "            return out\n"),
    ("leading lines of a method", "    # the step\n", "    # the next step\n"),
])
def test_edits_that_cannot_be_spliced_are_parsed_whole(what, old, new):
    reparser = Reparser()
    reparser.parse(TRAINER, "t.py")
    text = TRAINER.replace(old, new, 1)
    assert text != TRAINER
    try:
        fresh = cst.parse_module(text)
    except cst.ParserSyntaxError:
        with pytest.raises(InputError):
            reparser.parse(text, "t.py")
        return
    got = reparser.parse(text, "t.py")
    assert reparser.stats["spliced"] == 0 and reparser.stats["fallback"] == 1, what
    assert got.code == text and got.deep_equals(fresh)


def test_the_footer_split_is_that_of_a_fresh_parse():
    """A comment line typed after a method's last statement, indented as the method's body: a
    fresh parse gives it to the method's block footer; the splice, whose fragment ends before it,
    must not take it elsewhere (the edit is not inside one statement: a full parse)."""
    reparser = Reparser()
    reparser.parse(TRAINER, "t.py")
    for extra in ("            # after\n", "        # after\n", "    # before evaluate\n", "# col 0\n"):
        text = TRAINER.replace("\n    def evaluate", "\n" + extra + "    def evaluate", 1)
        got = reparser.parse(text, "t.py")
        assert got.code == text and got.deep_equals(cst.parse_module(text)), extra


def test_common_prefix_and_suffix():
    a = "x" * 10000 + "abc" + "y" * 9000
    b = "x" * 10000 + "aXc" + "y" * 9000
    assert common_prefix(a, b) == 10001
    assert common_suffix(a, b, min(len(a), len(b)) - 10001) == 9001
    assert common_prefix("abc", "abc") == 3 and common_suffix("aa", "aaa", 2) == 2
