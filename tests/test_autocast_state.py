"""AMP101's device-specific autocast state functions (`torch.get_autocast_gpu_dtype()` ->
`torch.get_autocast_dtype("cuda")`): the knowledge table against the installed torch (each old
function warns and names its replacement, and both read the same state), the model's names
for every import style, and the rewrite of a name imported from torch."""

import warnings

import pytest

from ampfix.engine.analyze import Settings, check_text, fix_text
from ampfix.engine.registry import select_rules
from ampfix.knowledge.torch_amp_api import AUTOCAST_STATE, STATE_KIND
from ampfix.model.names import API_TABLE
from conftest import call_named, model

torch = pytest.importorskip("torch")

DEVICE = {"gpu": "cuda", "cpu": "cpu", "ipu": "ipu", "xla": "xla"}


def _device(old: str) -> str:
    return DEVICE[old.split("_")[2]]


def test_model_table_holds_every_old_function():
    names = {q.rsplit(".", 1)[1]: a for q, a in API_TABLE.items() if a.kind == STATE_KIND}
    assert set(names) == set(AUTOCAST_STATE)
    assert all(a.deprecated and a.device == _device(old) for old, a in names.items())


@pytest.mark.parametrize("old", sorted(AUTOCAST_STATE))
def test_each_old_function_warns_and_names_its_replacement(old):
    if not hasattr(torch, old):
        pytest.skip(f"torch {torch.__version__} has no {old}")
    new, n_args = AUTOCAST_STATE[old]
    dev = _device(old)
    current = getattr(torch, new.replace("set_", "get_" if "dtype" in new else "is_"))(dev)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        getattr(torch, old)(*([current] if n_args else []))
    assert [w.category for w in rec] == [DeprecationWarning]
    assert f"Please use torch.{new}('{dev}'" in str(rec[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        getattr(torch, new)(dev, *([current] if n_args else []))  # the replacement does not warn


def test_not_deprecated_spellings_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.set_autocast_enabled(torch.is_autocast_enabled())
        torch.is_autocast_cache_enabled()


def test_old_and_new_getters_agree_inside_autocast():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert torch.get_autocast_cpu_dtype() == torch.get_autocast_dtype("cpu") == torch.bfloat16
            assert torch.is_autocast_cpu_enabled() is torch.is_autocast_enabled("cpu") is True


def test_model_resolves_every_import_style():
    m = model("""
        import torch as T
        import torch._C as C
        from torch import get_autocast_gpu_dtype as g

        a = T.get_autocast_gpu_dtype()
        b = C.is_autocast_cpu_enabled()
        c = g()
        """)
    for text, dev in (("T.get_autocast_gpu_dtype()", "cuda"), ("C.is_autocast_cpu_enabled()", "cpu"), ("g()", "cuda")):
        api = m.api_of(call_named(m, text))
        assert (api.kind, api.device, api.deprecated) == (STATE_KIND, dev, True)


def _rewrite(src, version=(2, 4)):
    rules = select_rules(["AMP101"], [], preview=True)
    new, _, remaining = fix_text(src, "m.py", rules, Settings(min_torch_version=version))
    return new, remaining


def test_import_and_uses_renamed_together():
    src = ("from torch import get_autocast_gpu_dtype, set_autocast_cpu_enabled as sce\n\n\n"
           "def f(x):\n    sce(True)\n    return x.to(get_autocast_gpu_dtype())\n")
    new, remaining = _rewrite(src)
    assert new == ("from torch import get_autocast_dtype, set_autocast_enabled as sce\n\n\n"
                   "def f(x):\n    sce(\"cpu\", True)\n    return x.to(get_autocast_dtype(\"cuda\"))\n")
    assert not remaining


@pytest.mark.parametrize("src", [
    # the new name is taken in the file
    "from torch import get_autocast_gpu_dtype\n\n\ndef get_autocast_dtype():\n    return get_autocast_gpu_dtype()\n",
    # re-exported
    "from torch import get_autocast_gpu_dtype\n__all__ = ['get_autocast_gpu_dtype']\nd = get_autocast_gpu_dtype()\n",
    # one use is a value: neither the import nor the call changes
    "from torch import get_autocast_gpu_dtype\nd = get_autocast_gpu_dtype()\nf = get_autocast_gpu_dtype\n",
])
def test_import_kept_where_a_use_or_the_rename_cannot_change(src):
    new, remaining = _rewrite(src)
    assert new == src and remaining


def test_held_back_for_a_torch_before_the_replacement():
    src = "import torch\nd = torch.get_autocast_gpu_dtype()\n"
    new, _ = _rewrite(src, (2, 3))
    assert new == src
    diags, _ = check_text(src, "m.py", select_rules(["AMP101"], []), Settings(min_torch_version=(2, 3)))
    assert len(diags) == 1 and diags[0].fix is None and "needs torch >= 2.4" in diags[0].message


def test_in_the_branch_modern_torch_takes_fixed_only_where_the_project_declares_its_torch():
    # mmengine's shape: the `else` of a test of torch < 1.10 runs on 2.4 (it warns) and on 1.10-2.3 (no replacement)
    src = ("import torch\n\n\ndef f():\n    if torch.__version__ < '1.10':\n        return None\n"
           "    else:\n        return torch.get_autocast_gpu_dtype()\n")
    rules = select_rules(["AMP101"], [])
    diags, _ = check_text(src, "m.py", rules, Settings(min_torch_version=(2, 4)))
    assert len(diags) == 1 and diags[0].fix is None and "version test on line 5" in diags[0].message
    declared = Settings(min_torch_version=(2, 4), min_torch_source="`torch>=2.4` in pyproject.toml")
    diags, _ = check_text(src, "m.py", rules, declared)
    assert len(diags) == 1 and diags[0].fix is not None
    new, _, remaining = fix_text(src, "m.py", rules, declared)
    assert "return torch.get_autocast_dtype('cuda')" in new and not remaining
