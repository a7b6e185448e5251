"""Issue 22, hostile notebooks: a notebook whose JSON Python refuses, or whose parts have the
wrong type, costs only itself (one error line naming it, exit status 2, every other file
reported); NaN in a notebook is no reason to leave a fix unapplied, and a fix that cannot be
written back says why."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_ampfix

pytest.importorskip("nbformat")

# AMP003's finding (a preview rule: the runs that look for it turn preview on)
BAD = ("import torch\n\ndef step(model, optimizer, scaler, loss):\n    scaler.scale(loss).backward()\n"
       "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n    scaler.step(optimizer)\n    scaler.update()\n")
KERNEL = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}}


def _nb(metadata=KERNEL, source=None, **top):
    cell = {"cell_type": "code", "execution_count": None, "id": "c1", "metadata": {}, "outputs": [],
            "source": BAD.splitlines(True) if source is None else source}
    return {"cells": [cell], "metadata": metadata, "nbformat": 4, "nbformat_minor": 5, **top}


def _text(nb) -> str:
    return json.dumps(nb, indent=1) + "\n"


HOSTILE = {
    "huge integer": (_text(_nb({**KERNEL, "big": 1})).replace('"big": 1', '"big": ' + "9" * 5000),
                     "not a valid notebook: a value Python's JSON reader refuses (Exceeds the limit (4300 digits)"),
    "huge integer in an output": (
        _text(_nb()).replace('"outputs": []', '"outputs": [{"output_type": "stream", "name": "stdout", "text": '
                                             + "1" * 4400 + "}]"),
        "not a valid notebook: a value Python's JSON reader refuses"),
    "kernelspec a list": (_text(_nb({"kernelspec": ["python"]})),
                          "not a valid notebook: `metadata.kernelspec` is an array, not an object"),
    "kernelspec a string": (_text(_nb({"kernelspec": "python3"})),
                            "not a valid notebook: `metadata.kernelspec` is a string, not an object"),
    "language a number": (_text(_nb({"kernelspec": {"language": 3, "name": "p"}})),
                          "not a valid notebook: `metadata.kernelspec.language` is a number, not a string"),
    "language_info a list": (_text(_nb({"language_info": [1]})),
                             "not a valid notebook: `metadata.language_info` is an array, not an object"),
    "metadata a string": (_text(_nb("python")), "not a valid notebook: `metadata` is a string, not an object"),
    "metadata null": (_text(_nb(None)), "not a valid notebook: `metadata` is null, not an object"),
    "source holds ints": (_text(_nb(source=["import torch\n", 1, None])),
                          "not a valid notebook: `source` holds a number; it must be a string or a list of strings"),
    "source a number": (_text(_nb(source=5)),
                        "not a valid notebook: `source` is a number; it must be a string or a list of strings"),
    "source an object": (_text(_nb(source={"a": "b"})),
                         "not a valid notebook: `source` is an object; it must be a string or a list of strings"),
    "cell a string": (_text({**_nb(), "cells": ["x"]}), "not a valid notebook: the cell is a string, not an object"),
    "cell_type null": (_text({**_nb(), "cells": [{**_nb()["cells"][0], "cell_type": None}]}),
                       "not a valid notebook: `cell_type` is null, not a string"),
    "nbformat a string": (_text(_nb(nbformat="4")), "not a valid notebook: `nbformat` is a string, not an integer"),
    "nbformat a boolean": (_text(_nb(nbformat=True)), "not a valid notebook: `nbformat` is a boolean, not an integer"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
@pytest.mark.parametrize("command", ["check", "rewrite"])
def test_a_hostile_notebook_costs_only_itself(tmp_path, case, command):
    text, message = HOSTILE[case]
    (tmp_path / "hostile.ipynb").write_text(text)
    (tmp_path / "good.ipynb").write_text(_text(_nb()))
    (tmp_path / "train.py").write_text(BAD)
    res = run_ampfix(command, "--preview", "--no-cache", ".", cwd=tmp_path)
    out, err = res.stdout.decode(), res.stderr.decode()
    assert res.returncode == 2, err
    assert "Traceback" not in err and "internal error" not in err
    (line,) = err.splitlines()
    assert line.startswith("hostile.ipynb") and ": error: " + message in line, line
    assert (tmp_path / "hostile.ipynb").read_text() == text
    if command == "check":
        assert "good.ipynb:cell 1:5:5: AMP003" in out and "train.py:5:5: AMP003" in out
    else:  # the other files were fixed
        assert "scaler.unscale_(optimizer)" in (tmp_path / "train.py").read_text()
        assert "scaler.unscale_(optimizer)" in (tmp_path / "good.ipynb").read_text()


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_in_the_metadata_does_not_stop_the_fix(tmp_path, constant):
    """Python's JSON (and so Jupyter) reads and writes NaN; a NaN is not equal to itself, which
    made the check that nothing else changed fail and the fix silently not applied."""
    text = _text(_nb({**KERNEL, "score": 1.5})).replace('"score": 1.5', f'"score": {constant}')
    p = tmp_path / "train.ipynb"
    p.write_text(text)
    res = run_ampfix("rewrite", "--preview", p)
    assert res.returncode == 0, res.stderr
    assert "Fixed 1 finding in 1 file" in res.stdout.decode() and res.stderr == b""
    expected = text.replace('    "    torch.nn.utils.clip', '    "    scaler.unscale_(optimizer)\\n",\n'
                                                            '    "    torch.nn.utils.clip')
    assert p.read_text() == expected
    assert run_ampfix("check", "--preview", p).returncode == 0


def _fixed_without_write_back(monkeypatch, p, code: str, preview: bool = False) -> None:
    """`ampfix rewrite p` where the fixed cells cannot be written back: it says why, changes
    nothing, and reports the notebook's one finding, `code`."""
    from ampfix.engine import notebook, runner

    def refuse(text, path, new_sources):
        raise notebook.NotWritable("putting the fixed cells back would change other parts of the notebook")

    monkeypatch.setattr(notebook, "write_back", refuse)
    run = runner.run(runner.make_plan(runner.Options(paths=[str(p)], fix=True, jobs=1, no_cache=True,
                                                     preview=preview)))
    assert run.warnings == [f"{p}: warning: not rewritten: putting the fixed cells back would change other parts "
                            "of the notebook; its findings are reported as they are"]
    assert [d.code for d in run.diagnostics] == [code] and run.results[0].new_source is None


def test_a_fix_that_cannot_be_written_back_says_why(tmp_path, monkeypatch):
    p = tmp_path / "train.ipynb"
    p.write_text(_text(_nb()))
    _fixed_without_write_back(monkeypatch, p, "AMP003", preview=True)


def test_a_fix_that_cannot_be_written_back_reports_what_the_project_shows(tmp_path, monkeypatch):
    """The findings of a notebook whose fixed cells cannot be written back are reported as
    `check` reports them, the project read: here the autocast region comes from a helper of the
    project (`amp.autocast_context`), and the backward inside it (AMP001) is a finding only with
    that module read."""
    import shutil
    from pathlib import Path

    from ampfix.engine import runner

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "projects" / "bad_autocast_helper"
    shutil.copy(fixture / "amp.py", tmp_path / "amp.py")
    shutil.copy(fixture / "pyproject.toml", tmp_path / "pyproject.toml")
    p = tmp_path / "train.ipynb"
    p.write_text(_text(_nb(source=(fixture / "train.py").read_text().splitlines(True))))
    plan = runner.make_plan(runner.Options(paths=[str(p)], jobs=1, no_cache=True))
    assert [d.code for d in runner.run(plan).diagnostics] == ["AMP001"]
    _fixed_without_write_back(monkeypatch, p, "AMP001")
