"""The `ampfix` command line: check, rewrite, rules, explain (and verify)."""

from __future__ import annotations

import difflib
import json
import os
import stat
import sys
import tempfile
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import click

from ampfix import __version__
from ampfix.config import Config, ConfigError, parse_version, resolve_config
from ampfix.discovery import discover, matches_any
from ampfix.engine import Diagnostic, FileError, FileResult, InputError, Settings, decode_source, process_bytes, triggered
from ampfix.registry import SelectionError, all_rules, find_rule, select_rules, validate_selectors

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2
PARALLEL_MIN_BYTES = 64 * 1024  # below this a process pool costs more than it saves


class UsageError(click.UsageError):
    exit_code = EXIT_ERROR


def _split(values: Sequence[str]) -> List[str]:
    out: List[str] = []
    for v in values:
        out.extend(p for p in v.replace(" ", ",").split(",") if p)
    return out


# ----------------------------------------------------------------------------- running


def _work(job: Tuple[str, Tuple[str, ...], Settings, bool, bytes]) -> FileResult:
    path, codes, settings, fix, data = job
    rules = all_rules()
    try:
        return process_bytes(data, path, [rules[c] for c in codes], settings, fix=fix)
    except Exception as exc:  # an internal error must not cost the other files their check
        return FileResult(path=path, error=FileError(path, None, None, f"internal error: {type(exc).__name__}: {exc} "
                                                                       "(please report this file)"))


def _needs_analysis(path: str, data: bytes, codes: Sequence[str]) -> Optional[FileResult]:
    """A result right away for a file no selected rule can fire on (or that cannot be
    decoded); None when it must be parsed and analysed."""
    try:
        src = decode_source(data, path)
    except InputError as exc:
        return FileResult(path=path, error=exc.error)
    rules = all_rules()
    if triggered([rules[c] for c in codes], src.text):
        return None
    return FileResult(path=path)


def _codes_for(path: str, config: Config, base_codes: Sequence[str]) -> Tuple[str, ...]:
    ignored: List[str] = []
    for glob, codes in config.per_file_ignores.items():
        if matches_any(Path(path), config.root, [glob]):
            ignored.extend(c.upper() for c in codes)
    return tuple(c for c in base_codes if not any(c.startswith(i) or i == "ALL" for i in ignored))


def _run(files: Sequence[str], config: Config, codes: Sequence[str], settings: Settings, fix: bool,
         stdin_filename: Optional[str]) -> List[FileResult]:
    """Read and pre-filter every file here (cheap), then parse and analyse only the files
    that contain a selected rule's trigger, in parallel when that is worth a process pool."""
    jobs = []
    results: Dict[int, FileResult] = {}
    for i, f in enumerate(files):
        if f == "-":
            name = stdin_filename or "-"
            data = sys.stdin.buffer.read()
            file_codes = _codes_for(name, config, codes) if stdin_filename else tuple(codes)
            results[i] = _work((name, file_codes, settings, fix, data))
            results[i].old_source = data
            continue
        try:
            data = Path(f).read_bytes()
        except OSError as exc:
            results[i] = FileResult(path=f, error=FileError(f, None, None, f"cannot read: {exc.strerror or exc}"))
            continue
        file_codes = _codes_for(f, config, codes)
        early = _needs_analysis(f, data, file_codes)
        if early is not None:
            results[i] = early
        else:
            jobs.append((i, (f, file_codes, settings, fix, data)))
    try:
        wanted = int(os.environ.get("AMPFIX_WORKERS", "0"))
    except ValueError:
        wanted = 0
    workers = min(wanted if wanted > 0 else (os.cpu_count() or 1), len(jobs))
    if workers > 1 and sum(len(job[4]) for _, job in jobs) >= PARALLEL_MIN_BYTES:
        jobs.sort(key=lambda j: -len(j[1][4]))  # largest first: the pool stays balanced
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for (i, _), res in zip(jobs, pool.map(_work, [j for _, j in jobs], chunksize=1)):
                results[i] = res
    else:
        for i, job in jobs:
            results[i] = _work(job)
    return [results[i] for i in range(len(files))]


def _prepare(paths: Sequence[str], select: Sequence[str], ignore: Sequence[str], config_file: Optional[str],
             min_torch: Optional[str], force_exclude: bool, unsafe: bool):
    paths = list(paths) or ["."]
    try:
        config = resolve_config(paths, config_file)
        cli_select = validate_selectors(_split(select), "--select") if select else None
        cli_ignore = validate_selectors(_split(ignore), "--ignore")
        cfg_select = validate_selectors(config.select, f"{config.path}: select") if config.select is not None else None
        cfg_ignore = validate_selectors(config.ignore, f"{config.path}: ignore")
        for glob, codes in config.per_file_ignores.items():
            validate_selectors(codes, f"{config.path}: per-file-ignores {glob!r}")
        min_version = parse_version(min_torch, "--min-torch-version") if min_torch else config.min_torch_version
    except (ConfigError, SelectionError) as exc:
        raise UsageError(str(exc)) from None
    selection = cli_select if cli_select is not None else cfg_select
    rules = select_rules(selection, cfg_ignore + cli_ignore)
    files, missing = discover(paths, config.exclude, config.root, force_exclude=force_exclude)
    settings = Settings(min_torch_version=min_version, unsafe_fixes=unsafe)
    return config, [r.code for r in rules], files, missing, settings


def _report_errors(results: Sequence[FileResult], missing: Sequence[str]) -> int:
    n = 0
    for m in missing:
        click.echo(f"{m}: error: no such file or directory", err=True)
        n += 1
    for r in results:
        if r.error is not None:
            click.echo(str(r.error), err=True)
            n += 1
    return n


def _format_diag(d: Diagnostic, show_fix: bool = True) -> str:
    mark = ""
    if show_fix and d.fix == "safe":
        mark = "[*] "
    elif show_fix and d.fix == "unsafe":
        mark = "[-] "
    code = click.style(d.code, fg="red", bold=True)
    loc = click.style(d.path, bold=True) + f":{d.line}:{d.column}:"
    return f"{loc} {code} {mark}{d.message}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


# ----------------------------------------------------------------------------- commands

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, prog_name="ampfix")
def main() -> None:
    """Find and fix PyTorch automatic mixed precision (AMP) mistakes."""


def _common(f):
    f = click.option("--select", multiple=True, metavar="CODES",
                     help="Rule codes or prefixes to enable (comma separated; overrides the config).")(f)
    f = click.option("--ignore", multiple=True, metavar="CODES", help="Rule codes or prefixes to disable.")(f)
    f = click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
                     help="Use this pyproject.toml instead of the nearest one.")(f)
    f = click.option("--min-torch-version", default=None, metavar="X.Y",
                     help="Oldest torch the code must support (default: config, else 2.4).")(f)
    f = click.option("--stdin-filename", default=None, help="The name to report for `-` (stdin).")(f)
    f = click.option("--force-exclude", is_flag=True,
                     help="Apply `exclude` to paths named on the command line too (for pre-commit).")(f)
    f = click.option("-q", "--quiet", is_flag=True, help="Print findings only, no summary.")(f)
    f = click.argument("paths", nargs=-1, type=click.Path(allow_dash=True))(f)
    return f


@main.command(context_settings=CONTEXT)
@_common
@click.option("--output-format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--statistics", is_flag=True, help="Count findings per rule instead of listing them.")
@click.option("--exit-zero", is_flag=True, help="Exit 0 even when there are findings.")
def check(paths, select, ignore, config_file, min_torch_version, stdin_filename, force_exclude, quiet,
          output_format, statistics, exit_zero) -> None:
    """Report AMP mistakes in PATHS (files, folders, `-` for stdin; default: .).

    Exit status: 0 clean, 1 findings, 2 usage or input errors.
    """
    config, codes, files, missing, settings = _prepare(paths, select, ignore, config_file, min_torch_version,
                                                       force_exclude, unsafe=False)
    results = _run(files, config, codes, settings, fix=False, stdin_filename=stdin_filename)
    n_errors = _report_errors(results, missing)
    diags = [d for r in results for d in r.diagnostics]
    if output_format == "json":
        click.echo(json.dumps([d.to_json() for d in diags], indent=2))
    elif statistics:
        rules = all_rules()
        counts = Counter(d.code for d in diags)
        fixable = {d.code for d in diags if d.fix == "safe"}
        for code, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
            mark = "[*]" if code in fixable else "   "
            click.echo(f"{n:>5}\t{code}\t{mark} {rules[code].name}")
    else:
        for d in diags:
            click.echo(_format_diag(d))
        if not quiet:
            _summary(diags, len(files), n_errors)
    if n_errors:
        sys.exit(EXIT_ERROR)
    sys.exit(EXIT_FINDINGS if diags and not exit_zero else EXIT_CLEAN)


def _summary(diags: Sequence[Diagnostic], n_files: int, n_errors: int) -> None:
    if not diags:
        if n_errors:
            click.echo(f"No findings in the files that could be checked ({_plural(n_errors, 'error')}).")
        else:
            click.echo(f"All checks passed! ({_plural(n_files, 'file')} checked)")
        return
    n_in = len({d.path for d in diags})
    click.echo(f"Found {_plural(len(diags), 'finding')} in {_plural(n_in, 'file')}"
               f" ({_plural(n_files, 'file')} checked).")
    safe = sum(1 for d in diags if d.fix == "safe")
    unsafe = sum(1 for d in diags if d.fix == "unsafe")
    if safe:
        click.echo(f"[*] {safe} fixable with `ampfix rewrite`.")
    if unsafe:
        click.echo(f"[-] {unsafe} more fixable with `ampfix rewrite --unsafe-fixes`.")


def write_atomically(path: str, data: bytes) -> None:
    """Replace `path` with `data`: temp file in the same folder, same mode, fsync, rename."""
    target = Path(path)
    mode = stat.S_IMODE(target.stat().st_mode)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".ampfix.tmp", dir=str(target.parent))
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _decode_for_diff(data: bytes) -> str:
    return decode_source(data, "<diff>").text


@main.command(context_settings=CONTEXT)
@_common
@click.option("--diff", is_flag=True, help="Print a unified diff of the changes and write nothing "
                                           "(exit 1 when something would change).")
@click.option("--unsafe-fixes", is_flag=True, help="Also apply fixes that may change behaviour.")
@click.option("--exit-non-zero-on-fix", is_flag=True, help="Exit 1 when a file was changed.")
def rewrite(paths, select, ignore, config_file, min_torch_version, stdin_filename, force_exclude, quiet,
            diff, unsafe_fixes, exit_non_zero_on_fix) -> None:
    """Apply ampfix's fixes to PATHS in place (safe fixes; unsafe ones with --unsafe-fixes).

    With `-` the fixed source is written to stdout. Exit status: 0 when nothing is left to
    report, 1 when findings remain (or with --diff, when something would change), 2 on errors.
    """
    config, codes, files, missing, settings = _prepare(paths, select, ignore, config_file, min_torch_version,
                                                       force_exclude, unsafe=unsafe_fixes)
    results = _run(files, config, codes, settings, fix=True, stdin_filename=stdin_filename)
    n_errors = _report_errors(results, missing)
    changed = 0
    fixed_total: Counter = Counter()
    for r, f in zip(results, files):
        if r.error is not None:
            continue
        fixed_total.update(r.fixed)
        if f == "-":
            changed += r.new_source is not None
            if diff:
                if r.new_source is not None:
                    _print_diff(r)
            else:
                sys.stdout.buffer.write(r.new_source if r.new_source is not None else (r.old_source or b""))
                sys.stdout.buffer.flush()
            continue
        if r.new_source is None:
            continue
        changed += 1
        if diff:
            _print_diff(r)
        else:
            try:
                write_atomically(f, r.new_source)
            except OSError as exc:
                click.echo(f"{f}: error: cannot write: {exc.strerror or exc}", err=True)
                n_errors += 1
    remaining = [d for r in results for d in r.diagnostics]
    out_err = "-" in files and not diff  # stdout carries the code: report on stderr
    if not diff:
        for d in remaining:
            click.echo(_format_diag(d), err=out_err)
    if not quiet:
        n_fixed = sum(fixed_total.values())
        verb = "Would fix" if diff else "Fixed"
        if n_fixed:
            click.echo(f"{verb} {_plural(n_fixed, 'finding')} in {_plural(changed, 'file')}:", err=out_err)
            for key, n in sorted(fixed_total.items()):
                click.echo(f"  {n:>4}  {key}", err=out_err)
        else:
            click.echo("Nothing to fix.", err=out_err)
        if remaining:
            unsafe = sum(1 for d in remaining if d.fix == "unsafe")
            extra = f" ({unsafe} fixable with `--unsafe-fixes`)" if unsafe and not unsafe_fixes else ""
            click.echo(f"{_plural(len(remaining), 'finding')} remaining{extra}.", err=out_err)
    if n_errors:
        sys.exit(EXIT_ERROR)
    if diff:
        sys.exit(EXIT_FINDINGS if changed else EXIT_CLEAN)
    if remaining or (exit_non_zero_on_fix and changed):
        sys.exit(EXIT_FINDINGS)
    sys.exit(EXIT_CLEAN)


def _print_diff(r: FileResult) -> None:
    old = _decode_for_diff(r.old_source or b"")
    new = _decode_for_diff(r.new_source or b"")
    rel = not os.path.isabs(r.path)
    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                 fromfile=f"a/{r.path}" if rel else r.path, tofile=f"b/{r.path}" if rel else r.path)
    for line in lines:
        click.echo(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n", nl=False)


@main.command(name="rules", context_settings=CONTEXT)
@click.option("--output-format", type=click.Choice(["text", "json"]), default="text", show_default=True)
def rules_cmd(output_format: str) -> None:
    """List the rules."""
    rules = all_rules()
    if output_format == "json":
        click.echo(json.dumps([{"code": r.code, "name": r.name, "fix": r.fixable, "message": r.message}
                               for r in rules.values()], indent=2))
        return
    for r in rules.values():
        click.echo(f"{r.code}  {r.name:<34} fix: {r.fixable:<9} {r.message}")


@main.command(context_settings=CONTEXT)
@click.argument("code")
def explain(code: str) -> None:
    """Print a rule's documentation (by code, e.g. AMP003, or by name)."""
    rule = find_rule(code)
    if rule is None:
        raise UsageError(f"unknown rule {code!r}; `ampfix rules` lists them")
    click.echo(f"# {rule.code} {rule.name}\n")
    click.echo(f"Fix: {rule.fixable}\n")
    click.echo(f"{rule.message}\n")
    click.echo(rule.docs.strip("\n"))


def _register_optional_commands() -> None:
    try:
        from ampfix.verify.command import verify
    except ImportError:  # the verifier is optional; check/rewrite never need it
        return
    main.add_command(verify)


_register_optional_commands()
