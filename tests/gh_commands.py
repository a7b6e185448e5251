"""GitHub Actions workflow commands (`::error file=...,line=...::message`) read the way the
Actions runner reads them: the runner's `ActionCommand.TryParseV2` (actions/runner,
src/Runner.Common/ActionCommand.cs), written again in Python for the tests. A line that the
runner would not take for a command is None here too.

The rules it follows: leading whitespace is dropped; the line starts with `::`; the command and
its properties end at the next `::`; the command name is the text up to the first space and must
be a known command; properties are split on `,`, each on its first `=`, and unescaped (`%0D`,
`%0A`, `%3A`, `%2C`, `%25`); the data is the rest of the line, unescaped (`%0D`, `%0A`, `%25`).
Property names are case-insensitive."""

from dataclasses import dataclass, field
from typing import Dict, Optional

KNOWN = {"error", "warning", "notice", "debug", "group", "endgroup", "add-mask", "set-output", "save-state",
         "add-matcher", "remove-matcher", "echo", "stop-commands", "add-path", "set-env"}
_DATA = (("%0D", "\r"), ("%0A", "\n"), ("%25", "%"))
_PROPERTY = (("%0D", "\r"), ("%0A", "\n"), ("%3A", ":"), ("%2C", ","), ("%25", "%"))


@dataclass
class Command:
    name: str
    properties: Dict[str, str] = field(default_factory=dict)  # keys lower-cased
    data: str = ""


def _unescape(text: str, table) -> str:
    for escaped, plain in table:  # in the runner's order: %25 last
        text = text.replace(escaped, plain)
    return text


def parse(line: str) -> Optional[Command]:
    message = line.rstrip("\r\n").lstrip()
    if not message.startswith("::"):
        return None
    end = message.find("::", 2)
    if end < 0:
        return None
    info = message[2:end]
    space = info.find(" ")
    name = info if space < 0 else info[:space]
    if name not in KNOWN:
        return None
    cmd = Command(name)
    if space > 0:
        for prop in (p for p in info[space + 1:].strip().split(",") if p):
            pair = [p for p in prop.split("=", 1) if p]
            if len(pair) == 2:
                cmd.properties[pair[0].lower()] = _unescape(pair[1], _PROPERTY)
    cmd.data = _unescape(message[end + 2:], _DATA)
    return cmd
