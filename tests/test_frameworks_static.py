"""The framework rules (AMP2xx) beyond the fixture tests: AMP251's rewrite of the MindSpore
runtime fixture is its hand-written fix; the runtime framework fixtures are clean; checking
never imports the frameworks."""

import ast
import subprocess
import sys

from ampfix.engine.analyze import Settings, check_text, fix_text
from ampfix.engine.registry import select_rules

from conftest import FIXTURES, ROOT

TRAIN = FIXTURES / "train"


def _body(text):
    """The module without its docstring, comments and formatting."""
    tree = ast.parse(text)
    if tree.body and isinstance(tree.body[0], ast.Expr) and isinstance(tree.body[0].value, ast.Constant):
        tree.body = tree.body[1:]
    return ast.dump(tree)


def test_amp251_rewrite_of_the_mindspore_fixture_is_its_fixed_copy():
    original = (TRAIN / "ms_fixed_scale_no_opt_scale.py").read_text()
    wanted = (TRAIN / "ms_fixed_scale_with_opt_scale.py").read_text()
    for unsafe in (False, True):
        new, fixed, remaining = fix_text(original, "ms.py", select_rules(["AMP251"], []), Settings(unsafe_fixes=unsafe))
        assert fixed and not remaining
        assert _body(new) == _body(wanted)  # the same program; only the docstring and layout differ
    diags, _ = check_text(wanted, "ms_fixed.py", select_rules(["AMP2"], []), Settings())
    assert not diags


def test_runtime_framework_fixtures_are_clean():
    for name in ("fabric_mlp.py", "accelerate_mlp.py", "ms_fixed_scale_with_opt_scale.py"):
        diags, _ = check_text((TRAIN / name).read_text(), name, select_rules(["ALL"], []), Settings())
        assert not diags, (name, [d.message for d in diags])


def test_check_never_imports_the_frameworks():
    code = (
        "import sys\n"
        "from ampfix.api import check_paths\n"
        f"check_paths([{str(FIXTURES / 'rules')!r}, {str(TRAIN)!r}], select=['AMP2'])\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('lightning', 'lightning_fabric', 'pytorch_lightning', 'accelerate', 'mindspore', 'torch'))\n"
        "assert not bad, bad\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
