"""`ampfix server`: a language server (pygls, over stdio).

It publishes ampfix's diagnostics when a Python document is opened, changed or saved, using the
configuration (`[tool.ampfix]`) that `ampfix check` would use for the file, and offers each
finding's fix as a quick fix (safe ones preferred; unsafe ones say so) plus a `source.fixAll`
action that applies every safe fix, as `ampfix rewrite` would. Needs `pip install "ampfix[server]"`.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

from ampfix import __version__

from ampfix.engine import runner
from ampfix.engine.incremental import Reparser
from ampfix.engine.analyze import (Analysis, Diagnostic, InputError, Settings, TextEdit, fix_text, forget_roots,
                                   gc_paused, project_for, text_edits)
from ampfix.frontends import lsp_io
from ampfix.engine.registry import all_rules

SOURCE = "ampfix"
FIX_ALL_KIND = f"{types.CodeActionKind.SourceFixAll.value}.ampfix"

log = logging.getLogger(__name__)

#: a change is analysed once no newer change has come for this long: a burst of keystrokes (or
#: an edit sent as several changes) costs one analysis, of its last version
DEBOUNCE_S = 0.05
#: once diagnostics are published and the document rests this long, the fixes that code actions
#: will offer are prepared, one at a time (a change in between stops it), so that a code action
#: answers from the last analysis instead of computing them
WARM_S = 0.1


@dataclass
class _DocState:
    """What the server keeps of one open document: its last analysis (keyed by the text, the
    rules and the settings, so an unchanged text is never analysed twice and code actions
    answer from it), the "apply all safe fixes" result of that text, and the pending analysis."""

    key: Optional[tuple] = None
    analysis: Optional[Analysis] = None
    broken: bool = False  # the text of `key` does not parse (mid-edit): `analysis` is None
    fix_all: Optional[Tuple[str, str, Dict[str, int]]] = None  # (text, fixed text, fixes applied)
    pending: Optional[asyncio.TimerHandle] = None
    last_good: Optional[list] = None  # the LSP diagnostics of its last version that parsed
    reparser: Optional[Reparser] = None  # its last parsed version: an edit inside one statement re-parses it only
    collected: bool = True  # the garbage of the analyses before `analysis` was collected (while resting)


_docs: Dict[str, _DocState] = {}


class AmpfixServer(LanguageServer):
    pass


# the transport (framing, params, lifecycle, one-line errors) is ampfix/frontends/lsp_io.py
server = AmpfixServer("ampfix", __version__, protocol_cls=lsp_io.Protocol)
_shown_config_errors: set = set()  # a broken configuration is said once, not on every keystroke


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
    related = [types.DiagnosticRelatedInformation(
        location=types.Location(uri=Path(os.path.abspath(str(r["path"]))).as_uri(), range=types.Range(
            start=types.Position(line=int(r["line"]) - 1, character=int(r["column"]) - 1),
            end=types.Position(line=int(r["line"]) - 1, character=int(r["column"]) - 1))),
        message=str(r["message"])) for r in d.related] or None
    return types.Diagnostic(range=_range(doc, d), message=d.message, severity=severity, code=d.code,
                            source=SOURCE, tags=tags, data={"fix": d.fix, "name": d.name},
                            related_information=related)


def _path(doc) -> Optional[str]:
    return to_fs_path(doc.uri) if doc.uri.startswith("file:") else None


def _analysis(doc) -> Optional[Analysis]:
    """The analysis of the document's current text: the last one when the text, the rules and
    the settings are those it was made for, else a new one (kept in place of the last)."""
    path = _path(doc)
    setup = _setup(path)
    state = _docs.setdefault(doc.uri, _DocState())
    if setup is None:  # excluded by the configuration
        state.key, state.analysis, state.broken, state.fix_all = None, None, False, None
        return None
    rules, settings = setup
    key = (doc.source, path, tuple(r.code for r in rules), repr(settings))
    if state.key == key:
        return state.analysis
    if state.reparser is None:
        state.reparser = Reparser()
    forget_roots()  # (a root marker may have come or gone since the last analysis)
    project = project_for(path, settings) if path is not None else None
    if project is not None:  # the other modules as they are on disk now (kept between analyses)
        project.refresh()  # type: ignore[attr-defined]
    try:
        analysis: Optional[Analysis] = Analysis(doc.source, path or doc.uri, rules, settings,
                                                parser=state.reparser.parse, top_shifts=state.reparser.top_shifts)
    except (InputError, RecursionError):  # a syntax error while typing: the Python tooling shows it
        analysis = None
    state.key, state.analysis, state.broken, state.fix_all = key, analysis, analysis is None, None
    state.collected = False
    return analysis


def _findings(doc) -> Optional[List[Diagnostic]]:
    """The findings in `doc` (from its last analysis); None when it cannot be analysed as it is
    (a syntax error while the user types: the Python tooling shows it)."""
    analysis = _analysis(doc)
    if analysis is not None:
        return analysis.diagnostics
    state = _docs.get(doc.uri)
    return None if state is not None and state.broken else []


def publish(ls: LanguageServer, uri: str) -> None:
    """Analyse the document (unless its text was) and publish its diagnostics, with the cyclic
    garbage collector off until they are sent: a model is ~100k objects, and a full collection
    that its allocation triggers (~0.1 s on a 4400-line file) is made while the document rests
    (`_warm`) instead of between a keystroke and its diagnostics."""
    with gc_paused():
        _publish(ls, uri)


def _publish(ls: LanguageServer, uri: str) -> None:
    doc = ls.workspace.get_text_document(uri)
    if not _is_python(doc):
        return
    found = _findings(doc)
    state = _docs.setdefault(uri, _DocState())
    if found is None:  # mid-edit syntax error: the last good diagnostics stay
        diags = state.last_good or []
    else:
        diags = state.last_good = [_lsp_diagnostic(doc, d) for d in found]
    ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, version=doc.version,
                                                                        diagnostics=diags))
    # after a full parse, the code lengths the next edit's re-parse needs are computed right away
    # (someone who opens a file often types at once), the rest once the document rests
    reparser = state.reparser
    ready = reparser is None or reparser.module is None or reparser.top_shifts(reparser.module) is not None
    _later(ls, uri, WARM_S if ready else 0, _warm)


def _later(ls: LanguageServer, uri: str, delay: float, step) -> None:
    """Run `step(ls, uri)` after `delay` unless the document changes meanwhile (one pending step
    per document: a new one replaces it)."""
    state = _docs.get(uri)
    if state is None:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # pragma: no cover - not under the server's event loop
        return
    if state.pending is not None:
        state.pending.cancel()
    state.pending = loop.call_later(delay, _if_current, ls, uri, ls.workspace.get_text_document(uri).version, step)


def _if_current(ls: LanguageServer, uri: str, version: Optional[int], step) -> None:
    state = _docs.get(uri)
    if state is not None:
        state.pending = None
    if ls.workspace.get_text_document(uri).version == version:  # else a newer change is pending
        step(ls, uri)


def _warm(ls: LanguageServer, uri: str) -> None:
    """Prepare one quick fix's edit, then yield to the messages that came meanwhile. ("Apply all
    safe fixes" is computed when it is resolved, i.e. chosen: preparing it here would keep a
    code action request waiting behind a whole `rewrite` of the file.)"""
    doc = ls.workspace.get_text_document(uri)
    state = _docs.get(uri)
    if state is None or state.analysis is None or state.key is None or state.key[0] != doc.source:
        return
    if state.reparser is not None and state.reparser.module is not None \
            and state.reparser.top_shifts(state.reparser.module) is None:
        state.reparser.prepare()  # the code lengths the next edit's re-parse needs (once per tree)
        _later(ls, uri, WARM_S, _warm)
        return
    if not state.collected:  # the models of earlier versions (they hold cycles), once per analysis
        state.collected = True
        gc.collect()
        _later(ls, uri, 0, _warm)
        return
    todo = state.analysis.without_fix_edit()
    if todo:
        state.analysis.fix_edits(lambda d: d is todo[0])
        _later(ls, uri, 0, _warm)


def _cancel_pending(uri: str) -> None:
    state = _docs.get(uri)
    if state is not None and state.pending is not None:
        state.pending.cancel()
        state.pending = None


def schedule(ls: LanguageServer, uri: str) -> None:
    """Publish the document's diagnostics once it has not changed for `DEBOUNCE_S`: every
    version superseded before then is skipped, never analysed."""
    _docs.setdefault(uri, _DocState())
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # pragma: no cover - not under the server's event loop
        publish(ls, uri)
        return
    _later(ls, uri, DEBOUNCE_S, publish)


@server.feature(types.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: LanguageServer, params: types.DidOpenTextDocumentParams) -> None:
    _cancel_pending(params.text_document.uri)
    publish(ls, params.text_document.uri)


@server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: LanguageServer, params: types.DidChangeTextDocumentParams) -> None:
    schedule(ls, params.text_document.uri)


@server.feature(types.TEXT_DOCUMENT_DID_SAVE)
def did_save(ls: LanguageServer, params: types.DidSaveTextDocumentParams) -> None:
    _cancel_pending(params.text_document.uri)
    publish(ls, params.text_document.uri)  # an unchanged text is answered from its last analysis


@server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: LanguageServer, params: types.DidCloseTextDocumentParams) -> None:
    _cancel_pending(params.text_document.uri)
    _docs.pop(params.text_document.uri, None)
    ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=params.text_document.uri, diagnostics=[]))


def _overlaps(a: types.Range, b: types.Range) -> bool:
    def key(p: types.Position) -> Tuple[int, int]:
        return (p.line, p.character)

    return key(a.start) <= key(b.end) and key(b.start) <= key(a.end)


def _wanted(kinds: Optional[Sequence[str]], kind: str) -> bool:
    return not kinds or any(kind == k or kind.startswith(k + ".") for k in kinds)


def _resolves_edits(ls: LanguageServer) -> bool:
    """The client can ask for a code action's edit later (`codeAction/resolve`)."""
    try:
        support = ls.client_capabilities.text_document.code_action.resolve_support  # type: ignore[union-attr]
        return support is not None and "edit" in support.properties
    except AttributeError:
        return False


def _fix_all(doc) -> Optional[Tuple[str, Dict[str, int]]]:
    """(fixed text, fixes applied) of "apply all safe fixes" for the document's text (computed
    once per text); None when the configuration excludes the file."""
    _analysis(doc)  # keys the state by the current text
    state = _docs.setdefault(doc.uri, _DocState())
    if state.fix_all is not None and state.fix_all[0] == doc.source:
        return state.fix_all[1], state.fix_all[2]
    path = _path(doc)
    setup = _setup(path)
    if setup is None:
        return None
    rules, settings = setup
    # the settings of the analysis the diagnostics come from (the project read as `ampfix
    # rewrite` reads it: a fix the diagnostics offer because of another module is applied too,
    # and none that only a file read alone would suggest), the safe fixes only
    safe = replace(settings, unsafe_fixes=False, add_noqa=False, details=False)
    try:
        new, fixed, _ = fix_text(doc.source, path or doc.uri, rules, safe)
    except InputError:
        new, fixed = doc.source, {}
    state.fix_all = (doc.source, new, fixed)  # dropped with the analysis when the text changes
    return new, fixed


def _fix_all_edit(doc, new: str) -> types.WorkspaceEdit:
    return types.WorkspaceEdit(changes={doc.uri: [_edit(doc, e) for e in text_edits(doc.source, new)]})


@server.feature(
    types.TEXT_DOCUMENT_CODE_ACTION,
    types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.QuickFix, FIX_ALL_KIND], resolve_provider=True),
)
def code_action(ls: LanguageServer, params: types.CodeActionParams) -> List[types.CodeAction]:
    """Quick fixes and "apply all safe fixes", from the last analysis of the text: a quick fix's
    edit is computed for the findings in the asked range only; "apply all safe fixes" is
    computed when the client resolves it (or here, for a client that cannot resolve)."""
    if not lsp_io.is_open(ls, params.text_document.uri):
        return []  # never opened (or closed): nothing of ampfix's to offer
    doc = ls.workspace.get_text_document(params.text_document.uri)
    if not _is_python(doc):
        return []
    kinds = params.context.only
    actions: List[types.CodeAction] = []
    analysis = _analysis(doc)
    if analysis is None:  # excluded, or mid-edit syntax error: no fix to offer on this text
        return []
    findings = analysis.diagnostics
    if _wanted(kinds, types.CodeActionKind.QuickFix.value):
        in_range = {id(d): _lsp_diagnostic(doc, d) for d in findings if d.fix in ("safe", "unsafe")}
        in_range = {k: v for k, v in in_range.items() if _overlaps(v.range, params.range)}
        for d in analysis.fix_edits(lambda d: id(d) in in_range):
            fe = d.fix_edit
            if id(d) not in in_range or fe is None or not fe.edits or fe.applicability not in ("safe", "unsafe"):
                continue
            note = "" if fe.applicability == "safe" else " (unsafe: may change behaviour)"
            actions.append(types.CodeAction(
                title=f"ampfix: {fe.description} ({d.code}){note}",
                kind=types.CodeActionKind.QuickFix,
                diagnostics=[in_range[id(d)]],
                is_preferred=fe.applicability == "safe",
                edit=types.WorkspaceEdit(changes={doc.uri: [_edit(doc, e) for e in fe.edits]}),
            ))
    safe = sum(d.fix == "safe" for d in findings)
    if safe and _wanted(kinds, FIX_ALL_KIND):
        if _resolves_edits(ls):
            actions.append(types.CodeAction(title=_fix_all_title(safe), kind=FIX_ALL_KIND,
                                            data={"uri": doc.uri, "version": doc.version}))
        else:
            done = _fix_all(doc)
            if done is not None and done[0] != doc.source:
                actions.append(types.CodeAction(title=_fix_all_title(sum(done[1].values())), kind=FIX_ALL_KIND,
                                                edit=_fix_all_edit(doc, done[0])))
    return actions


def _fix_all_title(n: int) -> str:
    return f"ampfix: apply all safe fixes ({n})"


@server.feature(types.CODE_ACTION_RESOLVE)
def resolve_code_action(ls: LanguageServer, action: types.CodeAction) -> types.CodeAction:
    """The edit of "apply all safe fixes", for the document's current text."""
    data = action.data if isinstance(action.data, dict) else {}
    uri = data.get("uri")
    if action.kind != FIX_ALL_KIND or not isinstance(uri, str) or action.edit is not None:
        return action
    if not lsp_io.is_open(ls, uri):
        return action  # closed meanwhile (or never opened): no edit of ampfix's to give
    doc = ls.workspace.get_text_document(uri)
    done = _fix_all(doc)
    if done is not None:
        action.edit = _fix_all_edit(doc, done[0])
    return action


def main() -> None:
    sys.exit(lsp_io.serve(server))
