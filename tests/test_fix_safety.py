"""Rewrites that are safe by construction (issue 18): the engine proves every fix before it offers
it and re-checks every pass before it keeps it; a fix that would break the run is refused, and its
finding says why. The rules' own moves (under the scaled backward's test, after the scaler is
created) are in the fixtures (`fixtures/rules/*/bad_fix_*.py`); the runs that show the break are in
tests/test_fix_safety_runtime.py."""

import shutil
from pathlib import Path

import libcst as cst
import pytest

from ampfix.engine import fixcheck
from ampfix.engine.analyze import Settings, check_text, fix_text, process_bytes
from ampfix.engine.registry import all_rules, select_rules
from ampfix.fixes.edits import insert_before
from ampfix.model import AmpModel
from ampfix.rule import SAFE, Fix, Rule, Violation

from conftest import FIXTURES, run_ampfix

RULES = list(all_rules().values())
AMP009 = select_rules(["AMP009"], [], preview=True)  # a preview rule (its measured precision)


class NaiveUnscale(Rule):
    """What AMP003's fix did before: `unscale_` right before the clip, whatever comes after."""

    code, name = "AMP950", "naive-unscale"
    message = "naive"
    triggers = ("clip_grad",)
    fixable = "safe"
    docs = "Bad:\n```python\nx\n```\nGood:\n```python\ny\n```\n"

    def check(self, ctx):
        model = ctx.model
        for call in model.calls:
            if model.is_api(call, "clip_grad"):
                stmt = model.statement_of(call)
                new = [f"{ctx.extra.get('scaler', 'scaler')}.unscale_({ctx.extra.get('opt', 'optimizer')})"]
                yield Violation(call, fix=Fix(insert_before(model.module, stmt, new), applicability=SAFE,
                                              description="naive unscale_"))


EARLY_RETURN = '''import torch


def step(model, optimizer, scaler, loss, max_norm):
    scaler.scale(loss).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
    if norm > max_norm:
        optimizer.zero_grad()
        return
    scaler.step(optimizer)
    scaler.update()
'''


def test_a_fix_that_adds_a_finding_is_refused():
    """The naive `unscale_` before a clip that may be followed by an early return: on that path
    nothing updates the scaler (a check of the result reports AMP009): not written."""
    new, fixed, remaining = fix_text(EARLY_RETURN, "t.py", [NaiveUnscale, *AMP009], Settings())
    assert new == EARLY_RETURN and not fixed
    (d,) = [d for d in remaining if d.code == "AMP950"]
    assert d.fix is None and "(not fixed: it would add AMP009 on line 6" in d.message
    # the remaining findings are what `check` of the text reports
    again, _ = check_text(new, "t.py", [NaiveUnscale, *AMP009], Settings())
    assert [(x.code, x.line, x.column) for x in again] == [(x.code, x.line, x.column) for x in remaining]


NONE_SCALER = '''import torch


class Trainer:
    def __init__(self, model, use_amp):
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        self.scaler = torch.amp.GradScaler("cuda") if use_amp else None

    def step(self, loss, clip):
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
'''


class NaiveSelfUnscale(NaiveUnscale):
    code = "AMP951"

    def check(self, ctx):
        ctx.extra.update(scaler="self.scaler", opt="self.optimizer")
        yield from super().check(ctx)


def test_a_fix_that_calls_a_method_on_a_possible_none_is_not_offered():
    """The issue's AMP003 case: `self.scaler.unscale_` under `if clip:`, where the scaler is None
    in every fp32 or apex run: the fix is not offered (check says so), and rewrite writes nothing."""
    diags, _ = check_text(NONE_SCALER, "t.py", [NaiveSelfUnscale], Settings())
    (d,) = diags
    assert d.fix is None
    assert "(not fixed: `self.scaler` may be None at line 16 (line 8), so the fixed code could raise there)" in d.message
    new, fixed, _ = fix_text(NONE_SCALER, "t.py", [NaiveSelfUnscale], Settings())
    assert new == NONE_SCALER and not fixed


def test_amp003_moves_the_unscale_under_the_backwards_test():
    new, fixed, remaining = fix_text(NONE_SCALER, "t.py", select_rules(["AMP003"], [], preview=True), Settings())
    assert fixed and not remaining
    assert ("        if clip:\n            if self.scaler is not None:\n                self.scaler.unscale_(self.optimizer)\n"
            "            torch.nn.utils.clip_grad_norm_") in new


class MovesComments(Rule):
    """What AMP013's dict entry did before: the new entry takes the last entry's comma (and its
    trailing comment), the last one the comma of the one before (and that comment)."""

    code, name = "AMP952", "moves-comments"
    message = "moves comments"
    triggers = ("{",)
    fixable = "safe"
    docs = NaiveUnscale.docs

    def check(self, ctx):
        for node in ctx.model.nodes_of(cst.Dict):
            last = node.elements[-1]
            entry = cst.DictElement(key=cst.SimpleString('"scaler"'), value=cst.parse_expression("scaler.state_dict()"),
                                    comma=last.comma)
            elements = [*node.elements[:-1], last.with_changes(comma=node.elements[-2].comma), entry]
            yield Violation(node, fix=Fix({node: node.with_changes(elements=elements)}, applicability=SAFE,
                                          description="entry added"))


def test_a_fix_that_moves_a_comment_off_its_line_is_refused():
    src = ('def save(scaler):\n    return {\n        "model": 1,  # weights\n'
           '        "saved_at": now(),  # noqa: DTZ005\n    }\n')
    new, fixed, remaining = fix_text(src, "t.py", [MovesComments], Settings())
    assert new == src and not fixed
    assert "(not fixed: the fix would copy the comment `# weights` to another line)" in remaining[0].message


def test_amp013_keeps_each_comment_on_its_entry():
    path = FIXTURES / "rules" / "AMP013" / "bad_fix_comments.py"
    new, fixed, _ = fix_text(path.read_text(), str(path), select_rules(["AMP013"], [], preview=True), Settings(unsafe_fixes=True))
    assert fixed
    assert ('            "saved_at": datetime.datetime.now(),  # noqa: DTZ005\n'
            '            "scaler": self.scaler.state_dict(),\n        }\n') in new
    assert new.count("# noqa: DTZ005") == 1 and new.count("# 0-based") == 1


def test_comment_troubles_of_a_plain_edit():
    old = "a = 1  # one\nb = 2  # two\n"
    assert fixcheck.comment_troubles(old, "a = 1  # one\nb = 3  # two\n", fixcheck.opcodes(old, "a = 1  # one\nb = 3  # two\n")) == []
    moved = "a = 1\nb = 2  # one\n"
    troubles = fixcheck.comment_troubles(old, moved, fixcheck.opcodes(old, moved))
    assert [t.reason for t in troubles] == ["the fix would remove the comment `# two`",
                                            "the fix would move the comment `# one` off the line `a = 1`"]


def test_the_pass_check_refuses_an_unassigned_read_the_fix_did_not_announce():
    """The engine's second net: a statement a pass adds that reads a local assigned later."""
    old = "def f(ckpt):\n    opt.load_state_dict(ckpt['o'])\n    scaler = make()\n"
    new = "def f(ckpt):\n    opt.load_state_dict(ckpt['o'])\n    scaler.load_state_dict(ckpt['s'])\n    scaler = make()\n"
    old_model, new_model = AmpModel(cst.parse_module(old)), AmpModel(cst.parse_module(new))
    (t,) = fixcheck.unsafe_reads(old_model, new_model, fixcheck.opcodes(old, new))
    assert t.reason == "the fix makes line 3 use `scaler`, which may not be assigned there"
    assert t.old_lines == (2, 3)


def test_amp104_leaves_the_native_branch_alone():
    """Code that supports apex and native AMP: a clip in the native branch is not apex's to fix."""
    src = '''import torch
from apex import amp


def train(args, model, optimizer, loader):
    if args.apex:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O2")
    else:
        scaler = torch.amp.GradScaler("cuda")
    for x in loader:
        loss = model(x).sum()
        if args.apex:
            with amp.scale_loss(loss, optimizer) as scaled:
                scaled.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
'''
    diags, _ = check_text(src, "t.py", select_rules(["AMP104"], []), Settings())
    fixes = {d.line: d.fix for d in diags}
    assert fixes.get(15) == "safe"  # the apex branch
    assert fixes.get(20) is None  # the native branch: never edited (if reported at all)
    new, _, _ = fix_text(src, "t.py", select_rules(["AMP104"], []), Settings())
    assert new.splitlines()[19] == "            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)"


# ----------------------------------------------------------------------------- the summary is a fresh check


def _rule_inputs():
    return sorted(p for p in (FIXTURES / "rules").rglob("bad_*.py") if not p.name.endswith((".fixed.py", ".unsafe.py")))


@pytest.mark.parametrize("unsafe", [False, True], ids=["safe", "unsafe"])
def test_remaining_is_what_check_of_the_written_file_reports(unsafe):
    """Every rule fixture, every rule: what rewrite reports as remaining is exactly what a check of
    the text it writes reports, and found = fixed + remaining per rule (no fix adds a finding)."""
    settings = Settings(unsafe_fixes=unsafe)
    for path in _rule_inputs():
        data = path.read_bytes()
        result = process_bytes(data, str(path), RULES, settings, fix=True)
        assert result.error is None, path
        written = result.new_source if result.new_source is not None else data
        fresh = process_bytes(written, str(path), RULES, settings, fix=False)
        got = sorted((d.code, d.line, d.column) for d in result.diagnostics)
        assert got == sorted((d.code, d.line, d.column) for d in fresh.diagnostics), path
        for code, n in result.found.items():
            left = sum(1 for d in result.diagnostics if d.code == code)
            assert left <= n, (path, code)
        assert all(d.code in result.found for d in result.diagnostics), path


def test_cli_summary_agrees_with_a_fresh_check(tmp_path: Path):
    """`ampfix rewrite`'s printed summary, from the CLI: found = fixed + remaining, and remaining is
    what `ampfix check` then reports for the written files."""
    names = ["AMP003/bad_fix_early_return.py", "AMP003/bad_fix_none_scaler.py", "AMP013/bad_fix_scaler_created_later.py",
             "AMP013/bad_fix_all_or_nothing.py", "AMP007/bad_fix_none_scaler.py", "AMP009/bad_fix_none_scaler.py",
             "AMP102/bad_checkpoint_reader.py", "AMP102/bad_basic.py"]
    for name in names:
        shutil.copy(FIXTURES / "rules" / name, tmp_path / name.replace("/", "_"))
    # AMP003, AMP007 and AMP102 are preview rules: preview on
    before = run_ampfix("check", "--preview", "--no-cache", "--output-format", "json", tmp_path)
    import json

    n_before = len(json.loads(before.stdout))
    res = run_ampfix("rewrite", "--preview", "--unsafe-fixes", "--no-cache", tmp_path)
    out = res.stdout.decode()
    summary = [line for line in out.splitlines() if line.startswith("Found ")][-1]
    after = run_ampfix("check", "--preview", "--no-cache", "--output-format", "json", tmp_path)
    n_after = len(json.loads(after.stdout))
    words = summary.replace("(", " ").replace(",", " ").split()
    found, fixed, remaining = int(words[1]), int(words[3]), int(words[5])
    assert (found, remaining) == (n_before, n_after), (summary, n_before, n_after)
    assert found == fixed + remaining, summary


@pytest.mark.parametrize("before,after", [
    ('{\n    "model": m,  # weights\n    "saved_at": now(),  # noqa: DTZ005\n}',
     '{\n    "model": m,  # weights\n    "saved_at": now(),  # noqa: DTZ005\n    "scaler": s.state_dict(),\n}'),
    ('{\n    "model": m,  # weights\n    "saved_at": now()  # noqa: DTZ005\n}',
     '{\n    "model": m,  # weights\n    "saved_at": now(),  # noqa: DTZ005\n    "scaler": s.state_dict()\n}'),
    ('{"model": m, "optimizer": o}', '{"model": m, "optimizer": o, "scaler": s.state_dict()}'),
    ('{"model": m,\n "optimizer": o}', '{"model": m,\n "optimizer": o,\n "scaler": s.state_dict()}'),
    ('{"model": m, "optimizer": o,}', '{"model": m, "optimizer": o, "scaler": s.state_dict(),}'),
    ('{\n    "optimizer": o,  # last\n\n    # closing remark\n}',
     '{\n    "optimizer": o,  # last\n    "scaler": s.state_dict(),\n\n    # closing remark\n}'),
    ('{  # head\n    "optimizer": o,  # only\n}', '{  # head\n    "optimizer": o,  # only\n    "scaler": s.state_dict(),\n}'),
], ids=["trailing-comma", "no-trailing-comma", "one-line", "aligned", "one-line-trailing", "closing-comment", "one-entry"])
def test_amp013_dict_entry_keeps_the_layout_and_every_comment(before, after):
    from ampfix.fixes.edits import add_dict_entry

    node = cst.parse_expression(before)
    new = add_dict_entry(node, cst.SimpleString('"scaler"'), cst.parse_expression("s.state_dict()"))
    assert cst.Module([]).code_for_node(new) == after


class AddsACall(Rule):
    """A fix that brings code another rule reports (with a fix of its own)."""

    code, name = "AMP960", "adds-a-call"
    message = "adds a call"
    triggers = ("x = 1",)
    fixable = "safe"
    docs = NaiveUnscale.docs

    def check(self, ctx):
        from ampfix.fixes.edits import insert_after

        body = list(ctx.model.module.body)
        for i, stmt in enumerate(body):
            if ctx.model.code(stmt) == "x = 1" and not (i + 1 < len(body) and "trigger_b" in ctx.model.code(body[i + 1])):
                yield Violation(stmt, fix=Fix(insert_after(ctx.model.module, stmt, ["trigger_b()"]),
                                              applicability=SAFE, description="call added"))


class BreaksTheCall(Rule):
    """A fix that the pass check refuses (its result does not compile)."""

    code, name = "AMP961", "breaks-the-call"
    message = "reported call"
    triggers = ("trigger_b",)
    fixable = "safe"
    docs = NaiveUnscale.docs

    def check(self, ctx):
        for stmt in ctx.model.nodes_of(cst.SimpleStatementLine):
            if ctx.model.code(stmt) == "trigger_b()":
                yield Violation(stmt, fix=Fix({stmt: cst.parse_statement("return 1\n")}, applicability=SAFE,
                                              description="breaks it"))


def test_a_finding_added_by_a_fix_and_never_fixed_refuses_that_fix():
    """A fix may bring a finding that a later pass fixes (an import rewritten once its last use
    is); when that later fix is refused, the finding would stay: the first fix is refused too."""
    src = "def trigger_b():\n    pass\n\n\nx = 1\n"
    new, fixed, remaining = fix_text(src, "t.py", [AddsACall, BreaksTheCall], Settings())
    assert new == src and not fixed
    (d,) = remaining
    assert d.code == "AMP960" and d.fix is None and "(not fixed: it would add AMP961: reported call)" in d.message
