"""Orchestration, shared by the command line and `ampfix.api`: resolve the configuration and
the rules, discover the files, read them, pre-filter, check or fix (in parallel when it pays),
and write fixed files back safely. The CLI only parses options and prints reports.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Dict, List, Optional, Sequence, Tuple

from ampfix.engine import fileio
from ampfix.engine.config import Config, ConfigError, parse_size, parse_version, resolve_config
from ampfix.engine.discovery import discover, matches_any
from ampfix.engine import collector, guard, signals
from ampfix.engine import rulemeta
from ampfix.engine.results import FileError, FileResult, InputError, Settings, decode_source, error_objects
from ampfix.engine.rulemeta import SelectionError

if TYPE_CHECKING:
    from ampfix.engine.requirements import ProjectRequirements

# LibCST, the engine and the rules are imported only when a file must really be analysed (or
# fixed): a warm run, every file a cache hit, never needs them (see ampfix/engine/rulemeta.py)

PARALLEL_MIN_BYTES = 64 * 1024  # below this a process pool costs more than it saves


class OptionsError(ValueError):
    """The options or the configuration are wrong (exit status 2, no file is checked).
    `in_config`: the configuration file is wrong (its message names the file and the key)."""

    def __init__(self, message: str, in_config: bool = False):
        super().__init__(message)
        self.in_config = in_config


@dataclass
class Options:
    paths: Sequence[str] = ()
    select: Sequence[str] = ()
    ignore: Sequence[str] = ()
    extend_select: Sequence[str] = ()
    config_file: Optional[str] = None
    min_torch_version: Optional[str] = None
    force_exclude: bool = False
    stdin_filename: Optional[str] = None
    fix: bool = False
    unsafe_fixes: bool = False
    jobs: Optional[int] = None
    details: bool = False  # attach each finding's fix as edits (SARIF, `full` text, the language server)
    add_noqa: bool = False  # add `# noqa: CODE` to each finding's line instead of fixing
    max_file_size: Optional[str] = None  # --max-file-size (else the config's, else 4 MiB)
    max_file_memory: Optional[str] = None  # the config's `max-file-memory` unless given (else 1 GiB)
    no_cache: bool = False  # --no-cache
    preview: Optional[bool] = None  # --preview / --no-preview (None: the config's `preview`)


@dataclass
class Plan:
    """What one run checks: the configuration, the rule codes, the files."""

    options: Options
    config: Config
    codes: Tuple[str, ...]
    files: List[str]
    missing: List[str]
    settings: Settings
    max_file_size: int = 0
    problems: List[str] = field(default_factory=list)  # paths that could not be read while discovering
    notes: List[FileError] = field(default_factory=list)  # warnings about the paths (a folder with no Python file)
    warnings: List[str] = field(default_factory=list)  # about the options (a preview rule selected without
    # preview) and the configuration (an exclude that leaves no file): the exit status is not changed
    preview: bool = False
    max_file_memory: int = 0  # the bound on one file's analysis, estimated before parsing (0: none)


@dataclass
class Run:
    plan: Plan
    results: List[FileResult] = field(default_factory=list)
    snapshots: Dict[str, fileio.Snapshot] = field(default_factory=dict)  # path -> as read (for the write)
    notes: List[str] = field(default_factory=list)  # `PATH: warning: ...` lines of the run (a journal restored)

    @property
    def warnings(self) -> List[str]:
        """Folders with nothing to check, files restored from a journal, files and notebook cells
        skipped, with the reason (the exit status is not changed)."""
        return list(self.plan.warnings) + [str(n) for n in self.plan.notes] + list(self.notes) + \
            [str(n) for r in self.results for n in r.notes]

    @property
    def errors(self) -> List[str]:
        out = [f"{m}: error: no such file or directory" for m in self.plan.missing]
        out.extend(self.plan.problems)
        out.extend(str(r.error) for r in self.results if r.error is not None)
        return out

    def error_objects(self, more: Sequence[str] = ()) -> List[FileError]:
        """The errors (and, after them, the warnings) as FileErrors, for the machine formats;
        `more`: error lines of the writing step."""
        return error_objects(self.plan.missing, self.plan.problems, self.results, more) + list(self.plan.notes) + \
            [FileError.parse(n, "warning") for n in self.notes]

    @property
    def n_checked(self) -> int:
        """Files analysed or looked at (a file skipped for its size, or stdin whose name is
        excluded, is not counted)."""
        return sum(1 for r in self.results if not r.skipped)

    @property
    def diagnostics(self):
        return [d for r in self.results for d in r.diagnostics]


def split_codes(values: Sequence[str]) -> List[str]:
    out: List[str] = []
    for v in values:
        out.extend(p for p in v.replace(" ", ",").split(",") if p)
    return out


def make_plan(options: Options) -> Plan:
    paths = list(options.paths) or ["."]
    try:
        config = resolve_config(paths, options.config_file)
    except ConfigError as exc:
        raise OptionsError(str(exc), in_config=True) from None
    in_config = False
    try:
        if options.select and not split_codes(options.select):
            raise OptionsError("--select: no rule code given (an empty --select would disable every rule; "
                               "use --select ALL, or a code such as AMP001)")
        info = rulemeta.rule_info(_rule_facts, _cache_folder(options, config))

        def validate_selectors(selectors, option):
            return rulemeta.validate_selectors(selectors, option, info)

        cli_select = validate_selectors(split_codes(options.select), "--select") if options.select else None
        cli_ignore = validate_selectors(split_codes(options.ignore), "--ignore")
        cli_extend = validate_selectors(split_codes(options.extend_select), "--extend-select")
        in_config = True
        cfg_select = validate_selectors(config.select, f"{config.path}: select") if config.select is not None else None
        cfg_extend = validate_selectors(config.extend_select, f"{config.path}: extend-select")
        cfg_ignore = validate_selectors(config.ignore, f"{config.path}: ignore")
        for glob, codes in config.per_file_ignores.items():
            validate_selectors(codes, f"{config.path}: per-file-ignores {glob!r}")
        in_config = False
        from ampfix.engine.requirements import ProjectRequirements

        requirements = ProjectRequirements(_project_start(options, paths))  # read once, if asked
        min_version, min_source = _min_torch(options, config, requirements)
        # where the project declares a Lightning before 2.0: Lightning 2's explicit precision
        # names (AMP204) do not exist there
        lightning_before_2 = requirements.lightning_before((2, 0)) or ""
        # where the project admits only a torch before 2.4: nothing it runs deprecates torch.cuda.amp (AMP101)
        torch_before_2_4 = requirements.torch_only_before((2, 4)) or ""
        max_size = (parse_size(options.max_file_size, "--max-file-size", "--max-file-size")
                    if options.max_file_size else config.max_file_size)
        max_memory = (parse_size(options.max_file_memory, "max_file_memory", "max-file-memory")
                      if options.max_file_memory else config.max_file_memory)
    except ConfigError as exc:
        raise OptionsError(str(exc), in_config=str(exc).startswith(str(config.path))) from None
    except SelectionError as exc:
        raise OptionsError(str(exc), in_config=in_config) from None
    # ruff's order: --select replaces the configuration's select and extend-select;
    # --extend-select adds to whichever applies
    if cli_select is not None:
        selection, extend = cli_select, cli_extend
    else:
        selection, extend = cfg_select, cfg_extend + cli_extend
    preview = options.preview if options.preview is not None else config.preview
    codes = rulemeta.select_codes(selection, cfg_ignore + cli_ignore, info, extend, preview)
    warnings = rulemeta.preview_warnings(selection, info, preview)
    if not codes:
        # a selection that leaves no rule is an error; one that names only rules that run when
        # named by their own code (AMP901, off by default) or with preview on (ruff warns then,
        # `preview_warnings`) checks nothing, and says so
        anyway = {c: replace(r, default_enabled=True, preview=False) for c, r in info.items()}
        named = rulemeta.select_codes(selection, cfg_ignore + cli_ignore, anyway, extend, True)
        if not named:
            raise OptionsError(_nothing_selected(options, config))
        if not warnings:
            how = "by their code (or ALL)" + ("" if preview or not any(info[c].preview for c in named)
                                              else ", with preview on (--preview)")
            warnings.append(f"warning: the selection runs no rule ({', '.join(named)}: only when selected "
                            f"{how}): nothing was checked")
    problems: List[str] = []
    files, missing = discover(paths, config.exclude, config.root, force_exclude=options.force_exclude,
                              problems=problems)
    summaries = None
    if not options.no_cache:
        from ampfix.engine.cache import cache_dir

        summaries = str(cache_dir(config.root))
    settings = Settings(min_torch_version=min_version, min_torch_source=min_source,
                        lightning_before_2=lightning_before_2, torch_before_2_4=torch_before_2_4,
                        unsafe_fixes=options.unsafe_fixes,
                        details=options.details, add_noqa=options.add_noqa, cache_folder=summaries,
                        max_file_memory=max_memory,
                        # AMPFIX_NO_PROJECT=1: each file alone (bench/bench_project.py measures the layer's cost)
                        project=os.environ.get("AMPFIX_NO_PROJECT") != "1")
    notes = [FileError(p, None, None, "no Python files found under this folder (*.py, *.pyi, *.ipynb, after "
                                      "exclude and .gitignore)", level="warning")
             for p in _empty_folders(paths, files)]
    if not files and not missing and config.exclude and any(os.path.isdir(p) for p in paths if p != "-"):
        everything, _ = discover(paths, (), config.root, problems=[])
        if everything:  # said once, for all: not also "no Python files" for each folder it emptied
            still_empty = set(_empty_folders(paths, everything))
            notes = [n for n in notes if n.path in still_empty]
            warnings.append(
                f"{config.path}: warning: `exclude` in [tool.ampfix] excludes every file under "
                f"{', '.join(paths)} ({len(everything)} Python file{'s' if len(everything) != 1 else ''}); "
                "nothing was checked")
    return Plan(options, config, tuple(codes), files, missing, settings, max_size, problems, notes, warnings, preview,
                max_file_memory=max_memory)


def _nothing_selected(options: Options, config: Config) -> str:
    """Why no rule is left: the selection and the ignores, and where each comes from."""
    parts = []
    if options.select:
        parts.append(f"--select {','.join(split_codes(options.select))}")
    elif config.select is not None:
        parts.append(f"select = {config.select} in {config.path}")
    if config.extend_select and not options.select:
        parts.append(f"extend-select = {config.extend_select} in {config.path}")
    if options.extend_select:
        parts.append(f"--extend-select {','.join(split_codes(options.extend_select))}")
    for values, where in ((config.ignore, f" in {config.path}"), (split_codes(options.ignore), " (--ignore)")):
        if values:
            parts.append(f"ignore = {list(values)}{where}")
    return (f"no rule is left to check ({'; '.join(parts) or 'the selection is empty'}): nothing would be "
            "checked; select a rule, or ignore fewer")


def _empty_folders(paths: Sequence[str], files: Sequence[str]) -> List[str]:
    """The folders among `paths` under which discovery found no file to check."""
    found = [os.path.normpath(f) for f in files if f != "-"]
    out = []
    for p in paths:
        if p == "-" or not os.path.isdir(p):
            continue
        d = os.path.normpath(p)
        prefix = os.path.join(d, "")
        if not any(f.startswith(prefix) or (d == "." and not os.path.isabs(f)) for f in found):
            out.append(p)
    return out


def _min_torch(options: Options, config: Config, requirements: "ProjectRequirements") -> Tuple[Tuple[int, ...], str]:
    """The oldest torch the checked code supports, and where that comes from: `--min-torch-version`,
    else `min-torch-version` in the configuration, else the project's own requirements on torch
    (`ampfix/engine/requirements.py`), else the default."""
    if options.min_torch_version:
        return parse_version(options.min_torch_version, "--min-torch-version"), "--min-torch-version"
    if config.min_torch_configured:
        return config.min_torch_version, f"min-torch-version in {config.path.name if config.path else 'the config'}"
    found = requirements.min_torch()
    if found is not None:
        return found.version, found.where
    return config.min_torch_version, ""


def _project_start(options: Options, paths: Sequence[str]) -> Path:
    """Where the metadata of the checked project is looked for from: the checked paths' common folder."""
    real = [p for p in paths if p != "-"]
    if options.stdin_filename and not real:
        real = [options.stdin_filename]
    try:
        return Path(os.path.commonpath([os.path.abspath(p) for p in real])) if real else Path.cwd()
    except ValueError:
        return Path.cwd()


def _rule_facts() -> Dict[str, rulemeta.RuleInfo]:
    from ampfix.engine import registry  # imports the rules (and LibCST): only when no table will do

    return registry.rule_facts()


def _uses_cache(options: Options) -> bool:
    return not (options.no_cache or options.fix or options.add_noqa)


def _cache_folder(options: Options, config: Config) -> Optional[Path]:
    """The cache folder when this run reads and writes the cache, else None."""
    if not _uses_cache(options):
        return None
    from ampfix.engine.cache import cache_dir

    return cache_dir(config.root)


def excluded(name: str, config: Config) -> bool:
    """Whether `exclude` / `extend-exclude` covers the path `name`, as it does for a file named
    on the command line under --force-exclude (for stdin's --stdin-filename)."""
    return matches_any(Path(name), config.root, config.exclude)


def codes_for(path: str, plan: Plan) -> Tuple[str, ...]:
    """The plan's codes minus the per-file ignores that match `path`."""
    ignored: List[str] = []
    for glob, codes in plan.config.per_file_ignores.items():
        if matches_any(Path(path), plan.config.root, [glob]):
            ignored.extend(c.upper() for c in codes)
    return tuple(c for c in plan.codes if not any(c.startswith(i) or i == "ALL" for i in ignored))


# ----------------------------------------------------------------------------- checking


Job = Tuple[str, Tuple[str, ...], Settings, bool, bytes]


def _work(job: Job) -> FileResult:
    path, codes, settings, fix, data = job
    from ampfix.engine.analyze import process_bytes
    from ampfix.engine.notebook import is_notebook, process_notebook
    from ampfix.engine.registry import all_rules

    rules = all_rules()
    try:
        if is_notebook(path):
            return guard.deep_call(process_notebook, data, path, [rules[c] for c in codes], settings, fix=fix)
        return guard.deep_call(process_bytes, data, path, [rules[c] for c in codes], settings, fix=fix)
    except Exception as exc:  # an internal error must not cost the other files their check
        return FileResult(path=path, error=FileError(path, None, None, f"internal error: {type(exc).__name__}: {exc} "
                                                                       "(please report this file)"))


def _mp_context():
    """fork where it is safe and cheap (Linux): a child starts in milliseconds."""
    import multiprocessing  # here: a run that analyses nothing needs no process

    if sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context()


def _crashed(path: str, exitcode: Optional[int]) -> FileResult:
    import signal

    if exitcode is not None and exitcode < 0:
        try:
            how = f"{signal.Signals(-exitcode).name}"
        except ValueError:
            how = f"signal {-exitcode}"
    else:
        how = f"exit status {exitcode}" if exitcode is not None else "it died"
    return FileResult(path=path, error=FileError(
        path, None, None, f"not analysed: the parser crashed on this file ({how}); "
                          "code nested very deeply is the usual cause"))


def _child(job: Job, conn, parent: int) -> None:  # pragma: no cover - runs in the child process
    signals.child_setup(parent)
    try:
        conn.send(_work(job))
    finally:
        conn.close()


def isolated(job: Job) -> FileResult:
    """`_work(job)` in a child process: a crash (segfault, abort) costs only this file. The
    child dies with this process; stopped (Ctrl-C, SIGTERM), this process ends it first."""
    ctx = _mp_context()
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(job, send, os.getpid()), daemon=True)
    proc.start()
    send.close()
    try:
        result = recv.recv()
    except (EOFError, OSError):
        result = None
    except BaseException:
        proc.kill()
        proc.join()
        raise
    finally:
        recv.close()
    proc.join()
    return result if isinstance(result, FileResult) else _crashed(job[0], proc.exitcode)


_RUNNING = None  # a pool's worker's: the shared flags of the files being analysed (`_pool`)
RUN_PREFIX = "ampfix-run-"  # the pool's temporary folder: ampfix-run-<pid>-XXXXXXXX


def _init_worker(parent: int, running, jobs: Optional[Dict[str, Tuple[int, Job]]] = None,
                 table=None) -> None:  # pragma: no cover - runs in the pool's workers
    """A worker dies with the run (SIGKILL included) and leaves Ctrl-C to it. `running`: the
    flags `_marked` sets while it analyses a file. `jobs` and `table`: the run's files by
    absolute path and the claims' shared flags, when the workers share the files out by claims
    (`share.Claims`)."""
    global _RUNNING
    signals.child_setup(parent)
    _RUNNING = running
    if jobs is not None:
        from ampfix.engine import share

        share.claims = share.Claims(table, jobs)
    collector.enter_batch()


def _kill_pool(pool) -> None:
    """End a pool's workers now (the run is stopped): SIGKILL, then reap them."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    for p in procs:
        try:
            p.kill()
        except (OSError, ValueError, AttributeError):
            pass
    try:
        pool.shutdown(wait=False, cancel_futures=True)
    except Exception:  # pragma: no cover - a pool already broken
        pass
    for p in procs:
        try:
            p.join(5)
        except (OSError, ValueError, AssertionError, AttributeError):
            pass


def _marked_work(item: Tuple[int, Job]) -> List[Tuple[int, FileResult]]:
    """`_work` on the file at place `i` of the run, its flag set while it runs (`_marked`). With
    claims (`share.Claims`): nothing when another worker claimed the file, and the results of
    the files this worker claimed for their summaries meanwhile, analysed after it."""
    from ampfix.engine import share

    i, job = item
    claims = share.claims
    if claims is not None and claims.take(i) is False:
        return []  # another worker parsed it for a summary, and analyses it
    out = [(i, _marked(i, job))]
    while claims is not None and claims.owed:
        j, owed = claims.owed.pop(0)
        out.append((j, _marked(j, owed)))
    return out


def _marked(i: int, job: Job) -> FileResult:
    """`_work`, with the file's flag in `_RUNNING` set while it runs: after a crash, the flags
    left set name the files that were being analysed when a worker died (`share.Flags`)."""
    running = _RUNNING
    if running is not None:
        running[i] = 1
    result = _work(job)
    if running is not None:
        running[i] = 0
    return result


def _sharing(job: Job, folder: str) -> Job:
    """`job` with the project layer's summaries handed between the workers through the pool's
    folder when the run keeps them nowhere (`--no-cache`): a module one worker summarised is
    read, not parsed again, by the others (`engine/share.py`, keyed by the module's content)."""
    path, codes, settings, fix, data = job
    if not settings.project or settings.cache_folder:
        return job
    return (path, codes, replace(settings, share_folder=os.path.join(folder, "summaries")), fix, data)


def _pool(jobs: List[Tuple[int, Job]], n: int, results: Dict[int, FileResult]) -> None:
    """Analyse `jobs` on `n` worker processes. When a worker dies (a native crash), the files
    it was analysing are each re-run alone (`isolated`) and the others in a fresh pool. When
    the run is stopped (Ctrl-C, SIGTERM: an exception here), the workers are killed and the
    temporary folder removed before the exception goes on; a run killed with SIGKILL takes its
    workers with it (`signals.child_setup`), and its folder is removed by the next run."""
    import shutil
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    from ampfix.engine.share import Claims, Flags

    signals.sweep_temp_folders(RUN_PREFIX)
    pending = list(jobs)
    first = True
    while pending:
        folder = signals.make_temp_folder(RUN_PREFIX)
        broken = False
        pool = None
        context = _mp_context()
        size = max(i for i, _ in pending) + 1
        running = claims = None
        try:
            try:  # `_marked`'s, shared with the workers (none: after a crash, every file left runs alone)
                running = Flags(os.path.join(folder, "running"), size)
            except OSError:
                pass
            # the workers share the files out by claims (`share.Claims`) on the first round, where
            # they are forks (the table of jobs is theirs without being sent)
            shared = [(i, _sharing(job, folder)) for i, job in pending]
            table = None
            if first and context.get_start_method() == "fork":
                try:
                    claims = Claims.table(context, folder, size)
                    table = {os.path.abspath(job[0]): (i, job) for i, job in shared}
                except OSError:
                    pass
            first = False
            pool = ProcessPoolExecutor(max_workers=min(n, len(pending)), mp_context=context,
                                       initializer=_init_worker, initargs=(os.getpid(), running, table, claims))
            futures = [(i, job, pool.submit(_marked_work, (i, job))) for i, job in shared]
            for i, job, fut in futures:
                try:
                    for j, result in fut.result():
                        results[j] = result
                except BrokenProcessPool:
                    broken = True
                except Exception as exc:  # e.g. a result that cannot be sent back
                    why = f"internal error: {type(exc).__name__}: {exc} (please report this file)"
                    results[i] = FileResult(path=job[0], error=FileError(job[0], None, None, why))
            suspects = {i for i, _ in pending if running[i]} if broken and running is not None else set()
            pool.shutdown(wait=True)
        except BaseException:
            if pool is not None:
                _kill_pool(pool)
            raise
        finally:
            for flags in (running, claims[0] if claims is not None else None):
                if flags is not None:
                    flags.close()
            shutil.rmtree(folder, ignore_errors=True)
        left = [(i, job) for i, job in pending if i not in results]
        if not left:
            return
        # a file claimed by a worker that died, or whose results could not be sent back: again,
        # in a fresh pool without claims (each file a worker was analysing when it died, alone)
        for i, job in left:
            if broken and (i in suspects or not suspects):
                results[i] = isolated(job)
        pending = [(i, job) for i, job in left if i not in results]


def _needs_analysis(path: str, data: bytes, codes: Sequence[str], risky: Optional[set] = None,
                    known: Tuple[Optional[str], Optional[str]] = (None, None)) -> Optional[FileResult]:
    """A result right away for a file no selected rule can fire on (or that cannot be
    decoded); None when it must be parsed and analysed (then `path` joins `risky` when the
    parser could crash on it, see `guard.risky`). `known`: (the first rule whose default trigger
    test `rulemeta.first_triggered` passed on the file, the file's decoded text), when the
    runner tested it: a rule that keeps `Rule`'s own tests passes them here too, so they are
    not run again. (The first test reads the raw text; the rules' own tests mask comments and
    docstrings: a file whose trigger words are only there is sent on, and `check_text` drops it
    before parsing it.)"""
    from ampfix.engine.analyze import worth_analysing
    from ampfix.engine.notebook import is_notebook, prefilter
    from ampfix.engine.registry import all_rules, overrides

    first, text = known
    if first is not None and text is not None and not any(
            overrides(all_rules()[first], test) for test in ("triggered_by", "project_candidate")):
        if risky is not None and guard.risky(text):
            risky.add(path)
        return None
    if is_notebook(path):
        early = prefilter(data, path, [all_rules()[c] for c in codes])
        if early is None and risky is not None and guard.risky(data.decode("utf-8", "replace")):
            risky.add(path)
        return early
    try:
        src = decode_source(data, path)
    except InputError as exc:
        return FileResult(path=path, error=exc.error)
    rules = all_rules()
    chosen = [rules[c] for c in codes]
    if worth_analysing(chosen, src.text):
        if risky is not None and guard.risky(src.text):
            risky.add(path)
        return None
    return FileResult(path=path)


def _risky_jobs(jobs: List[Tuple[int, Job]]) -> set:
    """The paths of `jobs` that `_needs_analysis` would have put in its `risky` set: the same
    test (`guard.risky`) of the same text (a notebook's bytes decoded with replacement, a
    source's decoded text)."""
    from ampfix.engine.notebook import is_notebook

    out = set()
    for _, (path, _, _, _, data) in jobs:
        text = data.decode("utf-8", "replace") if is_notebook(path) else decode_source(data, path).text
        if guard.risky(text):
            out.add(path)
    return out


def workers(jobs: Optional[int], n_jobs: int) -> int:
    """`--jobs`, else the AMPFIX_WORKERS environment variable, else one per CPU."""
    wanted = jobs or 0
    if not wanted:
        try:
            wanted = int(os.environ.get("AMPFIX_WORKERS", "0"))
        except ValueError:
            wanted = 0
    return max(1, min(wanted if wanted > 0 else (os.cpu_count() or 1), n_jobs))


def run(plan: Plan, stdin: Optional[BinaryIO] = None) -> Run:
    """Read and pre-filter every file here (cheap), then parse and analyse only the files
    that contain a selected rule's trigger, in parallel when that is worth a process pool."""
    with collector.batch():  # the collector's policy for a run (ampfix/engine/collector.py)
        return _run(plan, stdin)


def _run(plan: Plan, stdin: Optional[BinaryIO] = None) -> Run:
    fix = plan.options.fix
    jobs: List[Tuple[int, Job]] = []
    results: Dict[int, FileResult] = {}
    risky: set = set()  # parsed in a child process even when the run is sequential
    # which files those are matters only to a sequential run (a pool's workers test each file
    # before parsing it, `analyze.parse`): a run that may use a pool tests them once it knows
    # it does not (`_risky_jobs`: then fewer than `PARALLEL_MIN_BYTES` or a single file)
    tested: Optional[set] = risky if workers(plan.options.jobs, 2) == 1 else None
    store = None
    keys: Dict[int, str] = {}
    if _uses_cache(plan.options):
        from ampfix.engine.cache import Cache, cache_dir, cacheable

        store = Cache(cache_dir(plan.config.root))
    info = rulemeta.rule_info(_rule_facts, store.folder if store is not None else None)
    snapshots: Dict[str, fileio.Snapshot] = {}
    journals = fileio.Journals()
    notes: List[str] = []  # warnings of the run itself (a file restored from its journal)
    for i, f in enumerate(plan.files):
        if f == "-":
            name = plan.options.stdin_filename or "-"
            data = (stdin or sys.stdin.buffer).read()
            if plan.options.force_exclude and plan.options.stdin_filename and excluded(name, plan.config):
                # ruff's --force-exclude: stdin named as an excluded file is passed through unchecked
                results[i] = FileResult(path=name, old_source=data, skipped=True)
                continue
            file_codes = codes_for(name, plan) if plan.options.stdin_filename else plan.codes
            too_big = _over_memory(name, data, plan.max_file_memory)
            if too_big is not None:
                results[i] = FileResult(path=name, old_source=data, skipped=True, notes=[too_big])
                continue
            job = (name, file_codes, plan.settings, fix, data)
            results[i] = isolated(job) if guard.risky(data.decode("utf-8", "replace")) else _work(job)
            results[i].old_source = data
            continue
        note = journals.recover(f)  # a rewrite killed half way through writing f: restored first
        if note is not None:
            notes.append(note)
        try:
            size = os.stat(f).st_size
            if plan.max_file_size and size > plan.max_file_size:
                why = (f"skipped, not analysed: {_size(size)} is over max-file-size ({_size(plan.max_file_size)}; "
                       "set `max-file-size` in [tool.ampfix] or --max-file-size to check it)")
                results[i] = FileResult(path=f, skipped=True, notes=[FileError(f, None, None, why, level="warning")])
                continue
            data, snapshots[f] = fileio.read_file(f)
        except OSError as exc:
            results[i] = FileResult(path=f, error=FileError(f, None, None, f"cannot read: {exc.strerror or exc}"))
            continue
        file_codes = codes_for(f, plan)
        text, first = None, None
        if store is not None:
            # the cache first (a content hash and one small read): a hit needs neither the
            # rules nor LibCST; a miss tests the triggers as ampfix/engine/rulemeta.py knows them
            # (without the rules), and only then loads the rules; every verdict is kept
            keys[i] = store.key(f, data, file_codes, plan.settings)
            hit = store.get(keys[i], f, file_codes)
            if hit is not None:
                results[i] = hit
                continue
            if not f.lower().endswith(".ipynb"):
                try:
                    text = decode_source(data, f).text
                except InputError as exc:
                    results[i] = FileResult(path=f, error=exc.error)
                    if cacheable(results[i]):
                        store.put(keys[i], results[i])
                    continue
                first = rulemeta.first_triggered(file_codes, text, info, plan.settings.project)
                if first is None:
                    results[i] = FileResult(path=f)
                    store.put(keys[i], results[i])
                    continue
            early = _needs_analysis(f, data, file_codes, tested, (first, text))
            if early is not None:  # not triggered after all (a rule's own `triggered_by`, a notebook)
                results[i] = early
                if cacheable(early):
                    store.put(keys[i], early)
                continue
        else:
            if not f.lower().endswith(".ipynb"):
                # the triggers as ampfix/engine/rulemeta.py knows them first: a file that holds none
                # needs neither the rules nor LibCST (a decoding error is `_needs_analysis`'s to report)
                try:
                    text = decode_source(data, f).text
                except InputError:
                    text = None
                first = rulemeta.first_triggered(file_codes, text, info, plan.settings.project) \
                    if text is not None else None
                if text is not None and first is None:
                    results[i] = FileResult(path=f)
                    continue
            early = _needs_analysis(f, data, file_codes, tested, (first, text))
            if early is not None:
                results[i] = early
                continue
        too_big = _over_memory(f, data, plan.max_file_memory)
        if too_big is not None:
            results[i] = FileResult(path=f, skipped=True, notes=[too_big])
            continue
        jobs.append((i, (f, file_codes, plan.settings, fix, data)))
    n = workers(plan.options.jobs, len(jobs))
    if n > 1 and sum(len(job[4]) for _, job in jobs) >= PARALLEL_MIN_BYTES:
        jobs.sort(key=lambda j: -len(j[1][4]))  # largest first: the pool stays balanced
        _pool(jobs, n, results)
    else:
        if tested is None and jobs:
            risky = _risky_jobs(jobs)
        for i, job in jobs:
            results[i] = isolated(job) if job[0] in risky else _work(job)
    if store is not None:
        for i, _ in jobs:
            if cacheable(results[i]):
                store.put(keys[i], results[i])
    if os.environ.get("AMPFIX_STATS"):
        _print_stats()
    if "ampfix.engine.analyze" in sys.modules:  # (a warm run imported neither it nor a project)
        sys.modules["ampfix.engine.analyze"].close_projects()
    return Run(plan, [results[i] for i in range(len(plan.files))], snapshots=snapshots, notes=notes)


def _print_stats() -> None:
    """`AMPFIX_STATS=1`: what this process parsed (for benchmarks; with -j 1 that is the run)."""
    if "ampfix.engine.analyze" not in sys.modules:
        print("ampfix stats: parsed 0, summaries parsed 0, summaries from the cache 0, summaries failed 0",
              file=sys.stderr)
        return
    from ampfix.engine import analyze

    projects = list(analyze._PROJECTS.values())
    parsed = sum(len(p.parsed) for p in projects)  # type: ignore[attr-defined]
    stored = sum(p.from_store for p in projects)  # type: ignore[attr-defined]
    failed = [u for p in projects for u in p.unsummarised]  # type: ignore[attr-defined]
    print(f"ampfix stats: parsed {analyze.STATS['parsed']}, summaries parsed {parsed}, "
          f"summaries from the cache {stored}, summaries failed {len(failed)}", file=sys.stderr)
    for path, error in failed:
        print(f"ampfix stats, no summary of {path}: {error}", file=sys.stderr)


def _over_memory(path: str, data: bytes, limit: int) -> Optional[FileError]:
    """A warning when analysing the file would take more memory than `limit` (estimated from
    its tokens before it is parsed, see ampfix/engine/budget.py), else None."""
    from ampfix.engine import budget

    if not limit or len(data) * (budget.BYTES_PER_TOKEN + budget.BYTES_PER_BYTE) <= limit:
        return None  # cannot be over: at most one token per byte
    text = data.decode("utf-8", "replace")
    need = budget.estimate(text)
    if need <= limit:
        return None
    return FileError(path, None, None,
                     f"skipped, not analysed: analysing it would take about {_size(need)} of memory "
                     f"({budget.tokens(text)} tokens), over max-file-memory ({_size(limit)}; set `max-file-memory` "
                     "in [tool.ampfix] to check it)", level="warning")


def _size(n: int) -> str:
    for unit, k in (("GiB", 1024 ** 3), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if n >= k:
            return f"{n / k:.1f} {unit}"
    return f"{n} bytes"


# ----------------------------------------------------------------------------- writing


def write_atomically(path: str, data: bytes) -> None:
    """Replace `path` with `data` safely (see `ampfix.engine.fileio.write_fixed`)."""
    fileio.write_fixed(path, data, None)


def write_fixes(run_: Run) -> List[str]:
    """Write every changed file back (re-checked, locked, see ampfix/engine/fileio.py); returns one
    error line per file that was not written. A file not written counts no fix: its result
    gets its findings back, as `check` reports them. A file given under two names (hard links,
    a symlink and its target: the same device and inode) is written once."""
    errors = []
    fileio.sweep_folders(f for f in run_.plan.files if f != "-")  # temp files a killed run left
    written: Dict[Tuple[int, int], Tuple[str, bytes]] = {}
    for i, (f, r) in enumerate(zip(run_.plan.files, run_.results)):
        if f == "-" or r.error is not None or r.new_source is None:
            continue
        snapshot = run_.snapshots.get(f)
        same = written.get(snapshot.identity) if snapshot is not None else None
        if same is not None:
            if same[1] == r.new_source:  # written already, under its other name: the fixes count once
                r.new_source, r.fixed, r.found = None, {}, {}
                continue
            errors.append(f"{r.path}: error: not rewritten: it is the same file as {same[0]} (a link), which this run "
                          "rewrote with other fixes (other per-file settings); run ampfix again")
            _unfixed(run_, f, r, same[1])
            continue
        try:
            fileio.write_fixed(r.path, r.new_source, snapshot)
            if snapshot is not None:
                written[snapshot.identity] = (r.path, r.new_source)
            continue
        except fileio.WriteRefused as exc:
            errors.append(f"{r.path}: error: {exc}")
        except fileio.RestorePending as exc:
            errors.append(f"{r.path}: error: {exc.strerror}")
        except OSError as exc:
            errors.append(f"{r.path}: error: cannot write: {exc.strerror or exc}; nothing was written")
        _unfixed(run_, f, r, r.old_source)
    return errors


def _unfixed(run_: Run, f: str, r: FileResult, source: Optional[bytes]) -> None:
    """`r` as `check` reports the file with `source` in it (its fixes were not written)."""
    check_only = replace(run_.plan.settings, add_noqa=False)
    unfixed = _work((f, codes_for(f, run_.plan), check_only, False, source)) if source is not None else None
    r.new_source, r.fixed, r.found = None, {}, {}
    if unfixed is not None and unfixed.error is None:
        r.diagnostics = unfixed.diagnostics
