"""Correct code, including the PyTorch docs' AMP examples, produces no finding."""

from pathlib import Path

import pytest

from ampfix.api import check_source

from conftest import FIXTURES

GOOD = sorted((FIXTURES / "good").glob("*.py"))


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.name)
def test_correct_code_is_clean(path: Path):
    # every rule on by default and the preview ones (AMP003, whose examples these are, among them)
    diags = check_source(path.read_text(encoding="utf-8"), str(path), preview=True)
    assert diags == [], [f"{d.line}: {d.code} {d.message}" for d in diags]


def test_good_folder_is_not_empty():
    assert any(p.name == "pytorch_amp_examples.py" for p in GOOD)
