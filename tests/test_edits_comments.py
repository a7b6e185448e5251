"""The edits layer never drops a comment: replacing or removing a statement (a compound one
too, as the apex migration replaces `with amp.scale_loss(...)` blocks) keeps every comment
the new statements do not carry, and everything outside the statement stays byte-identical."""

import textwrap

import libcst as cst

from ampfix.fixes import edits
from ampfix.engine.analyze import _ApplyFixes
from ampfix.model import AmpModel

SRC = textwrap.dedent(
    """\
    def train(loss, optimizer):
        x = 1  # before
        # about the backward
        with amp.scale_loss(loss, optimizer) as scaled:  # header comment
            # inside the block
            scaled.backward()  # trailing inside
            # footer of the block
        y = 2  # after
    """
)


def _apply(module, replacements):
    return module.visit(_ApplyFixes({id(k): v for k, v in replacements.items()})).code


def _with(module):
    return module.body[0].body.body[1]


def _comments(text):
    return [line.strip() for line in text.splitlines() if line.strip().startswith("#") or "  #" in line]


def test_replace_compound_statement_keeps_all_its_comments():
    module = cst.parse_module(SRC)
    stmt = _with(module)
    new = _apply(module, edits.replace_statement(module, stmt, ["scaler.scale(loss).backward()"]))
    assert new == textwrap.dedent(
        """\
        def train(loss, optimizer):
            x = 1  # before
            # about the backward
            # header comment
            # inside the block
            # trailing inside
            # footer of the block
            scaler.scale(loss).backward()
            y = 2  # after
        """
    )
    compile(new, "t.py", "exec")


def test_replace_keeps_comments_the_new_statements_do_not_carry_only():
    module = cst.parse_module(SRC)
    stmt = _with(module)
    inner = stmt.body.body[0]  # reused with its own comments: they are not duplicated
    new = _apply(module, edits.replace_statement(module, stmt, [inner]))
    assert new.count("# inside the block") == 1 and new.count("# trailing inside") == 1
    assert "# header comment" in new and "# footer of the block" in new


def test_remove_compound_statement_keeps_its_comments():
    module = cst.parse_module(SRC)
    model = AmpModel(module)
    new = _apply(module, edits.remove_statement(model, _with(module)))
    for c in ("# about the backward", "# header comment", "# inside the block", "# trailing inside",
              "# footer of the block"):
        assert c in new, c
    assert "scaled.backward()" not in new
    compile(new, "t.py", "exec")
    # the lines around it are untouched
    assert new.startswith("def train(loss, optimizer):\n    x = 1  # before\n")
    assert new.endswith("    y = 2  # after\n")


def test_replace_simple_statement_keeps_trailing_comment_in_place():
    module = cst.parse_module("a = 1  # keep me\nb = 2\n")
    new = _apply(module, edits.replace_statement(module, module.body[0], ["a = 3", "c = 4"]))
    assert new == "a = 3\nc = 4  # keep me\nb = 2\n"
