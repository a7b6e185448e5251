"""Migration (AMP1xx) end to end, as a user runs it: `ampfix rewrite --select AMP1 --unsafe-fixes`
on real training scripts, which must then run on this (CPU) torch with FutureWarning turned into
an error, while the originals do warn. Plus the TorchFix regressions and the migration report."""

import ast
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import FIXTURES, run_ampfix

MIGRATE = FIXTURES / "migrate"
SCRIPTS = sorted(p.name for p in MIGRATE.glob("*.py"))
DEPRECATED_AMP = ("torch.cuda.amp", "torch.cpu.amp")


def run_python(path_or_code, *, cwd, code=False, timeout=120):
    """Run a script (or `-c` code) with every FutureWarning an error."""
    env = dict(os.environ, PYTHONWARNINGS="error::FutureWarning")
    args = ["-c", path_or_code] if code else [str(path_or_code)]
    return subprocess.run([sys.executable, "-W", "error::FutureWarning", *args], cwd=cwd, capture_output=True,
                          text=True, env=env, timeout=timeout)


def rewrite_stdin(source, *extra):
    res = run_ampfix("rewrite", "--preview", "--select", "AMP1", *extra, "-", "--stdin-filename", "snippet.py",
                     input=textwrap.dedent(source).encode())
    return res, res.stdout.decode()


def deprecated_refs(source):
    """Imports and attribute chains that still reach torch.cuda.amp / torch.cpu.amp / apex."""
    tree = ast.parse(source)
    out = []
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith(DEPRECATED_AMP) or a.name.split(".")[0] == "apex":
                    out.append(f"import {a.name}")
                if a.asname:
                    aliases[a.asname] = a.name
                else:
                    aliases[a.name.split(".")[0]] = a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if full.startswith(DEPRECATED_AMP) or node.module.split(".")[0] == "apex":
                    out.append(f"from {node.module} import {a.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts = []
            cur = node
            while isinstance(cur, ast.Attribute):
                parts.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name):
                full = ".".join([aliases.get(cur.id, cur.id), *reversed(parts)])
                if full.startswith(DEPRECATED_AMP):
                    out.append(full)
    return out


# ----------------------------------------------------------------------------- the scripts


@pytest.fixture(scope="module")
def migrated(tmp_path_factory):
    """All scripts migrated in one CLI run (as a user would on a repository)."""
    folder = tmp_path_factory.mktemp("migrated")
    for name in SCRIPTS:
        shutil.copy(MIGRATE / name, folder / name)
    res = run_ampfix("rewrite", "--preview", "--select", "AMP1", "--unsafe-fixes", folder)
    return folder, res


def test_there_are_enough_scripts():
    assert len([s for s in SCRIPTS if not s.startswith("apex")]) >= 3
    assert any(s.startswith("apex") for s in SCRIPTS)


@pytest.mark.parametrize("name", [s for s in SCRIPTS if not s.startswith("apex")])
def test_original_warns(name, tmp_path):
    shutil.copy(MIGRATE / name, tmp_path / name)
    res = run_python(tmp_path / name, cwd=tmp_path)
    assert res.returncode != 0, res.stdout
    assert "FutureWarning" in res.stderr and "is deprecated" in res.stderr, res.stderr[-2000:]


def test_apex_original_cannot_run(tmp_path):
    shutil.copy(MIGRATE / "apex_train.py", tmp_path / "apex_train.py")
    res = run_python(tmp_path / "apex_train.py", cwd=tmp_path)
    assert res.returncode != 0
    assert "No module named 'apex'" in res.stderr


def test_rewrite_reports_and_leaves_nothing(migrated):
    folder, res = migrated
    out = res.stdout.decode()
    assert res.returncode == 0, out + res.stderr.decode()
    assert f"in {len(SCRIPTS)} files:" in out
    check = run_ampfix("check", "--preview", "--select", "AMP1", folder)
    assert check.returncode == 0, check.stdout.decode()
    assert "All checks passed!" in check.stdout.decode()
    for name in SCRIPTS:
        assert deprecated_refs((folder / name).read_text()) == [], name


@pytest.mark.parametrize("name", SCRIPTS)
def test_migrated_script_runs_without_deprecation(name, migrated):
    folder, _ = migrated
    res = run_python(folder / name, cwd=folder)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "is deprecated" not in res.stderr
    lines = res.stdout.splitlines()
    assert lines[-1] == "done"
    assert sum(line.startswith("step ") for line in lines) >= 3


def test_migration_is_minimal(migrated):
    """Only lines with a deprecated use change (apex: its loop restructuring aside)."""
    folder, _ = migrated
    for name in SCRIPTS:
        if name.startswith("apex"):
            continue
        old = (MIGRATE / name).read_text().splitlines()
        new = (folder / name).read_text().splitlines()
        assert len(old) == len(new), name
        for a, b in zip(old, new):
            if a != b:
                assert any(k in a for k in ("amp", "autocast", "GradScaler", "custom_")), (name, a, b)


def test_diff_and_summary(tmp_path):
    for name in SCRIPTS:
        shutil.copy(MIGRATE / name, tmp_path / name)
    before = {n: (tmp_path / n).read_bytes() for n in SCRIPTS}
    res = run_ampfix("rewrite", "--preview", "--select", "AMP1", "--unsafe-fixes", "--diff", tmp_path)
    out = res.stdout.decode()
    assert res.returncode == 1  # something would change
    assert {n: (tmp_path / n).read_bytes() for n in SCRIPTS} == before  # --diff writes nothing
    headers = [line for line in out.splitlines() if line.startswith(("--- ", "+++ "))]
    for name in SCRIPTS:  # one diff per file
        assert sum(line.startswith("--- ") and line.endswith(name) for line in headers) == 1, headers
        assert sum(line.startswith("+++ ") and line.endswith(name) for line in headers) == 1, headers
    assert "\n-from torch.cuda.amp import GradScaler, autocast\n" in out
    assert "\n+from torch.amp import GradScaler, autocast\n" in out
    assert '\n+scaler = torch.amp.GradScaler("cuda")\n' in out  # apex
    summary = out[out.index("Would fix"):].splitlines()
    # findings fixed per rule (the import rewrites that follow the uses are edits, not findings)
    assert summary[0] == "Would fix 19 findings in 4 files:"
    assert summary[1:8] == [
        "    14  AMP101  deprecated-amp-api  (+4 follow-up edits)",
        "             4  imports of torch.cuda.amp / torch.cpu.amp -> torch.amp",
        '             3  torch.cpu.amp.autocast -> torch.amp.autocast("cpu")',
        '             5  torch.cuda.amp.GradScaler -> torch.amp.GradScaler("cuda")',
        '             4  torch.cuda.amp.autocast -> torch.amp.autocast("cuda")',
        '             1  torch.cuda.amp.custom_bwd -> torch.amp.custom_bwd(device_type="cuda")',
        '             1  torch.cuda.amp.custom_fwd -> torch.amp.custom_fwd(device_type="cuda")',
    ]
    assert any(line.startswith("     5  AMP102  apex-amp") for line in summary)
    assert summary[-1] == "Found 19 findings (19 would be fixed, 0 remaining)."


def test_check_counts_the_uses():
    """`check` lists every deprecated use (one finding each) before the rewrite."""
    res = run_ampfix("check", "--preview", "--select", "AMP101", MIGRATE / "torch_alias_cnn.py")
    out = res.stdout.decode()
    assert res.returncode == 1
    assert out.count("AMP101 [*]") == 6
    assert 'use `torch.amp.autocast("cpu", ...)`' in out


# ----------------------------------------------------------------------------- TorchFix regressions


def test_torchfix_from_import_no_name_error(tmp_path):
    src = """\
    from torch.cuda.amp import autocast

    with autocast(enabled=False):
        print("ok")
    """
    res, out = rewrite_stdin(src)
    assert res.returncode == 0
    assert out.startswith("from torch.amp import autocast\n")
    assert 'with autocast("cuda", enabled=False):' in out
    assert "torch.amp.autocast(" not in out  # no unbound `torch`
    run = run_python(out, cwd=tmp_path, code=True)
    assert run.returncode == 0 and run.stdout == "ok\n", run.stderr


def test_torchfix_torch_alias(tmp_path):
    src = """\
    import torch as T

    with T.cuda.amp.autocast(enabled=False):
        print("ok")
    """
    res, out = rewrite_stdin(src)
    assert 'with T.amp.autocast("cuda", enabled=False):' in out
    assert "import torch as T\n" in out and "torch.amp" not in out.replace("T.amp", "")
    run = run_python(out, cwd=tmp_path, code=True)
    assert run.returncode == 0 and run.stdout == "ok\n", run.stderr


def test_torchfix_module_alias_no_attribute_error(tmp_path):
    src = """\
    import torch.cuda.amp as tamp

    with tamp.autocast(enabled=False):
        print("ok")
    """
    res, out = rewrite_stdin(src)
    assert out.startswith("import torch.amp as tamp\n")
    assert 'with tamp.autocast("cuda", enabled=False):' in out
    assert "tamp.amp" not in out
    run = run_python(out, cwd=tmp_path, code=True)
    assert run.returncode == 0 and run.stdout == "ok\n", run.stderr


def test_torchfix_missed_gradscaler_and_bare_custom_fwd(tmp_path):
    src = """\
    import torch
    from torch.cuda.amp import GradScaler as GS
    from torch.cuda import amp

    a = torch.cuda.amp.GradScaler(enabled=False)
    b = GS(1024.0, enabled=False)
    c = amp.GradScaler(enabled=False)
    d = torch.cpu.amp.GradScaler(enabled=False)
    assert isinstance(b, torch.cuda.amp.GradScaler) and isinstance(c, GS)
    def f(s: torch.cuda.amp.GradScaler) -> GS:
        return s

    class Twice(torch.autograd.Function):
        @staticmethod
        @torch.cuda.amp.custom_fwd
        def forward(ctx, x):
            return 2 * x

        @staticmethod
        @amp.custom_bwd
        def backward(ctx, g):
            return 2 * g

    x = torch.ones(2, requires_grad=True)
    Twice.apply(x).sum().backward()
    print(b.get_scale() if b.is_enabled() else 1024.0, a._device, d._device, x.grad.tolist())
    """
    res, out = rewrite_stdin(src)
    assert res.returncode == 0, res.stderr.decode()
    assert deprecated_refs(out) == []
    assert 'b = GS("cuda", 1024.0, enabled=False)' in out
    assert '@torch.amp.custom_fwd(device_type="cuda")' in out and '@amp.custom_bwd(device_type="cuda")' in out
    assert "def f(s: torch.amp.GradScaler) -> GS:" in out
    run = run_python(out, cwd=tmp_path, code=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "1024.0 cuda cpu [2.0, 2.0]\n"


# ----------------------------------------------------------------------------- meaning preserved


def test_positional_autocast_arguments_keep_their_meaning(tmp_path):
    """torch.cpu.amp.autocast(enabled, dtype, cache_enabled) vs torch.amp.autocast(device_type, dtype,
    enabled, cache_enabled): positional arguments become keywords; old and new code agree."""
    src = """\
    import torch

    with torch.cpu.amp.autocast(False):
        a = torch.is_autocast_enabled("cpu")
    with torch.cpu.amp.autocast(True, torch.float16, False):
        b = (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"), torch.is_autocast_cache_enabled())
    print(a, b)
    """
    res, out = rewrite_stdin(src)
    assert 'torch.amp.autocast("cpu", enabled=False)' in out
    assert 'torch.amp.autocast("cpu", enabled=True, dtype=torch.float16, cache_enabled=False)' in out
    old = subprocess.run([sys.executable, "-c", textwrap.dedent(src)], capture_output=True, text=True)
    new = run_python(out, cwd=tmp_path, code=True)
    assert old.returncode == 0 and new.returncode == 0, new.stderr
    assert "FutureWarning" in old.stderr
    assert old.stdout == new.stdout == "False (True, torch.float16, False)\n"


def test_noqa_keeps_a_name_whole(tmp_path):
    """A `# noqa` on one use keeps that name's import and all its uses: never half migrated."""
    src = """\
    from torch.cpu.amp import autocast, GradScaler

    with autocast(enabled=False):  # noqa: AMP101
        pass
    with autocast(enabled=False):
        pass
    s = GradScaler(enabled=False)
    print("ok")
    """
    res, out = rewrite_stdin(src)
    assert out.startswith("from torch.cpu.amp import autocast\nfrom torch.amp import GradScaler\n")
    assert out.count("with autocast(enabled=False):") == 2
    assert 's = GradScaler("cpu", enabled=False)' in out
    check = run_ampfix("check", "--preview", "--select", "AMP101", "-", "--stdin-filename", "s.py", input=out.encode())
    assert b"has a use or import marked `# noqa` (line 4)" in check.stdout
    run = subprocess.run([sys.executable, "-c", out], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout == "ok\n"


# ----------------------------------------------------------------------------- apex: by hand


@pytest.mark.parametrize("name,expected", [
    ("bad_o3.py", "migrate by hand: opt_level O3 is pure fp16 training"),
    ("bad_two_initialize.py", "migrate by hand: several amp.initialize calls (lines 9, 10)"),
    ("bad_loss_elsewhere.py", "the loss is not computed in the block of the scale_loss `with` (it comes from "
                              "another function"),
])
def test_apex_manual_cases_report_precisely(name, expected, tmp_path):
    path = FIXTURES / "rules" / "AMP102" / name
    shutil.copy(path, tmp_path / name)
    res = run_ampfix("check", "--preview", "--select", "AMP102", tmp_path / name)
    out = res.stdout.decode()
    assert expected in out, out
    assert "[-]" not in out and "[*]" not in out  # no fix offered
    res = run_ampfix("rewrite", "--preview", "--select", "AMP1", "--unsafe-fixes", tmp_path / name)
    assert res.returncode == 1  # findings remain
    assert (tmp_path / name).read_text() == path.read_text()  # nothing half migrated


def test_apex_forward_region_holds_only_the_loss_dependencies(tmp_path):
    golden = (FIXTURES / "rules" / "AMP102" / "bad_basic.unsafe.py").read_text()
    tree = ast.parse(golden)
    regions = [n for n in ast.walk(tree) if isinstance(n, ast.With)
               and ast.unparse(n.items[0].context_expr) == "torch.autocast('cuda')"]
    assert len(regions) == 1
    inside = [ast.unparse(s) for s in regions[0].body]
    assert inside == [
        "x, y = (x.cuda(non_blocking=True), y.cuda(non_blocking=True))",
        "logits = model(x)",
        "loss = F.cross_entropy(logits, y)",
    ]
    assert "correct = (logits.argmax(dim=1) == y).sum().item()" in golden  # left outside, after the region
    assert golden.index("scaler.unscale_(optimizer)") < golden.index("clip_grad_norm_")
    assert golden.index("scaler.step(optimizer)") < golden.index("scaler.update()")
    assert deprecated_refs(golden) == []
