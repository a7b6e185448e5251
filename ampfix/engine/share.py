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
import os
import pickle
from pathlib import Path


class SharedSummaries:
    """A `project.SummaryStore` in a pool's private folder (see the module docstring)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._ready = False

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
        all (a temporary file, then a rename): another worker may read it at any moment."""
        import tempfile

        try:
            data = pickle.dumps((path, digest, summary), protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, RecursionError):
            return  # not kept: the other workers summarise it themselves
        try:
            if not self._ready:
                self.folder.mkdir(parents=True, exist_ok=True)
                self._ready = True
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=str(self.folder))
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                os.replace(tmp, self._entry(path, digest))
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
        except OSError:
            pass  # a folder that cannot be written costs speed, never the check


__all__ = ["SharedSummaries"]
