"""Language server latency, measured with a real LSP client (pygls) driving `ampfix server`.

    python bench/bench_server.py [--file PATH] [--rounds 5] [--keystrokes 10] [--gap 0.03]
    python bench/bench_server.py --baseline-python /path/to/old/.venv/bin/python
    python bench/bench_server.py --save [PATH]

The document is opened with the text of `--file` (default: accelerate 1.15.0's `accelerator.py`,
4400 lines, from the sdist that bench_check.py unpacks into bench/.cache/) plus, at its end, a
training step with a fixable finding (AMP003), so that code actions have something to offer.
Then, per round:
  * a burst of `--keystrokes` changes (one character typed each, `--gap` seconds apart, as a
    client sends them while someone types), then the time from the last change until the
    `publishDiagnostics` of its version arrives;
  * `--pause` seconds later (a person reading the diagnostic), a code action request on the
    finding's range (quick fix, and "apply all safe fixes" as the server offers it), timed from
    the request to the answer;
  * resolving "apply all safe fixes" when the server offers it for resolving.
With --save, each round starts with a save: PATH (default: the document's own file) gets a new
modification time, as an editor's save gives it (its bytes are left as they are), so the burst's
analysis is the first after a file of the tree changed on disk.
The client announces VS Code's capabilities (it resolves code action edits). With
--baseline-python the same is measured for `PYTHON -m ampfix server` (e.g. the code before a
change, installed in another venv with pygls), alternating rounds, so both see the same load.
Everything is printed as a Markdown table (medians, and every run).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

from lsprotocol import types
from pygls.lsp.client import LanguageClient

HERE = Path(__file__).resolve().parent
DEFAULT_FILE = HERE / ".cache" / "sdist-accelerate-1.15.0" / "accelerate-1.15.0" / "src" / "accelerate" / "accelerator.py"

STEP = '''

def _bench_train_step(model, optimizer, scaler, loss):
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
'''


def capabilities() -> types.ClientCapabilities:
    """What VS Code says about diagnostics and code actions (it resolves a code action's edit)."""
    return types.ClientCapabilities(
        text_document=types.TextDocumentClientCapabilities(
            synchronization=types.TextDocumentSyncClientCapabilities(did_save=True),
            publish_diagnostics=types.PublishDiagnosticsClientCapabilities(version_support=True),
            code_action=types.CodeActionClientCapabilities(
                code_action_literal_support=types.ClientCodeActionLiteralOptions(
                    code_action_kind=types.ClientCodeActionKindOptions(value_set=["quickfix", "source.fixAll"])),
                resolve_support=types.ClientCodeActionResolveOptions(properties=["edit"]),
                data_support=True, is_preferred_support=True)))


class Session:
    def __init__(self, python: str, label: str):
        self.python, self.label = python, label
        self.client = LanguageClient("bench", "1")
        self.arrived: Dict[int, float] = {}  # version -> arrival time of its diagnostics
        self.last: Optional[types.PublishDiagnosticsParams] = None
        self.event = asyncio.Event()

        @self.client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        def on_diagnostics(params: types.PublishDiagnosticsParams) -> None:
            self.arrived.setdefault(params.version if params.version is not None else -1, time.perf_counter())
            self.last = params
            self.event.set()

    async def start(self, cwd: Path) -> None:
        # from bench/.cache: `-m ampfix` must import the interpreter's own ampfix, not this checkout's
        await self.client.start_io(self.python, "-m", "ampfix", "server", cwd=str(cwd))
        await self.client.initialize_async(types.InitializeParams(capabilities=capabilities(), root_uri=None))
        self.client.initialized(types.InitializedParams())

    async def diagnostics_of(self, version: int, timeout: float = 900.0) -> types.PublishDiagnosticsParams:
        deadline = time.perf_counter() + timeout
        while version not in self.arrived:
            self.event.clear()
            await asyncio.wait_for(self.event.wait(), max(0.01, deadline - time.perf_counter()))
        assert self.last is not None
        return self.last

    async def stop(self) -> None:
        await self.client.shutdown_async(None)
        self.client.exit(None)
        await self.client.stop()


async def one_round(s: Session, uri: str, text: str, version: int, keystrokes: int, gap: float, line: int,
                    pause: float):
    """A burst of typing on `line` (a new comment line); returns (latency, code action time, resolve
    time, version after the burst, text after the burst)."""
    typed = "# "
    for _ in range(keystrokes):
        typed += "x"
        version += 1
        lines = text.split("\n")
        lines.insert(line, typed)
        s.client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text="\n".join(lines))]))
        sent = time.perf_counter()
        if gap:
            await asyncio.sleep(gap)
    final = await s.diagnostics_of(version)
    latency = s.arrived[version] - sent
    diag = next(d for d in final.diagnostics if d.code == "AMP003")
    await asyncio.sleep(pause)  # the person reads the diagnostic, then asks for its fix
    t0 = time.perf_counter()
    actions = await s.client.text_document_code_action_async(types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), range=diag.range,
        context=types.CodeActionContext(diagnostics=[diag])))
    t_action = time.perf_counter() - t0
    assert any(a.kind == types.CodeActionKind.QuickFix for a in actions or []), actions
    fix_all = [a for a in actions or [] if a.kind == "source.fixAll.ampfix"]
    t_resolve = None
    if fix_all and fix_all[0].edit is None:
        t0 = time.perf_counter()
        resolved = await s.client.code_action_resolve_async(fix_all[0])
        t_resolve = time.perf_counter() - t0
        assert resolved.edit is not None
    lines = text.split("\n")
    lines.insert(line, typed)
    return latency, t_action, t_resolve, version, "\n".join(lines)


async def main_async(args) -> None:
    text = Path(args.file).read_text(encoding="utf-8") + STEP
    uri = Path(args.file).resolve().as_uri()
    line = text.count("\n") // 2  # a line in the middle of the file
    pythons = [(sys.executable, "current")]
    if args.baseline_python:
        pythons.append((args.baseline_python, "baseline"))
    sessions = [Session(py, label) for py, label in pythons]
    cwd = HERE / ".cache"
    results: Dict[str, Dict[str, List[float]]] = {}
    for s in sessions:
        await s.start(cwd)
        t0 = time.perf_counter()
        s.client.text_document_did_open(types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))
        await s.diagnostics_of(1)
        results[s.label] = {"open": [time.perf_counter() - t0], "latency": [], "action": [], "resolve": []}
    state = {s.label: (1, text) for s in sessions}
    for _ in range(args.rounds):
        for s in sessions:  # alternating: the machine's load hits both
            if args.save is not None:
                saved = Path(args.save or args.file)
                st = saved.stat()
                os.utime(saved, ns=(st.st_atime_ns, max(time.time_ns(), st.st_mtime_ns + 1_000_000)))
            version, current = state[s.label]
            latency, t_action, t_resolve, version, current = await one_round(
                s, uri, current, version, args.keystrokes, args.gap, line, args.pause)
            state[s.label] = (version, current)
            r = results[s.label]
            r["latency"].append(latency)
            r["action"].append(t_action)
            if t_resolve is not None:
                r["resolve"].append(t_resolve)
    for s in sessions:
        await s.stop()
    lines_n = text.count("\n") + 1
    saved = "" if args.save is None else f", each round after a save of {Path(args.save or args.file).name}"
    print(f"{Path(args.file).name} ({lines_n} lines with the added step), {args.rounds} rounds{saved} of "
          f"{args.keystrokes} keystrokes {args.gap * 1000:.0f} ms apart, code action {args.pause:.1f} s after the "
          f"diagnostics; {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f} at the end")
    print()
    print("| server | open: first diagnostics | diagnostics after the last keystroke (median) | "
          "code action round trip (median) | resolve apply-all (median) | every run (latency / action) |")
    print("|---|---:|---:|---:|---:|---|")
    for label, r in results.items():
        med = {k: (f"{statistics.median(v):.3f} s" if v else "-") for k, v in r.items()}
        runs = ", ".join(f"{a:.2f}/{b:.2f}" for a, b in zip(r["latency"], r["action"]))
        print(f"| {label} | {med['open']} | {med['latency']} | {med['action']} | {med['resolve']} | {runs} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", default=str(DEFAULT_FILE))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--keystrokes", type=int, default=10)
    ap.add_argument("--gap", type=float, default=0.03, help="seconds between two keystrokes")
    ap.add_argument("--pause", type=float, default=1.0,
                    help="seconds between the diagnostics' arrival and the code action request")
    ap.add_argument("--baseline-python", metavar="PYTHON")
    ap.add_argument("--save", nargs="?", const="", metavar="PATH",
                    help="a save (a new modification time) of PATH, default the document's file, before each burst")
    args = ap.parse_args()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
