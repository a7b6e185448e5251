"""Adopting the gate on legacy code: `check --add-noqa`, file-level `# ampfix: noqa`, and
AMP901 (a `# noqa: AMPxxx` that silences nothing)."""

import textwrap

from ampfix.engine.noqa import add_noqa, uncommentable_lines

from conftest import run_ampfix
from test_cli import BAD_CLIP, out, write

CLIP = "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)"
# AMP003 (BAD_CLIP's finding) is a preview rule: every run here turns preview on


def test_add_noqa_then_the_gate_passes(tmp_path):
    p = write(tmp_path, "train.py", BAD_CLIP)
    res = run_ampfix("check", "--preview", "--add-noqa", p)
    assert res.returncode == 0, out(res)
    assert "Added 1 noqa directive to 1 file." in out(res)[0]
    assert p.read_text() == BAD_CLIP.replace(CLIP, CLIP + "  # noqa: AMP003")
    assert run_ampfix("check", "--preview", p).returncode == 0
    res = run_ampfix("check", "--preview", "--add-noqa", p)  # nothing left to add
    assert res.returncode == 0 and "Added 0 noqa directives" in out(res)[0] and p.read_text().count("noqa") == 1


def test_add_noqa_merges_with_existing_comments(tmp_path):
    for before, after in (("  # noqa: E501", "  # noqa: E501, AMP003"),
                          ("  # type: ignore", "  # type: ignore  # noqa: AMP003"),
                          ("  # noqa:AMP001", "  # noqa:AMP001, AMP003")):
        p = write(tmp_path, "train.py", BAD_CLIP.replace(CLIP, CLIP + before))
        assert run_ampfix("check", "--preview", "--add-noqa", p).returncode == 0
        assert p.read_text() == BAD_CLIP.replace(CLIP, CLIP + after), before
        assert run_ampfix("check", "--preview", p).returncode == 0


def test_add_noqa_never_breaks_a_continuation_or_a_string(tmp_path):
    src = textwrap.dedent('''\
        import torch


        def step(model, optimizer, scaler, loss):
            scaler.scale(loss).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), \\
                1.0)
            scaler.step(optimizer)
            scaler.update()


        def step2(model, optimizer, scaler, loss):
            scaler.scale(loss).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=len("""
            text""")
            )
            scaler.step(optimizer)
            scaler.update()
        ''')
    p = write(tmp_path, "train.py", src)
    before = run_ampfix("check", "--preview", p, "--output-format", "json")
    assert before.returncode == 1
    res = run_ampfix("check", "--preview", "--add-noqa", p)
    assert res.returncode == 0, out(res)
    new = p.read_text()
    compile(new, str(p), "exec")
    assert "        1.0)  # noqa: AMP003\n" in new  # the last line of the statement, not after `\`
    assert '    text""")\n    )  # noqa: AMP003\n' in new  # not inside the string
    assert new.replace("  # noqa: AMP003", "") == src
    assert run_ampfix("check", "--preview", p).returncode == 0


def test_add_noqa_unit():
    text = 'x = f(a, \\\n  b)\ny = """\nz"""\n'
    assert uncommentable_lines(text) == {1, 3}
    new, added, failed = add_noqa(text, [("AMP003", [1, 2]), ("AMP004", [3]), ("AMP001", [4])])
    assert new == 'x = f(a, \\\n  b)  # noqa: AMP003\ny = """\nz"""  # noqa: AMP001\n'
    assert added == 2 and failed == [("AMP004", 3)]


def test_file_level_noqa(tmp_path):
    p = write(tmp_path, "train.py", "# ampfix: noqa\n" + BAD_CLIP)
    assert run_ampfix("check", "--preview", p).returncode == 0
    assert run_ampfix("rewrite", "--preview", p).returncode == 0 and p.read_text() == "# ampfix: noqa\n" + BAD_CLIP
    p = write(tmp_path, "train.py", BAD_CLIP + "# ampfix: noqa: AMP003, AMP101\n")
    assert run_ampfix("check", "--preview", p).returncode == 0
    p = write(tmp_path, "train.py", "# AMPFIX:NOQA:AMP001\n" + BAD_CLIP)
    assert run_ampfix("check", "--preview", p).returncode == 1
    # only on a line of its own: at the end of a line it is not a file-level directive
    p = write(tmp_path, "train.py", BAD_CLIP.replace("import torch", "import torch  # ampfix: noqa"))
    assert run_ampfix("check", "--preview", p).returncode == 1


def test_unused_noqa_rule_is_off_by_default_and_fixes_safely(tmp_path):
    src = BAD_CLIP.replace("    scaler.step(optimizer)", "    scaler.step(optimizer)  # noqa: AMP003, E501")
    src = src.replace(CLIP, CLIP + "  # noqa: AMP003")
    p = write(tmp_path, "train.py", src)
    assert run_ampfix("check", "--preview", p).returncode == 0
    res = run_ampfix("check", "--preview", p, "--select", "AMP0,AMP901")
    stdout = out(res)[0]
    assert res.returncode == 1
    assert f"{p}:7:29: AMP901 [*] unused `# noqa` code `AMP003`" in stdout and stdout.count("AMP901") == 1
    # a code of a rule that did not run is left alone: another run may need it
    assert run_ampfix("check", "--preview", p, "--select", "AMP901").returncode == 0
    assert run_ampfix("check", "--preview", p, "--select", "AMP0,AMP901", "--ignore", "AMP003").returncode == 0
    res = run_ampfix("rewrite", "--preview", p, "--select", "AMP0,AMP901")
    assert res.returncode == 0 and "AMP901  unused-noqa" in out(res)[0] and "stale noqa code removed" in out(res)[0]
    assert p.read_text() == src.replace("  # noqa: AMP003, E501", "  # noqa: E501")
