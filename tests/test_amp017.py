"""AMP017 (fp16-without-loss-scaling): what it claims about run time, checked with real torch on
this CPU (float16 autocast exists on the CPU in torch 2.13 and rounds as on a GPU), and the
shapes that must stay silent that a fixture cannot hold (apex, Lightning: other rules report
the APIs themselves)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from ampfix.api import check_source
from test_verify import ROOT, check, fx, run_json

SCRIPT = "buggy_fp16_no_scaler.py"


def amp017(source: str):
    return [d for d in check_source(textwrap.dedent(source), "train.py") if d.code == "AMP017"]


def test_float16_gradients_flush_to_zero_without_scaling():
    """The mechanism: one backward of a small loss under float16 autocast gives gradients that
    are exactly zero where float32's are not; scaled by a GradScaler's 65536 they match float32's."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Tanh(), torch.nn.Linear(128, 256))
    x, y = torch.randn(128, 64), torch.randn(128, 256)

    def grads(dtype, scale):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            loss = 1e-3 * torch.nn.functional.mse_loss(model(x), y)
        (loss * scale).backward()
        return torch.cat([p.grad.flatten() / scale for p in model.parameters()])

    fp32, unscaled, scaled = grads(None, 1.0), grads(torch.float16, 1.0), grads(torch.float16, 65536.0)
    nonzero = fp32 != 0
    lost = ((unscaled == 0) & nonzero).float().sum() / nonzero.float().sum()
    assert lost > 0.05, lost  # float16 flushed them
    assert ((scaled == 0) & nonzero).sum() == 0  # loss scaling keeps every one
    assert torch.allclose(scaled, fp32, rtol=1e-2, atol=1e-9)
    assert (unscaled - fp32).abs().sum() > 10 * (scaled - fp32).abs().sum()


def test_unscaled_float16_stalls_and_the_rewrite_trains_like_fp32():
    pytest.importorskip("torch")
    p, doc = run_json(fx(SCRIPT), "--unsafe-fixes", "--steps", "100", "--warmup", "5", "--reps", "1",
                      "--threads", "1", expect=0)
    assert doc["rewritten"] is True and not doc["same_source"]
    assert [f["code"] for f in doc["fixes"]] == ["AMP017"]
    runs = {r["label"]: r for r in doc["runs"]}
    assert runs["fixed-amp"]["scaler_enabled"] and not runs["original"]["scaler_enabled"]
    orig = doc["original_vs_fp32"]
    assert orig["status"] == "FAIL", orig  # the loss stalls: float16 gradients flushed to zero
    assert orig["metrics"]["final_gap"] > 0.2, orig["metrics"]
    parity = check(doc, "loss-parity")
    assert parity["status"] == "PASS", parity
    assert parity["metrics"]["final_gap"] < 0.01, parity["metrics"]
    assert "float16" in check(doc, "amp-active")["detail"]
    assert check(doc, "fp32-equivalence")["metrics"]["identical"] is True


def test_unsafe_rewrite_adds_a_grad_scaler_and_nothing_else(tmp_path):
    path = tmp_path / SCRIPT
    shutil.copy(fx(SCRIPT), path)
    before = path.read_text()
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, "-m", "ampfix", "rewrite", str(path)], cwd=ROOT, capture_output=True,
                       text=True, env=env)
    assert p.returncode == 1 and path.read_text() == before, p.stdout  # unsafe: not without --unsafe-fixes
    p = subprocess.run([sys.executable, "-m", "ampfix", "rewrite", "--unsafe-fixes", str(path)], cwd=ROOT,
                       capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    after = path.read_text().splitlines()
    old = before.splitlines()
    assert [ln for ln in old if ln not in after] == [
        "    loss.backward()  # the mistake: float16 gradients, no loss scaling", "    opt.step()"]
    assert [ln for ln in after if ln not in old] == [
        "scaler = torch.amp.GradScaler(device)",
        "    scaler.scale(loss).backward()  # the mistake: float16 gradients, no loss scaling",
        "    scaler.step(opt)", "    scaler.update()"]
    p = subprocess.run([sys.executable, "-m", "ampfix", "check", "--select", "ALL", str(path)], cwd=ROOT,
                       capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stdout


def test_apex_scale_loss_and_lightning_manual_backward_are_silent():
    assert not amp017("""
        import torch
        from apex import amp

        def train(model, optimizer, loader):
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            for x in loader:
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = model(x).sum()
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
                optimizer.step()
        """)
    assert not amp017("""
        import torch
        import lightning as L

        class Lit(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.automatic_optimization = False

            def training_step(self, batch, batch_idx):
                opt = self.optimizers()
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = self.net(batch).sum()
                self.manual_backward(loss)
                opt.step()
        """)


def test_a_dtype_from_the_callers():
    assert not amp017("""
        import torch

        def train(model, optimizer, loader, dtype):
            for x in loader:
                with torch.autocast("cuda", dtype=dtype):  # the caller's: unknown
                    loss = model(x).sum()
                loss.backward()
                optimizer.step()
        """)
    # the same loop with the dtype known from its callers: reported, once
    found = amp017("""
        import torch

        def train(model, optimizer, loader, dtype):
            for x in loader:
                with torch.autocast("cuda", dtype=dtype):
                    loss = model(x).sum()
                loss.backward()
                optimizer.step()

        train(net, opt, data, torch.float16)
        train(net, opt, data, dtype=torch.half)
        """)
    assert [(d.line, d.column) for d in found] == [(8, 9)]
