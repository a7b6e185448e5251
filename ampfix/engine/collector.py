"""The cyclic garbage collector during analysis: one policy for the engine's runs and the
language server (measured in bench/SPEED.md).

* `paused()`: the collector is off while one file is parsed and analysed. A tree and its model are
  tens of thousands of objects whose allocation would trigger collections (each traversing
  everything alive); they are acyclic, so reference counting frees them all the same.
* A batch run (`runner.run` and its pool's workers) raises the collector's thresholds
  (`fewer_collections`) and freezes, when each file's analysis ends, what the analysis left alive
  (`batch`): the project layer's texts, summaries and memos then leave the collector's
  generations (`gc.freeze`) instead of being traversed by the collection that the file's
  allocations trigger as soon as the collector is back on (3-4% of a check of accelerate or peft).
  Cyclic garbage frozen with them (a few hundred objects a file: exceptions caught, their frames)
  is reclaimed by one full collection every `FREEZE_FILES` files; when the run ends, everything
  is unfrozen for the collector's next collection.

This module imports nothing heavy: a run that analyses nothing pays for none of it.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator, Tuple

#: the cyclic garbage collector's thresholds during a run, in this process and in the pool's
#: workers (CPython's are 700, 10, 10). Each file is analysed with the collector off
#: (`paused`), but the run keeps what the project layer reads (texts, summaries, memos)
#: and every collection between files traversed it again: 6-8% of a `-j 1` check of peft and
#: accelerate, 2% with these (bench/SPEED.md, sixth session). Cycles are still collected, later.
RUN_GC_THRESHOLD = (100_000, 20, 20)

#: in a batch run, one full collection (after unfreezing) every this many files: it reclaims the
#: cyclic garbage frozen with what the analyses left alive
FREEZE_FILES = 1000

_batch = {"on": False, "files": 0}


def fewer_collections() -> Tuple[int, ...]:
    """Raise the collector's thresholds to `RUN_GC_THRESHOLD` (never lower them); the old ones."""
    old = gc.get_threshold()
    gc.set_threshold(*(max(a, b) for a, b in zip(old, RUN_GC_THRESHOLD)))
    return old


@contextmanager
def batch() -> Iterator[None]:
    """A batch run: the thresholds raised (`fewer_collections`) and each file's survivors frozen
    when its analysis ends (see the module docstring); on leaving, the thresholds restored and
    every frozen object unfrozen. A process that froze objects itself before the run (a host
    that embeds ampfix and forks workers) keeps them frozen: the run then freezes nothing."""
    old, was = _start()
    try:
        yield
    finally:
        froze = _batch["on"] and not was
        _batch["on"] = was
        if froze:
            # what the run allocated since the last collection joins the oldest generation with
            # what the batch froze, uncollected (left to the collector's next full collection: a
            # CLI run exits now): restoring the thresholds over a young generation that grew
            # under the raised ones would collect it at the next allocation (tens of milliseconds
            # on the main process of a pool run, which holds LibCST and the rules); both calls
            # move whole lists, where counting the frozen objects first (`_thaw`) walks them
            gc.freeze()
            gc.unfreeze()
            _batch["files"] = 0
        gc.set_threshold(*old)


def enter_batch() -> None:
    """A pool's worker: a batch run for the rest of its life (it ends with the run)."""
    _start()


def _start() -> Tuple[Tuple[int, ...], bool]:
    """Begin a batch: the thresholds raised, freezing on unless the process froze objects of its
    own; the old thresholds and whether a batch was on already."""
    old = fewer_collections()
    was = _batch["on"]
    _batch["on"] = was or gc.get_freeze_count() == 0
    return old, was


def _thaw(collect: bool = True) -> None:
    """Unfreeze what the batch froze (into the oldest generation) and, with `collect`, collect."""
    _batch["files"] = 0
    if gc.get_freeze_count():
        gc.unfreeze()
        if collect:
            gc.collect()


@contextmanager
def paused() -> Iterator[None]:
    """The cyclic collector off while one file is parsed and analysed (see the module docstring).
    Acyclic is kept so by a test (`test_a_checked_files_model_and_tree_are_freed_without_a_collection`):
    a cycle through a model leaves its whole tree to the next collection, which then traverses it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if _batch["on"]:
                _batch["files"] += 1
                if _batch["files"] >= FREEZE_FILES:
                    _thaw()
                gc.freeze()
            gc.enable()
