"""`ampfix server` end to end with a real LSP client (pytest-lsp): diagnostics on open, change
and save; each fix a quick fix; "apply all safe fixes" as source.fixAll."""

import sys

import pytest

pytest.importorskip("pygls")
pytest_lsp = pytest.importorskip("pytest_lsp")

from lsprotocol import types  # noqa: E402
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities  # noqa: E402

from test_cli import BAD_CLIP, FIXED_CLIP, GOOD  # noqa: E402


@pytest_lsp.fixture(config=ClientServerConfig(server_command=[sys.executable, "-m", "ampfix", "server"]))
async def client(lsp_client: LanguageClient):
    await lsp_client.initialize_session(types.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"), root_uri=None))
    yield
    await lsp_client.shutdown_session()


def _apply(text: str, edits) -> str:
    lines = text.splitlines(keepends=True)

    def off(p):
        return sum(len(line) for line in lines[: p.line]) + p.character

    for e in sorted(edits, key=lambda e: (e.range.start.line, e.range.start.character), reverse=True):
        text = text[: off(e.range.start)] + e.new_text + text[off(e.range.end):]
    return text


def _preview(folder):
    """AMP003, BAD_CLIP's finding, is a preview rule: the server runs it for the files under
    `folder` with `preview = true` in their [tool.ampfix]."""
    (folder / "pyproject.toml").write_text("[tool.ampfix]\npreview = true\n")


async def _diagnostics(client: LanguageClient, uri: str, version: int):
    for _ in range(100):
        await client.wait_for_notification(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        if uri in client.diagnostics and client.diagnostics[uri] is not None:
            return list(client.diagnostics[uri])
    raise AssertionError("no diagnostics")


async def test_diagnostics_on_open_change_save_and_code_actions(client: LanguageClient, tmp_path):
    _preview(tmp_path)
    path = tmp_path / "train.py"
    path.write_text(BAD_CLIP)
    uri = path.as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=BAD_CLIP)))
    (diag,) = await _diagnostics(client, uri, 1)
    assert diag.code == "AMP003" and diag.source == "ampfix"
    assert (diag.range.start.line, diag.range.start.character) == (5, 4)
    assert diag.severity == types.DiagnosticSeverity.Error

    actions = await client.text_document_code_action_async(types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), range=diag.range,
        context=types.CodeActionContext(diagnostics=[diag])))
    quick = [a for a in actions if a.kind == types.CodeActionKind.QuickFix]
    (fix,) = quick
    assert "scaler.unscale_(optimizer)" in fix.title and fix.is_preferred
    assert _apply(BAD_CLIP, fix.edit.changes[uri]) == FIXED_CLIP
    fix_all = [a for a in actions if a.kind == "source.fixAll.ampfix"]
    # VS Code resolves a code action's edit when it is chosen: "apply all safe fixes" is
    # computed then, not with every code action request
    assert len(fix_all) == 1 and fix_all[0].edit is None
    resolved = await client.code_action_resolve_async(fix_all[0])
    assert _apply(BAD_CLIP, resolved.edit.changes[uri]) == FIXED_CLIP
    only = await client.text_document_code_action_async(types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), range=diag.range,
        context=types.CodeActionContext(diagnostics=[], only=[types.CodeActionKind.SourceFixAll])))
    assert [a.kind for a in only] == ["source.fixAll.ampfix"]

    # the user applies the fix: the finding goes away on change
    client.diagnostics.pop(uri, None)
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
        content_changes=[types.TextDocumentContentChangeWholeDocument(text=FIXED_CLIP)]))
    assert await _diagnostics(client, uri, 2) == []

    # ... and comes back, e.g. after an undo, on save
    client.diagnostics.pop(uri, None)
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=3),
        content_changes=[types.TextDocumentContentChangeWholeDocument(text=BAD_CLIP)]))
    await _diagnostics(client, uri, 3)
    client.diagnostics.pop(uri, None)
    client.text_document_did_save(types.DidSaveTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri)))
    (again,) = await _diagnostics(client, uri, 3)
    assert again.code == "AMP003"


async def test_config_syntax_errors_and_unicode_columns(client: LanguageClient, tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.ampfix]\npreview = true\nignore = ["AMP003"]\n')
    ignored = tmp_path / "ignored.py"
    ignored.write_text(BAD_CLIP)
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=ignored.as_uri(), language_id="python", version=1, text=BAD_CLIP)))
    assert await _diagnostics(client, ignored.as_uri(), 1) == []

    other = tmp_path / "sub" / "train.py"
    other.parent.mkdir()
    (other.parent / "pyproject.toml").write_text("[tool.ampfix]\npreview = true\n")
    # a non-BMP character before the finding: the column is in UTF-16 units for the client
    text = BAD_CLIP.replace("    torch.nn.utils.clip", "    x = '😀'; torch.nn.utils.clip")
    other.write_text(text)
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=other.as_uri(), language_id="python", version=1, text=text)))
    (diag,) = await _diagnostics(client, other.as_uri(), 1)
    assert diag.range.start.character == len("    x = '😀'; ".encode("utf-16-le")) // 2

    broken = tmp_path / "sub" / "broken.py"
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=broken.as_uri(), language_id="python", version=1,
                                             text=BAD_CLIP + "def (:\n")))
    assert await _diagnostics(client, broken.as_uri(), 1) == []
    good = tmp_path / "sub" / "good.py"
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=good.as_uri(), language_id="python", version=1, text=GOOD)))
    assert await _diagnostics(client, good.as_uri(), 1) == []


_NO_RESOLVE = client_capabilities("visual-studio-code")
_NO_RESOLVE.text_document.code_action.resolve_support = None


@pytest_lsp.fixture(config=ClientServerConfig(server_command=[sys.executable, "-m", "ampfix", "server"]))
async def plain_client(lsp_client: LanguageClient):
    await lsp_client.initialize_session(types.InitializeParams(capabilities=_NO_RESOLVE, root_uri=None))
    yield
    await lsp_client.shutdown_session()


async def test_fix_all_edit_inline_for_a_client_that_cannot_resolve(plain_client: LanguageClient, tmp_path):
    _preview(tmp_path)
    path = tmp_path / "train.py"
    uri = path.as_uri()
    plain_client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=BAD_CLIP)))
    (diag,) = await _diagnostics(plain_client, uri, 1)
    actions = await plain_client.text_document_code_action_async(types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), range=diag.range,
        context=types.CodeActionContext(diagnostics=[], only=[types.CodeActionKind.SourceFixAll])))
    (fix_all,) = actions
    assert fix_all.title == "ampfix: apply all safe fixes (1)"
    assert _apply(BAD_CLIP, fix_all.edit.changes[uri]) == FIXED_CLIP


async def test_fix_all_reads_the_project_as_the_diagnostics_do(client: LanguageClient, tmp_path):
    """A finding that another module shows (the scaler of `engine.py`'s helper is the
    GradScaler `main.py` passes in) is offered as a safe fix, and "apply all safe fixes" applies
    it too: its edit is made with the project read, as the diagnostics and `ampfix rewrite` are
    (it was made with the file alone, and gave no edit for the one fix it counted)."""
    import shutil
    from pathlib import Path

    project = tmp_path / "proj"
    shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "projects" / "bad_scaler_parameter", project)
    path = project / "engine.py"
    text = path.read_text()
    uri = path.as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))
    (diag,) = await _diagnostics(client, uri, 1)
    assert diag.code == "AMP008" and diag.data["fix"] == "safe"
    actions = await client.text_document_code_action_async(types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), range=diag.range,
        context=types.CodeActionContext(diagnostics=[diag])))
    (fix_all,) = [a for a in actions if a.kind == "source.fixAll.ampfix"]
    assert fix_all.title == "ampfix: apply all safe fixes (1)"
    resolved = await client.code_action_resolve_async(fix_all)
    assert resolved.edit is not None
    assert _apply(text, resolved.edit.changes[uri]) == text.replace("        loss.backward()",
                                                                      "        scaler.scale(loss).backward()")


async def test_a_burst_of_changes_is_analysed_once_at_its_last_version(client: LanguageClient, tmp_path):
    """Changes that come faster than the server's debounce skip the versions they supersede:
    the diagnostics published are those of the last text, tagged with its version, and
    code actions answer from that analysis."""
    _preview(tmp_path)
    path = tmp_path / "train.py"
    uri = path.as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=GOOD)))
    assert await _diagnostics(client, uri, 1) == []
    published = []
    features = client.protocol.fm.features
    record = features[types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS]  # pytest-lsp's own, which fills client.diagnostics
    features[types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS] = lambda *args: (published.append(args[-1]), record(*args))[1]
    # 20 keystrokes: the text alternates between a clean and a bad version, and ends bad
    for version in range(2, 22):
        text = BAD_CLIP if version % 2 else GOOD
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)]))
    for _ in range(100):
        await client.wait_for_notification(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        if published and published[-1].version == 21:
            break
    assert published[-1].version == 21 and [d.code for d in published[-1].diagnostics] == ["AMP003"]
    assert len(published) < 20  # superseded versions were skipped, not analysed one by one
    (diag,) = published[-1].diagnostics
    actions = await client.text_document_code_action_async(types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), range=diag.range,
        context=types.CodeActionContext(diagnostics=[diag])))
    (quick,) = [a for a in actions if a.kind == types.CodeActionKind.QuickFix]
    assert _apply(BAD_CLIP, quick.edit.changes[uri]) == FIXED_CLIP


async def test_edits_re_parsed_in_place_give_a_fresh_analysis_diagnostics(client: LanguageClient, tmp_path):
    """The server re-parses an edit inside one statement only (`ampfix/engine/incremental.py`):
    after each edit of a sequence (typing in a method, a comment line, lines removed, a syntax
    error and its fix, a method and a class added, a deletion), the diagnostics are those of the
    same text opened fresh."""
    from test_incremental import TRAINER, _edits

    def key(diags):
        return sorted((d.code, d.range.start.line, d.range.start.character, d.range.end.line,
                       d.range.end.character, d.message) for d in diags)

    _preview(tmp_path)  # TRAINER's findings are AMP003's
    uri = (tmp_path / "trainer.py").as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=TRAINER)))
    assert [d.code for d in await _diagnostics(client, uri, 1)].count("AMP003") == 2
    for version, (what, text) in enumerate(_edits(), start=2):
        client.diagnostics.pop(uri, None)
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)]))
        got = await _diagnostics(client, uri, version)
        if "syntax error" in what:
            continue  # the last good diagnostics stay while the text does not parse
        fresh_uri = (tmp_path / f"fresh{version}.py").as_uri()
        client.text_document_did_open(types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=fresh_uri, language_id="python", version=1, text=text)))
        assert key(got) == key(await _diagnostics(client, fresh_uri, 1)), what


HELPER_CALLER = """\
# the helper runs the backward pass
import torch

from pkg.helpers import backward_step


def fit(model, optimizer, loader):
    scaler = torch.amp.GradScaler("cuda")
    for x, y in loader:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.mse_loss(model(x), y)
            backward_step(loss, scaler)
        scaler.step(optimizer)
        scaler.update()
"""


async def test_a_module_written_on_disk_is_seen_at_the_next_analysis(client: LanguageClient, tmp_path):
    # the server keeps the project (its modules, import graph and resolutions) between
    # analyses: a module that appears on disk, or changes there, is read at the next one
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    path = tmp_path / "train.py"
    path.write_text(HELPER_CALLER)
    uri = path.as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=HELPER_CALLER)))
    assert await _diagnostics(client, uri, 1) == []  # pkg.helpers does not exist: unknown

    helpers = tmp_path / "pkg" / "helpers.py"
    helpers.write_text("def backward_step(loss, scaler):\n    scaler.scale(loss).backward()\n")
    for version, expected in ((2, ["AMP001"]), (3, [])):
        client.diagnostics.pop(uri, None)
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=HELPER_CALLER + "\n" * version)]))
        found = await _diagnostics(client, uri, version)
        assert [d.code for d in found] == expected, version
        helpers.write_text("def backward_step(loss, scaler):\n    return loss  # no backward any more\n")
