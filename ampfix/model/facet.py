"""A facet of the model: the facts of one family of questions (training, precision,
checkpoints, apex), asked by few rules. Built on first use (`model.training`, ...), it reads the
core facts (tree, names, values, call graph, objects, events) through `self.model`, so the core
stays one small surface and a facet's names do not crowd it."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from ampfix.model import AmpModel


class Facet:
    def __init__(self, model: "AmpModel") -> None:
        # a proxy: the model keeps its facets, and a facet that kept the model would make every
        # model (and its tree) a reference cycle that only the cyclic collector frees
        self.model = weakref.proxy(model)
