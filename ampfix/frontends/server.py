"""`ampfix server`: a language server (pygls, over stdio).

It publishes ampfix's diagnostics when a Python document is opened, changed or saved, using the
configuration (`[tool.ampfix]`) that `ampfix check` would use for the file, and offers each
finding's fix as a quick fix (safe ones preferred; unsafe ones say so) plus a `source.fixAll`
action that applies every safe fix, as `ampfix rewrite` would. Needs `pip install "ampfix[server]"`.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

from ampfix import __version__

from ampfix.engine import runner
from ampfix.frontends import lsp_io
from ampfix.engine.analyze import Diagnostic, InputError, Settings, TextEdit, fix_suggestions, fix_text, text_edits
from ampfix.engine.registry import all_rules

SOURCE = "ampfix"
FIX_ALL_KIND = f"{types.CodeActionKind.SourceFixAll.value}.ampfix"

log = logging.getLogger(__name__)


class AmpfixServer(LanguageServer):
    pass


# the transport (framing, params, lifecycle, one-line errors) is ampfix/frontends/lsp_io.py
server = AmpfixServer("ampfix", __version__, protocol_cls=lsp_io.Protocol)
_shown_config_errors: set = set()  # a broken configuration is said once, not on every keystroke
_last_good: Dict[str, list] = {}  # uri -> the diagnostics of its last version that parsed


def _is_python(doc) -> bool:
    lang = getattr(doc, "language_id", None)
    return lang == "python" or doc.uri.endswith((".py", ".pyi"))


def _setup(path: Optional[str]) -> Optional[Tuple[list, Settings]]:
    """The rules and settings `ampfix check PATH` would use; None when the configuration
    excludes the file."""
    if path is None:  # an unsaved buffer: the default rules
        from ampfix.engine.registry import select_rules

        return select_rules(None, []), Settings()
    options = runner.Options(paths=[path], force_exclude=True)
    try:
        plan = runner.make_plan(options)
    except runner.OptionsError as exc:
        # a broken configuration: say so (once), and check with the defaults meanwhile
        if str(exc) not in _shown_config_errors:
            _shown_config_errors.add(str(exc))
            server.window_show_message(types.ShowMessageParams(type=types.MessageType.Error,
                                                               message=f"ampfix: {exc}"))
        from ampfix.engine.registry import select_rules

        return select_rules(None, []), Settings()
    if plan.config.path is not None:  # this configuration works (again): a later error in it is news
        _shown_config_errors.difference_update({m for m in _shown_config_errors if str(plan.config.path) in m})
    if os.path.isfile(path) and not plan.files:
        return None  # excluded by the configuration
    rules = all_rules()
    codes = runner.codes_for(path, plan)
    return [rules[c] for c in codes], plan.settings


def _range(doc, d: Diagnostic) -> types.Range:
    return types.Range(
        start=doc.position_to_client_units(types.Position(line=d.line - 1, character=d.column - 1)),
        end=doc.position_to_client_units(types.Position(line=d.end_line - 1, character=d.end_column - 1)),
    )


def _edit(doc, e: TextEdit) -> types.TextEdit:
    return types.TextEdit(
        range=types.Range(
            start=doc.position_to_client_units(types.Position(line=e.start_line - 1, character=e.start_column - 1)),
            end=doc.position_to_client_units(types.Position(line=e.end_line - 1, character=e.end_column - 1)),
        ),
        new_text=e.text,
    )


def _lsp_diagnostic(doc, d: Diagnostic) -> types.Diagnostic:
    severity = types.DiagnosticSeverity.Error if d.code.startswith("AMP0") else types.DiagnosticSeverity.Warning
    tags = [types.DiagnosticTag.Unnecessary] if d.code == "AMP901" else None
    return types.Diagnostic(range=_range(doc, d), message=d.message, severity=severity, code=d.code,
                            source=SOURCE, tags=tags, data={"fix": d.fix, "name": d.name})


def _findings(doc) -> Optional[List[Diagnostic]]:
    """The findings in `doc`; None when it cannot be analysed as it is (a syntax error while
    the user types: the Python tooling shows it)."""
    path = to_fs_path(doc.uri) if doc.uri.startswith("file:") else None
    setup = _setup(path)
    if setup is None:
        return []
    rules, settings = setup
    try:
        return fix_suggestions(doc.source, path or doc.uri, rules, settings)
    except (InputError, RecursionError):
        return None


def publish(ls: LanguageServer, uri: str) -> None:
    doc = ls.workspace.get_text_document(uri)
    if not _is_python(doc):
        return
    found = _findings(doc)
    if found is None:  # mid-edit syntax error: the last good diagnostics stay
        diags = _last_good.get(uri, [])
    else:
        diags = _last_good[uri] = [_lsp_diagnostic(doc, d) for d in found]
    ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, version=doc.version,
                                                                        diagnostics=diags))


@server.feature(types.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: LanguageServer, params: types.DidOpenTextDocumentParams) -> None:
    publish(ls, params.text_document.uri)


@server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: LanguageServer, params: types.DidChangeTextDocumentParams) -> None:
    publish(ls, params.text_document.uri)


@server.feature(types.TEXT_DOCUMENT_DID_SAVE)
def did_save(ls: LanguageServer, params: types.DidSaveTextDocumentParams) -> None:
    publish(ls, params.text_document.uri)


@server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: LanguageServer, params: types.DidCloseTextDocumentParams) -> None:
    _last_good.pop(params.text_document.uri, None)
    ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=params.text_document.uri, diagnostics=[]))


def _overlaps(a: types.Range, b: types.Range) -> bool:
    def key(p: types.Position) -> Tuple[int, int]:
        return (p.line, p.character)

    return key(a.start) <= key(b.end) and key(b.start) <= key(a.end)


def _wanted(kinds: Optional[Sequence[str]], kind: str) -> bool:
    return not kinds or any(kind == k or kind.startswith(k + ".") for k in kinds)


@server.feature(
    types.TEXT_DOCUMENT_CODE_ACTION,
    types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.QuickFix, FIX_ALL_KIND], resolve_provider=False),
)
def code_action(ls: LanguageServer, params: types.CodeActionParams) -> List[types.CodeAction]:
    if not lsp_io.is_open(ls, params.text_document.uri):
        return []  # never opened (or closed): nothing of ampfix's to offer
    doc = ls.workspace.get_text_document(params.text_document.uri)
    if not _is_python(doc):
        return []
    kinds = params.context.only
    actions: List[types.CodeAction] = []
    findings = _findings(doc) or []
    if _wanted(kinds, types.CodeActionKind.QuickFix.value):
        for d in findings:
            fe = d.fix_edit
            if fe is None or not fe.edits or fe.applicability not in ("safe", "unsafe"):
                continue
            lsp_diag = _lsp_diagnostic(doc, d)
            if not _overlaps(lsp_diag.range, params.range):
                continue
            note = "" if fe.applicability == "safe" else " (unsafe: may change behaviour)"
            actions.append(types.CodeAction(
                title=f"ampfix: {fe.description} ({d.code}){note}",
                kind=types.CodeActionKind.QuickFix,
                diagnostics=[lsp_diag],
                is_preferred=fe.applicability == "safe",
                edit=types.WorkspaceEdit(changes={doc.uri: [_edit(doc, e) for e in fe.edits]}),
            ))
    if any(d.fix == "safe" for d in findings) and _wanted(kinds, FIX_ALL_KIND):
        path = to_fs_path(doc.uri) if doc.uri.startswith("file:") else None
        setup = _setup(path)
        if setup is not None:
            rules, settings = setup
            try:
                new, fixed, _ = fix_text(doc.source, path or doc.uri, rules, Settings(
                    min_torch_version=settings.min_torch_version))
            except InputError:
                new, fixed = doc.source, {}
            if new != doc.source:
                actions.append(types.CodeAction(
                    title=f"ampfix: apply all safe fixes ({sum(fixed.values())})",
                    kind=FIX_ALL_KIND,
                    edit=types.WorkspaceEdit(changes={doc.uri: [_edit(doc, e) for e in text_edits(doc.source, new)]}),
                ))
    return actions


def main() -> None:
    sys.exit(lsp_io.serve(server))
