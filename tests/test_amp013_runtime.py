"""AMP013's fix of a resume, run on a real GradScaler (CPU), in bagua's shape: the scaler is built
`GradScaler(enabled=args.amp)`, so a checkpoint saved by a run without `--amp` holds `{}` for it.
The restore the fix inserts must load that checkpoint into a run with `--amp` (an enabled scaler
refuses an empty state: RuntimeError "The source state dict is empty"), and still restore the
scale a run with `--amp` saved."""

import pytest

from ampfix.engine.analyze import Settings, fix_text
from ampfix.engine.registry import find_rule

torch = pytest.importorskip("torch")

TRAINER = '''import torch


def save(path, optimizer, scaler):
    torch.save({"optimizer": optimizer.state_dict(), "scaler": scaler.state_dict()}, path)


def resume(path, optimizer, amp):
    scaler = torch.amp.GradScaler("cpu", enabled=amp)
    ckpt = torch.load(path)
    optimizer.load_state_dict(ckpt["optimizer"])
    return scaler
'''


def _fixed() -> str:
    new, _, _ = fix_text(TRAINER, "trainer.py", [find_rule("AMP013")], Settings(unsafe_fixes=True))
    return new


def _resume(source: str, tmp_path, saved_with_amp: bool, resumed_with_amp: bool):
    ns: dict = {}
    exec(compile(source, "trainer.py", "exec"), ns)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    saved = torch.amp.GradScaler("cpu", enabled=saved_with_amp, init_scale=1024.0)
    path = tmp_path / "ckpt.pt"
    ns["save"](path, optimizer, saved)
    return ns["resume"](path, optimizer, resumed_with_amp)


def test_the_fix_restores_the_scaler():
    fixed = _fixed()
    assert fixed != TRAINER
    assert 'scaler.load_state_dict(ckpt["scaler"])' in fixed


@pytest.mark.parametrize("saved_with_amp", [False, True])
def test_a_resume_with_amp_loads_any_checkpoint(tmp_path, saved_with_amp):
    scaler = _resume(_fixed(), tmp_path, saved_with_amp, resumed_with_amp=True)
    # the scale a run with --amp saved comes back; a checkpoint without one leaves the default
    assert scaler.get_scale() == (1024.0 if saved_with_amp else 65536.0)


def test_an_empty_scaler_state_is_what_a_bare_restore_refuses(tmp_path):
    """Why the fix tests the entry's value, not only its key: the plain restore raises here."""
    bare = TRAINER.replace('    return scaler', '    scaler.load_state_dict(ckpt["scaler"])\n    return scaler')
    with pytest.raises(RuntimeError, match="empty"):
        _resume(bare, tmp_path, saved_with_amp=False, resumed_with_amp=True)
