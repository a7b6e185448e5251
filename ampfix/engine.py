"""Run rules over one file: decode, pre-filter, parse once, build the model, collect
diagnostics, honour `# noqa`, and apply fixes without ever breaking the file."""

from __future__ import annotations

import ast
import codecs
import io
import re
import tokenize
from dataclasses import asdict, dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple, Type

import libcst as cst
from libcst.metadata import MetadataWrapper

from ampfix.model import AmpModel
from ampfix.rule import FileContext, Fix, Rule, Violation

MAX_FIX_PASSES = 10


# ----------------------------------------------------------------------------- results


@dataclass
class Diagnostic:
    path: str
    line: int
    column: int  # 1-based
    end_line: int
    end_column: int
    code: str
    name: str
    message: str
    fix: Optional[str] = None  # "safe", "unsafe" or None

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class FileError:
    path: str
    line: Optional[int]
    column: Optional[int]
    message: str

    def __str__(self) -> str:
        where = self.path
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        return f"{where}: error: {self.message}"


@dataclass
class FileResult:
    path: str
    diagnostics: List[Diagnostic] = field(default_factory=list)
    error: Optional[FileError] = None
    new_source: Optional[bytes] = None  # set by fixing when the file changed
    old_source: Optional[bytes] = None
    fixed: Dict[str, int] = field(default_factory=dict)  # "CODE" or "CODE: what" -> findings fixed


class InputError(Exception):
    def __init__(self, error: FileError):
        super().__init__(str(error))
        self.error = error


# ----------------------------------------------------------------------------- decoding


@dataclass
class SourceText:
    text: str
    encoding: str
    bom: bool

    def encode(self, text: str) -> bytes:
        data = text.encode(self.encoding)
        return codecs.BOM_UTF8 + data if self.bom else data


def decode_source(data: bytes, path: str) -> SourceText:
    """Decode like the interpreter does: BOM, then a PEP 263 cookie, else UTF-8."""
    bom = data.startswith(codecs.BOM_UTF8)
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:
        raise InputError(FileError(path, None, None, f"cannot determine the encoding: {exc}")) from None
    if encoding == "utf-8-sig":
        encoding = "utf-8"
    body = data[len(codecs.BOM_UTF8):] if bom else data
    try:
        text = body.decode(encoding)
    except (UnicodeDecodeError, LookupError) as exc:
        line = None
        if isinstance(exc, UnicodeDecodeError):
            line = body[: exc.start].count(b"\n") + 1
            reason = f"cannot decode as {encoding}: byte 0x{body[exc.start]:02x} is not valid here"
        else:
            reason = f"unknown encoding {encoding!r}"
        raise InputError(FileError(path, line, None, reason)) from None
    if "\x00" in text:
        raise InputError(FileError(path, text[: text.index("\x00")].count("\n") + 1, None, "file contains a NUL byte"))
    return SourceText(text, encoding, bom)


def parse(text: str, path: str) -> cst.Module:
    try:
        return cst.parse_module(text)
    except cst.ParserSyntaxError as exc:
        # CPython's own parser names the place and the problem better, when it disagrees too
        try:
            compile(text, path, "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
        except SyntaxError as py_exc:
            raise InputError(FileError(path, py_exc.lineno, py_exc.offset, f"syntax error: {py_exc.msg}")) from None
        except (ValueError, RecursionError, MemoryError):
            pass
        msg = exc.message.strip().splitlines()[0] if exc.message else "invalid syntax"
        raise InputError(FileError(path, exc.raw_line, exc.raw_column + 1, f"syntax error: {msg}")) from None
    except Exception as exc:  # libcst raises a few other errors on odd input
        raise InputError(FileError(path, None, None, f"cannot parse: {type(exc).__name__}: {exc}")) from None


# ----------------------------------------------------------------------------- noqa

NOQA_RE = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Za-z]+[0-9]+(?:[\s,]+[A-Za-z]+[0-9]+)*))?", re.IGNORECASE)


def noqa_lines(text: str) -> Dict[int, Optional[Set[str]]]:
    """line -> None (bare noqa: everything) or the set of codes named."""
    result: Dict[int, Optional[Set[str]]] = {}
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):  # pragma: no cover - parsed already
        return result
    for tok in tokens:
        if tok.type != tokenize.COMMENT:
            continue
        mt = NOQA_RE.search(tok.string)
        if not mt:
            continue
        line = tok.start[0]
        codes = mt.group("codes")
        if codes is None:
            result[line] = None
        else:
            named = {c.upper() for c in re.split(r"[\s,]+", codes) if c}
            prev = result.get(line, set())
            result[line] = None if prev is None and line in result else (prev or set()) | named
    return result


def suppressed(noqa: Dict[int, Optional[Set[str]]], code: str, lines: Iterable[int]) -> bool:
    for line in lines:
        if line in noqa:
            codes = noqa[line]
            if codes is None or any(code == c or code.startswith(c) for c in codes):
                return True
    return False


# ----------------------------------------------------------------------------- analysis


@dataclass
class Settings:
    min_torch_version: Tuple[int, ...] = (2, 4)
    unsafe_fixes: bool = False


@dataclass
class _Found:
    rule: Type[Rule]
    violation: Violation
    diagnostic: Diagnostic
    noqa: bool


def triggered(rules: Sequence[Type[Rule]], text: str) -> List[Type[Rule]]:
    lowered = text.lower()
    return [r for r in rules if r.triggered_by(text, lowered)]


def _analyze(
    module: cst.Module, text: str, path: str, rules: Sequence[Type[Rule]], settings: Settings
) -> Tuple[List[_Found], AmpModel]:
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    model = AmpModel(wrapper)
    ctx = FileContext(path=path, source=text, model=model, min_torch_version=settings.min_torch_version,
                      unsafe_fixes=settings.unsafe_fixes)
    found: List[_Found] = []
    noqa: Optional[Dict[int, Optional[Set[str]]]] = None
    for rule_cls in rules:
        rule = rule_cls()
        for v in rule.check(ctx):
            pos = model.position(v.node)
            fix_kind = None if v.fix is None else ("safe" if v.fix.safe else "unsafe")
            diag = Diagnostic(
                path=path,
                line=pos.start.line,
                column=pos.start.column + 1,
                end_line=pos.end.line,
                end_column=pos.end.column + 1,
                code=rule_cls.code,
                name=rule_cls.name,
                message=v.message or rule_cls.message,
                fix=fix_kind,
            )
            if noqa is None:
                noqa = noqa_lines(text)
            stmt = model.statement_of(v.node)
            lines = {pos.start.line}
            if stmt is not None and isinstance(stmt, cst.SimpleStatementLine):
                spos = model.position(stmt)
                lines.update({spos.start.line, spos.end.line})
            found.append(_Found(rule_cls, v, diag, suppressed(noqa, rule_cls.code, lines)))
    # one finding per code and place: a rule may reach the same node twice
    seen: Set[Tuple[str, int, int]] = set()
    unique = []
    for f in found:
        key = (f.diagnostic.code, f.diagnostic.line, f.diagnostic.column)
        if key not in seen:
            seen.add(key)
            unique.append(f)
    unique.sort(key=lambda f: (f.diagnostic.line, f.diagnostic.column, f.diagnostic.code))
    return unique, model


def check_text(text: str, path: str, rules: Sequence[Type[Rule]], settings: Settings) -> Tuple[List[Diagnostic], bool]:
    """Diagnostics for `text` (noqa applied) and whether the file was parsed at all."""
    active = triggered(rules, text)
    if not active:
        return [], False
    module = parse(text, path)
    found, _ = _analyze(module, text, path, active, settings)
    return [f.diagnostic for f in found if not f.noqa], True


class _ApplyFixes(cst.CSTTransformer):
    def __init__(self, replacements: Dict[int, object]):
        super().__init__()
        self.replacements = replacements

    def on_leave(self, original_node, updated_node):  # type: ignore[override]
        r = self.replacements.get(id(original_node))
        return updated_node if r is None else r


def _fix_ranges(fix: Fix, model: AmpModel) -> List[Tuple[Tuple[int, int], Tuple[int, int]]]:
    out = []
    for node in fix.replacements:
        pos = model.position(node)
        out.append(((pos.start.line, pos.start.column), (pos.end.line, pos.end.column)))
    return out


def _overlaps(a, b) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def _compiles(text: str, path: str) -> bool:
    try:
        compile(text, path, "exec", dont_inherit=True)
        return True
    except (SyntaxError, ValueError):
        return False


def fix_text(text: str, path: str, rules: Sequence[Type[Rule]], settings: Settings) -> Tuple[str, Dict[str, int], List[Diagnostic]]:
    """Apply fixes until nothing applicable is left.

    Returns (new text, {code: fixed count}, remaining diagnostics). Every pass is checked:
    its output must parse (LibCST, and CPython when the input compiled), or the pass is
    dropped and the file keeps the last good text.
    """
    active = triggered(rules, text)
    fixed: Dict[str, int] = {}
    if not active:
        return text, fixed, []
    original_compiles = None
    current = text
    module = parse(current, path)
    for _ in range(MAX_FIX_PASSES):
        found, model = _analyze(module, current, path, active, settings)
        applicable = [
            f for f in found
            if f.violation.fix is not None and not f.noqa and (f.violation.fix.safe or settings.unsafe_fixes)
        ]
        if not applicable:
            return current, fixed, [f.diagnostic for f in found if not f.noqa]
        chosen: List[_Found] = []
        taken: List[Tuple[Tuple[int, int], Tuple[int, int]]] = []
        chosen_fixes: Dict[int, Fix] = {}
        for f in applicable:
            fix = f.violation.fix
            assert fix is not None
            if id(fix) in chosen_fixes:  # several findings share one fix (e.g. one unscale_ for two clips)
                chosen.append(f)
                continue
            ranges = _fix_ranges(fix, model)
            if any(_overlaps(r, t) for r in ranges for t in taken):
                continue
            chosen.append(f)
            chosen_fixes[id(fix)] = fix
            taken.extend(ranges)
        replacements: Dict[int, object] = {}
        for fix in chosen_fixes.values():
            for node, new in fix.replacements.items():
                replacements[id(node)] = new
        new_module = module.visit(_ApplyFixes(replacements))
        new_text = new_module.code
        if new_text == current:
            return current, fixed, [f.diagnostic for f in found if not f.noqa]
        try:
            reparsed = cst.parse_module(new_text)
        except Exception:
            return current, fixed, [f.diagnostic for f in found if not f.noqa]
        if original_compiles is None:
            original_compiles = _compiles(text, path)
        if original_compiles and not _compiles(new_text, path):
            return current, fixed, [f.diagnostic for f in found if not f.noqa]
        for f in chosen:
            desc = f.violation.fix.description  # type: ignore[union-attr]
            key = f"{f.diagnostic.code}: {desc}" if desc else f.diagnostic.code
            fixed[key] = fixed.get(key, 0) + 1
        current, module = new_text, reparsed
    found, _ = _analyze(module, current, path, active, settings)
    return current, fixed, [f.diagnostic for f in found if not f.noqa]


# ----------------------------------------------------------------------------- files


def process_bytes(
    data: bytes,
    path: str,
    rules: Sequence[Type[Rule]],
    settings: Settings,
    fix: bool = False,
) -> FileResult:
    result = FileResult(path=path)
    try:
        src = decode_source(data, path)
        if fix:
            new_text, fixed, remaining = fix_text(src.text, path, rules, settings)
            result.diagnostics = remaining
            result.fixed = fixed
            if new_text != src.text:
                result.old_source = data
                result.new_source = src.encode(new_text)
        else:
            result.diagnostics, _ = check_text(src.text, path, rules, settings)
    except InputError as exc:
        result.error = exc.error
    except RecursionError:
        result.error = FileError(path, None, None, "file is nested too deeply to analyse")
    return result
