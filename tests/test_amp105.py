"""AMP105 apex-checkpoint-without-amp-state: which `amp.initialize(...)` calls the file shows to
scale the loss dynamically (apex's default for O1 and O2, `loss_scale="dynamic"` at any level),
and which it does not (a static `loss_scale=`, O0/O3, a level or `enabled=` not shown)."""

import textwrap

import pytest

from ampfix.api import check_source

TEMPLATE = """
import argparse
import torch
from apex import amp

parser = argparse.ArgumentParser()
parser.add_argument("--opt-level", default={default!r})
args = parser.parse_args()
LEVEL = "O2"


class Trainer:
    def __init__(self, model, optimizer, config, flag):
        self.model, self.optimizer = amp.initialize({args})

    def save(self, path):
        torch.save({{"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}}, path)
"""


def findings(args: str, default: str = "O1"):
    text = textwrap.dedent(TEMPLATE.format(args=args, default=default))
    return [d for d in check_source(text, select=["AMP105"], preview=True) if d.code == "AMP105"]


@pytest.mark.parametrize("args, default", [
    ("model, optimizer", "O1"),  # apex's default level, O1
    ("model, optimizer, opt_level='O1'", "O1"),
    ("model, optimizer, opt_level='O2', loss_scale=None", "O1"),
    ("model, optimizer, True, 'O2'", "O1"),  # positional enabled, opt_level
    ("model, optimizer, opt_level='O3', loss_scale='dynamic'", "O1"),  # dynamic asked for at any level
    ("model, optimizer, opt_level=LEVEL", "O1"),  # a name bound to a literal
    ("model, optimizer, opt_level=args.opt_level", "O2"),  # an option of the file, its default O2
    ("model, optimizer, enabled=True, opt_level='O1'", "O1"),
])
def test_dynamic_loss_scale_is_reported(args, default):
    assert len(findings(args, default)) == 1


@pytest.mark.parametrize("args, default", [
    ("model, optimizer, opt_level='O1', loss_scale=128.0", "O1"),  # static: no state to lose
    ("model, optimizer, opt_level='O3'", "O1"),  # O3 and O0: a static 1.0 by default
    ("model, optimizer, opt_level='O0'", "O1"),
    ("model, optimizer, opt_level=args.opt_level", "O3"),  # the option's default is static
    ("model, optimizer, opt_level=config['fp16_opt_level']", "O1"),  # not shown
    ("model, optimizer, opt_level='O1', loss_scale=config['loss_scale']", "O1"),
    ("model, optimizer, enabled=flag, opt_level='O1'", "O1"),  # maybe disabled
    ("model, optimizer, 'O1'", "O1"),  # (robustness 1.2.1's call: 'O1' is `enabled=`; not shown)
    ("model, optimizer, **config", "O1"),
])
def test_static_or_unknown_loss_scale_is_silent(args, default):
    assert findings(args, default) == []


def test_amp_state_saved_anywhere_in_the_file_is_silent():
    text = textwrap.dedent(TEMPLATE.format(args="model, optimizer", default="O1")) + (
        "\n\ndef save_amp(path):\n    torch.save(amp.state_dict(), path)\n")
    assert [d for d in check_source(text, select=["AMP105"], preview=True)] == []


def test_amp_state_restored_in_the_file_is_silent():
    text = textwrap.dedent(TEMPLATE.format(args="model, optimizer", default="O1")) + (
        "\n\ndef resume(checkpoint):\n    amp.load_state_dict(checkpoint['amp'])\n")
    assert [d for d in check_source(text, select=["AMP105"], preview=True)] == []
