"""bench/ecosystem.py: the labels file, its comparison with findings, the rewrite summary (no downloads)."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def eco():
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("ecosystem", ROOT / "bench" / "ecosystem.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["ecosystem"] = mod  # dataclasses look their module up
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop("ecosystem", None)
        sys.path.remove(str(ROOT / "bench"))


HEADER = "package,version,path,line,code,verdict,reason\n"


def test_labels_compare_precision_unlabelled_stale(eco):
    labels = eco.parse_labels(
        HEADER
        + "p,1.0,./a/train.py,10,AMP003,TRUE,clips scaled grads\n"
        + 'p,1.0,a/train.py,20,AMP101,false,"shim prefers torch.amp, falls back"\n'
        + "p,1.0,a/x.py,5,AMP103,DEBATABLE,apex LARC has no torch twin\n"
        + "p,1.0,a/gone.py,1,AMP007,TRUE,fixed since\n"
        + "q,2.0,b.py,1,AMP007,FALSE,other package not run\n"
    )
    assert labels[0].path == "a/train.py" and labels[1].verdict == "FALSE"
    findings = [("p", "1.0", {"path": "a/train.py", "line": 10, "code": "AMP003", "message": "m"}),
                ("p", "1.0", {"path": "a/train.py", "line": 20, "code": "AMP101", "message": "m"}),
                ("p", "1.0", {"path": "a/x.py", "line": 5, "code": "AMP103", "message": "m"}),
                ("p", "1.0", {"path": "a/new.py", "line": 3, "code": "AMP003", "message": "m"}),
                ("p", "1.1", {"path": "a/train.py", "line": 10, "code": "AMP003", "message": "m"})]  # other version
    cmp = eco.compare(findings, labels, default_codes=["AMP003", "AMP103"], packages={("p", "1.0"), ("p", "1.1")})
    assert cmp.precision("AMP003") == 1.0 and cmp.precision("AMP101") == 0.0 and cmp.precision("AMP103") is None
    assert cmp.verdicts["AMP103"]["DEBATABLE"] == 1
    assert [(d["path"], d["line"]) for _, _, d in cmp.unlabelled] == [("a/new.py", 3), ("a/train.py", 10)]
    assert [lab.path for lab in cmp.stale] == ["a/gone.py"]  # q was not run: not stale
    assert cmp.false_default == []  # AMP101 is FALSE but not in the default selection given
    assert cmp.failed  # unlabelled findings
    table = "\n".join(eco.precision_table(cmp, ["AMP003", "AMP101", "AMP103"], ["AMP003", "AMP103"]))
    assert "| AMP003 | yes | 3 | 1 | 0 | 0 | 2 | 100% |" in table
    assert "| AMP101 | no | 1 | 0 | 1 | 0 | 0 | 0% |" in table

    cmp = eco.compare(findings[1:2], labels, default_codes=["AMP101"], packages={("p", "1.0")})
    assert [lab.line for lab, _ in cmp.false_default] == [20] and cmp.failed


def test_notebook_findings_are_keyed_by_cell(eco):
    labels = eco.parse_labels(HEADER + "p,1.0,nb.ipynb:cell 3,4,AMP102,TRUE,apex is the notebook's only AMP\n")
    in_cell_3 = {"path": "nb.ipynb", "cell": 3, "line": 4, "code": "AMP102", "message": "m"}
    in_cell_5 = dict(in_cell_3, cell=5)
    cmp = eco.compare([("p", "1.0", in_cell_3), ("p", "1.0", in_cell_5)], labels, ["AMP102"])
    assert cmp.verdicts["AMP102"]["TRUE"] == 1 and [d["cell"] for _, _, d in cmp.unlabelled] == [5]
    assert not cmp.stale


@pytest.mark.parametrize("row, error", [
    ("p,1,a.py,1,AMP001,MAYBE,x\n", "verdict"),
    ("p,1,a.py,1,AMP001,TRUE,\n", "reason"),
    ("p,1,a.py,one,AMP001,TRUE,x\n", "line must be a number"),
    ("p,1,a.py,1,AMP001,TRUE,x\np,1,a.py,1,AMP001,FALSE,y\n", "second label"),
    ('p,1,a.py,1,AMP001,TRUE,"under \\"float16\\": scaled, then stepped"\n', "more than 7 columns"),
])
def test_malformed_labels(eco, row, error):
    with pytest.raises(ValueError, match=error):
        eco.parse_labels(HEADER + row)
    with pytest.raises(ValueError, match="columns"):
        eco.parse_labels("package,path\n")


def test_rewrite_summary(eco):
    text = ("Fixed 3 findings in 2 files:\n     2  AMP101  deprecated-amp-api\n     1  AMP003  clip-scaled-gradients\n"
            "Found 5 findings (3 fixed, 2 remaining).\n2 findings remaining (1 fixable with `--unsafe-fixes`).\n")
    assert eco.parse_rewrite_summary(text) == (2, {"AMP101": 2, "AMP003": 1})
    assert eco.parse_rewrite_summary("Nothing to fix.\n") == (0, {})
    assert eco.parse_rewrite_summary("Nothing to fix.\nFound 1 finding (0 fixed, 1 remaining).\n"
                                     "1 finding remaining.\n") == (1, {})


def test_scratch_copies_carry_the_metadata_check_reads(eco, tmp_path):
    """A rewrite check's scratch copy holds what `check` reads for the oldest torch beside the
    code: declared files and the packaging metadata (whisperspeech's `torch>=2` is in PKG-INFO)."""
    for rel in ("pyproject.toml", "setup.cfg", "requirements.txt", "requirements/base.txt", "PKG-INFO",
                "pkg.egg-info/requires.txt", "pkg.egg-info/SOURCES.txt", "src/pkg-1.0.dist-info/METADATA",
                "pkg-1.0.dist-info/METADATA", "README.md"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    assert sorted(eco._metadata(tmp_path)) == [
        "PKG-INFO", "pkg-1.0.dist-info/METADATA", "pkg.egg-info/requires.txt", "pyproject.toml", "requirements.txt",
        "requirements/base.txt", "setup.cfg", "src/pkg-1.0.dist-info/METADATA"]
