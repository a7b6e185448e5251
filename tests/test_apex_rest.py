"""The rest of apex (AMP103) end to end, and its facts against torch's own signatures: a
DeepLearningExamples-shaped script using apex DDP, SyncBatchNorm conversion, FusedAdam, FusedSGD,
FusedLayerNorm and FusedRMSNorm cannot run here (no apex); after `ampfix rewrite --select AMP1
--unsafe-fixes` nothing from apex is left, `check` is clean, and it trains on CPU torch with
FutureWarning as an error."""

import ast
import inspect
import shutil

import pytest

from conftest import FIXTURES, run_ampfix
from test_migrate import run_python

SCRIPT = FIXTURES / "migrate_apex" / "apex_rest_train.py"


def apex_refs(source):
    tree = ast.parse(source)
    out = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
           and any((getattr(n, "module", None) or a.name).split(".")[0] == "apex" for a in n.names)]
    return out + [n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "apex"]


def test_original_cannot_run(tmp_path):
    shutil.copy(SCRIPT, tmp_path / SCRIPT.name)
    res = run_python(tmp_path / SCRIPT.name, cwd=tmp_path)
    assert res.returncode != 0 and "No module named 'apex'" in res.stderr


def test_migrated_runs_without_apex_or_deprecation(tmp_path):
    path = tmp_path / SCRIPT.name
    shutil.copy(SCRIPT, path)
    res = run_ampfix("rewrite", "--select", "AMP1", "--unsafe-fixes", path)
    assert res.returncode == 0, res.stdout.decode() + res.stderr.decode()
    out = res.stdout.decode()
    assert "AMP103  apex-to-torch" in out and "optional apex import removed" in out, out
    check = run_ampfix("check", "--select", "AMP1", path)
    assert check.returncode == 0, check.stdout.decode()
    source = path.read_text()
    assert apex_refs(source) == []
    assert "torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), weight_decay=0.0, fused=True)" in source
    assert "torch.nn.parallel.DistributedDataParallel(model)" in source
    run = run_python(path, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert lines[-1] == "done" and sum(line.startswith("step ") for line in lines) == 4


def _torch_target(target):
    torch = pytest.importorskip("torch")
    obj = torch
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def test_mappings_match_torch_signatures():
    """What AMP103 keeps means the same in torch: the leading positional parameters have apex's
    names in apex's order, every kept keyword is a parameter of the torch target, and each
    target exists."""
    from ampfix.knowledge.apex_api import APIS

    for key, api in APIS.items():
        obj = _torch_target(api.target)
        sig = inspect.signature(obj if inspect.isfunction(obj) or inspect.ismethod(obj) else obj.__init__)
        params = [p for p in sig.parameters if p != "self"]
        assert tuple(params[:api.positional]) == api.apex_params[:api.positional], key
        kept = [k for k, plan in api.keywords.items() if plan == "keep"]
        assert set(kept) <= set(params), (key, set(kept) - set(params))
        if api.kind in ("adam", "sgd"):
            assert "fused" in params
    # apex FusedAdam is AdamW (adam_w_mode=True) with weight_decay=0; torch's AdamW default differs
    assert inspect.signature(_torch_target("optim.AdamW").__init__).parameters["weight_decay"].default == 0.01
    # apex FusedRMSNorm's eps is 1e-5; torch's default is None (the dtype's eps): AMP103 passes it
    assert inspect.signature(_torch_target("nn.RMSNorm").__init__).parameters["eps"].default is None
