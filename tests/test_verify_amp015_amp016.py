"""What AMP015 and AMP016 claim about run time, checked on this CPU.

AMP015: a GradScaler with bfloat16 autocast changes nothing measurable (the losses are identical
with the scaler and with ampfix's rewrite that disables it). AMP016 and the precision model rest
on autocast's defaults: float16 for CUDA, bfloat16 for the CPU, and a nested region without
`dtype=` inheriting the enclosing region's dtype."""

from __future__ import annotations

import pytest

from test_verify import check, fx, run_json


def test_autocast_default_dtypes_and_nesting():
    torch = pytest.importorskip("torch")
    assert torch.get_autocast_dtype("cuda") == torch.float16  # AMP016: cuda autocast without dtype= is float16
    assert torch.get_autocast_dtype("cpu") == torch.bfloat16  # ... and CPU autocast bfloat16 (left alone)
    with torch.autocast("cpu", dtype=torch.float16):
        with torch.autocast("cpu"):  # a nested region inherits (AMP016 skips nested regions)
            assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.float16


def test_scaler_with_bf16_changes_nothing_on_cpu():
    pytest.importorskip("torch")
    p, doc = run_json(fx("scaler_with_bf16.py"), "--unsafe-fixes", "--steps", "40", "--warmup", "5", "--reps", "1",
                      "--threads", "1", expect=0)
    assert doc["rewritten"] is True and not doc["same_source"]
    runs = {r["label"]: r for r in doc["runs"]}
    assert runs["original"]["scaler_enabled"] and not runs["fixed-amp"]["scaler_enabled"]
    assert runs["original"]["scale_min"] == runs["original"]["scale_max"] == 65536.0  # never moved
    assert doc["losses"]["original"] == doc["losses"]["fixed-amp"]  # bit-identical without the scaler
    assert doc["original_vs_fp32"]["status"] == "PASS"
    assert check(doc, "loss-parity")["status"] == "PASS"
    assert check(doc, "fp32-equivalence")["metrics"]["identical"] is True
