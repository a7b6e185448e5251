"""How a pool's workers hand each other module summaries within one run (`runner._pool`, with
`--no-cache`): a module one worker summarised is read, not parsed and summarised again, by the
others; and how they share out the files, so that a file one worker parsed for its summary is
analysed by that worker, not parsed again by another (`Claims`).

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
from typing import Any, Dict, List, Optional, Tuple

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


class Claims:
    """Which worker of a pool analyses each file of the run: the first that claims it (a file
    created with `O_EXCL` in the pool's private folder, named by the file's place in the run).

    A worker claims a file when it starts the file's job, and also when its project is about to
    parse the file for a summary (`Project.claim`): the worker then analyses that file itself,
    after the job it is running, with the parse it made (`owed`), and a worker that gets the
    file's job later finds it claimed and leaves it. Without this, a module that one worker
    summarised and the other analysed was parsed by both (15 of accelerate's modules, 0.6 s of
    CPU). A file already claimed when a summary needs it (the other worker is analysing it, or
    has) is parsed for its summary as before."""

    def __init__(self, folder: str, jobs: Dict[str, Tuple[int, Any]]):
        self.folder = folder
        self.jobs = jobs  # absolute path -> (the file's place in the run, its job)
        self.owed: List[Tuple[int, Any]] = []  # claimed for a summary, not analysed yet (in order)

    def take(self, index: int) -> Optional[bool]:
        """Claim the file at `index`: True when this process now has it, False when another
        process claimed it first, None when the folder cannot tell (an error: nobody is refused)."""
        claim = os.path.join(self.folder, str(index))
        for first in (True, False):
            try:
                os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
                return True
            except FileExistsError:
                return False
            except FileNotFoundError:  # the first claim of the run makes the folder
                if not first:
                    return None
                try:
                    os.makedirs(self.folder, 0o700, exist_ok=True)
                except OSError:
                    return None
            except OSError:
                return None
        return None

    def for_summary(self, path: str) -> bool:
        """The project is about to parse `path` (absolute) for its summary: True when it is a
        file of the run that this process now analyses too (then owed)."""
        entry = self.jobs.get(path)
        if entry is None or self.take(entry[0]) is not True:
            return False
        self.owed.append(entry)
        return True


claims: Optional[Claims] = None  # a pool's worker's (`runner._init_worker`); None elsewhere


__all__ = ["Claims", "SharedSummaries", "claims"]
