"""A facet of the model: the facts of one family of questions (training, precision,
checkpoints, apex), asked by few rules. Built on first use (`model.training`, ...), it reads the
core facts (tree, names, values, call graph, objects, events) through `self.model`, so the core
stays one small surface and a facet's names do not crowd it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from ampfix.model import AmpModel


class Facet:
    def __init__(self, model: "AmpModel") -> None:
        self.model = model
