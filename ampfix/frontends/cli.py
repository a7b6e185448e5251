"""The `ampfix` command line: check, rewrite, rules, explain (and verify)."""

from __future__ import annotations

import errno
import json
import os
import sys
from collections import Counter
from typing import List, Optional, Sequence

import click

from ampfix import __version__

from ampfix.formats import reporters

from ampfix.engine import runner, signals
from ampfix.engine.results import Diagnostic

# the registry (the rules, LibCST) is imported where it is needed: a warm `check` (every file a
# cache hit) never needs it (see ampfix/engine/rulemeta.py)


def all_rules():
    from ampfix.engine.registry import all_rules as rules

    return rules()


def find_rule(code):
    from ampfix.engine.registry import find_rule as find

    return find(code)

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


class UsageError(click.UsageError):
    exit_code = EXIT_ERROR


def _plan(paths, select, ignore, config_file, min_torch, force_exclude, stdin_filename, jobs, fix=False,
          unsafe=False, details=False, add_noqa=False) -> runner.Plan:
    meta = click.get_current_context().meta
    if stdin_filename is not None and "-" not in paths:
        raise UsageError(f"--stdin-filename {stdin_filename} names the code read from stdin: add `-` to the paths "
                         "(`ampfix check --stdin-filename NAME -`)")
    options = runner.Options(paths=paths, select=select, ignore=ignore,
                             extend_select=meta.get("ampfix.extend_select") or (), config_file=config_file,
                             min_torch_version=min_torch, force_exclude=force_exclude,
                             stdin_filename=stdin_filename, fix=fix, unsafe_fixes=unsafe, jobs=jobs,
                             details=details, add_noqa=add_noqa, max_file_size=meta.get("ampfix.max_file_size"),
                             no_cache=bool(meta.get("ampfix.no_cache")), preview=meta.get("ampfix.preview"))
    try:
        return runner.make_plan(options)
    except runner.OptionsError as exc:
        if exc.in_config:  # one line naming the file and the key, not a usage message
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_ERROR)
        raise UsageError(str(exc)) from None


def _report_errors(lines: Sequence[str]) -> int:
    for line in lines:
        click.echo(line, err=True)
    return len(lines)


def _format_diag(d: Diagnostic, show_fix: bool = True) -> str:
    return reporters.concise(d)


class _Output:
    """Where the report goes: stdout (or stderr), or the file named by `-o/--output-file`."""

    def __init__(self, path: Optional[str], err: bool = False):
        self.path, self.err = path, err
        self.fh = None
        if path is not None and path != "-":
            try:
                folder = os.path.dirname(path)
                if folder:
                    os.makedirs(folder, exist_ok=True)  # as ruff does: the report's folder is made
                self.fh = open(path, "w", encoding="utf-8", newline="\n")
            except OSError as exc:
                raise UsageError(f"--output-file: cannot write {path}: {exc.strerror or exc}") from None

    def echo(self, text: str = "", nl: bool = True) -> None:
        try:
            click.echo(text, nl=nl, file=self.fh, err=self.err and self.fh is None)
        except BrokenPipeError:
            if self.fh is None:
                raise  # the reader of stdout went away (`ampfix check | head -1`): see _Main.invoke
            raise _ReportWriteError(f"cannot write the report to {self.path}: broken pipe") from None
        except OSError as exc:
            where = self.path if self.fh is not None else ("stderr" if self.err else "stdout")
            raise _ReportWriteError(f"cannot write the report to {where}: {exc.strerror or exc}") from None

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()


def _output_options(f):
    f = click.option("-o", "--output-file", default=None, metavar="FILE",
                     help="Write the report to FILE instead of stdout.")(f)
    f = click.option("--output-format", type=click.Choice(reporters.all_formats()), default="concise",
                     show_default=True,
                     help="concise: one line per finding (`text` is an alias); full: with the source line and "
                          "the fix as a diff; json; json-lines; sarif (SARIF 2.1.0, for code scanning); github "
                          "(GitHub Actions annotations).")(f)
    return f


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


# ----------------------------------------------------------------------------- commands

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class _ReportWriteError(Exception):
    pass


_FREEZE_AT_EXIT = []


def _no_final_collection() -> None:
    """At the interpreter's exit, everything still alive frozen (`gc.freeze`), once per process:
    CPython's finalization collects every generation, a traversal of all that a run leaves
    alive (LibCST, the rules, the results: 50 ms of a 1.05 s check of timm, bench/SPEED.md)
    for a process that is ending. Registered at exit only, so a process that runs the CLI in
    itself (the tests' CliRunner) keeps its collector as it was until it exits."""
    if not _FREEZE_AT_EXIT:
        import atexit
        import gc

        _FREEZE_AT_EXIT.append(True)
        atexit.register(gc.freeze)


class _Main(click.Group):
    """The command group: a report that cannot be written (a full disk, `/dev/full`, a closed
    pipe) ends the run with one line on stderr and exit status 2, not a traceback; Ctrl-C and
    SIGTERM/SIGHUP end it with 128 + the signal's number (130, 143, 129), after the clean-up
    (see ampfix/engine/signals.py)."""

    def list_commands(self, ctx):
        names = super().list_commands(ctx)
        return sorted({*names, *(n for n in ("verify",) if _optional_command(n) is not None)})

    def get_command(self, ctx, name):
        return super().get_command(ctx, name) or _optional_command(name)

    def invoke(self, ctx):
        _no_final_collection()
        try:
            with signals.terminable():  # SIGTERM/SIGHUP: clean up on the way out, like Ctrl-C
                return super().invoke(ctx)
        except BrokenPipeError:
            # the reader went away (`ampfix check | head -1`): exit quietly, with the status the
            # run had when its report was cut (findings: 1), as a Unix filter does
            _silence_stdout()
            ctx.exit(ctx.meta.get("ampfix.status", EXIT_CLEAN))
        except (KeyboardInterrupt, signals.Terminated) as exc:  # workers, children, temp folders are gone
            signals.leave(signals.exit_status(exc))
        except _ReportWriteError as exc:
            _silence_stdout()
            click.echo(f"error: {exc}", err=True)
            ctx.exit(EXIT_ERROR)
        except OSError as exc:
            if exc.filename is not None or exc.errno not in _OUTPUT_ERRNOS:
                raise
            if exc.errno == errno.EPIPE:
                _silence_stdout()
                ctx.exit(ctx.meta.get("ampfix.status", EXIT_CLEAN))
            _silence_stdout()
            click.echo(f"error: cannot write the report to stdout: {exc.strerror or exc}", err=True)
            ctx.exit(EXIT_ERROR)


_OUTPUT_ERRNOS = {getattr(errno, n) for n in ("ENOSPC", "EPIPE", "EIO", "EBADF", "EFBIG", "EDQUOT")
                  if hasattr(errno, n)}


def _silence_stdout() -> None:
    """Drop what is left in stdout's buffer (so that exiting does not fail on it again)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


@click.group(context_settings=CONTEXT, cls=_Main)
@click.version_option(__version__, prog_name="ampfix")
def main() -> None:
    """Find and fix PyTorch automatic mixed precision (AMP) mistakes."""


def _store_param(ctx, param, value):
    """Options read by `_plan` from the context (so the commands' signatures stay as they are)."""
    ctx.meta[f"ampfix.{param.name}"] = value
    return value


def _common(f):
    f = click.option("--select", multiple=True, metavar="CODES",
                     help="Rule codes or prefixes to enable (comma separated; overrides the config).")(f)
    f = click.option("--ignore", multiple=True, metavar="CODES", help="Rule codes or prefixes to disable.")(f)
    f = click.option("--extend-select", multiple=True, metavar="CODES", expose_value=False, callback=_store_param,
                     help="Rule codes or prefixes to enable on top of the selection (`--select`, else the "
                          "config's, else the default set).")(f)
    f = click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
                     help="Use this pyproject.toml instead of the nearest one.")(f)
    f = click.option("--min-torch-version", default=None, metavar="X.Y",
                     help="Oldest torch the code must support (default: min-torch-version in the config, else "
                          "the project's requirement on torch, else 2.4).")(f)
    f = click.option("--stdin-filename", default=None, metavar="NAME",
                     help="The name of the code read from stdin (`-` among the paths): reported, matched by "
                          "per-file-ignores and, with --force-exclude, by exclude.")(f)
    f = click.option("--force-exclude", is_flag=True,
                     help="Apply `exclude` to paths named on the command line too (for pre-commit).")(f)
    f = click.option("-q", "--quiet", is_flag=True, help="Print findings only, no summary.")(f)
    f = click.option("-j", "--jobs", type=click.IntRange(min=1), default=None, metavar="N",
                     help="Worker processes that analyse files in parallel (default: the AMPFIX_WORKERS "
                          "environment variable, else one per CPU; small runs stay in one process).")(f)
    f = click.option("--max-file-size", default=None, metavar="SIZE", expose_value=False, is_eager=False,
                     callback=_store_param,
                     help="Skip (and report) files larger than SIZE, e.g. 10MB (default: max-file-size in "
                          "[tool.ampfix], else 4MiB).")(f)
    f = click.option("--no-cache", is_flag=True, expose_value=False, callback=_store_param,
                     help="Neither read nor write the cache (.ampfix_cache/, or AMPFIX_CACHE_DIR).")(f)
    f = click.option("--preview/--no-preview", "preview", default=None, expose_value=False, callback=_store_param,
                     help="Also run the preview rules: new ones, and those whose measured precision on real "
                          "projects is below 0.95 (default: `preview` in [tool.ampfix], else off).")(f)
    f = click.argument("paths", nargs=-1, type=click.Path(allow_dash=True))(f)
    return f


def _status(status: int) -> int:
    """Remember the exit status before the report is written (a broken pipe ends with it)."""
    click.get_current_context().meta["ampfix.status"] = status
    return status


@main.command(context_settings=CONTEXT)
@_common
@_output_options
@click.option("--fix", is_flag=True, help="Apply the safe fixes in place, as `ampfix rewrite` does (with "
                                          "--unsafe-fixes, the unsafe ones too), and report what is left.")
@click.option("--unsafe-fixes", is_flag=True, help="With --fix or --diff: also apply fixes that may change "
                                                   "behaviour. Without: count them as fixable in the summary.")
@click.option("--diff", is_flag=True, help="Print the diff --fix would make, write nothing (exit 1 when "
                                           "something would change).")
@click.option("--exit-non-zero-on-fix", is_flag=True, help="With --fix: exit 1 when a file was changed.")
@click.option("--statistics", is_flag=True, help="Count findings per rule instead of listing them "
                                                 "(`--output-format json` for a JSON list).")
@click.option("--exit-zero", is_flag=True, help="Exit 0 even when there are findings.")
@click.option("--add-noqa", is_flag=True,
              help="Add `# noqa: CODE` to the line of each finding (merged with an existing noqa), so the "
                   "check can gate new code today and the old findings be fixed later.")
@click.option("--show-settings", is_flag=True, help="Print the settings that apply (configuration file, the "
                                                    "rules selected, exclusions, ...) and exit.")
@click.option("--show-files", is_flag=True, help="Print the files that would be checked and exit.")
def check(paths, select, ignore, config_file, min_torch_version, stdin_filename, force_exclude, quiet, jobs,
          output_format, output_file, fix, unsafe_fixes, diff, exit_non_zero_on_fix, statistics, exit_zero,
          add_noqa, show_settings, show_files) -> None:
    """Report AMP mistakes in PATHS (files, folders, `-` for stdin; default: .).

    With --fix, apply the safe fixes too (as `ampfix rewrite`). Exit status: 0 clean, 1
    findings, 2 usage or input errors.
    """
    fmt = reporters.canonical(output_format)
    if show_settings or show_files:
        plan = _plan(paths, select, ignore, config_file, min_torch_version, force_exclude, stdin_filename, jobs,
                     fix=fix or diff, unsafe=unsafe_fixes)
        out = _Output(output_file)
        out.echo(_settings_text(plan, fmt) if show_settings else "".join(f + "\n" for f in plan.files), nl=False)
        out.close()
        sys.exit(EXIT_CLEAN)
    if add_noqa:
        if fix or diff or statistics:
            raise UsageError("--add-noqa silences the findings; it does not go with --fix, --diff or --statistics")
        if "-" in paths:
            raise UsageError("--add-noqa edits files in place; it cannot read stdin")
        _add_noqa(paths, select, ignore, config_file, min_torch_version, stdin_filename, force_exclude, quiet, jobs)
        return
    if fix or diff:
        if statistics:
            raise UsageError("--statistics counts findings; with --fix, the summary counts what was fixed")
        _fix(paths, select, ignore, config_file, min_torch_version, stdin_filename, force_exclude, quiet, jobs,
             output_format, output_file, diff, unsafe_fixes, exit_non_zero_on_fix, exit_zero, "check --fix")
        return
    if statistics and fmt not in (*reporters.TEXT_FORMATS, "json", "json-lines"):
        raise UsageError(f"--statistics prints a table or, with --output-format json / json-lines, JSON; "
                         f"not {output_format}")
    plan = _plan(paths, select, ignore, config_file, min_torch_version, force_exclude, stdin_filename, jobs,
                 details=fmt in reporters.DETAIL_FORMATS and not statistics)
    result = runner.run(plan)
    _report_errors(result.warnings)
    n_errors = _report_errors(result.errors)
    diags = result.diagnostics
    out = _Output(output_file)
    status = _status(EXIT_ERROR if n_errors else EXIT_FINDINGS if diags and not exit_zero else EXIT_CLEAN)
    if statistics:
        from ampfix.engine import registry, rulemeta

        rules = rulemeta.rule_info(registry.rule_facts, runner._cache_folder(plan.options, plan.config))
        out.echo(reporters.statistics(fmt, diags, {c: r.name for c, r in rules.items()}), nl=False)
    elif fmt in reporters.TEXT_FORMATS:
        out.echo(reporters.render(fmt, diags), nl=False)
        if not quiet:
            _summary(diags, result.n_checked, n_errors, out.echo, unsafe_fixes)
    else:
        out.echo(reporters.render(fmt, diags, _sarif_rules(plan) if fmt == "sarif" else None,
                                  errors=result.error_objects()), nl=False)
    out.close()
    sys.exit(status)


def _sarif_rules(plan: runner.Plan):
    rules = all_rules()
    return {code: rules[code] for code in plan.codes}


def _settings_text(plan: runner.Plan, fmt: str) -> str:
    """`check --show-settings`: what applies to this run, resolved (the rules as the list of
    codes that will run, whatever selected them)."""
    from ampfix.engine import registry, rulemeta
    from ampfix.engine.cache import cache_dir

    info = rulemeta.rule_info(registry.rule_facts)
    cfg = plan.config
    options = plan.options
    cache = None if options.no_cache else str(cache_dir(cfg.root))
    settings = {
        "config-file": None if cfg.path is None else str(cfg.path),
        "project-root": str(cfg.root),
        "rules": list(plan.codes),
        "select": list(options.select) or cfg.select,
        "extend-select": [*cfg.extend_select, *(click.get_current_context().meta.get("ampfix.extend_select") or ())],
        "ignore": [*cfg.ignore, *options.ignore],
        "per-file-ignores": cfg.per_file_ignores,
        "exclude": cfg.exclude,
        "force-exclude": bool(options.force_exclude),
        "min-torch-version": ".".join(map(str, plan.settings.min_torch_version)),
        # where the project declares a Lightning before 2.0 (AMP204 is silent then); null: it does not
        "lightning-before-2": plan.settings.lightning_before_2 or None,
        # where the project admits only a torch before 2.4 (AMP101 is silent then); null: it does not
        "torch-before-2-4": plan.settings.torch_before_2_4 or None,
        "max-file-size": plan.max_file_size,
        "unsafe-fixes": bool(options.unsafe_fixes),
        "cache-dir": cache,
        "files": len(plan.files),
    }
    if fmt in ("json", "json-lines"):
        return json.dumps(settings, indent=2 if fmt == "json" else None) + "\n"
    lines = [f"# ampfix {__version__}: the settings of this run"]
    for key, value in settings.items():
        if key == "rules":
            lines.append(f"rules = [  # {len(value)} rules run")
            lines.extend(f'    "{c}",  # {info[c].name}' for c in value)
            lines.append("]")
        else:
            lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"


def _add_noqa(paths, select, ignore, config_file, min_torch_version, stdin_filename, force_exclude, quiet, jobs):
    plan = _plan(paths, select, ignore, config_file, min_torch_version, force_exclude, stdin_filename, jobs,
                 add_noqa=True)
    result = runner.run(plan)
    n_errors = _report_errors(result.errors)
    n_errors += _report_errors(runner.write_fixes(result))
    added = sum(sum(r.fixed.values()) for r in result.results if r.new_source is not None)
    files = sum(1 for r in result.results if r.new_source is not None and r.fixed)
    left = result.diagnostics
    for d in left:
        click.echo(reporters.concise(d) + "  (no line to put `# noqa` on)")
    if not quiet:
        click.echo(f"Added {_plural(added, 'noqa directive')} to {_plural(files, 'file')}.")
    if n_errors:
        sys.exit(EXIT_ERROR)
    sys.exit(EXIT_FINDINGS if left else EXIT_CLEAN)


def _summary(diags: Sequence[Diagnostic], n_files: int, n_errors: int, echo=click.echo,
             unsafe_fixes: bool = False) -> None:
    if not diags:
        if n_errors:
            echo(f"No findings in the files that could be checked ({_plural(n_errors, 'error')}).")
        else:
            echo(f"All checks passed! ({_plural(n_files, 'file')} checked)")
        return
    n_in = len({d.path for d in diags})
    echo(f"Found {_plural(len(diags), 'finding')} in {_plural(n_in, 'file')}"
               f" ({_plural(n_files, 'file')} checked).")
    safe = sum(1 for d in diags if d.fix == "safe")
    unsafe = sum(1 for d in diags if d.fix == "unsafe")
    if unsafe_fixes and safe + unsafe:
        echo(f"[*] {safe + unsafe} fixable with `ampfix check --fix --unsafe-fixes`.")
        return
    if safe:
        echo(f"[*] {safe} fixable with `ampfix check --fix`.")
    if unsafe:
        echo(f"[-] {unsafe} more fixable with `ampfix check --fix --unsafe-fixes`.")


@main.command(context_settings=CONTEXT)
@_common
@_output_options
@click.option("--diff", is_flag=True, help="Print a unified diff of the changes and write nothing "
                                           "(exit 1 when something would change).")
@click.option("--unsafe-fixes", is_flag=True, help="Also apply fixes that may change behaviour.")
@click.option("--exit-non-zero-on-fix", is_flag=True, help="Exit 1 when a file was changed.")
def rewrite(paths, select, ignore, config_file, min_torch_version, stdin_filename, force_exclude, quiet, jobs,
            output_format, output_file, diff, unsafe_fixes, exit_non_zero_on_fix) -> None:
    """Apply ampfix's fixes to PATHS in place (safe fixes; unsafe ones with --unsafe-fixes).

    The same as `ampfix check --fix`. With `-` the fixed source is written to stdout. The
    findings left are reported in --output-format. Exit status: 0 when nothing is left to
    report, 1 when findings remain (or with --diff, when something would change), 2 on errors.
    """
    _fix(paths, select, ignore, config_file, min_torch_version, stdin_filename, force_exclude, quiet, jobs,
         output_format, output_file, diff, unsafe_fixes, exit_non_zero_on_fix, False, "rewrite")


def _fix(paths, select, ignore, config_file, min_torch_version, stdin_filename, force_exclude, quiet, jobs,
         output_format, output_file, diff, unsafe_fixes, exit_non_zero_on_fix, exit_zero, command) -> None:
    """`ampfix rewrite` and `ampfix check --fix`: fix, write, report what is left (ruff's
    `check --fix` reporting: the findings left, then the fixes per rule and the counts)."""
    fmt = reporters.canonical(output_format)
    if diff and fmt not in reporters.TEXT_FORMATS:
        raise UsageError(f"--diff prints a unified diff; --output-format {output_format} does not apply to it "
                         "(use `ampfix check --output-format full` to see each fix as a diff)")
    plan = _plan(paths, select, ignore, config_file, min_torch_version, force_exclude, stdin_filename, jobs,
                 fix=True, unsafe=unsafe_fixes, details=fmt in reporters.DETAIL_FORMATS)
    result = runner.run(plan)
    files, results = plan.files, result.results
    _report_errors(result.warnings)
    n_errors = _report_errors(result.errors)
    write_errors: List[str] = []
    if not diff:
        write_errors = runner.write_fixes(result)
        n_errors += _report_errors(write_errors)
    out_err = "-" in files and not diff  # stdout carries the code: report on stderr
    out = _Output(output_file, err=out_err)
    changed = sum(1 for r, f in zip(results, files) if r.error is None and r.new_source is not None)
    remaining = result.diagnostics
    if n_errors:
        status = EXIT_ERROR
    elif diff:
        status = EXIT_FINDINGS if changed else EXIT_CLEAN
    elif (remaining and not exit_zero) or (exit_non_zero_on_fix and changed):
        status = EXIT_FINDINGS
    else:
        status = EXIT_CLEAN
    _status(status)
    for r, f in zip(results, files):
        if r.error is not None or (r.new_source is None and f != "-"):
            continue
        if f == "-" and not diff:
            sys.stdout.buffer.write(r.new_source if r.new_source is not None else (r.old_source or b""))
            sys.stdout.buffer.flush()
        elif diff and r.new_source is not None:
            out.echo(reporters.file_diff(r), nl=False)
    if not diff:
        text = reporters.render(fmt, remaining, _sarif_rules(plan), errors=result.error_objects(write_errors))
        if text or fmt not in reporters.TEXT_FORMATS:
            out.echo(text, nl=False)
    if not quiet:
        say = out.echo if fmt in reporters.TEXT_FORMATS else (lambda t: click.echo(t, err=True))
        for line in fix_summary(results, diff, unsafe_fixes):
            say(line)
    out.close()
    sys.exit(status)


def fix_summary(results: Sequence["runner.FileResult"], diff: bool = False, unsafe_fixes: bool = False) -> list:
    """The summary of a rewrite, ruff-style: the findings fixed per rule (only in files that
    were written, or with --diff would be), the edits that came with them, what is left.

    The remaining findings are a fresh check of the written text (the fix loop re-analyses what
    it writes), and a finding counts as fixed when `check` reported it before the rewrite and it
    is gone after, so found = fixed + remaining; the other edits are follow-ups (an import
    rewritten once its last use was). A file that could not be written fixed nothing."""
    rules = all_rules()
    fixed: Counter = Counter()
    edits: Counter = Counter()
    by_what: dict = {}
    found_total = 0
    added = 0
    n_files = 0
    for r in results:
        left = Counter(d.code for d in r.diagnostics)
        applied: Counter = Counter()
        for key, n in (r.fixed if r.new_source is not None else {}).items():
            code = key.split(":", 1)[0]
            applied[code] += n
            what = key.split(": ", 1)[1] if ": " in key else ""
            by_what.setdefault(code, Counter())[what] += n
        found = Counter(r.found) if r.found else left + applied
        if r.new_source is None and not r.found:
            found = left
        found_total += sum(found.values())
        if r.new_source is not None:
            for code in set(found) | set(left):
                fixed[code] += max(0, found[code] - left[code])
                added += max(0, left[code] - found[code])
            edits.update(applied)
            n_files += bool(applied)
    n_fixed = sum(fixed.values())
    remaining = sum(len(r.diagnostics) for r in results)
    lines = []
    verb = "Would fix" if diff else "Fixed"
    if edits:
        lines.append(f"{verb} {_plural(n_fixed, 'finding')} in {_plural(n_files, 'file')}:")
        for code in sorted(set(edits) | {c for c, n in fixed.items() if n}):
            extra = edits[code] - fixed[code]
            more = f"  (+{_plural(extra, 'follow-up edit')})" if extra > 0 else ""
            name = rules[code].name if code in rules else ""
            lines.append(f"  {fixed[code]:>4}  {code}  {name}{more}")
            for what, n in sorted(by_what.get(code, {}).items()):
                if what:
                    lines.append(f"          {n:>4}  {what}")
    else:
        lines.append("Nothing to fix.")
    if edits or remaining:
        how = "would be fixed" if diff else "fixed"
        new = f", {added} added by the fixes" if added else ""
        lines.append(f"Found {_plural(found_total + added, 'finding')} ({n_fixed} {how}, {remaining} remaining{new}).")
    if remaining:
        unsafe = sum(1 for r in results for d in r.diagnostics if d.fix == "unsafe")
        extra = f" ({unsafe} fixable with `--unsafe-fixes`)" if unsafe and not unsafe_fixes else ""
        lines.append(f"{_plural(remaining, 'finding')} remaining{extra}.")
    return lines


@main.command(name="rules", context_settings=CONTEXT)
@click.option("--output-format", type=click.Choice(["text", "json", "markdown"]), default="text", show_default=True)
def rules_cmd(output_format: str) -> None:
    """List the rules (`markdown`: the README's rule table)."""
    from ampfix.knowledge import precision

    rules = all_rules()
    if output_format == "json":
        out = []
        for r in rules.values():
            m = precision.measured(r.code)
            out.append({"code": r.code, "name": r.name, "fix": r.fixable, "message": r.message,
                        "default_enabled": r.default_enabled, "preview": r.in_preview(),
                        "precision": None if m is None else {"value": round(m.precision, 4), "true": m.true,
                                                             "false": m.false, "debatable": m.debatable,
                                                             "source": m.source}})
        click.echo(json.dumps(out, indent=2))
        return
    if output_format == "markdown":
        click.echo(rules_table(rules.values()), nl=False)
        return
    for r in rules.values():
        off = "" if r.default_enabled else f" (off by default: --select {r.code}, or ALL)"
        off += " (preview)" if r.in_preview() else ""
        click.echo(f"{r.code}  {r.name:<34} fix: {r.fixable:<9} {r.message}{off}")


def rules_table(rules) -> str:
    """The README's rule table, generated from the rules (a test keeps the README in step)."""
    from ampfix.knowledge import precision

    lines = ["| code | name | fix | precision (judged findings) |", "|---|---|---|---|"]
    for r in rules:
        note = (r.fix_note or r.fixable).replace("|", "\\|")
        if not r.default_enabled:
            note += f"; off by default: select it as `{r.code}` (or `ALL`)"
        measured = precision.short(r.code) + (", preview" if r.in_preview() else "")
        lines.append(f"| {r.code} | {r.name} | {note} | {measured} |")
    return "\n".join(lines) + "\n"


@main.command(context_settings=CONTEXT)
@click.argument("code")
def explain(code: str) -> None:
    """Print a rule's documentation (by code, e.g. AMP003, or by name)."""
    rule = find_rule(code)
    if rule is None:
        raise UsageError(f"unknown rule {code!r}; `ampfix rules` lists them")
    from ampfix.knowledge import precision

    click.echo(f"# {rule.code} {rule.name}\n")
    click.echo(f"Fix: {rule.fixable}\n")
    click.echo(f"Measured: {precision.note(rule.code)}\n")
    if rule.in_preview():
        click.echo("Preview: runs only with `--preview` (or `preview = true` in [tool.ampfix]).\n")
    click.echo(f"{rule.message}\n")
    click.echo(rule.docs.strip("\n"))


@main.command(context_settings=CONTEXT)
def server() -> None:
    """Run the language server on stdin/stdout (for editors; needs `ampfix[server]`).

    It publishes diagnostics on open, change and save, and offers each fix as a code action
    and "apply all safe fixes" as a source.fixAll action.
    """
    try:
        from ampfix.frontends.server import main as serve
    except ImportError as exc:
        raise UsageError(f'the language server needs pygls ({exc}): pip install "ampfix[server]"') from None
    serve()


def _optional_command(name: str):
    """`verify`, imported when it is asked for (or listed): the verifier is optional, and
    check/rewrite never need it."""
    if name != "verify":
        return None
    try:
        from ampfix.verify.command import verify
    except ImportError:
        return None
    return verify
