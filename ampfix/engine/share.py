"""How a pool's workers hand each other module summaries within one run (`runner._pool`, with
`--no-cache`): a module one worker summarised is read, not parsed and summarised again, by the
others; how they share out the files, so that a file one worker parsed for its summary is
analysed by that worker, not parsed again by another (`Claims`); and the flags the pool's
processes share (`Flags`: the claims, and which files are being analysed).

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
import mmap
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


class Flags:
    """A flag (a byte) per place of the run, shared by the processes of a pool: a file of the
    pool's private folder, mapped into memory by each of them. The forks inherit the mapping; a
    spawned worker (macOS, Windows) maps the file again (pickled, it is its path and size). In
    the pool's folder, it goes with it, also when the next run sweeps the folder of a run that
    was killed. (It replaced a file per flag, the claims' and the crash marks': on the benchmark
    machine's `/tmp` the creation of a file costs about 0.35 ms of CPU, bench/SPEED.md,
    seventeenth session.)"""

    def __init__(self, path: str, size: int, create: bool = True):
        self.path, self.size = path, max(1, size)
        if create:  # zeros written, not a hole: a full disk fails here, not as a SIGBUS in a worker
            with open(path, "wb") as fh:
                fh.write(bytes(self.size))
        with open(path, "r+b") as fh:
            self._view: Optional[mmap.mmap] = mmap.mmap(fh.fileno(), self.size)

    def __reduce__(self):
        return (Flags, (self.path, self.size, False))

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        return self._view[index] if self._view is not None else 0

    def __setitem__(self, index: int, value: int) -> None:
        if self._view is not None:
            self._view[index] = value

    def close(self) -> None:
        """Unmap the file (before its folder is removed: Windows keeps a mapped file)."""
        if self._view is not None:
            self._view.close()
            self._view = None


class Claims:
    """Which worker of a pool analyses each file of the run: the first that claims it (a flag per
    file, by its place in the run, that the pool's processes share: `table`, set under a lock).

    A worker claims a file when it starts the file's job, and also when its project is about to
    parse the file for a summary (`Project.claim`): the worker then analyses that file itself,
    after the job it is running, with the parse it made (`owed`), and a worker that gets the
    file's job later finds it claimed and leaves it. Without this, a module that one worker
    summarised and the other analysed was parsed by both (15 of accelerate's modules, 0.6 s of
    CPU). A file already claimed when a summary needs it (the other worker is analysing it, or
    has) is parsed for its summary as before."""

    def __init__(self, table: Tuple[Any, Any], jobs: Dict[str, Tuple[int, Any]]):
        self.taken, self.lock = table
        self.jobs = jobs  # absolute path -> (the file's place in the run, its job)
        self.owed: List[Tuple[int, Any]] = []  # claimed for a summary, not analysed yet (in order)

    @staticmethod
    def table(context, folder: str, size: int) -> Tuple[Flags, Any]:
        """The shared flags of a run of `size` places (in the pool's `folder`), and their lock,
        made by the pool's parent with the pool's multiprocessing `context` (its workers inherit
        them)."""
        return Flags(os.path.join(folder, "claims"), size), context.Lock()

    def take(self, index: int) -> Optional[bool]:
        """Claim the file at `index`: True when this process now has it, False when a process
        (this one included) claimed it first, None when the table cannot tell (nobody is
        refused: the lock not had in `LOCK_WAIT` seconds, which only a worker that died holding
        it explains, and then the pool is broken and runs what is missing again)."""
        if not 0 <= index < len(self.taken) or not self.lock.acquire(timeout=LOCK_WAIT):
            return None
        try:
            if self.taken[index]:
                return False
            self.taken[index] = 1
            return True
        finally:
            self.lock.release()

    def claimed(self, index: int) -> bool:
        """Some process claimed the file at `index`."""
        return 0 <= index < len(self.taken) and bool(self.taken[index])

    def for_summary(self, path: str) -> bool:
        """The project is about to parse `path` (absolute) for its summary: True when it is a
        file of the run that this process now analyses too (then owed)."""
        entry = self.jobs.get(path)
        if entry is None or self.take(entry[0]) is not True:
            return False
        self.owed.append(entry)
        return True


#: how long a claim waits for the lock (held for a few microseconds a claim)
LOCK_WAIT = 5.0

claims: Optional[Claims] = None  # a pool's worker's (`runner._init_worker`); None elsewhere


__all__ = ["Claims", "SharedSummaries", "claims"]
