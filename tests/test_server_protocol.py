"""Issue 22, the language server's protocol: every request gets a response (an LSP error with a
one-line message at worst), whatever the framing or the params; `exit` without `shutdown`
exits 1; a configuration error is said once; a syntax error while typing keeps the last good
diagnostics.

The framing tests talk bytes to a real `python -m ampfix server` over its stdio; the editor
behaviour tests use a real LSP client (pytest-lsp)."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("pygls")
pytest_lsp = pytest.importorskip("pytest_lsp")

from lsprotocol import types  # noqa: E402
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities  # noqa: E402

from tests.conftest import ROOT  # noqa: E402
from tests.test_cli import BAD_CLIP, FIXED_CLIP  # noqa: E402

TIMEOUT = 60


class Raw:
    """A byte-level client of a real server process."""

    def __init__(self, cwd):
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen([sys.executable, "-m", "ampfix", "server"], cwd=cwd, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.inbox: "queue.Queue[dict]" = queue.Queue()
        self.seen: list = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        out = self.proc.stdout
        while True:
            length = None
            while True:
                line = out.readline()
                if not line:
                    return
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
                if line in (b"\r\n", b"\n"):
                    break
            self.inbox.put(json.loads(out.read(length)))

    def send_bytes(self, data: bytes):
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, obj, delta=0, header=None):
        body = json.dumps(obj).encode()
        head = header if header is not None else f"Content-Length: {len(body) + delta}\r\n\r\n".encode()
        self.send_bytes(head + body)

    def request(self, msg_id, method, params=None, **kw):
        msg = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not ...:
            msg["params"] = params
        self.send(msg, **kw)

    def notify(self, method, params):
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def response(self, msg_id, timeout=TIMEOUT):
        deadline = time.monotonic() + timeout
        for m in self.seen:
            if m.get("id") == msg_id and "method" not in m:
                self.seen.remove(m)
                return m
        while time.monotonic() < deadline:
            try:
                m = self.inbox.get(timeout=0.5)
            except queue.Empty:
                continue
            if m.get("id") == msg_id and "method" not in m:
                return m
            self.seen.append(m)
        raise AssertionError(f"no response to {msg_id!r}; got {self.seen}")

    def initialize(self):
        self.request(0, "initialize", {"processId": None, "rootUri": None, "capabilities": {}})
        assert "result" in self.response(0)
        self.notify("initialized", {})

    def finish(self, shutdown=True):
        if shutdown:
            self.request("bye", "shutdown", None)
            assert self.response("bye") == {"jsonrpc": "2.0", "id": "bye", "result": None}
        self.notify("exit", None)
        return self.proc.wait(timeout=TIMEOUT)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def raw(tmp_path):
    r = Raw(tmp_path)
    yield r
    r.close()


def _error(resp, code):
    assert "error" in resp and "result" not in resp, resp
    err = resp["error"]
    assert err["code"] == code, resp
    assert "\n" not in err["message"] and err["message"].startswith("ampfix: ") and "data" not in err, err
    return err["message"]


def _preview(folder):
    """AMP003, BAD_CLIP's finding, is a preview rule: the server runs it for the files under
    `folder` with `preview = true` in their [tool.ampfix]."""
    (folder / "pyproject.toml").write_text("[tool.ampfix]\npreview = true\n")


def _open(raw, tmp_path, text=BAD_CLIP, name="train.py"):
    _preview(tmp_path)  # the code actions asked for are AMP003's fix
    uri = (tmp_path / name).as_uri()
    raw.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                         "text": text}})
    return uri


def _code_action_params(uri):
    return {"textDocument": {"uri": uri}, "range": {"start": {"line": 5, "character": 4},
                                                    "end": {"line": 5, "character": 10}},
            "context": {"diagnostics": []}}


def test_an_oversized_content_length_is_refused_and_the_server_goes_on(raw, tmp_path):
    raw.initialize()
    raw.request(7, "shutdown", None, header=b"Content-Length: 99999999999999\r\n\r\n")
    message = _error(raw.response(7), -32600)
    assert "99999999999999 bytes" in message and "over the limit" in message
    uri = _open(raw, tmp_path)
    raw.request(8, "textDocument/codeAction", _code_action_params(uri))
    assert raw.response(8)["result"]
    assert raw.finish() == 0


@pytest.mark.parametrize("delta", [-5, -1, +5])
def test_a_wrong_content_length_does_not_desynchronise_the_stream(raw, tmp_path, delta):
    raw.initialize()
    uri = _open(raw, tmp_path)
    raw.request(1, "textDocument/codeAction", _code_action_params(uri), delta=delta)
    first = raw.response(1)
    assert "result" in first and len(first["result"]) >= 1  # read whole after all, and answered
    raw.request(2, "textDocument/codeAction", _code_action_params(uri))
    assert "result" in raw.response(2)
    assert raw.finish() == 0  # shutdown answered too


def test_a_body_that_is_not_json_gets_a_parse_error_with_its_id(raw):
    raw.initialize()
    raw.send_bytes(b'Content-Length: 40\r\n\r\n{"jsonrpc": "2.0", "id": 9, "method": "s')
    raw.send_bytes(b"\r\n")  # more bytes that do not complete it
    _error(raw.response(9), -32700)
    raw.send_bytes(b"Content-Length: 4\r\n\r\n[1,2")
    assert raw.finish() == 0


def test_garbage_between_messages_is_skipped(raw):
    raw.send_bytes(b"\x00\xffnot a header at all\r\n\r\n")
    raw.initialize()
    raw.send_bytes(b"Content-Type: nothing\r\n\r\n")
    assert raw.finish() == 0


def test_requests_before_initialize_get_server_not_initialized(raw, tmp_path):
    raw.request(1, "textDocument/codeAction", _code_action_params((tmp_path / "x.py").as_uri()))
    assert "not initialized" in _error(raw.response(1), -32002)
    raw.request(2, "shutdown", None)
    _error(raw.response(2), -32002)
    raw.initialize()
    assert raw.finish() == 0


@pytest.mark.parametrize("params", [None, [], 5, "x", {"textDocument": 5}, {"textDocument": {"uri": 3}},
                                    {"textDocument": {"uri": "file:///x.py"}, "range": "all"}, ...])
def test_params_of_the_wrong_type_get_invalid_params(raw, params):
    raw.initialize()
    raw.request(3, "textDocument/codeAction", params)
    message = _error(raw.response(3), -32602)
    assert "invalid params for textDocument/codeAction" in message
    # and a notification with wrong params is no reason to stop answering
    raw.notify("textDocument/didOpen", params if params is not ... else None)
    raw.request(4, "textDocument/codeAction", _code_action_params("file:///never/opened.py"))
    assert raw.response(4)["result"] == []
    assert raw.finish() == 0


def test_a_code_action_for_a_document_never_opened_is_answered(raw, tmp_path):
    raw.initialize()
    for uri in [(tmp_path / "missing.py").as_uri(), "untitled:Untitled-1", "file:///dev/null"]:
        raw.request(uri, "textDocument/codeAction", _code_action_params(uri))
        assert raw.response(uri) == {"jsonrpc": "2.0", "id": uri, "result": []}
    (tmp_path / "on_disk.py").write_text(BAD_CLIP)
    uri = (tmp_path / "on_disk.py").as_uri()
    raw.request(5, "textDocument/codeAction", _code_action_params(uri))
    assert raw.response(5)["result"] == []  # not open: the client did not ask about it
    raw.request(6, "no/such/method", {})
    assert raw.response(6)["error"]["code"] == -32601
    assert raw.finish() == 0


def test_requests_after_shutdown_are_refused_and_exit_is_0(raw):
    raw.initialize()
    raw.request(1, "shutdown", None)
    assert raw.response(1)["result"] is None
    raw.request(2, "textDocument/codeAction", _code_action_params("file:///x.py"))
    assert "shut down" in _error(raw.response(2), -32600)
    raw.notify("exit", None)
    assert raw.proc.wait(timeout=TIMEOUT) == 0


def test_exit_without_shutdown_exits_1(raw):
    raw.initialize()
    assert raw.finish(shutdown=False) == 1


def test_the_end_of_stdin_without_exit_exits_1(raw):
    raw.initialize()
    raw.proc.stdin.close()
    assert raw.proc.wait(timeout=TIMEOUT) == 1


# ----------------------------------------------------------------------------- with a real client


@pytest_lsp.fixture(config=ClientServerConfig(server_command=[sys.executable, "-m", "ampfix", "server"]))
async def client(lsp_client: LanguageClient):
    await lsp_client.initialize_session(types.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"), root_uri=None))
    yield
    await lsp_client.shutdown_session()


async def _next_diagnostics(client: LanguageClient, uri: str):
    client.diagnostics.pop(uri, None)
    for _ in range(100):
        await client.wait_for_notification(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        if client.diagnostics.get(uri) is not None:
            return list(client.diagnostics[uri])
    raise AssertionError("no diagnostics")


def _change(client, uri, version, text):
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
        content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)]))


async def test_a_syntax_error_while_typing_keeps_the_last_good_diagnostics(client: LanguageClient, tmp_path):
    _preview(tmp_path)
    path = tmp_path / "train.py"
    path.write_text(BAD_CLIP)
    uri = path.as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=BAD_CLIP)))
    (good,) = await _next_diagnostics(client, uri)
    assert good.code == "AMP003"
    typing_ = BAD_CLIP + "def f(:\n"  # half typed
    _change(client, uri, 2, typing_)
    (kept,) = await _next_diagnostics(client, uri)
    assert (kept.code, kept.range) == (good.code, good.range)
    # code actions on the broken text answer (nothing to offer while it does not parse)
    actions = await client.text_document_code_action_async(types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), range=good.range,
        context=types.CodeActionContext(diagnostics=[good])))
    assert list(actions) == []
    _change(client, uri, 3, FIXED_CLIP + "def f():\n    pass\n")  # typed to the end, and fixed
    assert await _next_diagnostics(client, uri) == []


async def test_a_configuration_error_is_shown_once(client: LanguageClient, tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.ampfix]\nselect = ["AMP777"]\n')
    # while the configuration is broken the files are checked with the default rules (preview off): the
    # finding here is AMP101's (the deprecated torch.cuda.amp spelling), on by default, not AMP003's or
    # AMP007's, preview rules
    text = BAD_CLIP + "\n\nscaler = torch.cuda.amp.GradScaler()\n"
    uris = []
    for k in range(3):
        path = tmp_path / f"train_{k}.py"
        path.write_text(text)
        uris.append(path.as_uri())
        client.text_document_did_open(types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=path.as_uri(), language_id="python", version=1, text=text)))
        await _next_diagnostics(client, path.as_uri())
    for version in range(2, 5):
        _change(client, uris[0], version, text + f"# edit {version}\n")
        (diag,) = await _next_diagnostics(client, uris[0])  # checked with the defaults meanwhile
        assert diag.code == "AMP101"
    shown = [m for m in client.messages if "AMP777" in m.message]
    assert len(shown) == 1 and shown[0].type == types.MessageType.Error
    # fixed, then broken again: said again
    (tmp_path / "pyproject.toml").write_text("[tool.ampfix]\n")
    _change(client, uris[1], 2, text + "# fixed\n")
    await _next_diagnostics(client, uris[1])
    (tmp_path / "pyproject.toml").write_text('[tool.ampfix]\nselect = ["AMP777"]\n')
    _change(client, uris[2], 2, text + "# broken again\n")
    await _next_diagnostics(client, uris[2])
    assert len([m for m in client.messages if "AMP777" in m.message]) == 2


# ----------------------------------------------------------------------------- the framer alone


def _framed(obj, delta=0):
    body = json.dumps(obj).encode()
    return f"Content-Length: {len(body) + delta}\r\n\r\n".encode() + body


def _framer_items(chunks, settle=0.05):
    """What `Framer` reads from a real pipe fed `chunks` (with a pause between them)."""
    from ampfix.frontends.lsp_io import Framer

    r, w = os.pipe()

    def feed():
        for chunk in chunks:
            os.write(w, chunk)
            time.sleep(0.1)
        os.close(w)

    threading.Thread(target=feed, daemon=True).start()
    framer = Framer(r, settle=settle)
    out = []
    while True:
        item = framer.next()
        if item is None:
            break
        kind, payload = item
        out.append((kind, json.loads(payload) if kind == "message" else payload))
    os.close(r)
    return out


def test_framer_reads_messages_split_and_joined_anyhow():
    a, b, c = ({"jsonrpc": "2.0", "id": i, "method": "m", "params": {"x": "é" * i}} for i in range(3))
    stream = _framed(a) + _framed(b) + _framed(c)
    assert _framer_items([stream]) == [("message", a), ("message", b), ("message", c)]
    pieces = [stream[i: i + 7] for i in range(0, len(stream), 7)]
    assert _framer_items(pieces) == [("message", a), ("message", b), ("message", c)]
    lower = _framed(a).replace(b"Content-Length", b"content-length")
    typed = _framed(b).replace(b"\r\n\r\n", b"\r\nContent-Type: application/vscode-jsonrpc; charset=utf-8\r\n\r\n")
    assert _framer_items([lower + typed]) == [("message", a), ("message", b)]


def test_framer_recovers_from_wrong_lengths_oversized_headers_and_garbage():
    a, b = {"jsonrpc": "2.0", "id": 1, "method": "m"}, {"jsonrpc": "2.0", "id": 2, "method": "n"}
    assert _framer_items([_framed(a, -5) + _framed(b)]) == [("message", a), ("message", b)]
    assert _framer_items([_framed(a, -5), _framed(b)]) == [("message", a), ("message", b)]
    assert _framer_items([_framed(a, +5) + _framed(b)]) == [("message", a), ("message", b)]
    assert _framer_items([_framed(a, +5)]) == [("message", a)]  # nothing more comes: taken as it is
    items = _framer_items([b"Content-Length: 99999999999999\r\n\r\n" + json.dumps(a).encode(), _framed(b)])
    assert items[0] == ("oversized", 99999999999999) and items[1][0] == "garbage" and items[2] == ("message", b)
    items = _framer_items([b"\x00\x01junk\r\n" + _framed(a) + b"more junk" + _framed(b)])
    assert [k for k, _ in items] == ["garbage", "message", "garbage", "message"]
