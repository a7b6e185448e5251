"""The project: the modules around the checked files, read through their summaries.

`Project` answers the questions a file's model asks about other modules (`ForeignFacts` in
`model/foreign.py`): what an import refers to (following `__init__.py` re-exports, aliases,
star imports), the bases of a class of another module, the calls other modules make to a
function. It reads each module once: a module summary (`model/summary.py`) comes from the
summary store (the cache, keyed by the module's content) when it holds it, from the parse the
engine already made when the module is being checked in this process, and otherwise from one
parse of the module; the summary is then kept in memory and in the store.

Unknown stays unknown: a module that is not found among the project's files (a third-party
package), that cannot be read or parsed, or a name it does not bind resolves to None.
"""

from __future__ import annotations

import ast
import bisect
import hashlib
import io
import os
import re
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, FrozenSet, List, Optional, Protocol, Set, Tuple, TypeVar, Union

import libcst as cst

from ampfix.model.foreign import Definition, ForeignClass, ForeignConstant, ForeignFunction, ForeignModule
from ampfix.lexemes import LEXEMES, MASK, masked as _masked
from ampfix.model.parsing import parse_module
from ampfix.model.summarize import AMP_TEXT, TRACE_TEXT, def_spans
from ampfix.model.summary import IMPORTED, LOCAL, UNREADABLE, ClassSummary, ModuleSummary, OutgoingCall, Stored, Value
from ampfix.model.tree import Index
from ampfix.project.graph import (ImportGraph, at_lines_holding, callers_dep, digest_of_paths, import_statements,
                                  importers_dep, imports_dep, read_text, subclasses_dep)
from ampfix.project.layout import Layout, Target, clear_caches

MAX_RESOLVE_DEPTH = 8
MAX_CALLER_FILES = 40
MAX_KEPT_MODULES = 64  # parses made for summaries, kept for the engine to reuse
_IMPORTED_RE = re.compile(r'^__imported__\("([^"]*)"\)((?:\.\w+)*)$')
_LOCAL_RE = re.compile(r"^__local__((?:\.\w+)+)$")
_DOTTED_RE = re.compile(r"^[A-Za-z_]\w*(?:\.\w+)*$")
_APEX_AMP_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+apex[ \t]+import[ \t]+(?:\(?[\w, \t]*\b)?amp\b|import[ \t]+apex\b)",
                              re.MULTILINE)
_APEX_AMP_USE = re.compile(r"\bamp\.(?:initialize|scale_loss|master_params|state_dict|load_state_dict)\(")
# `amp` (or anything) taken from another module: `from .utils import *`, `from .utils import amp`
_AMP_FROM_ELSEWHERE = re.compile(r"^[ \t]*from[ \t]+\S+[ \t]+import[ \t]+(?:\*|\(?[\w, \t]*\bamp\b)", re.MULTILINE)
# library modules a project module may bind with `from <package> import <module>` (`from apex import amp`):
# a name re-exported from there is that module, as a top-level module (`import torch`) is; a library's
# function or class so re-exported is not followed (`library_name`)
LIBRARY_MODULES = frozenset({"apex.amp", "torch.amp", "torch.cuda", "torch.cuda.amp", "torch.cpu", "torch.cpu.amp",
                             "torch.nn", "torch.nn.utils", "torch.optim", "torch.distributed"})


class SummaryStore(Protocol):
    """Where summaries are kept: between runs (the engine's cache, `engine.cache.Summaries`), or
    within one, where a pool's workers hand them to each other (`engine.share.SharedSummaries`)."""

    def get(self, path: str, digest: str) -> Union[ModuleSummary, Stored, None]:
        """The summary kept for this module and content, `UNREADABLE` when it could not be
        summarised, None when nothing (or nothing trustworthy) is kept."""

    def put(self, path: str, digest: str, summary: Optional[ModuleSummary]) -> None:
        """Keep `summary` (None: the module could not be summarised)."""


@dataclass
class Source:
    """A module's text as the engine read it (and its parse, when it has one)."""

    text: str
    digest: str
    module: Optional[cst.Module] = None


def digest_of(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _stat_key(path: str) -> Optional[Tuple[int, int]]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


def _reads(deps: Optional[Deps], paths: "Set[str]") -> bool:
    """A memoised answer with dependencies `deps` read the text of one of `paths` or resolved
    its imports."""
    return deps is not None and not (paths.isdisjoint(deps[0]) and paths.isdisjoint(deps[1]))


def _reads_imports(key) -> bool:
    """A key of `_key_code` whose code is read with the imports binding the names it uses
    (`Project._with_imports`): a definition, or the span of an importer's code."""
    return not isinstance(key, str) and (len(key) == 3 or key[1] is not None)


def _part_path(key) -> str:
    """The module of a key of `_reach_parts` or `_closure` (`Project._key_code`)."""
    return key if isinstance(key, str) else key[0]


def _read(path: str) -> Optional[Source]:
    text = read_text(path)
    return None if text is None else Source(text, digest_of(text))


# what computing a memoised answer read: (the modules whose texts it read, the files whose imports it resolved)
Deps = Tuple[Tuple[str, ...], Tuple[str, ...]]


K = TypeVar("K")
V = TypeVar("V")
_UNSET = object()  # `Project._memoised`: no placeholder


class _Memo(Dict[K, V]):
    """A memo of the project's answers, with what computing each one read (`deps`, None when
    nothing; absent while it is being computed): a later file's analysis that reuses an answer
    depends on the same modules as the one that computed it (`Project._replay`)."""

    def __init__(self) -> None:
        super().__init__()
        self.deps: Dict[object, Optional[Deps]] = {}

    def clear(self) -> None:
        super().clear()
        self.deps.clear()


class Project:
    """The project of one root folder (see the module docstring). One per run and process."""

    def __init__(self, root: Path, store: Optional[SummaryStore] = None,
                 parse: Optional[Callable[[str, str], Optional[cst.Module]]] = None, max_memory: int = 0,
                 claim: Optional[Callable[[str], bool]] = None):
        self.graph = ImportGraph(root, self._quiet_text)
        self.layout = self.graph.layout
        self.max_memory = max_memory  # `max-file-memory`: a module over it is not parsed (its summary unknown)
        self.root = self.layout.root
        self.store = store
        self._parse = parse or _parse
        self._sources: Dict[str, Source] = {}
        self._summaries: Dict[str, Optional[ModuleSummary]] = {}
        self._modules: Dict[str, ForeignModule] = {}
        self._members: _Memo[Tuple[str, str], Optional[Definition]] = _Memo()
        self._resolved: _Memo[Tuple[str, str], Optional[Definition]] = _Memo()
        self._bases: _Memo[Tuple[str, str], list] = _Memo()
        self._callers: _Memo[Tuple[str, str], Optional[list]] = _Memo()
        self._indexes: Dict[str, ModuleIndex] = {}
        self._spans: Dict[str, Dict[str, Tuple[int, int]]] = {}
        self._relevant: Dict[Tuple[str, Optional[str], str], bool] = {}
        self._bound: Dict[str, Dict[str, str]] = {}
        self._uses_memo: Dict[str, List[str]] = {}
        self._reexports: _Memo[str, List[str]] = _Memo()
        self._exports: _Memo[str, Optional[FrozenSet[str]]] = _Memo()  # path -> `star_names`
        self._reached: _Memo[Tuple[str, str], List[Optional[Definition]]] = _Memo()
        self._text_mros: _Memo[Tuple[str, str], Optional[List[ForeignClass]]] = _Memo()
        self._lacks_methods: _Memo[Tuple[Tuple[str, str], str], bool] = _Memo()
        self._imports_at: Dict[str, List[Tuple[int, int]]] = {}
        self._import_pieces: Dict[str, Dict[str, Tuple[str, ...]]] = {}  # `_import_pieces_of`
        # (words, lower words) -> path -> `_import_words`
        self._import_words_memo: Dict[Tuple[Tuple[str, ...], Tuple[str, ...]],
                                      Dict[str, List[Tuple[str, frozenset, frozenset]]]] = {}
        self._used: _Memo[Tuple[str, str], Optional[Definition]] = _Memo()
        self._names_for: _Memo[str, Dict[str, List[str]]] = _Memo()
        self._closures: _Memo[Tuple[Tuple[str, Optional[str]], int], Optional[frozenset]] = _Memo()
        self._words: Dict[Tuple[Tuple[str, ...], Tuple[str, ...]], Dict[object, Tuple[frozenset, frozenset]]] = {}
        self._words_of_modules: Dict[Tuple[Tuple[str, ...], Tuple[str, ...]], Dict[str, Tuple[frozenset, frozenset]]] = {}
        # (words, lower words) -> path -> the strings its whole text holds, where they bound every part's (`_text_words`)
        self._words_of_texts: Dict[Tuple[Tuple[str, ...], Tuple[str, ...]], Dict[str, Optional[Tuple[frozenset, frozenset, bool]]]] = {}
        self._masks: Dict[str, Tuple[str, str]] = {}  # path -> (its text, the text masked: `_masked`)
        self._active: List[Tuple[str, str]] = []
        self.parsed: List[str] = []  # modules this project parsed itself (not given by the engine)
        self.from_store = 0  # summaries read from the store
        # modules the model could not summarise (path, the error's type): their facts are unknown,
        # which silences what depends on them; a programming error shows here (`AMPFIX_STATS=1`)
        self.unsummarised: List[Tuple[str, str]] = []
        self._touched: Optional[set] = None
        # the memoised answers being computed (innermost last): where what each reads starts in the logs
        self._frames: List[Tuple[int, int]] = []
        self._text_log: List[str] = []  # the modules whose texts they read, in order
        self._import_log: List[str] = []  # the files whose imports they resolved
        self._deps_pool: Dict[Deps, Deps] = {}
        self._asked: Optional[set] = None  # the modules whose importers were asked (`end`)
        self._read_imports: Optional[set] = None  # the files whose imports were resolved (`end`)
        self._called: Optional[set] = None  # the functions whose callers were asked (`end`)
        self._subclassed: Optional[set] = None  # the classes whose subclasses were looked for (`end`)
        self._overrides: Dict[Tuple[str, str], Tuple[bool, Tuple[Tuple[str, str], ...]]] = {}
        # path -> (digest, the parse made for its summary, the tree index the summary's model
        # built of it): the engine's model of that module takes both (`take_parsed`,
        # `handed_index`), neither parsing nor walking the tree again
        self._kept: Dict[str, Tuple[str, cst.Module, Optional[Index]]] = {}
        self._handed: Optional[Tuple[cst.Module, Index]] = None
        # `claim(path)`, asked before a module is parsed for its summary: True when this process
        # now analyses that module too (a pool's worker took its job, `engine/share.py`); its
        # parse is then kept until the engine takes it, whatever `MAX_KEPT_MODULES` says
        self.claim = claim
        self._owed: Set[str] = set()
        self._stats: Dict[str, Optional[Tuple[int, int]]] = {}
        self._tree: Optional[tuple] = None  # the tree's `snapshot` when `refresh` last looked
        self._offered: Dict[str, str] = {}  # path -> digest of the texts offered since `refresh`
        self.used: Dict[str, str] = {}  # path -> digest of every module whose summary was read

    # ------------------------------------------------------------------ sources and summaries
    def offer(self, path: str, text: str, module: Optional[cst.Module] = None) -> None:
        """The engine read (and parsed) `path`: its summary, when asked for, comes from these.
        A text other than the one the project knew (an editor's buffer, a rewrite's next pass)
        makes it forget what it derived from the old one (`_forget_texts`)."""
        path = os.path.abspath(path)
        digest = digest_of(text)
        known = self._sources.get(path)
        if known is not None and known.digest != digest:
            self._forget_texts({path})
        self._sources[path] = Source(text, digest, module)
        self._offered[path] = digest

    def begin(self) -> None:
        """Start recording the modules read for one file's analysis, the modules whose
        importers it asked, the files whose imports it resolved and the functions whose callers
        it asked (`end` returns them). A module changed on disk since it was read makes the
        project forget what it knew (the language server also calls `refresh`, which notices
        new files)."""
        self._touched = set()
        self._asked = set()
        self._read_imports = set()
        self._called = set()
        self._subclassed = set()
        del self._frames[:]  # (left over by an analysis cut short: `_close`)
        del self._text_log[:], self._import_log[:]
        changed = {p for p, key in self._stats.items() if _stat_key(p) != key}
        if changed:
            self._forget_texts(changed)

    def refresh(self) -> None:
        """Before an analysis in a long-lived process (the language server): the project as the
        files are now. When a Python file or a folder of the tree appeared or went since it
        last looked (the import graph's `snapshot`: a walk of the tree and a stat of each file,
        no read), it forgets what it knew, the probes of its layout included (a new module may
        resolve an import, or shadow what it resolved to). When only contents changed (a file's
        times, a module it read, a text offered for one analysis that is not the file's), it
        forgets what it derived from those texts (`_forget_texts`), and keeps the rest: the
        summaries of the modules nobody edited are not read again after every save."""
        shape, stats = ImportGraph(Path(self.root), layout=self.layout).snapshot()
        if self._tree is None or shape != self._tree[0] or stats.keys() != self._tree[1].keys():
            self._forget(layout=True)
        else:
            changed = {f for f, st in stats.items() if self._tree[1][f] != st}
            changed.update(p for p, key in self._stats.items() if _stat_key(p) != key)
            changed.update(p for p, digest in self._offered.items()
                           if p not in changed and getattr(_read(p), "digest", None) != digest)
            if changed:
                self._forget_texts(changed)
        self._offered.clear()  # (another file's analysis reads this one as it is on disk)
        self._tree = (shape, stats)

    def _forget(self, layout: bool = False) -> None:
        if layout:
            clear_caches()
            self.layout = Layout(Path(self.root))
        for memo in (self._sources, self._summaries, self._modules, self._members, self._resolved, self._bases,
                     self._callers, self._bound, self._uses_memo, self._used, self._names_for, self._reached,
                     self._text_mros, self._lacks_methods, self._imports_at, self._stats, self._indexes, self._spans, self._relevant,
                     self._closures, self._words, self._words_of_modules, self._words_of_texts, self._deps_pool, self._offered,
                     self._reexports, self._masks, self._import_pieces, self._import_words_memo, self._overrides,
                     self._exports):
            memo.clear()
        self.graph = ImportGraph(Path(self.root), self._quiet_text, self.layout)

    def _forget_texts(self, changed: Set[str]) -> None:
        """Forget what was derived from the texts of the modules `changed` (their contents
        changed; the files and folders of the tree are the same): what is kept per module for
        them, every memoised answer whose computation read one of their texts or resolved their
        imports (the dependencies each answer keeps, `_Memo`), the callers of every function (a
        changed module may call one now), the subclasses looked for (one may define one now) and
        the import graph (their import lines). The summaries and answers that read only other
        modules stay."""
        for per_module in (self._sources, self._summaries, self._modules, self._indexes, self._spans, self._bound, self._uses_memo,
                           self._imports_at, self._stats, self._kept, self.used, self._import_pieces):
            for p in changed:
                per_module.pop(p, None)
        for key in [k for k in self._relevant if k[0] in changed]:
            del self._relevant[key]
        for parts in self._words.values():
            for key in [k for k in parts if _part_path(k) in changed]:
                del parts[key]
        for memo_of_paths in (*self._words_of_modules.values(), *self._words_of_texts.values(),
                              *self._import_words_memo.values()):
            for p in changed:
                memo_of_paths.pop(p, None)
        for memo in (self._members, self._resolved, self._bases, self._used, self._names_for, self._reached,
                     self._text_mros, self._lacks_methods, self._closures, self._reexports, self._exports):
            stale = [k for k in memo if k not in memo.deps or _reads(memo.deps[k], changed)]
            for key in stale:
                del memo[key]
                memo.deps.pop(key, None)
        self._callers.clear()
        self._overrides.clear()
        self.graph = ImportGraph(Path(self.root), self._quiet_text, self.layout)

    def close(self) -> None:
        """The run is over: forget what the project knew, the parses it keeps included. They
        are freed now, by reference counting; else with the project, which its modules' lazy
        summaries (closures over it) keep in reference cycles, by the garbage collector at the
        process's exit (about 1 s after a -j 1 check of timm)."""
        self._forget()
        self._kept.clear()
        self._handed = None
        self._owed.clear()

    def end(self) -> Tuple[List[str], Dict[str, str]]:
        """What the analysis since `begin` depended on: the modules whose texts it read, and
        the answers of the import graph it used, each a key of `graph.py` -> its digest (a new
        file changes the result as much as a changed text): for each module whose importers it
        asked, that set (`importers_dep`); for each file whose imports it resolved, what they
        resolve to (`imports_dep`); for each function whose callers it asked, the files the
        text scan selects (`callers_dep`); for each class whose subclasses it looked for, the
        same (`subclasses_dep`)."""
        touched, self._touched = self._touched or set(), None
        asked, self._asked = self._asked or set(), None
        read, self._read_imports = self._read_imports or set(), None
        called, self._called = self._called or set(), None
        subclassed, self._subclassed = self._subclassed or set(), None
        deps = {importers_dep(p): digest_of_paths(self.graph.importers_of(p)) for p in sorted(asked)}
        deps.update((imports_dep(p), self.graph.imports_digest(p)) for p in sorted(read))
        deps.update((callers_dep(p, q), self.graph.callers_digest(p, q)) for p, q in sorted(called))
        deps.update((subclasses_dep(p, n), self.graph.subclasses_digest(p, n)) for p, n in sorted(subclassed))
        return sorted(touched), deps

    def _resolving(self, path: str) -> None:
        """The analysis resolves names the file at `path` imports: what its import lines
        resolve to is a dependency of the result (`end`)."""
        if (self._read_imports is not None or self._frames) and self.layout.contains(path):
            if self._read_imports is not None:
                self._read_imports.add(path)
            if self._frames:
                self._import_log.append(path)

    def _touch(self, path: str) -> None:
        """The analysis read the text of the module at `path` (a dependency of the result)."""
        if self._touched is not None:
            self._touched.add(path)
        if self._frames:
            self._text_log.append(path)

    # A memoised answer depends on what computing it read: the memos that a question of
    # another module is answered from (`_Memo`) keep that with each answer, and a later file's
    # analysis that reuses the answer replays it into its own dependencies, as if it had
    # computed it (`_replay`); else the file's cached result would not notice that a module it
    # depends on through the answer changed. The memos of one module's own text (`index`,
    # `_def_spans`, ...) record that module on a hit. (The questions of the import graph,
    # `importers_of` and `callers`, are recorded on every call: no memoised answer asks them.)
    # (Two logs and the positions where each computation's part starts, rather than a set per
    # computation: an answer around another reads what that one read, with no copy, and what is
    # kept is a tuple of strings, which the garbage collector leaves alone.)
    def _open(self) -> int:
        """Start recording what computing a memoised answer reads (`_close` ends it)."""
        self._frames.append((len(self._text_log), len(self._import_log)))
        return len(self._frames) - 1

    def _close(self, frame: int) -> Optional[Deps]:
        """What was read since `_open` returned `frame` (None: nothing); the answer being
        computed around it (if any) read it too: it stays in the logs. A computation left
        open above it (cut short by a RecursionError) ends with it."""
        texts_at, imports_at = self._frames[frame]
        del self._frames[frame:]
        texts, imports = self._text_log[texts_at:], self._import_log[imports_at:]
        if not self._frames:
            del self._text_log[:], self._import_log[:]
        if not texts and not imports:
            return None
        deps = (tuple(sorted(set(texts))), tuple(sorted(set(imports))))
        return self._deps_pool.setdefault(deps, deps)  # many answers read the same modules: kept once

    def _replay(self, deps: Deps) -> None:
        """A memoised answer is reused: what computing it read is a dependency all the same."""
        texts, imports = deps
        if self._touched is not None:
            self._touched.update(texts)
        if self._read_imports is not None:
            self._read_imports.update(imports)
        if self._frames:
            self._text_log.extend(texts)
            self._import_log.extend(imports)

    def _memoised(self, memo: "_Memo[K, V]", key: K, compute: Callable[[], V], placeholder: object = _UNSET) -> V:
        """`memo[key]`, computed by `compute` the first time with what computing it read kept
        beside it (`_open`, `_close`), and replayed into the current file's dependencies on a
        hit. `placeholder`: what the key holds while it is computed (what a cycle back to it
        reads)."""
        if key in memo:
            deps = memo.deps.get(key)
            if deps is not None:
                self._replay(deps)
            return memo[key]
        if placeholder is not _UNSET:
            memo[key] = placeholder  # type: ignore[assignment]
        frame = self._open()
        try:
            found = memo[key] = compute()
        except BaseException:  # cut short (a RecursionError deep in a query): no answer to keep
            memo.pop(key, None)
            self._close(frame)
            raise
        memo.deps[key] = self._close(frame)
        return found

    def summary(self, path: str) -> Optional[ModuleSummary]:
        """The summary of the module at `path` (None: unreadable or unparsable)."""
        path = os.path.abspath(path)
        self._touch(path)
        if path in self._summaries:
            return self._summaries[path]
        self._summaries[path] = None  # an import cycle reads this as unknown
        try:
            return self._summary(path)
        except BaseException:  # cut short: the placeholder is no answer for the files that follow
            if self._summaries.get(path, 0) is None:
                del self._summaries[path]
            raise

    def _summary(self, path: str) -> Optional[ModuleSummary]:
        source = self._sources.get(path) or _read(path)
        if source is None:
            return None
        self._sources.setdefault(path, source)
        if source.module is None:
            self._stats[path] = _stat_key(path)
        summary = None
        stored = False
        if self.store is not None:
            kept = self.store.get(path, source.digest)
            if kept is not None:
                stored = kept is UNREADABLE
                summary = None if stored else kept
                self.from_store += 1
        if summary is None and not stored:
            if source.module is None and self._over_memory(source.text):
                return None  # unknown, and not kept: a larger bound may read it
            from ampfix.engine.guard import fresh_call

            # on a fresh stack: a summary asked deep in a query must not meet a RecursionError
            # that a shallower caller would not (the store keeps the outcome by content)
            summary = fresh_call(self._summarize, path, source)
            if self.store is not None:  # a module that cannot be summarised is kept as such too
                self.store.put(path, source.digest, summary)
        self._summaries[path] = summary
        if summary is not None:
            self.used[path] = source.digest
        return summary

    def _over_memory(self, text: str) -> bool:
        """Parsing `text` would take more than `max_memory` (ampfix/engine/budget.py), as the
        engine bounds the files it analyses."""
        if not self.max_memory:
            return False
        from ampfix.engine import budget

        if len(text) * (budget.BYTES_PER_TOKEN + budget.BYTES_PER_BYTE) <= self.max_memory:
            return False  # cannot be over: at most one token per character
        return budget.estimate(text) > self.max_memory

    def _summarize(self, path: str, source: Source) -> Optional[ModuleSummary]:
        from ampfix.model import AmpModel
        from ampfix.model.summarize import summarize

        module = source.module
        if module is None:
            owed = self.claim is not None and self.claim(path)
            module = self._parse(source.text, path)
            if module is None:
                return None
            self.parsed.append(path)
            self._kept[path] = (source.digest, module, None)  # the engine may analyse it next: no second parse
            if owed:
                self._owed.add(path)
            while len(self._kept) > MAX_KEPT_MODULES:
                victim = next((p for p in self._kept if p not in self._owed), None)
                if victim is None:
                    break
                del self._kept[victim]
        try:
            model = AmpModel(module, foreign=NO_FACTS, path=path)
            kept = self._kept.get(path)
            if kept is not None and kept[1] is module:
                self._kept[path] = (kept[0], module, model._index)
            model.source_text = source.text  # type: ignore[attr-defined]  # positions per statement, no full pass
            return summarize(model, source.digest, source.text)
        except (RecursionError, MemoryError, ValueError, KeyError, AttributeError, TypeError) as e:
            self.unsummarised.append((path, type(e).__name__))
            return None  # a module the model cannot read costs only its own facts

    def unreadable(self, path: str, text: str) -> None:
        """The engine could not parse `path`: its summary is unknown (kept so, for this content)."""
        path = os.path.abspath(path)
        self._summaries[path] = None
        if self.store is not None:
            self.store.put(path, digest_of(text), None)

    def take_parsed(self, path: str, text: str) -> Optional[cst.Module]:
        """The parse this project made of `path` for its summary, when the text is the same (the
        engine analysing that module then does not parse it again)."""
        path = os.path.abspath(path)
        self._owed.discard(path)
        kept = self._kept.pop(path, None)
        if kept is not None and kept[0] == digest_of(text):
            self._handed = (kept[1], kept[2]) if kept[2] is not None else None
            return kept[1]
        return None

    def handed_index(self, module: cst.Module) -> Optional[Index]:
        """The tree index of `module` when `take_parsed` just handed it over (once)."""
        handed, self._handed = self._handed, None
        return handed[1] if handed is not None and handed[0] is module else None

    def module(self, path: str) -> Optional[ForeignModule]:
        """The module at `path` (its summary read lazily; None: unreadable)."""
        path = os.path.abspath(path)
        cached = self._modules.get(path)
        if cached is None:
            if self.index(path) is None:
                return None
            cached = self._modules[path] = ForeignModule(path, lambda: self._summary_for_facts(path))
        else:
            self._touch(path)  # its text, as `index` read it (and its summary, read once)
        return cached

    def _summary_for_facts(self, path: str) -> ModuleSummary:
        """The summary a question about the module's contents reads: an empty one for a module
        whose text holds nothing AMP code is made of (no parse), else the real one."""
        text = self.text(path)
        if text is None:
            return ModuleSummary(path=path, digest="")
        if not AMP_TEXT.search(text):
            return light_summary(path, text, self.index(path))
        return self.summary(path) or ModuleSummary(path=path, digest="")

    def relevant(self, d: Definition) -> bool:
        """The code of `d` holds something AMP code is made of (`summarize.AMP_TEXT`): only then
        do its effects, returns or attributes need its module's summary."""
        return self._relevant_by(d, AMP_TEXT)

    def relevant_to_traces(self, d: Definition) -> bool:
        """The code of `d` holds something a training step's events are made of
        (`summarize.TRACE_TEXT`: not only checkpoint or configuration words): only then does a
        trace inline its effects."""
        return self._relevant_by(d, TRACE_TEXT)

    def _relevant_by(self, d: Definition, vocabulary: "re.Pattern[str]") -> bool:
        qual = d.qual if isinstance(d, (ForeignFunction, ForeignClass)) else None
        key = (d.path, qual, vocabulary.pattern)
        hit = self._relevant.get(key)
        if hit is None:
            hit = self._relevant[key] = self._relevant_text(d, vocabulary)
        else:
            self._touch(d.path)  # the answer depends on that module's text (the result's deps)
        return hit

    def _relevant_text(self, d: Definition, vocabulary: "re.Pattern[str]") -> bool:
        text = self.text(d.path) if d.path.endswith(".py") else None
        if text is None:
            return False
        qual = d.qual if isinstance(d, (ForeignFunction, ForeignClass)) else None
        span = self._def_spans(d.path).get(qual) if qual is not None else None
        if span is None:  # a module, or a definition the scan did not find: judge by the module
            return _in_code(vocabulary, text, 0, len(text))
        return _in_code(vocabulary, text, span[0], span[1])

    def index(self, path: str) -> Optional["ModuleIndex"]:
        """What the module binds at its top level, read from its text (no parse)."""
        path = os.path.abspath(path)
        cached = self._indexes.get(path)
        if cached is None:
            text = self.text(path)
            if text is None:
                return None
            cached = self._indexes[path] = module_index(text)
        else:
            self._touch(path)
        return cached

    # ------------------------------------------------------------------ resolution
    def resolve(self, importer: str, qualified: str) -> Optional[Definition]:
        key = (os.path.abspath(importer), qualified)
        self._resolving(key[0])
        return self._memoised(self._resolved, key, lambda: self._resolve(key[0], qualified, 0), placeholder=None)

    def _resolve(self, importer: str, qualified: str, depth: int, text_only: bool = False) -> Optional[Definition]:
        """`resolve` without its memo; `text_only`: a class's attributes are its methods found in
        the text (`_text_attribute`), no summary is read."""
        if depth > MAX_RESOLVE_DEPTH or not self.layout.contains(importer):
            return None
        self._resolving(importer)  # a re-export or star import of another module, on the first resolution
        level = len(qualified) - len(qualified.lstrip("."))
        parts = [p for p in qualified[level:].split(".") if p]
        dots = "." * level
        found = self._longest_target(importer, dots, parts)  # then attributes
        if found is not None:
            target, k = found
            d = self._target(target, depth)
            for name in parts[k:]:
                d = self._text_attribute(d, name) if text_only else self._attribute(d, name, depth + 1)
            return d
        if not parts and level:
            target = self.layout.resolve(importer, dots)
            return self._target(target, depth) if target is not None else None
        return None

    def library_name(self, importer: str, qualified: str) -> Optional[str]:
        """What `qualified` (an import binding of `importer`, then attributes: `..compat.torch`,
        `pkg.compat.torch.cuda`) stands for when it names a library's top-level module that one of
        the project's modules binds only by importing it (thinc's `compat.py`: `import torch` in a
        `try`, `torch = None` in its `except`): that library name (`torch`, `torch.cuda`), through
        re-exports of the project's own. None when it is the project's own definition, unknown,
        bound by imports of different things or otherwise, a library's function or class rather
        than a module, or not one of the project's modules at all."""
        importer = os.path.abspath(importer)
        for _ in range(MAX_RESOLVE_DEPTH):
            if not self.layout.contains(importer):
                return None
            self._resolving(importer)
            level = len(qualified) - len(qualified.lstrip("."))
            parts = [p for p in qualified[level:].split(".") if p]
            longest = self._longest_target(importer, "." * level, parts)
            if longest is None:
                return None
            target, k = longest
            if target.attr is not None:
                path, name, rest = target.path, target.attr, parts[k:]
            elif target.path.endswith(".py") and k < len(parts):
                path, name, rest = target.path, parts[k], parts[k + 1:]
            else:
                return None
            index = self.index(path)
            if index is not None and name not in index.names:
                star = self._exporting_star(path, name)  # `from .utils import *` binds it there
                if star is None:
                    return None
                importer, qualified = path, _star_member(star, name) + "".join(f".{r}" for r in rest)
                continue
            if index is None or index.names.get(name) != "import" or len(set(index.imports.get(name, ()))) != 1:
                return None
            imported = index.imports[name][0]
            if imported.startswith(".") or self.layout.resolve(path, imported.split(".")[0]) is not None:
                importer, qualified = path, imported + "".join(f".{r}" for r in rest)  # the project's own: follow it
                continue
            # a library's top-level module (`import torch`, `import torch.utils.dlpack`) or one of the
            # library modules ampfix knows (`from apex import amp`): the name a use spells is the
            # library's. (A library's function or class re-exported, `from torch.cuda.amp import
            # autocast`, is its import's to report, in that module.)
            if "." not in imported or imported in LIBRARY_MODULES:
                return imported + "".join(f".{r}" for r in rest)
            return None
        return None

    # ------------------------------------------------------------------ star imports
    def star_names(self, importer: str, module: str) -> Optional[FrozenSet[str]]:
        """The names `from <module> import *`, written in the file `importer`, binds there when
        `module` is one of the project's (`module` as written: `.utils`, `pkg.utils`): those its
        `__all__` lists when it is a literal list or tuple of strings, else every name it binds
        at its top level (`module_index`: definitions, assignments, imports) that does not start
        with `_`, with those of its own star imports of the project's modules after the last of
        a library (a chain, to a bounded depth; a module met again on the way adds nothing; the
        names it binds itself come first, as `_lookup` reads them). None: not known (a module
        that is not the project's, a namespace package, an `__all__` computed). Memoised."""
        importer = os.path.abspath(importer)
        self._resolving(importer)
        path = self._star_target(importer, module)
        if path is None:
            return None
        return self._memoised(self._exports, path, lambda: self._star_names(path, (path,)), placeholder=None)

    def _star_names(self, path: str, chain: Tuple[str, ...]) -> Optional[FrozenSet[str]]:
        text, index = self.text(path), self.index(path)
        if text is None or index is None:
            return None
        listed = dunder_all(text)
        if listed is not _NO_ALL:
            return listed  # type: ignore[return-value]
        starred: Set[str] = set()
        for star in index.stars if len(chain) < MAX_RESOLVE_DEPTH else ():
            target = self._star_target(path, star)
            if target is None:
                starred.clear()  # not the project's: its names are not known, and may be any of those before
            elif target not in chain:  # (a cycle adds nothing)
                starred.update(self._star_names(target, chain + (target,)) or ())
        return frozenset(starred.union(n for n in index.names if not n.startswith("_")))

    def _star_target(self, importer: str, module: str) -> Optional[str]:
        """The file of the project's module `from <module> import *` in `importer` reads; None:
        not a module file of the project."""
        if not self.layout.contains(importer):
            return None
        target = self.layout.resolve(importer, module)
        if target is None or target.attr is not None or not target.path.endswith(".py"):
            return None
        return target.path

    def _exporting_star(self, path: str, name: str) -> Optional[str]:
        """The module (as written) of the last star import of the module at `path` whose
        names hold `name` (`star_names`); None when none does, or a later star import's
        names are not known (it may bind `name` too)."""
        index = self.index(path)
        for star in reversed(index.stars if index is not None else ()):
            names = self.star_names(path, star)
            if names is None:
                return None
            if name in names:
                return star
        return None

    def _longest_target(self, importer: str, dots: str, parts: List[str]) -> Optional[Tuple[Target, int]]:
        """The longest prefix of `parts` (after the relative import's `dots`) that names a module
        of the project or a name bound in one, as an import in `importer` reads it
        (`_package_attribute`), and its length; None when no prefix does."""
        for k in range(len(parts), 0, -1) if parts else [0]:
            target = self.layout.resolve(importer, dots + ".".join(parts[:k]))
            if target is not None:
                return self._package_attribute(importer, dots, parts[:k], target), k
        return None

    def _package_attribute(self, importer: str, dots: str, parts: List[str], target: Target) -> Target:
        """`pkg.name` (or `.name`) that the layout found as the submodule or folder `pkg/name`:
        what `pkg/__init__.py` binds to `name` when it binds it otherwise, as Python reads the
        package's attribute before it looks for a submodule (`from .name import name` in the
        package, `from pkg import name` in the file: the function, not the module)."""
        if target.attr is not None or not parts or (not dots and len(parts) < 2):
            return target
        parent = self.layout.resolve(importer, dots + ".".join(parts[:-1]))
        if parent is None or parent.attr is not None or not parent.path.endswith("__init__.py"):
            return target
        index = self.index(parent.path)
        name = parts[-1]
        if index is None or name not in index.names:
            return target
        if any(self.layout.resolve(parent.path, q) == target for q in index.imports.get(name, ())):
            return target  # `from . import name`: the package binds the submodule itself
        return Target(parent.path, attr=name)

    def _target(self, target: Target, depth: int) -> Optional[Definition]:
        if not target.path:  # a namespace package: a folder, no file
            folder = target.folder
            cached = self._modules.get(folder)
            if cached is None:
                cached = self._modules[folder] = ForeignModule(folder, lambda: ModuleSummary(path=folder, digest=""))
            return cached
        module = self.module(target.path)
        if module is None:
            return None
        if target.attr is None:
            return module
        return self._member(module, target.attr, depth + 1)

    def _attribute(self, d: Optional[Definition], name: str, depth: int) -> Optional[Definition]:
        if isinstance(d, ForeignModule):
            return self._member(d, name, depth)
        if isinstance(d, ForeignClass):
            if name in d.summary.methods:
                return ForeignFunction(d.module, f"{d.qual}.{name}", d)
            inner = d.summary.attributes.get(name)
            if inner:
                return ForeignConstant(d.module, f"{d.qual}.{name}", tuple(inner))
        return None

    def member(self, module: ForeignModule, name: str) -> Optional[Definition]:
        return self._member(module, name, 0)

    def _member(self, module: ForeignModule, name: str, depth: int) -> Optional[Definition]:
        key = (module.path, name)
        if key not in self._members and (key in self._active or depth > MAX_RESOLVE_DEPTH):
            return None  # a cycle of re-exports

        def lookup() -> Optional[Definition]:
            self._active.append(key)
            try:
                return self._lookup(module, name, depth)
            finally:
                self._active.pop()

        return self._memoised(self._members, key, lookup)

    def _lookup(self, module: ForeignModule, name: str, depth: int) -> Optional[Definition]:
        index = self.index(module.path) if module.path.endswith(".py") else None
        kind = index.names.get(name) if index is not None else None
        if kind == "class":
            return ForeignClass(module, name)
        if kind == "function":
            return ForeignFunction(module, name)
        if kind == "import" and index is not None:
            return self._resolve(module.path, index.imports[name][-1], depth + 1)
        if kind == "constant":
            return ForeignConstant(module, name)
        if module.path.endswith("__init__.py") or not module.path.endswith(".py"):
            sub = self.layout.submodule(Target(module.path if module.path.endswith(".py") else "",
                                               folder="" if module.path.endswith(".py") else module.path), name)
            if sub is not None:
                return self._target(sub, depth + 1)
        for star in reversed(index.stars) if index is not None else ():  # (the last one binds it)
            d = self._resolve(module.path, star, depth + 1)
            if isinstance(d, ForeignModule):
                found = self._member(d, name, depth + 1)
                if found is not None:
                    return found
        return None

    def canonical_definition(self, module: ForeignModule, text: str) -> Union[Definition, str, None]:
        """What a canonical expression of `module`'s summary names: a definition of the
        project, a library's qualified name (kept as a string), or None."""
        m = _IMPORTED_RE.match(text)
        if m is not None:
            d = self.resolve(module.path, m.group(1))
            for name in [p for p in m.group(2).split(".") if p]:
                d = self._attribute(d, name, 1)
            return d
        m = _LOCAL_RE.match(text)
        if m is not None:
            names = [p for p in m.group(1).split(".") if p]
            d = self.member(module, names[0])
            for name in names[1:]:
                d = self._attribute(d, name, 1)
            return d
        if _DOTTED_RE.match(text) and not text.startswith("__"):
            return text
        return None

    def bases(self, cls: ForeignClass) -> List[Union[Definition, str, None]]:
        def resolved() -> List[Union[Definition, str, None]]:
            module = self.module(cls.path)
            return [self.canonical_definition(module, b.text) if module is not None else None
                    for b in cls.summary.bases]

        return self._memoised(self._bases, cls.key, resolved)

    # ------------------------------------------------------------------ related modules
    def text(self, path: str) -> Optional[str]:
        """The text of the module at `path` (a dependency of the result being analysed)."""
        path = os.path.abspath(path)
        self._touch(path)
        return self._quiet_text(path)

    def _quiet_text(self, path: str) -> Optional[str]:
        """`text` without recording it: the import graph reads every file's import lines, and
        the result depends on what it answers (`importers_of`), not on each text it read."""
        source = self._sources.get(path) or _read(path)
        if source is None:
            return None
        self._sources.setdefault(path, source)
        return source.text

    def imports_of(self, path: str) -> List[str]:
        """The project modules the file at `path` imports, with the modules a package it
        imports re-exports (`ImportGraph.imports_of`); the packages whose re-exports were read
        are dependencies of the result."""
        path = os.path.abspath(path)
        self._resolving(path)
        for target in self.graph.direct_imports(path):
            if target.endswith("__init__.py") and target != path:
                self._touch(target)
                self._resolving(target)  # its re-exports are followed
        return self.graph.imports_of(path)

    def importers_of(self, path: str) -> List[str]:
        """The project's files that import the module at `path` (`ImportGraph.importers_of`);
        the set is a dependency of the result (`end`)."""
        path = os.path.abspath(path)
        if self._asked is not None:
            self._asked.add(path)
        return self.graph.importers_of(path)

    def related_text(self, path: str) -> str:
        """The text of the modules `path` imports and of those that import it: where the rest
        of a training step spread over modules is written (for the rules' project triggers)."""
        return "\n".join(self.text(f) or "" for f in self._related(os.path.abspath(path)))

    def _related(self, path: str) -> List[str]:
        """The modules `path` imports, those defining a name it imports from a module that
        re-exports it (`_reexported`), then those importing it (`related_text`'s)."""
        imported = self.imports_of(path)
        more = [m for m in self._reexported(path) if m not in imported]
        return [*imported, *more, *self.importers_of(path)]

    def _reexported(self, path: str) -> List[str]:
        """The modules that define what `path` imports by name from a module binding that name
        by an import of its own (`from pkg.api import step`, where `pkg/api.py` has `from
        pkg.engine import step`): the import graph follows a package's `__init__.py` one level,
        not a plain module's re-export, and the step's code is where the name leads. Memoised."""
        return self._memoised(self._reexports, path, lambda: self._reexports_of(path))

    def _reexports_of(self, path: str) -> List[str]:
        out: List[str] = []
        for qualified, target in self.graph.resolutions(path):
            if target is None or not target.path or target.attr is None:
                continue
            index = self.index(target.path)
            if index is None or index.names.get(target.attr) != "import":
                continue
            d = self._use(path, qualified)
            if d is not None and d.path and d.path not in (path, target.path) and d.path not in out:
                out.append(d.path)
        return out

    def reach_text(self, path: str) -> str:
        """The code of the related modules (`related_text`) that can take part in the file's
        training step: the definitions of other modules the file uses (functions, classes with
        their bases, what they call, a few levels deep) and the code of the modules importing
        it that uses its names; each part followed by what the top-level imports of its module
        binding a name it mentions name (`_import_pieces_of`: module, name and alias, a line
        each; `_held_by` reads them through `_with_imports`). Read from the texts, no parse:
        the rules' project triggers test it, so a file that only imports a package whose other
        modules train is not analysed for the rest of them. Never more than `related_text` (a
        narrowing of it), but for the lines of the imports' pieces."""
        out = []
        for key in self._reach_parts(os.path.abspath(path)):
            out.append(self._key_code(key))
            if _reads_imports(key):
                code, where = out[-1], _part_path(key)
                out.extend("\n".join(pieces) for name, pieces in self._import_pieces_of(where).items()
                           if _mentions(code, name) and self._imported_in_code(where, name))
        return "\n".join(out)

    def reach_held(self, path: str, words: Tuple[str, ...], lower_words: Tuple[str, ...]
                   ) -> Optional[Tuple[set, set]]:
        """The strings of `words` that `reach_text(path)` holds as the triggers read it
        (`trigger_view`), and of `lower_words` its lower-cased text holds: read part by part,
        each part's answer memoised (a definition many files use is read once). None when the
        file reaches nothing."""
        parts = self._reach_parts(os.path.abspath(path))
        return self._held_by(parts, words, lower_words) if parts else None

    def _held_by(self, keys, words: Tuple[str, ...], lower_words: Tuple[str, ...]) -> Tuple[set, set]:
        memo = self._words.setdefault((words, lower_words), {})
        found: set = set()
        found_lower: set = set()
        for key in keys:
            hit = memo.get(key)
            if hit is None:
                bound = self._text_words(_part_path(key), words, lower_words)
                if bound is None:
                    hit = _words_in(self._key_code(key), words, lower_words, view=lambda: self._key_view(key))
                elif not (bound[0] or bound[1]):  # only the strings the module's text holds can be in the part
                    hit = (frozenset(), frozenset())
                else:
                    held = tuple(w for w in words if w in bound[0])
                    held_lower = tuple(w for w in lower_words if w in bound[1])
                    hit = _words_in(self._key_code(key), held, held_lower, (words, lower_words) if bound[2] else None,
                                    view=lambda: self._key_view(key))
                if (bound is None or bound[0] or bound[1]) and _reads_imports(key):
                    hit = self._with_imports(key, hit, words, lower_words)  # and the imports binding its names
                memo[key] = hit
            else:  # a dependency of this file's result all the same
                self._touch(key if isinstance(key, str) else key[0])
            found |= hit[0]
            found_lower |= hit[1]
        return found, found_lower

    def _text_words(self, path: str, words: Tuple[str, ...], lower_words: Tuple[str, ...]
                    ) -> Optional[Tuple[frozenset, frozenset, bool]]:
        """The strings of `words` (of `lower_words`, lower-cased) that the whole text of the
        module at `path` holds: no part of its text (`_key_code`) holds others, when no string
        holds a line break (a part is the text, a span of it, or pieces of it that end at line
        breaks; the reasons are `_module_words`'s). The third element: the trigger view of a
        part may hold others (the text has `_autocast`, or both `enabled` and `autocast(`: what
        `_AUTOCAST_QUERY` and `_AUTOCAST_OFF` remove, which can join what was apart; a mask
        makes no letter), so the view is read for all of `words`. None when a string holds a
        line break. Memoised."""
        memo = self._words_of_texts.setdefault((words, lower_words), {})
        if path in memo:
            self._touch(path)  # a dependency of this file's result all the same
            return memo[path]
        text = self.text(path)
        hit = None
        if text is not None and _plain_words(words, lower_words):
            held, held_lower = _held(text, words, lower_words)
            hit = (held, held_lower, "_autocast" in text or ("enabled" in text and "autocast(" in text))
        memo[path] = hit
        return hit

    def _reach_parts(self, path: str) -> List[Union[str, Tuple[str, Optional[str]], Tuple[str, int, int]]]:
        """The parts of the code `reach_text` reads, as keys of `_key_code`: a definition
        (path, qualified name; None for a module's top-level code), a whole module (its path),
        the span of an importer's code (path, start, end)."""
        related = set(self._related(path)) - {path}
        if not related:
            return []
        parts: List[Union[str, Tuple[str, Optional[str]], Tuple[str, int, int]]] = []
        seen: set = set()
        todo: List[Tuple[Optional[Definition], int]] = [(self._use(path, q), 0) for q in self._uses_of(path)]
        at = 0
        while at < len(todo):  # breadth first: each definition at its shallowest
            d, depth = todo[at]
            at += 1
            if len(parts) >= MAX_REACH_PARTS:  # too much to follow: all of the related modules
                return self._related(path)
            if d is None or d.path not in related:
                continue
            qual = d.qual if isinstance(d, (ForeignFunction, ForeignClass)) else None
            if isinstance(d, ForeignModule) or (d.path, qual) in seen:
                continue
            seen.add((d.path, qual))
            module_text = self.text(d.path) or ""
            if qual is None:  # a constant: the module's own top-level code
                parts.append((d.path, None))
                continue
            span = self._def_spans(d.path).get(qual)
            if span is None:
                parts.append(d.path)  # not found by the scan: all of it
                continue
            parts.append((d.path, qual))
            if depth < MAX_REACH_DEPTH:
                code = module_text[span[0]:span[1]]
                todo.extend((found, depth + 1) for found in self._reached_from(d, qual, code, module_text))
        for importer in sorted(self.importers_of(path)):
            if importer == path:
                continue
            itext = self.text(importer) or ""
            names = self._names_bound_to(importer).get(path)
            if names:  # the code of the importer that uses what it imports from the file
                # (the names, then a look at the character before each: a look-behind written first
                # in the pattern makes the scan try it at every offset, six times slower)
                mention = re.compile(r"(?:%s)\b" % "|".join(map(re.escape, names)))
                spans = self._def_spans(importer)
                methods = sorted(s for q, s in spans.items() if "." in q)  # neither overlaps another
                tops = sorted(s for q, s in spans.items() if "." not in q)
                imports = self._import_spans(importer)
                added = set()
                for m in mention.finditer(itext):
                    if m.start() and _NAME_OR_DOT.match(itext, m.start() - 1):
                        continue  # part of a longer name, or an attribute (`x.name`): not the import's
                    if _containing(imports, m.start()) is not None:
                        continue  # the import itself
                    span = _containing(methods, m.start()) or _containing(tops, m.start())  # the innermost
                    if span is None:  # module-level code uses it: all of that module
                        parts.append(importer)
                        break
                    if span not in added:
                        added.add(span)
                        parts.append((importer, span[0], span[1]))
        return parts

    def reach_bound(self, path: str, words: Tuple[str, ...], lower_words: Tuple[str, ...]) -> Tuple[set, set]:
        """A bound of `reach_text(path)` as the triggers read it, cheaper than `reach_words`:
        the strings of `words` (and of `lower_words`, lower-cased) that some part of a related
        module may hold (`_module_words`), over every related module (`_related`: all the
        parts of `reach_text` lie in them). Never fewer than `reach_held` holds; one memoised
        answer per module, so most files of a tree cost a union of a few sets. Each related
        module's text is a dependency of the result."""
        found: set = set()
        found_lower: set = set()
        for f in self._related(os.path.abspath(path)):
            held, held_lower = self._module_words(f, words, lower_words)
            found |= held
            found_lower |= held_lower
        return found, found_lower

    def _module_words(self, path: str, words: Tuple[str, ...], lower_words: Tuple[str, ...]
                      ) -> Tuple[frozenset, frozenset]:
        """The strings of `words` (of `lower_words`, lower-cased) that the code of any key of
        `_key_code` in the module at `path` holds as `_held_by` reads it: all of the module,
        its top-level code, each of its definitions (an importer's span is one of them; a
        definition with what its imports name, `_with_imports`).
        Where the trigger view only masks (no `_autocast`, not both `enabled` and `autocast(`:
        comments, docstrings and `_AUTOCAST_VALUE`'s names become `MASK`, which no string holds)
        and no string holds a line break, the strings the module's whole text holds (a bound:
        a part may hold fewer): the code of a key is its text, or pieces of it that end at line
        breaks, and a mask splits what it replaces from its neighbours, so neither makes a
        string that the text does not hold (and lower-casing an ASCII string's characters does
        not depend on their neighbours). Else each key is read as `_held_by` reads it. Memoised."""
        memo = self._words_of_modules.setdefault((words, lower_words), {})
        hit = memo.get(path)
        if hit is not None:
            self._touch(path)  # a dependency of this file's result all the same
            return hit
        text = self.text(path)
        bound = self._text_words(path, words, lower_words) if text is not None else None
        if text is None:
            hit = (frozenset(), frozenset())
        elif bound is not None and not bound[2]:
            hit = (bound[0], bound[1])
        else:
            keys = [path, (path, None), *((path, qual) for qual in self._def_spans(path))]
            held, held_lower = self._held_by(keys, words, lower_words)
            hit = (frozenset(held), frozenset(held_lower))
        memo[path] = hit
        return hit

    def reach_words(self, path: str, words: Tuple[str, ...], lower_words: Tuple[str, ...]
                    ) -> Optional[Tuple[set, set]]:
        """A cheap bound of `reach_text(path)` as the triggers read it (`trigger_view`): the
        strings of `words` it may hold, and of `lower_words` its lower-cased text may hold
        (never fewer than it holds); None when not sure (then read `reach_held`). It follows what the file uses as `reach_text` does, but
        through every module rather than the related ones only, and counts all of an importer's
        text: the reach of each definition is memoised once per process (`_closure`), so the
        150-odd files of a tree that pass a rule's own project test but whose reach holds none
        of the rest cost a few set unions each instead of a walk of the definitions."""
        path = os.path.abspath(path)
        related = set(self._related(path)) - {path}
        if not related:
            return set(), set()
        keys: set = set()
        for q in self._uses_of(path):
            d = self._use(path, q)
            if d is None or d.path not in related or isinstance(d, ForeignModule):
                continue
            reached = self._closure(d, MAX_REACH_DEPTH)
            if reached is None:
                return None
            keys |= reached
            if len(keys) >= MAX_REACH_PARTS:
                return None  # `reach_text` reads all of the related modules then
        return self._held_by([*keys, *(p for p in self.importers_of(path) if p != path)], words, lower_words)

    def _key_code(self, key, masked: bool = False) -> str:
        """The code of a key of `_reach_parts` or `_closure`: a definition (path, qualified
        name), a module's top-level code (path, None), all of a module (its path), the span of
        an importer's code (path, start, end). `masked`: read from the module's text with its
        comments and triple-quoted strings masked (`_masked`, at the same offsets)."""
        where = _part_path(key)
        module_text = self.text(where) or ""
        if masked:
            memo = self._masks.get(where)
            if memo is None or memo[0] is not module_text:
                memo = self._masks[where] = (module_text, _masked(module_text))
            module_text = memo[1]
        if isinstance(key, str):
            return module_text
        if len(key) == 3:  # the span of an importer's code
            return module_text[key[1]:key[2]]  # type: ignore[misc]
        qual = key[1]
        if qual is None:
            return _top_level_code(module_text, self._def_spans(where))
        span = self._def_spans(where).get(qual)
        return module_text if span is None else module_text[span[0]:span[1]]

    def _key_view(self, key) -> str:
        """`trigger_view` of the code of `key`, with its module's text lexed once (`_masked`)."""
        return _view_of_masked(self._key_code(key, masked=True))

    def _closure(self, d: Definition, left: int) -> Optional[frozenset]:
        """The definitions `reach_text` may read from `d` with `left` levels to follow, through
        any module: (path, qualified name or None for a module's top-level code). None: more
        than `reach_text` follows. Memoised."""
        qual = d.qual if isinstance(d, (ForeignFunction, ForeignClass)) else None
        key = (d.path, qual)
        return self._memoised(self._closures, (key, left), lambda: self._closure_of(d, key, left))

    def _closure_of(self, d: Definition, key: Tuple[str, Optional[str]], left: int) -> Optional[frozenset]:
        """`_closure` without its memo."""
        out = {key}
        qual = key[1]
        if qual is not None and left > 0:
            module_text = self.text(d.path) or ""
            span = self._def_spans(d.path).get(qual)
            if span is not None:
                for found in self._reached_from(d, qual, module_text[span[0]:span[1]], module_text):
                    if found is None or isinstance(found, ForeignModule):
                        continue
                    inner = self._closure(found, left - 1)
                    if inner is None or len(out | inner) >= MAX_REACH_PARTS:
                        return None
                    out |= inner
        return frozenset(out)

    def _with_imports(self, key, hit: Tuple[frozenset, frozenset], words: Tuple[str, ...],
                      lower_words: Tuple[str, ...]) -> Tuple[frozenset, frozenset]:
        """`hit`, the strings of `words` (of `lower_words`) that a part's code holds, with those
        of what the top-level imports of its module name for each name the part mentions
        (`_import_pieces_of`: `ac()` is autocast's after `from torch.cuda.amp import autocast
        as ac`). Only the names whose pieces hold some of the strings are looked for."""
        holding = self._import_words(_part_path(key), words, lower_words)
        if not holding:
            return hit
        code = self._key_code(key)
        found, found_lower = set(hit[0]), set(hit[1])
        for name, held, held_lower in holding:
            if not (held <= found and held_lower <= found_lower) and _mentions(code, name):
                found |= held
                found_lower |= held_lower
        return frozenset(found), frozenset(found_lower)

    def _import_words(self, path: str, words: Tuple[str, ...], lower_words: Tuple[str, ...]
                      ) -> List[Tuple[str, frozenset, frozenset]]:
        """(bound name, the strings of `words` and of `lower_words` that its pieces hold as the
        triggers read them, `trigger_view`) for each name the module's top-level imports bind
        in its code whose pieces hold some. Memoised per module and strings."""
        memo = self._import_words_memo.setdefault((words, lower_words), {})
        hit = memo.get(path)
        if hit is not None:
            self._touch(path)
            return hit
        hit = []
        pieces_of = self._import_pieces_of(path)
        if any(_held("\n".join(p for pieces in pieces_of.values() for p in pieces), words, lower_words)):
            for name, pieces in pieces_of.items():
                held: set = set()
                held_lower: set = set()
                for piece in pieces:
                    found = _words_in(piece, words, lower_words)
                    held |= found[0]
                    held_lower |= found[1]
                if (held or held_lower) and self._imported_in_code(path, name):
                    hit.append((name, frozenset(held), frozenset(held_lower)))
        memo[path] = hit
        return hit

    def _import_pieces_of(self, path: str) -> Dict[str, Tuple[str, ...]]:
        """What the module's top-level imports (`ModuleIndex.imports`) name, by the name each
        binds: the module, the name imported from it and the name bound (`torch.cuda.amp`,
        `autocast`, `ac` for `from torch.cuda.amp import autocast as ac`), each a piece of the
        import's text, so no piece holds a string the module's text does not. Memoised."""
        hit = self._import_pieces.get(path)
        if hit is not None:
            self._touch(path)
            return hit
        index = self.index(path)
        hit = {}
        for name, qualifieds in (index.imports.items() if index is not None else ()):
            pieces: Dict[str, None] = {}
            for qualified in qualifieds:
                module, _, imported = qualified.rpartition(".")
                pieces.update(dict.fromkeys(p for p in (module, imported, name) if p))
            hit[name] = tuple(pieces)
        self._import_pieces[path] = hit
        return hit

    def _imported_in_code(self, path: str, name: str) -> bool:
        """Some top-level import of the module that binds `name` is code: not in a docstring
        (the module's masks, `_masked`; `module_imports` reads lines, not strings)."""
        index = self.index(path)
        masked = self._key_code(path, masked=True)
        for at in index.imported_at.get(name, ()) if index is not None else ():
            end = masked.find("\n", at)
            if "import" in masked[at:end if end >= 0 else len(masked)]:
                return True
        return False

    def _import_spans(self, path: str) -> List[Tuple[int, int]]:
        """Where the import statements of a module are written (sorted; memoised)."""
        cached = self._imports_at.get(path)
        if cached is None:
            text = self.text(path) or ""
            cached = self._imports_at[path] = sorted(m.span() for ms in import_statements(text) for m in ms)
        else:
            self._touch(path)
        return cached

    def _reached_from(self, d: Definition, qual: str, code: str, module_text: str) -> List[Optional[Definition]]:
        """What the code of `d` (a function, a method, a class) names in its module: what it
        calls, its bases (a class's or its method's class's), the other methods of its class it
        calls on `self`. Memoised per definition."""
        found: List[Optional[Definition]] = []  # (a cycle back to `d` reads what is found so far)
        return self._memoised(self._reached, (d.path, qual),
                              lambda: self._reach_from(d, qual, code, module_text, found), placeholder=found)

    def _reach_from(self, d: Definition, qual: str, code: str, module_text: str,
                    cached: List[Optional[Definition]]) -> List[Optional[Definition]]:
        """`_reached_from` without its memo: what it finds is appended to `cached` (returned)."""
        module = self.module(d.path)
        if module is None:
            return cached
        names = list(_CALLED_RE.findall(code))
        owner = qual.partition(".")[0]
        header = None
        if isinstance(d, ForeignClass):
            header = _CLASS_RE.search(code)
        elif "." in qual:  # a method: its class's header too
            header = _CLASS_RE.search(module_text, self._def_spans(d.path).get(owner, (0, 0))[0])
        if header is not None and header.group(1) == owner and header.group(2):
            names.extend(b.strip() for b in header.group(2).split(","))
        for name in dict.fromkeys(names):
            head, _, rest = name.partition(".")
            if head in ("self", "cls") and rest and isinstance(d, ForeignFunction) and "." in qual:
                method = f"{owner}.{rest.partition('.')[0]}"  # another method of its class
                if method in self._def_spans(d.path):
                    cached.append(ForeignFunction(module, method, ForeignClass(module, owner)))
                continue
            if not head.isidentifier() or head in ("self", "cls", "super"):
                continue
            found = self.member(module, head)
            for attr in [a for a in rest.split(".") if a]:
                found = self._text_attribute(found, attr)
            if found is not None:
                cached.append(found)
        return cached

    def lacks_relevant_method(self, cls: ForeignClass, name: str) -> bool:
        """True when no class `cls` may inherit from (`text_mro`) defines a method `name`
        whose code holds AMP code (`relevant`): a call of it has no effect and no value worth
        reading, and no summary is read to know it. False: not sure. Memoised (asked for every
        call of a method on an object of another module's class)."""
        return self._memoised(self._lacks_methods, (cls.key, name), lambda: self._lacks_method(cls, name))

    def _lacks_method(self, cls: ForeignClass, name: str) -> bool:
        """`lacks_relevant_method` without its memo."""
        classes = self.text_mro(cls)
        if classes is None:
            return False
        # (`\bdef`, with the boundary tested behind the literal word: `re` then looks for `def`
        # first, instead of trying the pattern at every offset: 20x faster, the same matches)
        defines = re.compile(r"def(?<=\bdef)[ \t]+%s\b" % re.escape(name))
        for c in classes:
            text = self.text(c.path) or ""
            span = self._def_spans(c.path)[c.qual]
            if defines.search(text, span[0], span[1]):
                method = f"{c.qual}.{name}"
                if method not in self._def_spans(c.path) or self.relevant(ForeignFunction(c.module, method, c)):
                    return False
        return True

    def lacks_relevant_attributes(self, cls: ForeignClass) -> bool:
        """True when no class `cls` may inherit from holds AMP code (its attributes are then
        not read, `foreign_attribute`) and none is a dataclass (no fields). False: not sure."""
        return self.lacks_relevant_classes(cls) and not any(self._may_be_dataclass(c) for c in self.text_mro(cls) or ())

    def _may_be_dataclass(self, c: ForeignClass) -> bool:
        """The decorators written above class `c` mention `dataclass` (a module that only
        imports `accelerate.utils.dataclasses` makes none of its classes one). True when the
        class is not found in the text: not sure."""
        text = self.text(c.path) or ""
        if "dataclass" not in text:
            return False
        span = self._def_spans(c.path).get(c.qual)
        return span is None or "dataclass" in _decorators_above(text, span[0])

    def lacks_relevant_classes(self, cls: ForeignClass) -> bool:
        """True when no class `cls` may inherit from (`text_mro`) holds AMP code: the values
        its instances' attributes may hold are not read (`foreign_attribute`). False: not sure."""
        classes = self.text_mro(cls)
        return classes is not None and not any(self.relevant(c) for c in classes)

    def text_mro(self, cls: ForeignClass) -> Optional[List[ForeignClass]]:
        """`cls` and every class of the project its bases' names may resolve to, read from the
        texts (no summary): never fewer classes than the summaries' `foreign_mro`. None when
        not sure (a base that is not a plain name, a name bound twice or by a star import, a
        class the scan does not find). Memoised."""
        # (a cycle of bases reads None: not sure)
        return self._memoised(self._text_mros, cls.key, lambda: self._text_mro(cls), placeholder=None)

    def _text_mro(self, cls: ForeignClass) -> Optional[List[ForeignClass]]:
        """`text_mro` without its memo."""
        out: List[ForeignClass] = []
        todo: List[Tuple[ForeignClass, int]] = [(cls, 0)]
        seen = set()
        while todo:
            c, depth = todo.pop()
            if c.key in seen:
                continue
            bases = self._text_bases(c) if depth <= MAX_RESOLVE_DEPTH else None
            if bases is None:
                return None
            seen.add(c.key)
            out.append(c)
            todo.extend((b, depth + 1) for b in bases)
        return out

    def _text_bases(self, c: ForeignClass) -> Optional[List[ForeignClass]]:
        text = self.text(c.path) if c.path.endswith(".py") else None
        span = self._def_spans(c.path).get(c.qual) if text is not None and "." not in c.qual else None
        index = self.index(c.path)
        if span is None or index is None:
            return None
        header = _CLASS_RE.match(text, span[0])
        if header is None or header.group(1) != c.qual:
            return None
        out: List[ForeignClass] = []
        for raw in (header.group(2) or "").split(","):
            base = raw.strip()
            if not base or "=" in base:  # `metaclass=...`: not a base
                continue
            head, _, rest = base.partition(".")
            if not all(part.isidentifier() for part in base.split(".")):
                return None
            kind = index.names.get(head)
            imported = index.imports.get(head, ())
            if kind == "class" and not rest and not imported:
                out.append(ForeignClass(c.module, head))
            elif kind == "import" and len(imported) == 1:
                found = self._use(c.path, imported[0] + (f".{rest}" if rest else ""))
                if isinstance(found, ForeignClass):
                    out.append(found)
                elif found is not None:
                    return None  # a module, a function, a constant of the project: not sure
            elif kind is not None or index.stars:
                return None  # a function's result, a constant, a name bound twice or by a star import
        return out

    def _bindings_of(self, path: str) -> Dict[str, str]:
        return self._of_text(self._bound, path, _bindings)

    def _names_bound_to(self, importer: str) -> Dict[str, List[str]]:
        """The names the module at `importer` binds by its imports, by the path of the module
        each names a definition of (`_use`), in the order of its import lines. Memoised per
        importer: a package's `__init__.py` is an importer of each of its modules, and the
        triggers read it for every file of them (`_reach_parts`)."""
        def group() -> Dict[str, List[str]]:
            out: Dict[str, List[str]] = {}
            for local, q in self._bindings_of(importer).items():
                found = self._use(importer, q)
                if found is not None:
                    out.setdefault(found.path, []).append(local)
            return out

        return self._memoised(self._names_for, importer, group)

    def _uses_of(self, path: str) -> List[str]:
        """`_uses` of the module's text (`reach_words` and `reach_held` both read it)."""
        return self._of_text(self._uses_memo, path, _uses)

    def _of_text(self, memo: Dict[str, V], path: str, derive: Callable[[str], V]) -> V:
        """`derive` of the text of the module at `path`, memoised per module in `memo` (which
        `_forget_texts` empties for a module whose text changed); the text is a dependency of
        the answer, memoised or not."""
        cached = memo.get(path)
        if cached is None:
            cached = memo[path] = derive(self.text(path) or "")
        else:
            self._touch(path)
        return cached

    def _use(self, importer: str, qualified: str) -> Optional[Definition]:
        """What `qualified` (an imported name, then attributes) names, read from the texts only
        (`resolve` reads a class's summary for its attributes). Memoised."""
        key = (importer, qualified)
        self._resolving(importer)
        return self._memoised(self._used, key, lambda: self._resolve(importer, qualified, 0, text_only=True))

    def _text_attribute(self, d: Optional[Definition], name: str) -> Optional[Definition]:
        if isinstance(d, ForeignModule):
            return self.member(d, name)
        if isinstance(d, ForeignClass) and f"{d.qual}.{name}" in self._def_spans(d.path):
            return ForeignFunction(d.module, f"{d.qual}.{name}", d)
        return None

    def _def_spans(self, path: str) -> Dict[str, Tuple[int, int]]:
        spans = self._spans.get(path)
        if spans is None:
            spans = self._spans[path] = def_spans(self.text(path) or "")
        else:
            self._touch(path)
        return spans

    def apex_amp_uses(self, path: str) -> List[Tuple[str, int]]:
        """The modules related to `path` (it imports them, or they import it) that use NVIDIA
        apex's amp (`amp.initialize`, `amp.scale_loss`, `amp.master_params`, `amp.state_dict`,
        `amp.load_state_dict`, after an import of apex's amp, or of `amp` or `*` from another
        module, which may re-export it): (path relative to the root, line) of the first use in
        each, read from their text. A migration of one module to native AMP
        is project-wide or not applied (`ampfix/migrations/apex/`); a script that shares
        nothing with it (a sibling example with its own `amp.initialize`) is independent of it."""
        path = os.path.abspath(path)
        out: List[Tuple[str, int]] = []
        for f in sorted({*self.imports_of(path), *self.importers_of(path)} - {path}):
            text = self.text(f)
            if text is None or not (("apex" in text and _APEX_AMP_IMPORT.search(text))
                                    or ("import" in text and _AMP_FROM_ELSEWHERE.search(text))):
                continue
            use = _APEX_AMP_USE.search(text)
            if use is not None:
                self._touch(f)
                out.append((os.path.relpath(f, self.root), text.count("\n", 0, use.start()) + 1))
        return out

    # ------------------------------------------------------------------ callers
    def files(self) -> List[str]:
        """Every Python file of the project (for the callers of a function)."""
        return self.graph.files()

    def callers(self, path: str, qual: str) -> Optional[List[Tuple[ForeignModule, OutgoingCall]]]:
        """The calls other modules of the project make to function `qual` of the module at
        `path`: those of the files the text scan selects (`ImportGraph.caller_candidates`),
        whose call resolves to it; None when more than `MAX_CALLER_FILES` files may call it.
        The scan's answer is a dependency of the result (`end`), and so are the texts of the
        files it selects."""
        path = os.path.abspath(path)
        key = (path, qual)
        if self._called is not None:
            self._called.add(key)
        candidates = self.graph.caller_candidates(path, qual)
        for f in candidates:
            self._touch(f)
        return self._memoised(self._callers, key, lambda: None if len(candidates) > MAX_CALLER_FILES
                              else self._calls_to(path, qual, candidates), placeholder=None)

    def overridden_below(self, cls: ForeignClass, name: str) -> bool:
        """Some class of the project that may derive from `cls` (a class whose bases name it, or
        name such a class, a few levels down) defines a method `name`: an object annotated as a
        `cls` may run that one instead (the annotation does not say which). Read from the
        texts the graph's scan selects (`ImportGraph.subclass_candidates`); the scans and the
        texts are dependencies of the result, recorded on every call (`end`). Memoised."""
        key = (cls.path, f"{cls.qual}.{name}")
        hit = self._overrides.get(key)
        if hit is None:
            hit = self._overrides[key] = self._overridden_below(cls, name)
        for path, base in hit[1]:
            if self._subclassed is not None:
                self._subclassed.add((path, base))
            for f in self.graph.subclass_candidates(path, base):
                self._touch(f)
        return hit[0]

    def holders(self, path: str, word: str) -> List[str]:
        """The project's files whose text holds `word` (`ImportGraph.subclass_candidates`, the
        same text scan): the scan and the texts are dependencies of the result (`end`)."""
        path = os.path.abspath(path)
        if self._subclassed is not None:
            self._subclassed.add((path, word))
        found = self.graph.subclass_candidates(path, word)
        for f in found:
            self._touch(f)
        return found

    def _overridden_below(self, cls: ForeignClass, name: str) -> Tuple[bool, Tuple[Tuple[str, str], ...]]:
        """`overridden_below`'s answer, and the (path, class name) scans it made."""
        scanned: List[Tuple[str, str]] = []
        level = [(cls.path, cls.qual.rpartition(".")[2])]
        for _ in range(MAX_REACH_DEPTH + 1):
            below: List[Tuple[str, str]] = []
            for path, base in level:
                if (path, base) in scanned:
                    continue
                scanned.append((path, base))
                names_base = re.compile(r"\b%s\b" % re.escape(base))
                for f in self.graph.subclass_candidates(path, base):
                    spans = self._def_spans(f)
                    for m in _CLASS_HEADER.finditer(self.text(f) or ""):
                        if (f, m.group(1)) == (path, base) or not names_base.search(m.group(2)):
                            continue
                        if any(q.rpartition(".")[2] == m.group(1) and f"{q}.{name}" in spans for q in spans):
                            return True, tuple(scanned)
                        below.append((f, m.group(1)))
            if not below:
                return False, tuple(scanned)
            level = below
        return True, tuple(scanned)  # deeper than followed: not sure

    def _calls_to(self, path: str, qual: str, candidates: List[str]) -> List[Tuple[ForeignModule, OutgoingCall]]:
        """`callers` without its memo."""
        found: List[Tuple[ForeignModule, OutgoingCall]] = []
        for f in candidates:
            module = self.module(f)
            if module is None:
                continue
            for call in module.summary.calls:
                if not call.callee.endswith(f'{qual}")') and not call.callee.endswith(f".{qual}"):
                    continue
                d = self.canonical_definition(module, call.callee)
                if isinstance(d, ForeignFunction) and d.path == path and d.qual == qual:
                    found.append((module, call))
        return found


MAX_REACH_DEPTH = 3  # definitions reached from what the file uses: what they call, and so on
# a class statement: its name and what is written between the parentheses after it (its bases,
# to the `):` that ends the header: a base may hold parentheses of its own, `mixin(), Base`)
_CLASS_HEADER = re.compile(r"^[ \t]*class[ \t]+(\w+)[ \t]*\((.*?)\)[ \t]*:", re.MULTILINE | re.DOTALL)
MAX_REACH_PARTS = 400
_NAME_OR_DOT = re.compile(r"[\w.]")
_WORD_CHAR = re.compile(r"\w")
# A dotted name before `(` (`_CALLED_RE`), a name and the attributes after it (`_DOTTED_USE_RE`).
# Where Python's `re` has possessive quantifiers (3.11), the runs of word characters do not
# give back what they took: a shorter run is followed by a word character or a dot, never by
# what must follow, so the matches are the same, without trying every shorter run of every name
# that is not called or not dotted (2x and 1.4x faster on peft's and accelerate's texts).
if sys.version_info >= (3, 11):
    _CALLED_RE = re.compile(r"(?<![\w.])([A-Za-z_]\w*+(?:\.\w++)*+)[ \t]*+\(")
    _DOTTED_USE_RE = re.compile(r"(?<![\w.])([A-Za-z_]\w*+)((?:\.\w++)+)")
else:  # pragma: no cover - the same patterns, backtracking
    _CALLED_RE = re.compile(r"(?<![\w.])([A-Za-z_]\w*(?:\.\w+)*)[ \t]*\(")
    _DOTTED_USE_RE = re.compile(r"(?<![\w.])([A-Za-z_]\w*)((?:\.\w+)+)")


def _bindings(text: str) -> Dict[str, str]:
    """The names the imports of a module (anywhere in it) bind, and what they import:
    `f` -> `pkg.mod.f` for `from pkg.mod import f`, `m` -> `pkg.mod` for `import pkg.mod as m`."""
    bound: Dict[str, str] = {}
    if "import" not in text:
        return bound
    froms, imports = import_statements(text)
    for m in froms:
        base = m.group(1)
        for part in m.group(2).strip("()").replace("\\\n", " ").split(","):
            name, _, alias = part.strip().partition(" as ")
            name, alias = name.strip(), alias.strip()
            if name.isidentifier():
                bound[alias or name] = f"{base}.{name}" if base and not base.endswith(".") else f"{base}{name}"
    for m in imports:
        for part in m.group(1).split(","):
            name, _, alias = part.strip().partition(" as ")
            name, alias = name.strip(), alias.strip()
            if name and all(p.isidentifier() for p in name.split(".")):
                bound[alias or name.split(".")[0]] = name if alias else name.split(".")[0]
    return bound


def _uses(text: str) -> List[str]:
    """The qualified names a module uses from what it imports: `pkg.mod.f` for `from pkg.mod
    import f` (and `pkg.mod.f.g` for `f.g`), `pkg.mod.h` for `import pkg.mod as m` and `m.h`.
    Read from the text: `project.resolve` says which are the project's."""
    bound = _bindings(text)
    out: Dict[str, None] = dict.fromkeys(bound.values())
    if bound:
        for head, rest in set(_DOTTED_USE_RE.findall(text)):
            qualified = bound.get(head)
            if qualified is not None:
                out[qualified + rest] = None
    return list(out)


def _decorators_above(text: str, start: int) -> str:
    """The lines above the top-level `class`/`def` line at offset `start` that may be its
    decorators: `@` lines at the margin and what continues them (indented, or closing a
    bracket), over blank and comment lines, up to the first other line at the margin. Past
    4000 characters, all of them (more than its decorators: the caller only looks for a word)."""
    window = text[max(0, start - 4000):start]
    lines = window.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i]
        head = line[:1]
        if head == "@" or head in (" ", "\t") or not line.strip() or line.startswith(("#", ")", "]", "}")):
            continue
        return "\n".join(lines[i + 1:])
    return window


def _in_code(vocabulary: "re.Pattern[str]", text: str, start: int, end: int) -> bool:
    """`vocabulary` matches `text[start:end]` outside its comments and triple-quoted strings
    (docstrings: a class whose only AMP word is "optimization" in a docstring holds no AMP code).
    Other strings count (`getattr(torch, "float16")`, `precision="16-mixed"` choose precision),
    and so does a match after a quote that closes nothing (the text does not lex). The text is
    lexed only as far as the first match in code."""
    hit = vocabulary.search(text, start, end)
    lexemes = LEXEMES.finditer(text, start, end)
    lexeme = None  # the last comment or string read
    while hit is not None:
        while lexeme is None or lexeme.end() <= hit.start():
            lexeme = next(lexemes, None)
            if lexeme is None or lexeme.group("open") is not None:
                return True
        if lexeme.start() > hit.start() or not (lexeme.group("c") is not None
                                               or text.startswith(('"""', "'''"), lexeme.start())):
            return True  # in code, or in a string that is not a docstring
        hit = vocabulary.search(text, lexeme.end(), end)
    return False


def _mentions(code: str, name: str) -> bool:
    """`code` names `name` as a whole name, not as an attribute (`x.name`) or a part of another."""
    at = code.find(name)
    while at >= 0:
        end = at + len(name)
        if not (at and _NAME_OR_DOT.match(code, at - 1)) and not (end < len(code) and _WORD_CHAR.match(code, end)):
            return True
        at = code.find(name, end)
    return False


def _containing(spans: List[Tuple[int, int]], at: int) -> Optional[Tuple[int, int]]:
    """The span of `spans` (sorted, none overlapping another) that holds offset `at`."""
    i = bisect.bisect_right(spans, (at, float("inf"))) - 1
    return spans[i] if i >= 0 and spans[i][0] <= at < spans[i][1] else None


# what another module's code says of autocast without opening a region that could hold a step of
# the checked file: a query of the state (`torch.is_autocast_enabled()`, `get_autocast_dtype`) and
# a region turned off in the code itself (`torch.autocast(..., enabled=False)`, what a numerically
# sensitive layer does inside its own forward); one level of brackets inside the call
_AUTOCAST_QUERY = re.compile(r"\b(?:is|get|set)_autocast\w*")
# a name for a value that cannot open a region, only configure one: a dtype, a flag, arguments
# (`autocast_dtype`, `autocast_enabled`, `autocast_kwargs`; peft's `autocast_adapter_dtype`, a flag
# that casts adapter weights); the region it configures is opened by a mention of autocast itself
_AUTOCAST_VALUE = re.compile(r"\bautocast_\w*(?:dtype|enabled|kwargs|args)\b")
_AUTOCAST_OFF = re.compile(r"autocast\((?:[^()]|\([^()]*\))*?\benabled[ \t]*=[ \t]*False[ \t]*(?=[,)\n])"
                           r"(?:[^()]|\([^()]*\))*\)")


def _words_in(code: str, words: Tuple[str, ...], lower_words: Tuple[str, ...],
              view_words: Optional[Tuple[Tuple[str, ...], Tuple[str, ...]]] = None,
              view: Optional[Callable[[], str]] = None) -> Tuple[frozenset, frozenset]:
    """The strings of `words` that `trigger_view(code)` holds, and of `lower_words` that its
    lower-cased text holds (the view is made only for code that holds some in the first place).
    `view_words`: the strings to look for in the view, when it may hold some that `code` does
    not (`Project._text_words`; `words` are then those `code` may hold). `view`: makes the
    view (`Project._key_view`, which lexes the whole module once)."""
    found = _held(code, words, lower_words)
    if found[0] or found[1]:
        seen = view() if view is not None else trigger_view(code)
        if seen != code:
            found = _held(seen, *(view_words or (words, lower_words)))
    return found


def _plain_words(words: Tuple[str, ...], lower_words: Tuple[str, ...]) -> bool:
    """No string is empty or holds a line break (of `str.splitlines`), and the lower-case ones
    are ASCII (`_module_words`)."""
    return all(w.splitlines() == [w] for w in (*words, *lower_words)) and all(w.isascii() for w in lower_words)


def _held(text: str, words: Tuple[str, ...], lower_words: Tuple[str, ...]) -> Tuple[frozenset, frozenset]:
    lowered = text.lower() if lower_words else ""
    return frozenset(w for w in words if w in text), frozenset(w for w in lower_words if w in lowered)


def trigger_view(code: str) -> str:
    """The code of another module as the rules' project triggers read it (`reach_text`,
    `reach_words`): without its comments and triple-quoted strings (docstrings, masked:
    `_masked`), nor the mentions of autocast that open no region (`_AUTOCAST_QUERY`,
    `_AUTOCAST_OFF`, `_AUTOCAST_VALUE`). The checked file's own text is only masked
    (`analyze._Tests`): a rule may report on an autocast query or a disabled region there."""
    return _view_of_masked(_masked(code))


def _view_of_masked(code: str) -> str:
    """`trigger_view` of code whose comments and docstrings are masked already."""
    if "autocast_" in code:
        code = _without_autocast_values(code)
    if "_autocast" in code:  # (each pattern only where its words are)
        code = _without_autocast_queries(code)
    if "enabled" in code and "autocast(" in code:
        code = _AUTOCAST_OFF.sub("", code)
    return code


# `_AUTOCAST_VALUE` and `_AUTOCAST_QUERY` begin with `\b`, which keeps `re` from looking for their
# literal words first: it tries the patterns at every offset of the text (peft's views, 9 MB:
# 0.045 and 0.030 s). These find the literal words, then test the boundary before the match (a
# match of the word's `\w*` run holds only word characters, so no match of the original pattern
# can begin inside one): the same substitutions, 20 times faster.
_AUTOCAST_VALUE_WORDS = re.compile(r"autocast_\w*(?:dtype|enabled|kwargs|args)\b")
_AUTOCAST_QUERY_WORDS = re.compile(r"_autocast\w*")


def _boundary_before(text: str, at: int) -> bool:
    """`\\b` holds before the word character at `at`."""
    return at == 0 or _WORD_CHAR.match(text, at - 1) is None


def _without_autocast_values(code: str) -> str:
    """`_AUTOCAST_VALUE.sub(MASK, code)`."""
    return _AUTOCAST_VALUE_WORDS.sub(lambda m: MASK if _boundary_before(code, m.start()) else m.group(0), code)


def _without_autocast_queries(code: str) -> str:
    """`_AUTOCAST_QUERY.sub("", code)`: `is_`, `get_` or `set_` (after a boundary) before the
    word `_autocast...`, and the word, are removed."""
    out: List[str] = []
    at = 0
    for m in _AUTOCAST_QUERY_WORDS.finditer(code):
        start = m.start()
        for verb in ("is", "get", "set"):
            begin = start - len(verb)
            if begin >= at and code.startswith(verb, begin) and _boundary_before(code, begin):
                out.append(code[at:begin])
                at = m.end()
                break
    if not out:
        return code
    out.append(code[at:])
    return "".join(out)


def _top_level_code(text: str, spans: Dict[str, Tuple[int, int]]) -> str:
    """`text` without its top-level functions and classes."""
    out, at = [], 0
    for start, end in sorted(s for q, s in spans.items() if "." not in q):
        if start >= at:
            out.append(text[at:start])
            at = end
    out.append(text[at:])
    return "".join(out)


# a top-level `def`, `class` or assignment, at the start of a line
_TOP = r"(?:(?:async[ \t]+)?def[ \t]+(\w+)|class[ \t]+(\w+)|(\w+)[ \t]*(?::[^=\n]*)?=(?!=))"
_TOP_RE = re.compile("^" + _TOP, re.MULTILINE)
# `_TOP_RE` after a line break: `re` finds the line break first, where it would try `^` at every
# offset (2.4 times slower on the 17017 modules of the cached trees, bench/SPEED.md)
_TOP_AFTER_BREAK = re.compile(r"\n" + _TOP)


def top_level_names(text: str) -> List[Tuple[int, Tuple[Optional[str], ...]]]:
    """(offset, groups) of each match of `_TOP_RE.finditer(text)`: a match at the start of the
    text, then those after a line break (`_TOP_AFTER_BREAK`, at the same offsets: none spans a
    line break)."""
    first = _TOP_RE.match(text)
    out = [(0, first.groups())] if first is not None else []
    out.extend((m.start() + 1, m.groups()) for m in _TOP_AFTER_BREAK.finditer(text, first.end() if first else 0))
    return out


@dataclass
class ModuleIndex:
    """What a module binds at its top level, read from its text without a parse: enough to
    resolve imports and re-exports; a question about the contents reads the summary."""

    names: Dict[str, str]  # name -> "function" | "class" | "constant" | "import" (the last binding wins)
    imports: Dict[str, List[str]]  # name -> the qualified names it is imported as
    stars: List[str]
    imported_at: Dict[str, List[int]]  # name -> where the import statements binding it start


def module_index(text: str) -> ModuleIndex:
    found: List[Tuple[int, str, str]] = []
    for at, (function, cls, assigned) in top_level_names(text):
        if function:
            found.append((at, function, "function"))
        elif cls:
            found.append((at, cls, "class"))
        elif assigned and assigned not in ("if", "else", "elif", "try", "except", "finally", "with", "for", "while"):
            found.append((at, assigned, "constant"))
    imports: Dict[str, List[str]] = {}
    stars: List[str] = []
    imported_at: Dict[str, List[int]] = {}
    for pos, bound, qualified in module_imports(text):
        if bound == "*":
            stars.append(qualified)
            continue
        imports.setdefault(bound, []).append(qualified)
        imported_at.setdefault(bound, []).append(pos)
        found.append((pos, bound, "import"))
    names: Dict[str, str] = {}
    for _, name, kind in sorted(found):
        names[name] = kind
    return ModuleIndex(names, imports, stars, imported_at)


def _star_member(star: str, name: str) -> str:
    """What `from <star> import name` imports, as the model records it (`.utils.amp`, `.amp`)."""
    return f"{star}.{name}" if star and not star.endswith(".") else f"{star}{name}"


_NO_ALL = object()
_ALL_WORD = re.compile(r"\b__all__\b")
_ALL_ASSIGN = re.compile(r"^__all__[ \t]*(?::[^=\n]*)?=[ \t]*(?=[\[(])", re.MULTILINE)


def dunder_all(text: str) -> object:
    """A module's `__all__`, read from its text: the names of a literal list or tuple of
    strings assigned once at its top level (`__all__ = ["a", "b"]`) as a frozenset; None when
    the text names `__all__` otherwise too (`__all__ += [...]`, `__all__ = base.__all__ + [...]`,
    in a function, in a comment: what it holds is not known); `_NO_ALL` when it never names it."""
    if "__all__" not in text:
        return _NO_ALL
    words = _ALL_WORD.findall(text)
    if not words:
        return _NO_ALL
    found = _ALL_ASSIGN.search(text)
    if found is None or len(words) != 1:
        return None
    depth, end = 0, None
    rest = text[found.end():]
    try:
        for tok in tokenize.generate_tokens(io.StringIO(rest).readline):
            if tok.type == tokenize.OP and tok.string in "([{":
                depth += 1
            elif tok.type == tokenize.OP and tok.string in ")]}":
                depth -= 1
                if depth == 0:
                    end = tok.end
                    break
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return None
    if end is None:
        return None
    lines = rest.splitlines(keepends=True)
    offset = sum(len(line) for line in lines[:end[0] - 1]) + end[1]
    after = rest[offset:].split("\n", 1)[0].strip()
    if after and not after.startswith("#"):
        return None  # `__all__ = [...] + more`
    try:
        value = ast.literal_eval(rest[:offset])
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        return None
    return frozenset(value)


_CLASS_RE = re.compile(r"^class[ \t]+(\w+)[ \t]*(?:\(([^)]*)\))?[ \t]*:", re.MULTILINE)
_LIBRARY_PREFIXES = ("torch", "lightning", "pytorch_lightning", "accelerate", "apex", "transformers", "abc", "enum",
                     "typing", "builtins")


def light_summary(path: str, text: str, index: Optional[ModuleIndex]) -> ModuleSummary:
    """The summary of a module whose text holds nothing AMP code is made of: its classes and
    their bases (a class hierarchy may pass through it), nothing else, and no parse."""
    out = ModuleSummary(path=path, digest="")
    imports = index.imports if index is not None else {}
    for m in _CLASS_RE.finditer(text):
        bases = []
        for raw in (m.group(2) or "").split(","):
            base = raw.strip()
            if not base or "=" in base:
                continue
            head, _, rest = base.partition(".")
            if head in imports:
                q = imports[head][-1] + (f".{rest}" if rest else "")
                bases.append(Value(q if q.split(".")[0] in _LIBRARY_PREFIXES else f'__imported__("{q}")'))
            elif all(part.isidentifier() for part in base.split(".")):
                bases.append(Value(f"__local__.{base}" if head not in ("object",) else base))
            else:
                bases.append(Value("__unknown__"))
        out.classes[m.group(1)] = ClassSummary(m.group(1), text.count("\n", 0, m.start()) + 1, bases)
    return out


_TOP_IMPORT_RE = re.compile(
    r"^(?P<indent>[ \t]*)(?:from[ \t]+(?P<base>\.*[\w.]*)[ \t]+import[ \t]+(?P<names>\([^)]*\)|[^\n#;]+)"
    r"|import[ \t]+(?P<mods>[^\n#;]+))", re.MULTILINE)
_BLOCK_RE = re.compile(r"^(?:try|except|else|finally|if|elif)\b", re.MULTILINE)


def module_imports(text: str) -> List[Tuple[int, str, str]]:
    """(offset, bound name, qualified) for the imports a module runs at its top level: at the
    left margin, or in a top-level `try`/`if` block (`try: from .x import y`)."""
    out: List[Tuple[int, str, str]] = []
    if "import" not in text:
        return out
    for m in at_lines_holding(text, _TOP_IMPORT_RE):  # (each match's first line holds "import")
        if m.group("indent"):
            line_start = text.rfind("\n", 0, m.start()) + 1
            block = None
            for line in reversed(_lines_before(text, line_start, 12)):  # the top-level line above it
                if line and not line[0].isspace():
                    block = line
                    break
            if block is None or not _BLOCK_RE.match(block):
                continue
        if m.group("mods"):
            for part in m.group("mods").split(","):
                name, _, alias = part.strip().partition(" as ")
                name, alias = name.strip(), alias.strip()
                if name and all(p.isidentifier() for p in name.split(".")):
                    out.append((m.start(), alias or name.split(".")[0], name if alias else name.split(".")[0]))
            continue
        base = m.group("base")
        for part in m.group("names").strip("()").replace("\\\n", " ").split(","):
            name, _, alias = part.strip().partition(" as ")
            name, alias = name.strip(), alias.strip()
            if name == "*":
                out.append((m.start(), "*", base))
            elif name.isidentifier():
                qualified = f"{base}.{name}" if base and not base.endswith(".") else f"{base}{name}"
                out.append((m.start(), alias or name, qualified))
    return out


def _lines_before(text: str, end: int, n: int) -> List[str]:
    """`text[:end].splitlines()[-n:]`, read from a window before `end` that doubles until it
    holds more than `n` lines (or starts the text): the same lines, without splitting all of
    the text above (an import inside a function of a large module read it all again). A window
    that starts inside a line, or between the two characters of a `\\r\\n`, changes only its
    first line, which is not among the last `n` when there are more than `n`."""
    width = 4096
    while True:
        start = max(0, end - width)
        lines = text[start:end].splitlines()
        if start == 0 or len(lines) > n:
            return lines[-n:]
        width *= 2


class _NoFacts:
    """The facts a module's summary is built with: none from other modules (a summary
    depends on its own module's text only), yet calls that may leave the module are recorded."""

    def resolve(self, importer, qualified):
        return None

    def member(self, module, name):
        return None

    def bases(self, cls):
        return []

    def relevant(self, d):
        return False

    def relevant_to_traces(self, d):
        return False

    def callers(self, path, qual):
        return None

    def lacks_relevant_method(self, cls, name):
        return False

    def lacks_relevant_attributes(self, cls):
        return False

    def lacks_relevant_classes(self, cls):
        return False

    def overridden_below(self, cls, name):
        return True

    def holders(self, path, word):
        return None

    def library_name(self, importer, qualified):
        return None

    def star_names(self, importer, module):
        return None


NO_FACTS = _NoFacts()


def _parse(text: str, path: str) -> Optional[cst.Module]:
    try:
        return parse_module(text)
    except Exception:
        return None


__all__ = ["NO_FACTS", "Project", "Source", "SummaryStore", "digest_of", "IMPORTED", "LOCAL"]
