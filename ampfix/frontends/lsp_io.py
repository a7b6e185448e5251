"""The language server's transport, made to answer every request whatever the client sends.

pygls' own stdio loop trusts the framing and the params: a `Content-Length` of 10^14 is read
into memory (MemoryError kills the server), a body a few bytes short leaves the rest of it in
front of the next header and no later message is read, params of the wrong type get a
`window/showMessage` and no response, requests before `initialize` or after `shutdown` get a
traceback or nothing, and `exit` without `shutdown` ends the process with status 0. Here:

* `Framer` reads messages from the raw file descriptor: headers are looked for anywhere in
  the stream (what is in front of `Content-Length:` that is not a message is skipped, so the
  stream resynchronises); a body over `MAX_MESSAGE` is never read into memory; a body that is
  not JSON is given the bytes that follow it up to the next header (a `Content-Length` that was
  short) before it is given up; a body whose length never arrives but that is complete JSON
  is taken as it is (a `Content-Length` that was long).
* `serve` dispatches: a body that is not JSON gets a parse error (-32700) - with the request's
  id when one can be read from it; a request before `initialize` gets -32002, one after
  `shutdown` -32600; params that do not fit the method get -32602 with a one-line message;
  a handler that fails answers -32603 with a one-line message (no traceback). `exit` ends the
  process with 0 after `shutdown`, else 1.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import select
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional, Tuple

from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pygls.protocol import LanguageServerProtocol

log = logging.getLogger(__name__)

MAX_MESSAGE = 64 * 1024 * 1024  # bytes of one message; an editor's largest file fits many times over
MAX_HEADERS = 8 * 1024
_HEADER_RE = re.compile(rb"content-length[ \t]*:[ \t]*(\d+)[ \t]*\r?\n", re.IGNORECASE)
_END_RE = re.compile(rb"\r?\n\r?\n")
# the beginning of a `Content-Length: N` line, cut where the bytes that came so far end


def _partial(word: bytes, tail: bytes) -> "re.Pattern[bytes]":
    pattern = tail
    for ch in reversed(word[1:]):
        pattern = re.escape(bytes([ch])) + b"(?:" + pattern + b")?"
    return re.compile(re.escape(word[:1]) + b"(?:" + pattern + b")?\\Z", re.IGNORECASE)


_PARTIAL_RE = _partial(b"content-length", rb"[ \t]*(?::[ \t]*\d*[ \t]*\r?)?")
_ID_RE = re.compile(rb'"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.)*")')

PARSE_ERROR, INVALID_REQUEST, INVALID_PARAMS, INTERNAL_ERROR = -32700, -32600, -32602, -32603
SERVER_NOT_INITIALIZED = -32002


class Framer:
    """LSP messages from a byte stream (see the module docstring). `next()` returns
    ("message", body), ("oversized", length), ("garbage", bytes that are not a message) or
    None at the end of the stream."""

    def __init__(self, fd: int, settle: float = 0.3):
        self.fd = fd
        self.buf = bytearray()
        self.eof = False
        self.settle = settle  # seconds without new bytes after which what is waiting is looked at

    def _fill(self, timeout: Optional[float] = None) -> bool:
        """Read what is there (waiting up to `timeout`, None: until something comes);
        False when nothing came (the end of the stream, or the time ran out)."""
        if self.eof:
            return False
        if timeout is not None:
            ready, _, _ = select.select([self.fd], [], [], timeout)
            if not ready:
                return False
        data = os.read(self.fd, 1 << 16)
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def next(self) -> Optional[Tuple[str, Any]]:
        garbage = bytearray()
        while True:
            m = _HEADER_RE.search(self.buf)
            if m is None:
                partial = _PARTIAL_RE.search(self.buf)  # the start of a header may be at the end
                keep = partial.start() if partial and partial.end() > partial.start() else len(self.buf)
                if len(garbage) < MAX_MESSAGE:
                    garbage += self.buf[:keep]
                del self.buf[:keep]
                # bytes that cannot be a message: looked at once no more come for a moment
                if not self._fill(self.settle if garbage.strip() else None):
                    if self.eof:
                        garbage += self.buf
                        self.buf.clear()
                    if garbage.strip():
                        return ("garbage", bytes(garbage))
                    if self.eof:
                        return None
                continue
            if m.start():
                garbage += self.buf[: m.start()]
                del self.buf[: m.start()]
            if garbage.strip():
                return ("garbage", bytes(garbage))  # the header is dealt with by the next call
            garbage.clear()
            m = _HEADER_RE.match(self.buf)
            end = _END_RE.search(self.buf, m.end() - 2)  # the header's own line break starts the blank line
            if end is None:
                if len(self.buf) > MAX_HEADERS:
                    del self.buf[: m.end()]
                    return ("garbage", b"headers without an end")
                if not self._fill():
                    return None
                continue
            length = int(m.group(1))
            del self.buf[: end.end()]
            if length > MAX_MESSAGE:
                return ("oversized", length)
            return ("message", self._body(length))

    def _body(self, length: int) -> bytes:
        while len(self.buf) < length:
            if not self._fill(self.settle) and (self.eof or _json_end(bytes(self.buf)) is not None):
                break  # a Content-Length longer than the body, and nothing more comes: it is complete
        take = min(length, len(self.buf))
        body = bytes(self.buf[:take])
        del self.buf[:take]
        end = _json_end(body)
        if end is not None:
            if body[end:].strip():  # a Content-Length too long: the rest belongs to the next message
                self.buf[:0] = body[end:]
                body = body[:end]
            return body
        # a Content-Length shorter than the body: its last bytes lie in front of the next header
        # (or are all that is left); look at them once they have come
        while _HEADER_RE.search(self.buf) is None and self._fill(self.settle):
            pass
        nxt = _HEADER_RE.search(self.buf)
        rest = bytes(self.buf[: nxt.start() if nxt else len(self.buf)])
        end = _json_end(body + rest)
        if rest.strip() and end is not None and not (body + rest)[end:].strip():
            del self.buf[: len(rest)]
            return body + rest
        return body


def _json_end(data: bytes) -> Optional[int]:
    """Where the JSON value that `data` starts with ends (in bytes), or None."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    start = len(text) - len(text.lstrip())
    try:
        _, end = json.JSONDecoder().raw_decode(text, start)
    except (ValueError, RecursionError):
        return None
    return len(text[:end].encode("utf-8"))


def is_open(server, uri: str) -> bool:
    """Whether the client opened the document (a request about another one is answered
    empty: pygls would read the file from disk, or fail on a file that is not there)."""
    from urllib.parse import unquote

    return unquote(uri) in server.workspace.text_documents


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


class Protocol(LanguageServerProtocol):
    """pygls' protocol with one-line error messages: a failing handler answers -32603 with
    `ampfix: Type: message`, no traceback in `data`."""

    def _send_response(self, msg_id, result=None, error=None):
        if error is not None and getattr(error, "data", None) is not None:
            message = error.message.strip().splitlines()[-1] if error.message.strip() else "internal error"
            error = types.ResponseError(code=error.code, message=_one_line(f"ampfix: {message}"))
        return super()._send_response(msg_id, result, error)


def _send_error(protocol, msg_id, code: int, message: str) -> None:
    protocol._send_data({"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": _one_line(message)}})


def _log(protocol, message: str) -> None:
    protocol._send_data({"jsonrpc": "2.0", "method": types.WINDOW_LOG_MESSAGE,
                         "params": {"type": types.MessageType.Warning.value, "message": _one_line(message)}})


def _request_id(body: bytes):
    """The id of a request whose body is not JSON, when it can be read from it (else None)."""
    m = _ID_RE.search(body)
    if m is None:
        return None
    try:
        return json.loads(m.group(1))
    except ValueError:
        return None


class _State:
    def __init__(self) -> None:
        self.initialized = False
        self.shut_down = False
        self.exit_code: Optional[int] = None


def dispatch(protocol, state: _State, body: bytes) -> None:
    """Check one message and hand it to pygls, or answer it with an error."""
    try:
        raw = json.loads(body)
    except (ValueError, RecursionError) as exc:
        _send_error(protocol, _request_id(body), PARSE_ERROR, f"ampfix: the message is not JSON ({exc})")
        return
    if not isinstance(raw, dict):
        _send_error(protocol, None, INVALID_REQUEST, "ampfix: a message must be a JSON object")
        return
    method, msg_id = raw.get("method"), raw.get("id")
    is_request = "id" in raw and "method" in raw
    if raw.get("jsonrpc") != "2.0" or (is_request and (not isinstance(msg_id, (int, str)) or isinstance(msg_id, bool))) \
            or ("method" in raw and not isinstance(method, str)):
        if is_request or "method" not in raw:
            _send_error(protocol, msg_id if isinstance(msg_id, (int, str)) else None, INVALID_REQUEST,
                        "ampfix: not a JSON-RPC 2.0 message (jsonrpc, id and method)")
        return
    if method is not None:
        if state.shut_down and method != types.EXIT:
            if is_request:
                _send_error(protocol, msg_id, INVALID_REQUEST, f"ampfix: {method}: the server is shut down")
            return
        if not state.initialized and method not in (types.INITIALIZE, types.EXIT):
            if is_request:
                _send_error(protocol, msg_id, SERVER_NOT_INITIALIZED,
                            f"ampfix: {method}: the server is not initialized (send `initialize` first)")
            return
    try:
        message = json.loads(body, object_hook=protocol.structure_message)
    except (JsonRpcException, Exception) as exc:  # params that do not fit the method
        cause = exc.__cause__ or exc
        why = _one_line(str(cause).splitlines()[0] if str(cause).strip() else type(cause).__name__)
        if is_request:
            _send_error(protocol, msg_id, INVALID_PARAMS, f"ampfix: invalid params for {method}: {why}")
        else:
            _log(protocol, f"ampfix: ignored {method}: invalid params: {why}")
        return
    if method == types.INITIALIZE and is_request:
        state.initialized = True
    elif method == types.SHUTDOWN and is_request:
        state.shut_down = True
    protocol.handle_message(message)


async def _loop(server, framer: Framer, state: _State) -> None:
    protocol = server.protocol
    loop = asyncio.get_running_loop()
    oversized = 0
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ampfix-lsp-reader") as reader:
        while True:
            item = await loop.run_in_executor(reader, framer.next)
            if item is None:
                return
            kind, payload = item
            if kind == "oversized":
                oversized = payload
                _log(protocol, f"ampfix: ignored a message of {payload} bytes (the limit is {MAX_MESSAGE} bytes)")
                continue
            if kind == "garbage":  # bytes without a usable header: a request among them gets an answer
                msg_id = _request_id(payload)
                if msg_id is not None:
                    why = (f"its Content-Length ({oversized} bytes) is over the limit of {MAX_MESSAGE} bytes"
                           if oversized else "it came without a usable Content-Length header")
                    _send_error(protocol, msg_id, INVALID_REQUEST, f"ampfix: the message was ignored: {why}")
                oversized = 0
                continue
            oversized = 0
            try:
                dispatch(protocol, state, payload)
            except SystemExit as exc:  # `exit`
                state.exit_code = exc.code if isinstance(exc.code, int) else 1
                return
            await asyncio.sleep(0)  # let the handlers this message started run


def serve(server, stdin_fd: Optional[int] = None, stdout=None) -> int:
    """Serve LSP over stdio until `exit` or the end of stdin; returns the exit status (0 after
    `shutdown`, else 1)."""
    import sys

    from pygls.io_ import StdoutWriter

    state = _State()
    server._stop_event = threading.Event()
    server.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))
    framer = Framer(sys.stdin.fileno() if stdin_fd is None else stdin_fd)
    try:
        asyncio.run(_loop(server, framer, state))
    except BrokenPipeError:
        log.error("the client closed the connection")
    finally:
        server.shutdown()
    if state.exit_code is not None:
        return state.exit_code
    return 0 if state.shut_down else 1
