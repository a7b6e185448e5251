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

from ampfix import __version__
from ampfix.engine.results import Diagnostic, FileResult, decode_source, diff_names, unified_diff

if TYPE_CHECKING:  # the rules (and LibCST) are not needed to report
    from ampfix.rule import Rule

FORMATS = ("concise", "full", "json", "json-lines", "sarif", "github")
ALIASES = {"text": "concise"}
TEXT_FORMATS = ("concise", "full")
#: formats that need each finding's fix as edits (computed only when asked for: it costs a
#: tree transformation per fixable finding)
DETAIL_FORMATS = ("full", "sarif")
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


def json_report(diags: Sequence[Diagnostic]) -> str:
    return json.dumps([d.to_json() for d in diags], indent=2) + "\n"


def json_lines(diags: Sequence[Diagnostic]) -> str:
    return "".join(json.dumps(d.to_json()) + "\n" for d in diags)


# ----------------------------------------------------------------------------- github


def _gh_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _gh_prop(text: str) -> str:
    return _gh_data(text).replace(":", "%3A").replace(",", "%2C")


def github(diags: Sequence[Diagnostic]) -> str:
    """One `::error` workflow command per finding: GitHub Actions shows it on the file and line
    in the pull request. A notebook finding is shown on the file (its line is a cell's line)."""
    out = []
    for d in diags:
        props = [f"title={_gh_prop(f'ampfix ({d.code})')}", f"file={_gh_prop(d.path)}"]
        if d.cell is None:
            props += [f"line={d.line}", f"col={d.column}", f"endLine={d.end_line}", f"endColumn={d.end_column}"]
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
        "defaultConfiguration": {"level": _level(rule.code), "enabled": bool(rule.default_enabled)},
        "properties": {"fix": rule.fixable, "tags": ["pytorch", "amp", "mixed-precision"]},
    }


def _region(sl: int, sc: int, el: int, ec: int) -> dict:
    return {"startLine": sl, "startColumn": sc, "endLine": el, "endColumn": ec}


def sarif(diags: Sequence[Diagnostic], rules: Dict[str, Type[Rule]]) -> str:
    """SARIF 2.1.0: one run, every rule's metadata (help text from its docs), one result per
    finding with its fix as a SARIF `fix` (the text edits `ampfix rewrite` makes for it).
    Columns are Unicode code points, 1-based. A notebook's lines are its cells' lines: the
    result says which cell (in the message and `properties.cell`) and carries no fix."""
    index = {code: i for i, code in enumerate(rules)}
    results = []
    for d in diags:
        uri = _uri(d.path)
        msg = d.message if d.cell is None else f"cell {d.cell}, line {d.line}: {d.message}"
        result: dict = {
            "ruleId": d.code,
            "ruleIndex": index.get(d.code, -1),
            "level": _level(d.code),
            "message": {"text": msg},
            "locations": [{"physicalLocation": {"artifactLocation": {"uri": uri},
                                                "region": _region(d.line, d.column, d.end_line, d.end_column)}}],
            "properties": {"name": d.name, "fix": d.fix},
        }
        if d.cell is not None:
            result["properties"]["cell"] = d.cell
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
                                "rules": [_sarif_rule(r) for r in rules.values()]}},
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
           color: bool = True) -> str:
    """The findings in one of FORMATS (text formats without the summary)."""
    fmt = canonical(fmt)
    if fmt in TEXT_FORMATS:
        return text_report(diags, fmt, color)
    if fmt == "json":
        return json_report(diags)
    if fmt == "json-lines":
        return json_lines(diags)
    if fmt == "github":
        return github(diags)
    if fmt == "sarif":
        if rules is None:
            from ampfix.engine.registry import all_rules

            rules = all_rules()
        return sarif(diags, rules)
    raise ValueError(f"unknown output format {fmt!r}")


def all_formats() -> List[str]:
    return [*FORMATS, *ALIASES]
