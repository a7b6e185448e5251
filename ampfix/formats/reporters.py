"""Report formats shared by `ampfix check` and `ampfix rewrite`: text in two styles (`concise`,
one line per finding; `full`, with the source line, a caret and the fix as a diff), `json`,
`json-lines`, `sarif` (SARIF 2.1.0 for code scanning) and `github` (workflow-command
annotations). Each function returns the report as a string; the CLI decides where it goes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Type
from urllib.parse import quote

import click

from ampfix import REPOSITORY, __version__, rule_url
from ampfix.engine.results import Diagnostic, FileError, FileResult, decode_source, diff_names, unified_diff

if TYPE_CHECKING:  # the rules (and LibCST) are not needed to report
    from ampfix.rule import Rule

FORMATS = ("concise", "full", "json", "json-lines", "sarif", "github")
ALIASES = {"text": "concise"}
TEXT_FORMATS = ("concise", "full")
#: formats that need each finding's fix as edits (computed only when asked for: it costs a
#: tree transformation per fixable finding)
DETAIL_FORMATS = ("full", "json", "json-lines", "sarif")
#: formats that carry the input errors (and skipped files) in the report itself; the text
#: formats leave them to stderr
MACHINE_FORMATS = ("json", "json-lines", "sarif", "github")
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"



def canonical(fmt: str) -> str:
    return ALIASES.get(fmt, fmt)


def where(d: Diagnostic) -> str:
    """`path:line:col`, or `path:cell N:line:col` in a notebook."""
    cell = f"cell {d.cell}:" if d.cell is not None else ""
    return f"{d.path}:{cell}{d.line}:{d.column}"


def _mark(d: Diagnostic) -> str:
    return {"safe": "[*] ", "unsafe": "[-] "}.get(d.fix or "", "")


def concise(d: Diagnostic, color: bool = True) -> str:
    if not color:
        return f"{where(d)}: {d.code} {_mark(d)}{d.message}"
    loc = click.style(where(d), bold=True) + ":"
    return f"{loc} {click.style(d.code, fg='red', bold=True)} {_mark(d)}{d.message}"


def full(d: Diagnostic, color: bool = True) -> str:
    """The concise line, the reported source lines with carets under the finding, and the fix
    (its kind, what it does and the diff it makes)."""
    out = [concise(d, color)]
    if d.source_lines:
        width = len(str(d.line + len(d.source_lines) - 1))
        gutter = " " * width + " |"
        out.append(gutter)
        for i, text in enumerate(d.source_lines):
            n = d.line + i
            shown = text.expandtabs(4)
            out.append(f"{n:>{width}} | {shown}".rstrip())
            if i == 0:
                start = len(text[: d.column - 1].expandtabs(4))
                stop = len(text[: d.end_column - 1].expandtabs(4)) if d.end_line == d.line else len(shown)
                carets = "^" * max(1, stop - start)
                if color:
                    carets = click.style(carets, fg="red", bold=True)
                out.append(f"{gutter} {' ' * start}{carets} {d.code}")
        if d.end_line > d.line + len(d.source_lines) - 1:
            out.append(f"{gutter} ...")
        out.append(gutter)
    edit = d.fix_edit
    if edit is not None:
        kind = {"safe": "safe fix", "unsafe": "unsafe fix (`--unsafe-fixes`)",
                "display": "suggested fix (not applied)"}.get(edit.applicability, "fix")
        out.append(f"  = {kind}: {edit.description}")
        out.extend("    " + line for line in edit.diff.splitlines())
    elif d.fix is not None:
        out.append(f"  = {d.fix} fix")
    for r in d.related:
        out.append(f"  = related: {r['path']}:{r['line']}:{r['column']}: {r['message']}")
    return "\n".join(out) + "\n"


def text_report(diags: Sequence[Diagnostic], style: str = "concise", color: bool = True) -> str:
    if style == "full":
        return "\n".join(full(d, color) for d in diags)
    return "".join(concise(d, color) + "\n" for d in diags)


def _loc(line: Optional[int], column: Optional[int]) -> Optional[dict]:
    return None if line is None else {"row": line, "column": column if column is not None else 1}


_APPLICABILITY = {"safe": "safe", "unsafe": "unsafe", "display": "display-only"}


def _json_fix(d: Diagnostic) -> Optional[dict]:
    """ruff's `fix`: its applicability, what it does, and its edits (1-based rows and columns,
    end exclusive; in a notebook, in the cell's lines). `edits` is empty when the fix cannot be
    given as edits of this one file or cell (a notebook fix that moves code between cells)."""
    if d.fix is None:
        return None
    edit = d.fix_edit
    edits = [] if edit is None or not edit.edits else [
        {"content": e.text, "location": _loc(e.start_line, e.start_column),
         "end_location": _loc(e.end_line, e.end_column)} for e in edit.edits]
    return {"applicability": _APPLICABILITY.get(d.fix, d.fix), "message": edit.description if edit else None,
            "edits": edits}


def json_object(d: Diagnostic) -> dict:
    """A finding as ruff's JSON output has it (`cell`, `code`, `end_location`, `filename`,
    `fix`, `location`, `message`, `noqa_row`, `url`), with ampfix's own keys beside them
    (`type`, `path`, `line`, `column`, `end_line`, `end_column`, `name`, and `related`: the code
    of other modules that is part of the cause, as `path`, `line`, `column`, `message`)."""
    return {
        "type": "finding",
        "cell": d.cell,
        "code": d.code,
        "end_location": _loc(d.end_line, d.end_column),
        "filename": d.path,
        "fix": _json_fix(d),
        "location": _loc(d.line, d.column),
        "message": d.message,
        "noqa_row": d.line,
        "url": rule_url(d.code),
        "path": d.path,
        "line": d.line,
        "column": d.column,
        "end_line": d.end_line,
        "end_column": d.end_column,
        "name": d.name,
        "related": [dict(r) for r in d.related],
    }


def json_error(e: FileError) -> dict:
    """An input error (or, with `type` "warning", a file skipped) in the shape of a finding, as
    ruff reports a syntax error: `code` says what kind (`invalid-syntax`, `io-error`,
    `invalid-input`, `internal-error`, `skipped`), `fix` and `url` are null."""
    return {
        "type": e.level,
        "cell": e.cell,
        "code": e.kind,
        "end_location": _loc(e.line, e.column),
        "filename": e.path,
        "fix": None,
        "location": _loc(e.line, e.column),
        "message": e.message,
        "noqa_row": None,
        "url": None,
        "path": e.path,
        "line": e.line,
        "column": e.column,
        "end_line": e.line,
        "end_column": e.column,
        "name": None,
    }


def _objects(diags: Sequence[Diagnostic], errors: Sequence[FileError]) -> List[dict]:
    return [json_error(e) for e in errors if e.level != "note"] + [json_object(d) for d in diags]


def json_report(diags: Sequence[Diagnostic], errors: Sequence[FileError] = ()) -> str:
    return json.dumps(_objects(diags, errors), indent=2) + "\n"


def json_lines(diags: Sequence[Diagnostic], errors: Sequence[FileError] = ()) -> str:
    return "".join(json.dumps(o) + "\n" for o in _objects(diags, errors))


# ----------------------------------------------------------------------------- github


def _gh_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _gh_prop(text: str) -> str:
    return _gh_data(text).replace(":", "%3A").replace(",", "%2C")


def github(diags: Sequence[Diagnostic], errors: Sequence[FileError] = ()) -> str:
    """One `::error` workflow command per finding: GitHub Actions shows it on the file and line
    in the pull request. A notebook finding is shown on the line of the notebook's JSON that
    holds the cell's line, when ampfix knows it (`Diagnostic.file_region`), else on the file.
    Input errors are `::error` commands too, files skipped `::warning` (notebook cells skipped
    are left to stderr and SARIF)."""
    out = []
    for e in errors:
        if e.level == "note":  # a notebook cell skipped: information, not an annotation on the pull request
            continue
        props = [f"title={_gh_prop(f'ampfix ({e.kind})')}", f"file={_gh_prop(e.path)}"]
        if e.line is not None and e.cell is None:
            props += [f"line={e.line}"] + ([f"col={e.column}"] if e.column is not None else [])
        out.append(f"::{e.level} {','.join(props)}::{_gh_data(str(e))}\n")
    for d in diags:
        props = [f"title={_gh_prop(f'ampfix ({d.code})')}", f"file={_gh_prop(d.path)}"]
        region = d.cell_region if d.cell is not None else (d.line, d.column, d.end_line, d.end_column)
        if region is not None:
            props += [f"line={region[0]}", f"col={region[1]}", f"endLine={region[2]}", f"endColumn={region[3]}"]
        out.append(f"::error {','.join(props)}::{_gh_data(f'{where(d)}: {d.code} {d.message}')}\n")
    return "".join(out)


# ----------------------------------------------------------------------------- sarif


def _uri(path: str) -> str:
    if os.path.isabs(path):
        return Path(path).as_uri()
    rel = Path(path).as_posix()
    while rel.startswith("./"):
        rel = rel[2:]
    return quote(rel)


def _level(code: str) -> str:
    return "error" if code.startswith("AMP0") else "warning"


def _sarif_rule(rule: Type[Rule]) -> dict:
    docs = rule.docs.strip("\n")
    first = docs.strip().split("\n\n")[0].replace("\n", " ").strip() if docs.strip() else rule.message
    return {
        "id": rule.code,
        "name": rule.name,
        "shortDescription": {"text": rule.message},
        "fullDescription": {"text": first},
        "help": {"text": docs, "markdown": f"**{rule.code} {rule.name}** (fix: {rule.fixable})\n\n{docs}"},
        "helpUri": rule_url(rule.code),
        "defaultConfiguration": {"level": _level(rule.code), "enabled": bool(rule.default_enabled)},
        "properties": {"fix": rule.fixable, "tags": ["pytorch", "amp", "mixed-precision"]},
    }


def _region(sl: int, sc: int, el: int, ec: int) -> dict:
    return {"startLine": sl, "startColumn": sc, "endLine": el, "endColumn": ec}


def _sarif_location(path: str, region: Optional[tuple], cell: Optional[int] = None) -> dict:
    loc: dict = {"physicalLocation": {"artifactLocation": {"uri": _uri(path)}}}
    if region is not None:
        loc["physicalLocation"]["region"] = _region(*region)
    if cell is not None:
        loc["logicalLocations"] = [{"name": f"cell {cell}", "fullyQualifiedName": f"{path}:cell {cell}",
                                    "kind": "notebookCell"}]
    return loc


def _notification(e: FileError) -> dict:
    region = None if e.line is None or e.cell is not None else (
        e.line, e.column or 1, e.line, e.column or 1)
    return {"level": e.level, "message": {"text": str(e)}, "descriptor": {"id": e.kind},
            "locations": [_sarif_location(e.path, region, e.cell)]}


def sarif(diags: Sequence[Diagnostic], rules: Dict[str, Type[Rule]], errors: Sequence[FileError] = ()) -> str:
    """SARIF 2.1.0: one run, every rule's metadata (help text from its docs), one result per
    finding with its fix as a SARIF `fix` (the text edits `ampfix rewrite` makes for it).
    Columns are Unicode code points, 1-based. A notebook finding's region is in the notebook's
    JSON (the line of the `.ipynb` that holds the cell's line, when ampfix knows it), its
    logical location the cell; its message and `properties.cell` say which cell; it carries
    no fix. Input errors and files skipped are `invocations[0].toolExecutionNotifications`
    (`executionSuccessful` is false when there is an error)."""
    index = {code: i for i, code in enumerate(rules)}
    results = []
    for d in diags:
        uri = _uri(d.path)
        msg = d.message if d.cell is None else f"cell {d.cell}, line {d.line}: {d.message}"
        region = (d.line, d.column, d.end_line, d.end_column) if d.cell is None else d.cell_region
        result: dict = {
            "ruleId": d.code,
            "ruleIndex": index.get(d.code, -1),
            "level": _level(d.code),
            "message": {"text": msg},
            "locations": [_sarif_location(d.path, region, d.cell)],
            "properties": {"name": d.name, "fix": d.fix},
        }
        if d.cell is not None:
            result["properties"]["cell"] = d.cell
            result["properties"]["cellLine"] = d.line
            result["properties"]["cellColumn"] = d.column
        if d.related:
            result["relatedLocations"] = [{
                "id": i,
                "physicalLocation": {"artifactLocation": {"uri": _uri(str(r["path"]))},
                                     "region": {"startLine": r["line"], "startColumn": r["column"]}},
                "message": {"text": str(r["message"])},
            } for i, r in enumerate(d.related)]
        if d.cell is None and d.fix_edit is not None and d.fix_edit.edits:
            result["fixes"] = [{
                "description": {"text": f"{d.fix_edit.description} ({d.fix_edit.applicability} fix)"},
                "artifactChanges": [{
                    "artifactLocation": {"uri": uri},
                    "replacements": [{"deletedRegion": _region(e.start_line, e.start_column, e.end_line, e.end_column),
                                      "insertedContent": {"text": e.text}} for e in d.fix_edit.edits],
                }],
            }]
        if result["ruleIndex"] < 0:
            del result["ruleIndex"]
        results.append(result)
    log = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "ampfix", "version": __version__, "semanticVersion": __version__,
                                "informationUri": REPOSITORY,
                                "rules": [_sarif_rule(r) for r in rules.values()]}},
            "invocations": [{
                "executionSuccessful": not any(e.level == "error" for e in errors),
                "toolExecutionNotifications": [_notification(e) for e in errors],
            }],
            "columnKind": "unicodeCodePoints",
            "results": results,
        }],
    }
    return json.dumps(log, indent=2) + "\n"


# ----------------------------------------------------------------------------- diffs


def file_diff(r: FileResult) -> str:
    """The unified diff `ampfix rewrite --diff` prints for one changed file (for a notebook,
    one diff per changed cell)."""
    from ampfix.engine.notebook import is_notebook

    if is_notebook(r.path):
        from ampfix.engine.notebook import notebook_diff

        return notebook_diff(r.path, r.old_source or b"", r.new_source or b"")
    old = decode_source(r.old_source or b"", r.path).text
    new = decode_source(r.new_source or b"", r.path).text
    return unified_diff(old, new, *diff_names(r.path))


def render(fmt: str, diags: Sequence[Diagnostic], rules: Optional[Dict[str, Type[Rule]]] = None,
           color: bool = True, errors: Sequence[FileError] = ()) -> str:
    """The findings in one of FORMATS (text formats without the summary). `errors`: the input
    errors and files skipped, which the machine formats carry (the text formats leave them to
    stderr)."""
    fmt = canonical(fmt)
    if fmt in TEXT_FORMATS:
        return text_report(diags, fmt, color)
    if fmt == "json":
        return json_report(diags, errors)
    if fmt == "json-lines":
        return json_lines(diags, errors)
    if fmt == "github":
        return github(diags, errors)
    if fmt == "sarif":
        if rules is None:
            from ampfix.engine.registry import all_rules

            rules = all_rules()
        return sarif(diags, rules, errors)
    raise ValueError(f"unknown output format {fmt!r}")


def statistics(fmt: str, diags: Sequence[Diagnostic], names: Dict[str, str]) -> str:
    """`check --statistics`: the findings counted per rule, most frequent first (ruff's
    columns; `json` / `json-lines`: objects with `code`, `name`, `count`, `fixable` (a safe
    fix for at least one of them) and `fixable_count`)."""
    counts: Dict[str, int] = {}
    safe: Dict[str, int] = {}
    for d in diags:
        counts[d.code] = counts.get(d.code, 0) + 1
        safe[d.code] = safe.get(d.code, 0) + (d.fix == "safe")
    rows = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    objects = [{"code": code, "name": names.get(code, ""), "count": n, "fixable": safe[code] > 0,
                "fixable_count": safe[code]} for code, n in rows]
    fmt = canonical(fmt)
    if fmt == "json":
        return json.dumps(objects, indent=2) + "\n"
    if fmt == "json-lines":
        return "".join(json.dumps(o) + "\n" for o in objects)
    return "".join(f"{o['count']:>5}\t{o['code']}\t{'[*]' if o['fixable'] else '   '} {o['name']}\n" for o in objects)


def all_formats() -> List[str]:
    return [*FORMATS, *ALIASES]
