"""Jupyter notebooks: the code cells, in order, are checked as one program (a scaler made in
cell 2 and stepped in cell 5 is one training step), and findings name the cell and the line in
it. IPython syntax (`%magic`, `!shell`, `x = !cmd`, `obj?`, non-Python `%%` cell magics) is
masked before parsing and put back as it was.

`rewrite` writes the notebook back changing only the `source` of the cells it fixed: outputs,
metadata, cell ids, key order, indentation and escaping stay byte for byte. nbformat reads and
checks the notebook; the new text is spliced into the original JSON at each fixed cell's
`source` (nbformat's own writer would re-indent and re-sort a notebook it did not write), then
read back with nbformat and compared with the original cell by cell before anything is kept.
"""

from __future__ import annotations

import ast
import json
import re
import warnings
from dataclasses import dataclass, field, replace
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Dict, List, Optional, Sequence, Tuple, Type

from ampfix.engine.analyze import (Diagnostic, FileError, FileResult, FixEdit, InputError, Settings, TextEdit, diff_names,
                           transform_text, unified_diff, worth_analysing)
from ampfix.rule import Rule

SUFFIX = ".ipynb"
INSTALL_HINT = 'notebooks need nbformat: pip install "ampfix[notebook]"'
MARKER = "# ampfix-cell: {}\n"
MARKER_RE = re.compile(r"^# ampfix-cell: (\d+)\n", re.MULTILINE)
PLACEHOLDER = "pass  # ampfix-magic: {}"
PLACEHOLDER_RE = re.compile(r"^[ \t]*pass  # ampfix-magic: (\d+)$")
#: cell magics whose body is Python run in the kernel (the others: %%bash, %%html, %%writefile ...)
PYTHON_CELL_MAGICS = {"time", "timeit", "capture", "prun", "debug", "memit", "mprun", "autoreload", "py"}
MAGIC_RE = re.compile(r"^[ \t]*(?:[%!]|[\w.,\s\[\]]+?=[ \t]*[%!])")
HELP_RE = re.compile(r"^[ \t]*(?:\?{1,2}[\w.]+|[\w.]+\?{1,2})[ \t]*$")
#: the line magics and shell aliases IPython runs without `%` (automagic, on by default) in a
#: cell of one line: IPython's own (`%lsmagic` in IPython 8 on Linux), ipykernel's, and common
#: extensions' (tensorboard, autoreload, sql, memory_profiler, line_profiler, watermark)
AUTOMAGIC = frozenset("""
alias alias_magic autoawait autocall automagic autosave bookmark cat cd clear colors conda config connect_info
cp debug dhist dirs doctest_mode ed edit env gui hist history killbgscripts ldir less lf lk ll load load_ext
loadpy logoff logon logstart logstate logstop ls lsmagic lx macro magic man matplotlib micromamba mamba mkdir
more mv notebook page pastebin pdb pdef pdoc pfile pinfo pinfo2 pip popd pprint precision prun psearch psource
pushd pwd pycat pylab qtconsole quickref recall rehashx reload_ext rep rerun reset reset_selective rm rmdir run
save sc set_env store sx system tb time timeit unalias unload_ext uv who who_ls whos xdel xmode
tensorboard autoreload aimport sql memit mprun lprun watermark
""".split())
AUTOMAGIC_RE = re.compile(r"^[ \t]*([A-Za-z_]\w*)(?:[ \t]+(.*))?$")
FLAGS = ast.PyCF_ONLY_AST | getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)


def is_notebook(path: str) -> bool:
    return path.lower().endswith(SUFFIX)


# ----------------------------------------------------------------------------- reading


def _error(path: str, message: str, line: Optional[int] = None, column: Optional[int] = None) -> InputError:
    return InputError(FileError(path, line, column, message))


def load_json(data: bytes, path: str) -> Tuple[str, dict]:
    """The notebook's text and its JSON (no nbformat needed: used to pre-filter), checked to
    have the shape the rest of this module reads (`check_shape`)."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _error(path, f"not a valid notebook: not UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})")
    nb = _loads(text, path)
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise _error(path, "not a valid notebook: no list of cells (nbformat 4 is supported)")
    check_shape(nb, path)
    return text, nb


def _loads(text: str, path: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise _error(path, f"not a valid notebook: invalid JSON: {exc.msg}", exc.lineno, exc.colno) from None
    except RecursionError:
        raise _error(path, "not a valid notebook: JSON nested too deeply") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits (sys.get_int_max_str_digits)
        why = str(exc).split(":")[0].strip() or type(exc).__name__
        raise _error(path, f"not a valid notebook: a value Python's JSON reader refuses ({why})") from None


def _kind(value) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def check_shape(nb: dict, path: str) -> None:
    """What nbformat 4 requires of the parts ampfix reads: integer versions, `metadata` (and
    its `kernelspec` and `language_info`) objects, each cell an object whose `source` is a
    string or a list of strings. Raises InputError naming the part (and the cell)."""
    for key in ("nbformat", "nbformat_minor"):
        if key in nb and (not isinstance(nb[key], int) or isinstance(nb[key], bool)):
            raise _error(path, f"not a valid notebook: `{key}` is {_kind(nb[key])}, not an integer")
    meta = nb.get("metadata", {})
    if not isinstance(meta, dict):
        raise _error(path, f"not a valid notebook: `metadata` is {_kind(meta)}, not an object")
    for key, member in (("kernelspec", "language"), ("language_info", "name")):
        part = meta.get(key)
        if part is None:
            continue
        if not isinstance(part, dict):
            raise _error(path, f"not a valid notebook: `metadata.{key}` is {_kind(part)}, not an object")
        if part.get(member) is not None and not isinstance(part[member], str):
            raise _error(path, f"not a valid notebook: `metadata.{key}.{member}` is {_kind(part[member])}, "
                               "not a string")
    for n, cell in enumerate(nb["cells"], 1):
        if not isinstance(cell, dict):
            raise _error(f"{path}:cell {n}", f"not a valid notebook: the cell is {_kind(cell)}, not an object")
        if not isinstance(cell.get("cell_type", ""), str):
            raise _error(f"{path}:cell {n}", f"not a valid notebook: `cell_type` is {_kind(cell['cell_type'])}, "
                                             "not a string")
        src = cell.get("source", "")
        if isinstance(src, list):
            bad = [x for x in src if not isinstance(x, str)]
            if bad:
                raise _error(f"{path}:cell {n}", f"not a valid notebook: `source` holds {_kind(bad[0])}; "
                                                 "it must be a string or a list of strings")
        elif not isinstance(src, str):
            raise _error(f"{path}:cell {n}", f"not a valid notebook: `source` is {_kind(src)}; it must be a string "
                                             "or a list of strings")


def _source(cell) -> str:
    src = cell.get("source", "") if isinstance(cell, dict) else ""
    return "".join(src) if isinstance(src, list) else src if isinstance(src, str) else ""


def _is_python(nb: dict) -> bool:
    """From the kernel's language (the shape is checked first: `check_shape`)."""
    meta = nb.get("metadata") or {}
    lang = ((meta.get("kernelspec") or {}).get("language") or (meta.get("language_info") or {}).get("name") or "python")
    return str(lang).lower() in ("python", "python3", "ipython", "ipython3")


def prefilter(data: bytes, path: str, rules: Sequence[Type[Rule]]) -> Optional[FileResult]:
    """A result right away when no selected rule can fire on the notebook's code, its own or
    through the modules of its project (or it is not a notebook); None when it must be analysed."""
    try:
        _, nb = load_json(data, path)
    except InputError as exc:
        return FileResult(path=path, error=exc.error)
    if not _is_python(nb):
        return FileResult(path=path)
    code = "\n".join(_source(c) for c in nb["cells"] if isinstance(c, dict) and c.get("cell_type") == "code")
    return None if worth_analysing(rules, code) else FileResult(path=path)


# ----------------------------------------------------------------------------- masking


@dataclass
class Cell:
    index: int  # position among all cells, 0-based
    source: str
    masked: str = ""
    magic_lines: Dict[int, str] = field(default_factory=dict)  # placeholder number -> original line
    skipped: bool = False  # not Python (a %%bash cell ...): left out of the program
    note: str = ""  # why it was skipped
    start: int = 0  # the line of `masked`'s first line in the joined program

    @property
    def number(self) -> int:
        return self.index + 1


def _compiles(text: str) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(text, "<cell>", "exec", flags=FLAGS, dont_inherit=True)
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False


def automagic(line: str) -> Optional[str]:
    """The magic a one-line cell runs when IPython reads it as an automagic command (`ls
    /data`, `cat config.yaml`, `pip install x`: a known magic's name, then something that is not
    an assignment or an operator, as IPython's prefilter decides), else None."""
    mt = AUTOMAGIC_RE.match(line.rstrip("\r\n"))
    if not mt or mt.group(1) not in AUTOMAGIC:
        return None
    rest = (mt.group(2) or "").strip()
    if rest[:1] in ("=", ","):
        return None  # IPython's AssignmentChecker: `ls = 3`, `ls, x = 1, 2` stay Python
    return mt.group(1)


def mask(cell: Cell, counter: List[int]) -> None:
    """IPython syntax becomes `pass  # ampfix-magic: N` (same indentation, same number of
    lines); a cell that compiles as Python is left as it is. A cell IPython runs as something
    other than Python (a `%%bash` cell magic, a one-line automagic command such as `ls /data`)
    is left out of the program, with a note saying why."""
    text = cell.source
    if _compiles(text):
        cell.masked = text
        return
    lines = text.splitlines(keepends=True)
    # IPython drops the leading blank lines of a cell before it looks for a cell magic
    first = next((i for i, ln in enumerate(lines) if ln.strip()), 0)
    if lines and lines[first].lstrip().startswith("%%"):
        name = lines[first].lstrip()[2:].split(None, 1)[0] if lines[first].lstrip()[2:].strip() else ""
        if name not in PYTHON_CELL_MAGICS:
            cell.skipped = True
            cell.note = f"skipped: a `%%{name}` cell (IPython runs it, not as Python)"
            return
    code_lines = [ln for ln in lines if ln.strip()]
    if len(code_lines) == 1:
        magic = automagic(code_lines[0].strip())
        if magic is not None:
            cell.skipped = True
            shown = code_lines[0].strip()
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            cell.note = (f"skipped: `{shown}` is an IPython command (automagic `%{magic}`), not Python")
            return
    out = []
    continued = False
    out_indent = ""
    for i, line in enumerate(lines):
        body = line.rstrip("\r\n")
        is_magic = continued or (i == first and body.lstrip().startswith("%%")) or bool(MAGIC_RE.match(body)) \
            or bool(HELP_RE.match(body))
        if is_magic:
            n = counter[0]
            counter[0] += 1
            cell.magic_lines[n] = body
            indent = body[: len(body) - len(body.lstrip())] if not continued else out_indent
            out_indent = indent
            out.append(indent + PLACEHOLDER.format(n) + line[len(body):])
            continued = body.endswith("\\")
        else:
            out.append(line)
            continued = False
    cell.masked = "".join(out)


def unmask(text: str, cell: Cell) -> Optional[str]:
    """The masked text with the IPython lines put back; None when a placeholder went missing,
    moved out of order or was duplicated."""
    if not cell.magic_lines:
        return text
    lines = text.splitlines(keepends=True)
    seen = []
    for i, line in enumerate(lines):
        body = line.rstrip("\r\n")
        mt = PLACEHOLDER_RE.match(body)
        if mt:
            n = int(mt.group(1))
            if n not in cell.magic_lines:
                return None
            seen.append(n)
            lines[i] = cell.magic_lines[n] + line[len(body):]
    return "".join(lines) if seen == sorted(cell.magic_lines) else None


# ----------------------------------------------------------------------------- the program


@dataclass
class Program:
    cells: List[Cell]
    text: str

    def locate(self, line: int) -> Tuple[Optional[Cell], int]:
        """The cell of a line of the joined program, and the line within the cell."""
        found = None
        for c in self.cells:
            if not c.skipped and c.start <= line:
                found = c
        if found is None:
            return None, line
        return found, line - found.start + 1


def build(nb_cells: Sequence[dict]) -> Program:
    cells: List[Cell] = []
    counter = [0]
    parts: List[str] = []
    line = 1
    for i, raw in enumerate(nb_cells):
        if raw.get("cell_type") != "code":
            continue
        cell = Cell(i, _source(raw))
        mask(cell, counter)
        cells.append(cell)
        if cell.skipped:
            continue
        body = cell.masked if cell.masked.endswith("\n") or not cell.masked else cell.masked + "\n"
        parts.append(MARKER.format(i))
        cell.start = line + 1
        parts.append(body)
        line += 1 + body.count("\n")
    return Program(cells, "".join(parts))


def rebuilt(program: Program, new_text: str, new_sources: Dict[int, str]) -> Program:
    """The program after fixing: the cells where the markers of `new_text` put them."""
    starts = {int(m.group(1)): new_text.count("\n", 0, m.end()) + 1 for m in MARKER_RE.finditer(new_text)}
    cells = []
    for c in program.cells:
        cells.append(Cell(c.index, new_sources.get(c.index, c.source), magic_lines=c.magic_lines, skipped=c.skipped,
                          start=starts.get(c.index, c.start)))
    return Program(cells, new_text)


def split(program: Program, new_text: str) -> Optional[Dict[int, str]]:
    """The new source of each cell of a changed program (unmasked, with the original's final
    newline or its absence); None when the cell structure did not survive."""
    marks = list(MARKER_RE.finditer(new_text))
    live = [c for c in program.cells if not c.skipped]
    if [int(m.group(1)) for m in marks] != [c.index for c in live] or (marks and new_text[: marks[0].start()].strip()):
        return None
    out: Dict[int, str] = {}
    for k, (m, cell) in enumerate(zip(marks, live)):
        end = marks[k + 1].start() if k + 1 < len(marks) else len(new_text)
        body = new_text[m.end(): end]
        if not cell.masked.endswith("\n") and body.endswith("\n"):
            body = body[:-1]
        src = unmask(body, cell)
        if src is None:
            return None
        out[cell.index] = src
    return out


def _map_diag(d: Diagnostic, program: Program, lines_of: Dict[int, List[str]]) -> Diagnostic:
    cell, line = program.locate(d.line)
    if cell is None:
        return d
    n_lines = max(1, len(lines_of[cell.index]))
    end_line = d.end_line - cell.start + 1
    end_column = d.end_column
    if end_line > n_lines:
        end_line, end_column = n_lines, len(lines_of[cell.index][n_lines - 1]) + 1 if lines_of[cell.index] else 1
    d.cell, d.line, d.end_line, d.end_column = cell.number, line, end_line, end_column
    src_lines = lines_of[cell.index]
    if d.source_lines:
        d.source_lines = tuple(src_lines[line - 1: line - 1 + len(d.source_lines)])
    d.noqa_lines = ()
    return d


def _apply(text: str, edits: Sequence[TextEdit]) -> str:
    lines = text.splitlines(keepends=True)
    starts = [0]
    for ln in lines:
        starts.append(starts[-1] + len(ln))

    def offset(line: int, col: int) -> int:
        return (starts[line - 1] if line - 1 < len(starts) else len(text)) + col - 1

    out = text
    for e in sorted(edits, key=lambda e: (e.start_line, e.start_column), reverse=True):
        out = out[: offset(e.start_line, e.start_column)] + e.text + out[offset(e.end_line, e.end_column):]
    return out


def _map_fix(d: Diagnostic, program: Program, cell_no: int, path: str) -> None:
    """The fix's edits and diff in the cell's terms (edits only when it changes that one cell)."""
    edit = d.fix_edit
    if edit is None or not edit.edits:
        return
    new_cells = split(program, _apply(program.text, edit.edits))
    if new_cells is None:
        d.fix_edit = None
        return
    by_index = {c.index: c for c in program.cells}
    changed = [i for i, src in new_cells.items() if src != by_index[i].source]
    diffs = "".join(unified_diff(by_index[i].source, new_cells[i], *_cell_names(path, i + 1)) for i in changed)
    edits: Optional[List[TextEdit]] = None
    if changed == [cell_no - 1]:
        from ampfix.engine.analyze import text_edits

        edits = text_edits(by_index[changed[0]].source, new_cells[changed[0]])
    d.fix_edit = FixEdit(edit.description, edit.applicability, edits, diffs)


def _json_position(text: str, offset: int) -> Tuple[int, int]:
    """(line, column) of an offset of the notebook's JSON text, 1-based (columns in code points)."""
    line_start = text.rfind("\n", 0, offset) + 1
    return text.count("\n", 0, offset) + 1, offset - line_start + 1


def cell_region(text: str, spans: Dict[int, Tuple[int, int]], index: int, line: int,
                end_line: int) -> Optional[Tuple[int, int, int, int]]:
    """Where lines `line`..`end_line` of cell `index` are in the notebook's JSON text: from the
    start of the JSON string that holds the first line to the end of the one that holds the
    last (a source kept as one string is that string). None when the cell is not found."""
    if index not in spans:
        return None
    a, b = spans[index]
    if text[a] == '"':
        return (*_json_position(text, a), *_json_position(text, b))
    first = last = None
    seen = 0  # lines of the cell before the current element
    for ea, eb in _elements(text, a):
        try:
            value = json.loads(text[ea:eb])
        except ValueError:
            return None
        if not isinstance(value, str):
            return None
        n = max(1, value.count("\n") + (0 if value.endswith("\n") else 1))
        if first is None and line <= seen + n:
            first = ea
        if end_line <= seen + n:
            last = eb
            break
        seen += value.count("\n")
        last = eb
    if first is None or last is None:
        return None
    return (*_json_position(text, first), *_json_position(text, last))


def _cell_names(path: str, number: int) -> Tuple[str, str]:
    a, b = diff_names(path)
    return f"{a}:cell {number}", f"{b}:cell {number}"


# ----------------------------------------------------------------------------- writing


_WS = " \t\n\r"


def _skip_ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


# NaN and Infinity are not JSON, but Python's reader and writer (and so Jupyter) accept them
_SCALAR_RE = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false|null|NaN|-?Infinity")


def _value_end(s: str, i: int) -> int:
    c = s[i]
    if c == '"':
        return scanstring(s, i + 1)[1]
    if c in "{[":
        close = "}" if c == "{" else "]"
        i = _skip_ws(s, i + 1)
        if s[i] == close:
            return i + 1
        while True:
            if c == "{":
                i = _skip_ws(s, scanstring(s, i + 1)[1])
                i = _skip_ws(s, i + 1)  # the colon
            i = _skip_ws(s, _value_end(s, i))
            if s[i] == close:
                return i + 1
            i = _skip_ws(s, i + 1)  # the comma
    mt = _SCALAR_RE.match(s, i)
    if not mt:
        raise ValueError(f"unexpected {c!r} at {i}")
    return mt.end()


def _members(s: str, i: int):
    """(key, value start, value end) of the JSON object starting at s[i]."""
    i = _skip_ws(s, i + 1)
    if s[i] == "}":
        return
    while True:
        key, i = scanstring(s, i + 1)
        i = _skip_ws(s, _skip_ws(s, i) + 1)
        end = _value_end(s, i)
        yield key, i, end
        i = _skip_ws(s, end)
        if s[i] == "}":
            return
        i = _skip_ws(s, i + 1)


def _elements(s: str, i: int):
    i = _skip_ws(s, i + 1)
    if s[i] == "]":
        return
    while True:
        end = _value_end(s, i)
        yield i, end
        i = _skip_ws(s, end)
        if s[i] == "]":
            return
        i = _skip_ws(s, i + 1)


def source_spans(text: str) -> Dict[int, Tuple[int, int]]:
    """cell index -> (start, end) of its `source` value in the notebook's JSON text."""
    start = _skip_ws(text, 0)
    cells = None
    for key, a, _ in _members(text, start):
        if key == "cells":
            cells = a
    out: Dict[int, Tuple[int, int]] = {}
    if cells is None:
        return out
    for n, (a, _) in enumerate(_elements(text, cells)):
        for key, va, vb in _members(text, a):
            if key == "source":
                out[n] = (va, vb)
    return out


_NON_ASCII_ESCAPE = re.compile(r"\\u(?!00[0-7])[0-9a-fA-F]{4}")


def _encode_source(text: str, old_value: str, line_indent: str, ensure_ascii: bool) -> str:
    """`text` as a JSON value laid out like `old_value` (a string, or a list of lines with the
    same whitespace around the items)."""
    if old_value.startswith('"'):
        return json.dumps(text, ensure_ascii=ensure_ascii)
    items = [json.dumps(ln, ensure_ascii=ensure_ascii) for ln in text.splitlines(keepends=True)]
    if not items:
        return "[]"
    inner = old_value[1:-1]
    if inner.strip():
        first = inner[: len(inner) - len(inner.lstrip())]
        last = inner[len(inner.rstrip()):]
        mt = re.search(r'",(\s*)"', inner)
        between = mt.group(1) if mt else first
    else:  # an empty list: nbformat's layout (one more space than the key's line)
        first, between, last = "\n" + line_indent + " ", "\n" + line_indent + " ", "\n" + line_indent
    return "[" + first + ("," + between).join(items) + last + "]"


def splice(text: str, new_sources: Dict[int, str]) -> str:
    """The notebook's JSON text with these cells' sources replaced, every other byte kept."""
    spans = source_spans(text)
    ensure_ascii = text.isascii() and bool(_NON_ASCII_ESCAPE.search(text))
    out = text
    for index in sorted(new_sources, reverse=True):
        a, b = spans[index]
        line_start = text.rfind("\n", 0, a) + 1
        line = text[line_start:a]
        indent = line[: len(line) - len(line.lstrip())]
        out = out[:a] + _encode_source(new_sources[index], text[a:b], indent, ensure_ascii) + out[b:]
    return out


def _read_nb(text: str, path: str):
    try:
        import nbformat
    except ImportError:
        raise _error(path, INSTALL_HINT) from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            nb = nbformat.reads(text, as_version=nbformat.NO_CONVERT)
    except Exception as exc:  # nbformat raises several kinds for a file that is not a notebook
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise _error(path, f"not a valid notebook: {msg}") from None
    if int(nb.get("nbformat", 0)) < 4:
        raise _error(path, f"nbformat {nb.get('nbformat')} notebooks are not supported (convert it to "
                           "version 4: jupyter nbconvert --to notebook --nbformat 4)")
    return nb


def _constant(name: str) -> str:
    """NaN, Infinity and -Infinity read as markers: equal to themselves (a NaN is not)."""
    return "\0" + name


class NotWritable(Exception):
    """The fixed cells cannot be written back; the message says why (one line)."""


def write_back(text: str, path: str, new_sources: Dict[int, str]) -> str:
    """The new notebook text; raises NotWritable when it would not read back as the same
    notebook with just these sources changed."""
    try:
        new_text = splice(text, new_sources)
        old_nb, new_nb = json.loads(text, parse_constant=_constant), json.loads(new_text, parse_constant=_constant)
    except (ValueError, KeyError, IndexError) as exc:
        raise NotWritable(f"the fixed cells could not be put back into the notebook's JSON ({type(exc).__name__})")
    for i, src in new_sources.items():
        old_nb["cells"][i]["source"] = src
        new_nb["cells"][i]["source"] = _source(new_nb["cells"][i])
    if old_nb != new_nb:
        raise NotWritable("putting the fixed cells back would change other parts of the notebook")
    try:
        nb = _read_nb(new_text, path)
    except InputError as exc:
        raise NotWritable(f"nbformat would not read the fixed notebook ({exc.error.message})") from None
    if [_source(c) for c in nb.cells] != [_source(c) for c in new_nb["cells"]]:
        raise NotWritable("nbformat reads the fixed notebook back with other cell sources")
    return new_text


# ----------------------------------------------------------------------------- processing


def process_notebook(data: bytes, path: str, rules: Sequence[Type[Rule]], settings: Settings,
                     fix: bool = False) -> FileResult:
    """`engine.process_bytes` for a notebook."""
    result = FileResult(path=path)
    try:
        text, raw = load_json(data, path)
        nb = _read_nb(text, path)
        if not _is_python(raw):
            return result
        program = build(nb.cells)
        result.notes = [FileError(path, None, None, c.note, cell=c.number, level="note")
                        for c in program.cells if c.skipped and c.note]
        lines_of = {c.index: c.source.splitlines() for c in program.cells}
        try:
            new_text, fixed, diags = transform_text(program.text, path, rules, settings, fix)
        except InputError as exc:
            err = exc.error
            if err.line is not None:
                cell, line = program.locate(err.line)
                if cell is not None:
                    raise InputError(FileError(path, line, err.column, err.message, cell=cell.number)) from None
            raise
        new_sources = None
        if new_text != program.text:
            cells = split(program, new_text)
            changed = {} if cells is None else {i: s for i, s in cells.items() if s != _source(nb.cells[i])}
            try:
                if cells is None:
                    raise NotWritable("the fixes changed the cells' structure")
                if changed:
                    new_sources = write_back(text, path, changed)
                    program = rebuilt(program, new_text, cells)
                    lines_of = {c.index: c.source.splitlines() for c in program.cells}
            except NotWritable as exc:
                result.notes.append(FileError(path, None, None, f"not rewritten: {exc}; its findings are reported as "
                                                 "they are", level="warning"))
            if new_sources is None:  # the cells could not be written back safely: report, change nothing
                # (as `check` reports it: the project read, no fix applied nor `# noqa` added)
                _, fixed, diags = transform_text(program.text, path, rules, replace(
                    settings, unsafe_fixes=False, add_noqa=False), False)
                fixed = {}
        shown = new_sources if new_sources is not None else text
        try:
            spans = source_spans(shown)
        except (ValueError, IndexError):
            spans = {}
        for d in diags:
            _map_diag(d, program, lines_of)
            if d.fix_edit is not None and d.cell is not None:
                _map_fix(d, program, d.cell, path)
            if d.cell is not None:
                try:
                    d.cell_region = cell_region(shown, spans, d.cell - 1, d.line, d.end_line)
                except (ValueError, IndexError):
                    d.cell_region = None
        result.diagnostics = diags
        if new_sources is not None:
            result.fixed = fixed
            result.old_source = data
            result.new_source = new_sources.encode("utf-8")
            if data.startswith(b"\xef\xbb\xbf"):
                result.new_source = b"\xef\xbb\xbf" + result.new_source
    except InputError as exc:
        result.error = exc.error
    except RecursionError:
        result.error = FileError(path, None, None, "notebook is nested too deeply to analyse")
    return result


def notebook_diff(path: str, old: bytes, new: bytes) -> str:
    """One unified diff per changed cell."""
    try:
        a = json.loads(old.decode("utf-8-sig"))["cells"]
        b = json.loads(new.decode("utf-8-sig"))["cells"]
    except (ValueError, KeyError, TypeError):
        return ""
    out = []
    for i, (ca, cb) in enumerate(zip(a, b)):
        sa, sb = _source(ca), _source(cb)
        if sa != sb:
            out.append(unified_diff(sa, sb, *_cell_names(path, i + 1)))
    return "".join(out)
