"""Notebooks, made and read with the real nbformat: one program in cell order, findings by
cell, IPython syntax masked, rewrites that change only the fixed cells' sources."""

import json
import textwrap

import pytest

from conftest import run_ampfix
from test_cli import out

nbformat = pytest.importorskip("nbformat")
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output  # noqa: E402

# the clip of CELLS (cell 5) is AMP003's, a preview rule: the runs that look for it turn preview on
SETUP = "import torch\nmodel = torch.nn.Linear(4, 2)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)"
CELLS = [
    new_markdown_cell("# Training\nThe scaler is made in cell 3 and stepped in cell 6."),
    new_code_cell("%matplotlib inline\n" + SETUP, execution_count=1,
                  outputs=[new_output("stream", name="stdout", text="ready\n")]),
    new_code_cell('scaler = torch.amp.GradScaler("cuda")\n!nvidia-smi\nfiles = !ls', execution_count=2),
    new_code_cell('with torch.autocast("cuda"):\n    loss = model(x).sum()\nscaler.scale(loss).backward()'),
    new_code_cell("torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n%time print(1)",
                  outputs=[new_output("execute_result", data={"text/plain": "tensor(1.)"}, execution_count=4)]),
    new_code_cell("scaler.step(optimizer)\nscaler.update()"),
    new_code_cell("%%bash\necho this is not python: (("),
]


def notebook(cells=CELLS, **meta):
    nb = new_notebook(cells=[c.copy() for c in cells])
    nb.metadata.update({"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}, **meta})
    return nb


def save(tmp_path, nb, name="train.ipynb", text=None):
    p = tmp_path / name
    p.write_text(text if text is not None else nbformat.writes(nb) + "\n", encoding="utf-8")
    return p


def test_cells_are_one_program_and_findings_name_the_cell(tmp_path):
    p = save(tmp_path, notebook())
    res = run_ampfix("check", "--preview", p)
    stdout, stderr = out(res)
    assert res.returncode == 1, stderr
    # the clip in cell 5 comes after the backward of cell 4 with the scaler of cell 3
    assert stdout.splitlines()[0].startswith(f"{p}:cell 5:1:1: AMP003 [*] ")
    d = json.loads(run_ampfix("check", "--preview", p, "--output-format", "json").stdout)[0]
    assert (d["cell"], d["line"], d["column"], d["code"]) == (5, 1, 1, "AMP003")
    # the cell that unscales is what makes the clip right: then the notebook is clean
    cells = list(CELLS)
    cells[3] = new_code_cell(CELLS[3].source + "\nscaler.unscale_(optimizer)")
    assert run_ampfix("check", "--preview", save(tmp_path, notebook(cells), "ok.ipynb")).returncode == 0


def test_rewrite_changes_only_the_fixed_cell(tmp_path):
    nb = notebook()
    p = save(tmp_path, nb)
    before = p.read_text()
    diff = run_ampfix("rewrite", "--preview", "--diff", p)
    assert diff.returncode == 1 and p.read_text() == before
    assert out(diff)[0].startswith(f"--- a/{p}:cell 5\n+++ b/{p}:cell 5\n") or f"--- {p}:cell 5" in out(diff)[0]
    res = run_ampfix("rewrite", "--preview", p)
    assert res.returncode == 0, out(res)
    after = p.read_text()
    # byte for byte what nbformat writes for the notebook with that one cell fixed
    nb.cells[4].source = "scaler.unscale_(optimizer)\n" + nb.cells[4].source
    assert after == nbformat.writes(nb) + "\n"
    new = nbformat.reads(after, as_version=4)
    assert new.cells[1].outputs == CELLS[1].outputs and new.cells[4].outputs == CELLS[4].outputs
    assert [c.id for c in new.cells] == [c.id for c in nbformat.reads(before, as_version=4).cells]
    assert "%time print(1)" in new.cells[4].source and "!nvidia-smi" in new.cells[2].source
    assert run_ampfix("check", "--preview", p).returncode == 0
    assert run_ampfix("rewrite", "--preview", p).returncode == 0 and p.read_text() == after  # a fixed point


def test_rewrite_keeps_a_foreign_json_layout(tmp_path):
    """Indent 2, keys in the writer's order, escaped non-ASCII, sources as one string: only the
    fixed source changes."""
    nb = json.loads(nbformat.writes(notebook()))
    nb["metadata"]["title"] = "Überblick ✓"
    for c in nb["cells"]:
        c["source"] = "".join(c["source"])
    nb = {"nbformat": nb["nbformat"], "nbformat_minor": nb["nbformat_minor"], "metadata": nb["metadata"],
          "cells": [dict(reversed(list(c.items()))) for c in nb["cells"]]}
    text = json.dumps(nb, indent=2, ensure_ascii=True)  # no final newline
    p = save(tmp_path, None, text=text)
    assert run_ampfix("rewrite", "--preview", p).returncode == 0
    new = p.read_text()
    old_cell = json.dumps(nb["cells"][4]["source"], ensure_ascii=True)
    new_cell = json.dumps("scaler.unscale_(optimizer)\n" + nb["cells"][4]["source"], ensure_ascii=True)
    assert new == text.replace(old_cell, new_cell, 1)
    assert "\\u00dcberblick \\u2713" in new


def test_list_sources_keep_their_layout(tmp_path):
    text = nbformat.writes(notebook())
    custom = text.replace('\n    "torch.nn.utils', '    "torch.nn.utils')  # an odd hand-edited layout
    p = save(tmp_path, None, text=custom)
    assert run_ampfix("rewrite", "--preview", p).returncode == 0
    data = json.loads(p.read_text())
    assert "".join(data["cells"][4]["source"]).startswith("scaler.unscale_(optimizer)\ntorch.nn.utils")
    assert p.read_text().replace('"scaler.unscale_(optimizer)\\n",', "", 1).replace(" ", "").replace("\n", "") == \
        custom.replace(" ", "").replace("\n", "")


def test_magics_and_shell_lines_are_masked_safely(tmp_path):
    cells = [
        new_code_cell(SETUP + '\nscaler = torch.amp.GradScaler("cuda")'),
        new_code_cell(textwrap.dedent("""\
            %load_ext autoreload
            for x in loader:
                !echo step \\
                    continued
                with torch.autocast("cuda"):
                    loss = model(x).sum()
                scaler.scale(loss).backward()
                out = %timeit -o torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                model?
                scaler.step(optimizer)
                scaler.update()""")),
        new_code_cell("%%time\nscaler.scale(loss).backward()\ntorch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
                      "scaler.step(optimizer)\nscaler.update()"),
    ]
    p = save(tmp_path, notebook(cells))
    res = run_ampfix("check", "--preview", p, "--output-format", "json")
    found = sorted((d["cell"], d["line"], d["code"]) for d in json.loads(res.stdout))
    # the %%time cell is Python (its line 3 is the clip); the %%bash cell of CELLS is not
    assert found == [(2, 9, "AMP003"), (3, 3, "AMP003")], out(res)
    assert run_ampfix("rewrite", "--preview", p).returncode == 0
    fixed = nbformat.read(p, as_version=4)
    assert fixed.cells[1].source == cells[1].source.replace(
        "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n    model?",
        "    scaler.unscale_(optimizer)\n    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n    model?")
    assert fixed.cells[2].source == cells[2].source.replace("\ntorch.nn", "\nscaler.unscale_(optimizer)\ntorch.nn")


def test_syntax_error_names_the_cell(tmp_path):
    cells = [new_code_cell(SETUP), new_code_cell('scaler = torch.amp.GradScaler("cuda")\nif True\n'
                                                 '    scaler.scale(loss).backward()\n    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)')]
    p = save(tmp_path, notebook(cells))
    res = run_ampfix("check", "--preview", p)
    assert res.returncode == 2
    assert out(res)[1].startswith(f"{p}:cell 2:2:") and "syntax error" in out(res)[1]


def test_invalid_notebooks_get_one_clear_line(tmp_path):
    good = tmp_path / "ok.py"
    good.write_text("x = 1\n")
    cases = {
        "broken.ipynb": '{"cells": [\n  {"cell_type": "code",\n',
        "list.ipynb": "[1, 2]",
        "v3.ipynb": json.dumps({"nbformat": 3, "nbformat_minor": 0, "worksheets": [], "cells": [],
                                "metadata": {}}),
        "binary.ipynb": b"\xff\xfe{}",
    }
    for name, text in cases.items():
        p = tmp_path / name
        p.write_bytes(text if isinstance(text, bytes) else text.encode())
    res = run_ampfix("check", tmp_path)
    stdout, stderr = out(res)
    assert res.returncode == 2
    lines = stderr.splitlines()
    assert len(lines) == 3 and "Traceback" not in stderr, stderr  # the v3 file has no code: nothing to read
    assert f"{tmp_path / 'broken.ipynb'}:3:1: error: not a valid notebook: invalid JSON" in stderr
    assert f"{tmp_path / 'list.ipynb'}: error: not a valid notebook: no list of cells" in stderr
    assert f"{tmp_path / 'binary.ipynb'}: error: not a valid notebook: not UTF-8" in stderr
    assert stdout == "No findings in the files that could be checked (3 errors).\n"


def test_other_languages_are_skipped(tmp_path):
    nb = notebook(kernelspec={"name": "ir", "display_name": "R", "language": "R"})
    assert run_ampfix("check", "--preview", save(tmp_path, nb)).returncode == 0


def test_without_nbformat_one_line_and_the_other_files_are_checked(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "nbformat.py").write_text("raise ImportError('blocked for the test')\n")
    p = save(tmp_path, notebook())
    clean_nb = save(tmp_path, notebook([new_code_cell("print(1)")]), "clean.ipynb")
    py = tmp_path / "train.py"
    py.write_text("import torch\nscaler = torch.amp.GradScaler()\nscaler.scale(l).backward()\n"
                  "torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)\nscaler.step(o)\nscaler.update()\n")
    res = run_ampfix("check", "--preview", p, clean_nb, py, env={"PYTHONPATH": str(blocker)})
    stdout, stderr = out(res)
    assert res.returncode == 2
    assert stderr == f'{p}: error: notebooks need nbformat: pip install "ampfix[notebook]"\n'
    assert f"{py}:4:1: AMP003" in stdout


def test_stdin_notebook(tmp_path):
    data = (nbformat.writes(notebook()) + "\n").encode()
    res = run_ampfix("check", "--preview", "-", "--stdin-filename", "nb.ipynb", input=data)
    assert out(res)[0].startswith("nb.ipynb:cell 5:1:1: AMP003")
    res = run_ampfix("rewrite", "--preview", "-", "--stdin-filename", "nb.ipynb", input=data)
    assert res.returncode == 0
    assert "scaler.unscale_(optimizer)" in nbformat.reads(res.stdout.decode(), as_version=4).cells[4].source


def test_add_noqa_in_a_notebook(tmp_path):
    p = save(tmp_path, notebook())
    res = run_ampfix("check", "--preview", "--add-noqa", p)
    assert res.returncode == 0, out(res)
    nb = nbformat.read(p, as_version=4)
    assert nb.cells[4].source.splitlines()[0].endswith("  # noqa: AMP003")
    assert run_ampfix("check", "--preview", p).returncode == 0


def test_sarif_and_github_for_notebooks(tmp_path):
    save(tmp_path, notebook())
    log = json.loads(run_ampfix("check", "--preview", "train.ipynb", "--output-format", "sarif", cwd=tmp_path).stdout)
    (result,) = log["runs"][0]["results"]
    assert result["properties"]["cell"] == 5 and result["message"]["text"].startswith("cell 5, line 1: ")
    assert "fixes" not in result
    # the region is the line of the .ipynb that holds the cell's line; the logical location the cell
    region = result["locations"][0]["physicalLocation"]["region"]
    json_lines = (tmp_path / "train.ipynb").read_text().splitlines()
    assert json_lines[region["startLine"] - 1][region["startColumn"] - 1:].startswith(
        '"torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\\n"')
    assert result["locations"][0]["logicalLocations"][0]["fullyQualifiedName"] == "train.ipynb:cell 5"
    gh = out(run_ampfix("check", "--preview", "train.ipynb", "--output-format", "github", cwd=tmp_path))[0]
    assert gh.startswith(f"::error title=ampfix (AMP003),file=train.ipynb,line={region['startLine']},"
                         f"col={region['startColumn']},endLine={region['endLine']},endColumn={region['endColumn']}"
                         "::train.ipynb:cell 5:1:1: AMP003")


def test_a_notebook_is_read_with_its_project(tmp_path):
    """A notebook that calls a helper of its project is analysed with that helper's facts, as
    a module is: here the helper's backward runs inside the notebook's autocast region (AMP001),
    which the notebook's own text does not show (no backward in it). Its twin, which calls the
    helper after the region, is clean."""
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "nb-project"\n')
    (tmp_path / "helpers.py").write_text(textwrap.dedent("""\
        def train_step(model, x, optimizer):
            loss = model(x).sum()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        """))
    head = new_code_cell("import torch\n\nfrom helpers import train_step")
    # (no rule's own trigger is in the notebook's text: only the project's make it analysed)
    bad = new_code_cell('for x in loader:\n    with torch.autocast("cpu"):\n'
                        '        out = model(x)\n        train_step(model, x, optimizer)')
    good = new_code_cell('for x in loader:\n    with torch.autocast("cpu"):\n'
                         '        out = model(x)\n    train_step(model, x, optimizer)')
    p = save(tmp_path, notebook([head, bad]), "bad.ipynb")
    res = run_ampfix("check", "--no-cache", p)
    stdout, stderr = out(res)
    assert res.returncode == 1, stdout + stderr
    assert stdout.splitlines()[0].startswith(f"{p}:cell 2:4:9: AMP001 "), stdout
    assert run_ampfix("check", "--no-cache", save(tmp_path, notebook([head, good]), "good.ipynb")).returncode == 0


def test_an_apex_cell_that_starts_with_the_removed_import_is_rewritten(tmp_path):
    # pytorch-ignite's EfficientNet notebook: a cell that starts with `try: from apex import amp`
    # and then calls `amp.initialize`; the import goes, the call becomes a GradScaler. The cell's
    # start stays where it was (it went with the import's comment lines, and the notebook was
    # left as it was: "not rewritten: the fixes changed the cells' structure")
    cells = [
        new_code_cell(SETUP + "\nloader = [torch.randn(2, 4) for _ in range(3)]"),
        new_code_cell('try:\n    from apex import amp\nexcept ImportError:\n    raise ImportError("install apex")\n\n\n'
                      '# Initialize Amp\nmodel, optimizer = amp.initialize(model, optimizer, opt_level="O1")'),
        new_code_cell("for x in loader:\n    loss = model(x).sum()\n"
                      "    with amp.scale_loss(loss, optimizer) as scaled_loss:\n        scaled_loss.backward()\n"
                      "    optimizer.step()"),
    ]
    p = save(tmp_path, notebook(cells))
    res = run_ampfix("rewrite", "--preview", "--unsafe-fixes", "--select", "AMP102", p)
    stdout, stderr = out(res)
    assert res.returncode == 0 and "not rewritten" not in stderr, stdout + stderr
    new = nbformat.read(p, as_version=4)
    assert len(new.cells) == 3 and "apex" not in "".join(c.source for c in new.cells)
    assert new.cells[1].source.endswith('# Initialize Amp\nscaler = torch.amp.GradScaler("cuda")'), new.cells[1].source
    assert "scaler.scale(loss).backward()" in new.cells[2].source
