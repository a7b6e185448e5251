"""Issue 13 (apex.amp): the apex shapes real projects use migrate mechanically with
`ampfix rewrite --select AMP1 --unsafe-fixes`; afterwards no apex reference is left in use,
`ampfix check` is clean, and the migrated scripts run their steps on CPU torch with
FutureWarning as an error. The shapes that have no native equivalent are reported precisely."""

import ast
import json
import os
import shutil
import subprocess
import sys

import pytest

from ampfix.engine.analyze import Settings, check_text
from ampfix.engine.registry import select_rules

from conftest import FIXTURES, run_ampfix
from test_migrate import deprecated_refs

APEX = FIXTURES / "rules" / "AMP102"
RUNNABLE = sorted(p.name for p in APEX.glob("bad_run_*.py") if not p.name.endswith(".unsafe.py"))
MIGRATED = sorted(p.name for p in APEX.glob("bad_*.py") if not p.name.endswith(".unsafe.py")
                  and p.with_name(p.name[:-3] + ".unsafe.py").exists())

# runs every script in one interpreter (torch is imported once), each in a fresh namespace
# (it counts the updates of enabled GradScalers: the scaler really steps)
DRIVER = r"""
import contextlib, io, json, runpy, sys, traceback, warnings
import torch
warnings.simplefilter("error", FutureWarning)
updates = [0]
original = torch.amp.GradScaler.update
def update(self, *a, **k):
    updates[0] += self.is_enabled()
    return original(self, *a, **k)
torch.amp.GradScaler.update = update
out = {}
for path in sys.argv[1:]:
    buf = io.StringIO()
    updates[0] = 0
    try:
        with contextlib.redirect_stdout(buf):
            runpy.run_path(path, run_name="__main__")
        out[path] = {"ok": True, "stdout": buf.getvalue(), "updates": updates[0]}
    except BaseException:
        out[path] = {"ok": False, "stdout": buf.getvalue(), "error": traceback.format_exc()[-3000:]}
print(json.dumps(out))
"""


def test_there_are_runnable_shapes():
    assert len(RUNNABLE) >= 8


@pytest.fixture(scope="module")
def migrated(tmp_path_factory):
    folder = tmp_path_factory.mktemp("apex")
    for name in MIGRATED:
        shutil.copy(APEX / name, folder / name)
    res = run_ampfix("rewrite", "--preview", "--select", "AMP1", "--unsafe-fixes", folder)
    return folder, res


def test_rewrite_leaves_no_apex_and_check_is_clean(migrated):
    folder, res = migrated
    assert res.returncode == 0, res.stdout.decode() + res.stderr.decode()
    check = run_ampfix("check", "--preview", "--select", "AMP1", folder)
    assert check.returncode == 0 and "All checks passed!" in check.stdout.decode(), check.stdout.decode()
    # and the migrated code is correct native AMP for every other rule (unscale before clipping, ...)
    check = run_ampfix("check", "--preview", folder)
    assert check.returncode == 0 and "All checks passed!" in check.stdout.decode(), check.stdout.decode()
    for name in MIGRATED:
        text = (folder / name).read_text()
        assert deprecated_refs(text) == [], name
        names = {n.id for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Name)}
        assert not names & {"apex", "amp", "apex_amp", "APEX_AVAILABLE"}, name


def test_cli_rewrite_equals_the_golden_files(migrated):
    folder, _ = migrated
    for name in MIGRATED:
        assert (folder / name).read_text() == (APEX / (name[:-3] + ".unsafe.py")).read_text(), name


def test_migrated_scripts_run_without_deprecation(migrated, tmp_path):
    """As migrated (on CPU torch the cuda autocast and scaler disable themselves), and once more
    with the device type "cpu", where autocast (bfloat16) and the GradScaler are really active:
    the scaler's step/unscale_/update sequence is what torch accepts, once per iteration."""
    folder, _ = migrated
    on_cpu = tmp_path / "on_cpu"
    on_cpu.mkdir()
    for name in RUNNABLE:
        text = (folder / name).read_text()
        (on_cpu / name).write_text(text.replace('GradScaler("cuda"', 'GradScaler("cpu"').replace(
            'autocast("cuda"', 'autocast("cpu"'))
    env = dict(os.environ, PYTHONWARNINGS="error::FutureWarning")
    paths = [folder / n for n in RUNNABLE] + [on_cpu / n for n in RUNNABLE]
    res = subprocess.run([sys.executable, "-W", "error::FutureWarning", "-c", DRIVER, *map(str, paths)],
                         cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    results = json.loads(res.stdout.splitlines()[-1])
    for path in paths:
        r = results[str(path)]
        assert r["ok"], (path, r.get("error"))
        lines = r["stdout"].splitlines()
        assert lines[-1] == "done", path
        steps = sum(line.startswith("step ") for line in lines)
        assert steps >= 3, path
        if path.parent == on_cpu and path.name != "bad_run_o0.py":  # O0: the scaler is off
            assert r["updates"] == steps, (path, r["updates"], steps)


def test_optional_apex_keeps_the_users_flag():
    text = (APEX / "bad_run_optional_flag.unsafe.py").read_text()
    assert 'scaler = torch.amp.GradScaler("cuda", enabled=args.fp16)' in text
    assert 'with torch.autocast("cuda", enabled=args.fp16):' in text
    assert "APEX_AVAILABLE" not in text and "try:" not in text
    assert text.count("scaler.scale(loss).backward()") == 1 and "loss.backward()" not in text.replace(
        "scaler.scale(loss).backward()", "")


def test_scaler_lives_where_both_reach_it():
    trainer = (APEX / "bad_run_trainer_class.unsafe.py").read_text()
    assert 'self.scaler = torch.amp.GradScaler("cuda", enabled=self.fp16)' in trainer
    assert "self.scaler.step(self.optimizer)" in trainer
    # same checkpoint key; an apex-format entry is skipped, so old checkpoints still load (the
    # script loads one: see test_migrated_scripts_run_without_deprecation)
    assert '        if "scale" in state["amp"]:\n            self.scaler.load_state_dict(state["amp"])' in trainer
    assert '"amp": self.scaler.state_dict()' in trainer
    # no `global` is injected: a scaler only a setup function would assign is not migrated
    setup = APEX / "bad_global_setup_function.py"
    assert not (APEX / "bad_global_setup_function.unsafe.py").exists()
    diags, _ = check_text(setup.read_text(), str(setup), select_rules(["AMP102"], [], preview=True), Settings(unsafe_fixes=True))
    assert diags and all(d.fix is None and "module global assigned inside `build`" in d.message for d in diags)
    returned = (APEX / "bad_run_returned.unsafe.py").read_text()
    assert "    return model, optimizer, scaler\n" in returned
    assert "    model, optimizer, scaler = prepare_model_and_optimizer(device, fp16)\n" in returned


def test_several_optimizers_one_update_per_iteration():
    text = (APEX / "bad_run_gan_num_losses.unsafe.py").read_text()
    assert text.count("GradScaler(") == 1
    assert "scaler.step(opt_d)" in text and "scaler.step(opt_g)" in text
    assert text.count("scaler.update()") == 1
    assert text.index("scaler.step(opt_g)") < text.index("scaler.update()")


def test_accumulation_steps_on_the_boundary_only():
    text = (APEX / "bad_run_accumulation.unsafe.py").read_text()
    assert text.count("scaler.scale(loss).backward()") == 2
    assert text.count("scaler.update()") == 1 and text.count("with torch.autocast") == 1
    body = text.split("else:")[1]
    assert "scaler.step(optimizer)" in body and "scaler.update()" in body


@pytest.mark.parametrize("name,expected", [
    ("bad_o2_no_master_weights.py", "O2 with master_weights=False steps fp16 weights without an fp32 copy"),
    ("bad_opt_level_variable.py", "opt_level is `opt_level`, not a literal"),
    ("bad_o1_cast_fp16.py", "O1 with cast_model_type=torch.float16 and no master weights trains pure fp16"),
    ("bad_o3.py", "opt_level O3 is pure fp16 training"),
])
def test_reported_shapes(name, expected, tmp_path):
    shutil.copy(APEX / name, tmp_path / name)
    res = run_ampfix("check", "--preview", "--select", "AMP102", tmp_path / name)
    out = res.stdout.decode()
    assert expected in out and "[-]" not in out, out


def test_fix_titles_say_what_changes():
    res = run_ampfix("rewrite", "--preview", "--select", "AMP102", "--unsafe-fixes", "--diff", APEX / "bad_o2_options.py",
                     APEX / "bad_run_o0.py")
    out = res.stdout.decode()
    assert "apex amp.initialize O2 -> torch.amp.GradScaler(\"cuda\") and autocast, with fp32 parameters" in out
    assert "keep_batchnorm_fp32=False dropped" in out and "cast_model_type (fp16 model) dropped" in out
    assert "O0 is fp32: autocast and GradScaler disabled" in out


def test_loss_scale_dynamic_or_number():
    text = (APEX / "bad_run_loss_scale_expr.unsafe.py").read_text()
    assert 'GradScaler("cuda", init_scale=65536.0 if args.loss_scale == 0 else args.loss_scale)' in text
    static = (APEX / "bad_basic.unsafe.py").read_text()
    assert 'GradScaler("cuda", init_scale=128.0)' in static


def test_gradients_are_unscaled_before_clipping():
    """apex unscaled the gradients when scale_loss exited; the native code clips after unscale_,
    once per iteration, before an `if fp16: ... else: ...` whose both branches clip."""
    plain = (APEX / "bad_run_clip_model_params.unsafe.py").read_text()
    assert "    scaler.unscale_(optimizer)\n    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)" in plain
    flag = (APEX / "bad_run_optional_flag.unsafe.py").read_text()
    assert "    scaler.unscale_(optimizer)\n    if args.fp16:\n" in flag


def test_import_torch_goes_after_a_future_import_sharing_its_line(tmp_path):
    # `from __future__ import ...; import os`: `import torch` cannot go before that line (a future
    # import must come first); it goes before the next import, and the file compiles
    src, text = _migrated(tmp_path, "from __future__ import annotations; import os\n"
                                    "from apex import amp\n"
                                    "from mymodels import model, optimizer, batches\n\n")
    assert text.startswith("from __future__ import annotations; import os\nimport torch\n"), text
    assert "amp.initialize" not in text and 'torch.amp.GradScaler("cuda")' in text
    compile(text, str(src), "exec")


def test_a_comment_over_the_removed_apex_import_stays_when_the_next_statement_is_replaced(tmp_path):
    # pytorch-ignite's EfficientNet notebook: a cell holds `try: from apex import amp ...` and then
    # `model, optimizer = amp.initialize(...)`. The try's comment lines move to the next statement
    # (`Rewrites.remove`), and that statement is replaced too: its replacement keeps them (they
    # were dropped, and with them the cell's marker, so the notebook was not rewritten)
    _, text = _migrated(tmp_path, "import torch\n"
                                  "from mymodels import model, optimizer, batches\n"
                                  "# set up mixed precision\n"
                                  "try:\n"
                                  "    from apex import amp\n"
                                  "except ImportError:\n"
                                  '    raise ImportError("install apex")\n\n'
                                  "# Initialize Amp\n")
    assert "apex" not in text and 'torch.amp.GradScaler("cuda")' in text, text
    assert "# set up mixed precision\n" in text and "# Initialize Amp\n" in text, text
    assert text.index("# set up mixed precision") < text.index("# Initialize Amp") < text.index("GradScaler"), text


def _migrated(tmp_path, head: str):
    """`head`, then an apex O1 training loop (`amp.initialize`, `amp.scale_loss`), rewritten with
    the unsafe fixes: (the file, its text after)."""
    src = tmp_path / "train.py"
    src.write_text(head + 'model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n'
                   "for x in batches:\n"
                   "    loss = model(x).sum()\n"
                   "    with amp.scale_loss(loss, optimizer) as scaled_loss:\n"
                   "        scaled_loss.backward()\n"
                   "    optimizer.step()\n")
    res = run_ampfix("rewrite", "--preview", "--select", "AMP1", "--unsafe-fixes", src)
    assert res.returncode == 0, res.stdout + res.stderr
    return src, src.read_text()


def _amp102(text, name):
    diags, _ = check_text(text, name, select_rules(["AMP102"], [], preview=True), Settings(unsafe_fixes=True))
    return diags


def test_an_input_gradient_is_autocast_only():
    """adversarial-robustness-toolbox's estimators: `fit`'s scale_loss is a training step (scaler.scale,
    step and update); `loss_gradient`'s only computes `x_grad.grad` for an attack, with no optimizer
    step: native AMP is autocast only there (a scaled backward would leave the input's gradient
    multiplied by the scale, a scaler.step would update the model), and it does not hold back the
    migration of `fit` (the golden file; the script checks the gradients are not scaled)."""
    text = (APEX / "bad_run_input_gradient.py").read_text()
    diags = _amp102(text, "bad_run_input_gradient.py")
    lines = text.splitlines()
    fit, grad, custom = [d for d in diags if "scale_loss(" in lines[d.line - 1]]
    assert "scaler.step(optimizer) + scaler.update()" in fit.message
    for d in (grad, custom):
        assert d.message.startswith("apex amp.scale_loss computes the gradient of `x_grad` and no optimizer steps: "
                                    "native AMP is autocast only"), d.message
        assert "scaler.step" not in d.message and "multiplied by the scale" in d.message
    assert all(d.fix == "unsafe" for d in diags)
    golden = (APEX / "bad_run_input_gradient.unsafe.py").read_text()
    assert golden.count("self.scaler.scale(loss).backward()") == 1 and golden.count("        loss.backward()\n") == 2
    assert golden.count("self.scaler.step(") == 1
    # the input is made to require gradients inside the autocast region, before the forward reads it
    assert "            x_grad.requires_grad = True\n            diff = self._model(x_grad)" in golden
    # ART's own shape: its opt_level is not known here, so nothing is migrated, but the advice stands
    art = text.replace('opt_level="O1"', "opt_level=config.OPT_LEVEL")
    diags = _amp102(art, "art.py")
    fit, grad, custom = [d for d in diags if "scale_loss(" in art.splitlines()[d.line - 1]]
    assert all(d.fix is None for d in diags)
    assert "autocast only" in grad.message and "opt_level is `config.OPT_LEVEL`" in grad.message
    assert "follows the scaled backward" not in grad.message + custom.message + fit.message
