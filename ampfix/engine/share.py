"""How a pool's workers hand each other module summaries within one run (`runner._pool`, with
`--no-cache`): a module one worker summarised is read, not parsed and summarised again, by the
others.

The cache (`cache.Summaries`) keeps summaries as JSON in sealed, validated entries, because its
folder outlives the run and may come from anywhere. Between the workers of one run that is
most of a summary's cost: a large module's summary (accelerate's `accelerator.py`: 1 MB of
JSON) took 0.16 s to write and 0.19 s to read back, against 0.006 s and 0.022 s pickled. So
the workers pickle: the folder is the run's own (`signals.make_temp_folder`: `mkdtemp`, mode
0700, removed when the pool ends), written only by this run's processes, forks of one parent
that also pickle their jobs and results through the pool's pipes. It trusts nothing more than
those pipes do. An entry is a tuple (path, digest, summary or None); one that does not unpickle,
or names another module or content, is a miss."""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path

from ampfix.engine.rulemeta import write_atomically


class SharedSummaries:
    """A `project.SummaryStore` in a pool's private folder (see the module docstring)."""

    def __init__(self, folder: Path):
        self.folder = folder

    def _entry(self, path: str, digest: str) -> Path:
        return self.folder / hashlib.sha256(f"{path}\0{digest}".encode()).hexdigest()

    def get(self, path: str, digest: str):
        """The summary kept (a `ModuleSummary`, or `UNREADABLE`), None on a miss."""
        from ampfix.model.summary import UNREADABLE, ModuleSummary

        try:
            kept_path, kept_digest, summary = pickle.loads(self._entry(path, digest).read_bytes())
        except Exception:  # absent, cut short, or not ours: a miss
            return None
        if kept_path != path or kept_digest != digest:
            return None
        if summary is None:
            return UNREADABLE
        return summary if isinstance(summary, ModuleSummary) else None

    def put(self, path: str, digest: str, summary) -> None:
        """Keep `summary` (None: the module could not be summarised). Written whole or not at
        all: another worker may read it at any moment."""
        try:
            data = pickle.dumps((path, digest, summary), protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, RecursionError):
            return  # not kept: the other workers summarise it themselves
        write_atomically(self._entry(path, digest), data)


__all__ = ["SharedSummaries"]
