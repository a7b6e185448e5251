"""The fixes where the naive insertion point breaks the run, run for real on CPU torch: the file
`ampfix rewrite` writes runs to the end (fp32 and AMP paths alike), and the naive fix (what the
fix would be without the proof: inserted right at the finding) raises what the issue saw
(AttributeError on a None scaler, RuntimeError from a second `unscale_`, UnboundLocalError on the
first resume)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES, run_ampfix

pytest.importorskip("torch")
RULES = FIXTURES / "rules"


def _python(path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, str(path), *args], cwd=path.parent, capture_output=True, text=True,
                          timeout=300, env=env)


def _insert(text: str, after_or_before: str, line_pattern: str, code: str) -> str:
    """`code` inserted before or after the first line matching `line_pattern`, at its indentation."""
    lines = text.split("\n")
    i = next(i for i, ln in enumerate(lines) if re.search(line_pattern, ln))
    indent = re.match(r"\s*", lines[i]).group(0)
    new = [indent + c for c in code.split("\n")]
    at = i if after_or_before == "before" else i + 1
    return "\n".join(lines[:at] + new + lines[at:])


CASES = {
    # fixture: (rewrite options, the naive fix, what the naive fix raises)
    "AMP003/bad_fix_none_scaler.py": (
        [], lambda t: _insert(t, "before", r"clip_grad_norm_\(self.model", "self.scaler.unscale_(self.optimizer)"),
        "AttributeError: 'NoneType' object has no attribute 'unscale_'"),
    "AMP003/bad_fix_early_return.py": (
        [], lambda t: _insert(t, "before", r"norm = torch.nn.utils.clip_grad_norm_", "self.scaler.unscale_(self.optimizer)"),
        "RuntimeError: unscale_() has already been called on this optimizer since the last update()"),
    "AMP007/bad_fix_none_scaler.py": (
        ["--unsafe-fixes"], lambda t: t.replace("        self.optimizer.step()  # expect: AMP007@9",
                                                "        self.scaler.step(self.optimizer)\n        self.scaler.update()"),
        "AttributeError: 'NoneType' object has no attribute 'step'"),
    "AMP009/bad_fix_none_scaler.py": (
        [], lambda t: t.replace("            opt.zero_grad()\n", "            opt.zero_grad()\n        scaler.update()\n", 1),
        "AttributeError: 'NoneType' object has no attribute 'update'"),
    "AMP016/bad_fix_dtype_in_branch.py": (
        [], lambda t: t.replace('torch.autocast("cuda", enabled=args.amp)', 'torch.autocast("cuda", enabled=args.amp, dtype=amp_dtype)'),
        "UnboundLocalError: cannot access local variable 'amp_dtype'"),
    "AMP201/bad_fix_optional_fabric.py": (
        [], lambda t: t.replace("loss.backward()  # expect: AMP201@9", "fabric.backward(loss)"),
        "AttributeError: 'NoneType' object has no attribute 'backward'"),
    "AMP013/bad_fix_scaler_created_later.py": (
        ["--unsafe-fixes"],
        lambda t: _insert(t.replace('"step": start + 3}', '"step": start + 3, "scaler": scaler.state_dict()}'), "after",
                          r"optimizer.load_state_dict\(ckpt", 'if "scaler" in ckpt:\n    scaler.load_state_dict(ckpt["scaler"])'),
        "UnboundLocalError: cannot access local variable 'scaler'"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_fixed_runs_and_naive_fix_breaks(name: str, tmp_path: Path):
    options, naive, error = CASES[name]
    code = name.split("/")[0]
    fixed = tmp_path / "fixed.py"
    shutil.copy(RULES / name, fixed)
    # --preview: AMP003, AMP007, AMP009, AMP010 and AMP201 are preview rules (selected by code without it, nothing is fixed)
    res = run_ampfix("rewrite", "--preview", "--select", code, "--no-cache", *options, fixed)
    assert res.returncode in (0, 1), res.stderr.decode()
    assert code in res.stdout.decode(), res.stdout.decode() + res.stderr.decode()  # the rule ran
    run = _python(fixed, str(tmp_path / "ckpt.pt"))
    assert run.returncode == 0 and run.stdout.startswith("done"), run.stderr[-2000:]
    broken = tmp_path / "naive.py"
    broken.write_text(naive((RULES / name).read_text()))
    run = _python(broken, str(tmp_path / "ckpt2.pt"))
    assert run.returncode != 0 and error in run.stderr, run.stderr[-2000:]


def test_the_naive_early_return_fix_is_what_a_fresh_check_flags():
    """The issue: after AMP003's old safe fix in a helper that returns early, a check of the
    rewritten file reports a new AMP009. ampfix now leaves that finding unfixed (and says why), so
    the rewrite adds nothing."""
    path = RULES / "AMP003" / "bad_fix_early_return.py"
    naive = CASES["AMP003/bad_fix_early_return.py"][1](path.read_text())
    res = run_ampfix("check", "--preview", "--select", "AMP009", "--stdin-filename", "naive.py", "-", input=naive.encode())
    assert res.returncode == 1 and "AMP009" in res.stdout.decode()
    res = run_ampfix("check", "--preview", "--select", "AMP003,AMP009", "--no-cache", path)
    out = res.stdout.decode()
    assert "AMP009" not in out and "(not fixed: the `return` on line 19 leaves without `scaler.update()`" in out
