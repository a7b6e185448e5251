"""Summarise a module from its model: what other modules need to know of it (`summary.py`).

`summarize(model, digest)` reads the model already built for the module (one parse): its
imports, top-level constants, functions and classes, and the calls it makes. Each function's
effects are its trace within the module (`events._local_trace`: its own AMP events and those of
the module's helpers it calls, in order, with their conditional contexts), keeping the calls
that leave the module as `CALL` effects for the project to compose.
"""

from __future__ import annotations

import hashlib
import re
from bisect import bisect_left, bisect_right
from typing import Any, Dict, FrozenSet, Hashable, List, Optional, Set, Tuple

import libcst as cst

from ampfix.lexemes import LEXEMES
from ampfix.model.events import BACKWARD, EXIT, EXTERNAL, TraceEvent
from ampfix.model.flow import ends_in_exit
from ampfix.model.readwrite import binding_counts, reads_writes
from ampfix.model.summary import (IMPORTED, LOCAL, PARAM, SELF, UNKNOWN, ClassSummary, Effect, FunctionSummary,
                                  ModuleSummary, OutgoingCall, Param, Value)
from ampfix.model.syntax import call_name, literal_string
from ampfix.model.tree import child_nodes, dotted, node_types

_NUMBER_OR_STRING = node_types(cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString)

MAX_TEXT = 2000
# what running a function may add to a training step's trace (the rules' backward, scaler,
# optimizer, autocast, gradient and framework events)
_EVENT_WORDS = (r"GradScaler|autocast|scaler|\.scale\(|backward|unscale_|\.step\(|\.update\(\)|zero_grad|"
                r"clip_grad|\.grad\b|float16|bfloat16|\.half\b|[\"']half[\"']|fp16|bf16|"
                r"a(?<=\ba)mp\b|_amp\b|a(?<=\ba)mp_|AMP|[Oo]ptim|Adam|SGD|RMSprop|Lamb|LAMB|Fabric|Accelerator|apex")
# (`a(?<=\ba)mp` is `\bamp`: an alternative that begins with `\b` keeps `re` from skipping the
# offsets where no alternative can begin, and the pattern is tried at every offset, 1.5x slower)
# what a module's (or a function's) text holds when it may do something AMP code is made of, or
# choose precision: code without any of these has no effects, and values nobody asks about. Not
# in it: `dtype` (every layer constructor of current PyTorch code takes `device=`/`dtype=`),
# `half` as a plain word (`half = dim // 2`) and `.update(...)` with arguments (a dict's), which
# made most of a model zoo's modules "relevant" and read (bench/PROJECT_RESULTS.md)
AMP_TEXT = re.compile(_EVENT_WORDS + r"|state_dict|torch\.save|precision|parse_args|add_argument")
# what a function's text holds when running it may add events to a trace: AMP_TEXT without the
# words that only checkpoints (`state_dict`, `torch.save`: `model/checkpoints.py` reads those)
# and configuration (`precision`, argparse) are made of
TRACE_TEXT = re.compile(_EVENT_WORDS)
MAX_ALTERNATIVES = 8  # a returned local variable is split into at most this many values
_NEWLINE = re.compile("\n")
_RUN = re.compile(r"@(\d+)")
_TRIPLE = re.compile(r'"""|\'\'\'')
_DEF_LINE = re.compile(r"^([ \t]*)(?:async[ \t]+)?(def|class)[ \t]+(\w+)")


def def_spans(text: str) -> Dict[str, Tuple[int, int]]:
    """Where each top-level function and class, and each method, is written: qualified name
    (`f`, `Cls`, `Cls.method`) -> (start, end) offsets in `text`, read from the indentation
    (decorators excluded; a nested function is part of its function)."""
    out: Dict[str, Tuple[int, int]] = {}
    open_: List[Tuple[int, str, int, str]] = []  # (indent, qualified name, start, "def" | "class")
    offset = 0
    quote: Optional[str] = None  # inside a triple-quoted string: its lines say nothing of the code
    for line in text.splitlines(keepends=True):
        if quote is not None or '"""' in line or "'''" in line:  # (most lines hold no quote: no scan)
            was_inside = quote is not None
            for q in _TRIPLE.findall(line):
                if quote is None:
                    quote = q
                elif q == quote:
                    quote = None
            if was_inside:
                offset += len(line)
                continue
        stripped = line.strip()
        if stripped and not stripped.startswith(("#", "@", ")", "]", "}")):
            indent = len(line) - len(line.lstrip(" \t"))
            while open_ and indent <= open_[-1][0]:
                _, name, start, _ = open_.pop()
                out.setdefault(name, (start, offset))
            # (`_DEF_LINE` matches only a line whose code starts with one of these words)
            m = _DEF_LINE.match(line) if stripped.startswith(("def", "class", "async")) else None
            if m is not None:
                if not open_:
                    open_.append((indent, m.group(3), offset, m.group(2)))
                elif len(open_) == 1 and open_[0][3] == "class" and m.group(2) == "def":
                    open_.append((indent, f"{open_[0][1]}.{m.group(3)}", offset, "def"))
        offset += len(line)
    while open_:
        _, name, start, _ = open_.pop()
        out.setdefault(name, (start, offset))
    return out


def relevant_code(text: str) -> bool:
    return AMP_TEXT.search(text) is not None
MAX_DEPTH = 4
# names of libraries whose API the model knows by qualified name: kept as they are, never
# looked up among the project's modules
LIBRARY_ROOTS = ("torch", "contextlib", "functools", "threading", "concurrent", "multiprocessing", "lightning",
                 "pytorch_lightning", "accelerate", "apex", "mindspore", "deepspeed", "transformers", "typing",
                 "dataclasses", "enum", "argparse", "os", "sys", "numpy", "math", "collections", "abc")
_OPS = {cst.Equal: "==", cst.NotEqual: "!=", cst.Is: "is", cst.IsNot: "is not", cst.In: "in", cst.NotIn: "not in",
        cst.LessThan: "<", cst.LessThanEqual: "<=", cst.GreaterThan: ">", cst.GreaterThanEqual: ">=",
        cst.Add: "+", cst.Subtract: "-", cst.Multiply: "*", cst.Divide: "/", cst.FloorDivide: "//",
        cst.Modulo: "%", cst.Power: "**", cst.BitOr: "|", cst.BitAnd: "&", cst.And: "and", cst.Or: "or",
        cst.Not: "not ", cst.Minus: "-", cst.Plus: "+", cst.BitInvert: "~"}


class Canonical:
    """Canonical expressions (see `summary.py`) of the expressions of one module."""

    def __init__(self, model):
        self.model = model

    def values(self, expr: Optional[cst.CSTNode], line: Optional[int] = None, locals_split: bool = False) -> List[Value]:
        """The canonical value(s) of `expr`: one per alternative of a conditional expression.
        `locals_split` (a returned value): a local variable of the function assigned in several
        places is one value per assignment (`clip = None`, then `clip = partial(...)` under an
        `if`: what a builder returns), as a conditional expression's alternatives are."""
        if expr is None:
            return []
        alternatives = [expr]
        if isinstance(expr, cst.IfExp):
            alternatives = [expr.body, expr.orelse]
        elif locals_split and isinstance(expr, cst.Name):
            alternatives = self._local_assignments(expr) or alternatives
        out = []
        for alt in alternatives:
            text = self.text(alt, 0)
            out.append(Value(text if text is not None and len(text) <= MAX_TEXT else UNKNOWN,
                             line if line is not None else self._line(alt)))
        return out

    def _local_assignments(self, name: cst.Name) -> List[cst.CSTNode]:
        """The values a local variable (not a parameter) of a function is assigned, when it has
        several and each is a value of its own (not the variable's own update, `x = x + 1`)."""
        m = self.model
        scope = m.scope_of(name)
        bscope = m.binding_scope(name.value, scope)
        if not isinstance(bscope, cst.FunctionDef) or m._is_param(bscope, name.value):
            return []
        values = m.values_of(name)
        if not 1 < len(values) <= MAX_ALTERNATIVES or any(
                not isinstance(v, cst.CSTNode) or _names(v, name.value) for v in values):
            return []
        return list(values)

    def _line(self, node: cst.CSTNode) -> int:
        """The line of a value when its position was asked already, else 0: a value's line is
        a nicety no finding reads, not worth generating the code of its statement (a whole
        class, for a method's value)."""
        return self.model._known_line(node) or 0

    def text(self, expr: cst.CSTNode, depth: int) -> Optional[str]:
        """The canonical text of `expr`, None when unknown."""
        if depth > MAX_DEPTH:
            return None
        if type(expr) in _NUMBER_OR_STRING:
            return expr.value  # type: ignore[attr-defined]
        if isinstance(expr, cst.ConcatenatedString):
            s = literal_string(expr)
            return repr(s) if s is not None else None
        if isinstance(expr, cst.Name) and expr.value in ("True", "False", "None"):
            return expr.value
        if isinstance(expr, (cst.Name, cst.Attribute)) and dotted(expr) is not None:
            return self._name(expr, depth)
        if isinstance(expr, cst.Attribute):
            base = self.text(expr.value, depth + 1)
            return None if base is None else f"{base}.{expr.attr.value}"
        if isinstance(expr, cst.Call):
            return self._call(expr, depth)
        if isinstance(expr, (cst.Tuple, cst.List, cst.Set)):
            parts = []
            for el in expr.elements:
                if isinstance(el, cst.StarredElement):
                    return None
                parts.append(self._part(el.value, depth))
            if isinstance(expr, cst.Tuple):
                return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
            return ("[" if isinstance(expr, cst.List) else "{") + ", ".join(parts) + \
                ("]" if isinstance(expr, cst.List) else "}") if parts or isinstance(expr, cst.List) else None
        if isinstance(expr, cst.Dict):
            items = []
            for el in expr.elements:
                if not isinstance(el, cst.DictElement):
                    return None
                key = self.text(el.key, depth + 1)
                if key is None:
                    return None
                items.append(f"{key}: {self._part(el.value, depth)}")
            return "{" + ", ".join(items) + "}"
        if isinstance(expr, cst.Subscript):
            value = self.text(expr.value, depth + 1)
            if value is None or len(expr.slice) != 1 or not isinstance(expr.slice[0].slice, cst.Index):
                return None
            return f"{value}[{self._part(expr.slice[0].slice.value, depth)}]"
        if isinstance(expr, cst.IfExp):
            return f"({self._part(expr.body, depth)} if {self._part(expr.test, depth)} else {self._part(expr.orelse, depth)})"
        if isinstance(expr, cst.BooleanOperation):
            return f"({self._part(expr.left, depth)} {_OPS[type(expr.operator)]} {self._part(expr.right, depth)})"
        if isinstance(expr, cst.UnaryOperation) and type(expr.operator) in _OPS:
            return f"({_OPS[type(expr.operator)]}{self._part(expr.expression, depth)})"
        if isinstance(expr, cst.BinaryOperation) and type(expr.operator) in _OPS:
            return f"({self._part(expr.left, depth)} {_OPS[type(expr.operator)]} {self._part(expr.right, depth)})"
        if isinstance(expr, cst.Comparison):
            out = self._part(expr.left, depth)
            for c in expr.comparisons:
                op = _OPS.get(type(c.operator))
                if op is None:
                    return None
                out += f" {op} {self._part(c.comparator, depth)}"
            return f"({out})"
        return None

    def _part(self, expr: cst.CSTNode, depth: int) -> str:
        text = self.text(expr, depth + 1)
        return UNKNOWN if text is None else text

    def _call(self, call: cst.Call, depth: int) -> Optional[str]:
        func = self.text(call.func, depth + 1)
        if func is None:
            return None
        if func in ("dataclasses.field", "field") or func.endswith(".field") and func.startswith("dataclasses"):
            for a in call.args:  # a dataclass field's default
                if a.keyword is not None and a.keyword.value == "default":
                    return self.text(a.value, depth + 1)
                if a.keyword is not None and a.keyword.value == "default_factory":
                    inner = self.text(a.value, depth + 1)
                    return None if inner is None else f"{inner}()"
            return None
        args = []
        for a in call.args:
            if a.star:
                if a.star == "**" and self._passed_on(a.value):
                    args.append(f"**{PARAM}.{a.value.value}")  # type: ignore[attr-defined]
                    continue
                return None
            value = self._part(a.value, depth)
            args.append(f"{a.keyword.value}={value}" if a.keyword is not None else value)
        return f"{func}({', '.join(args)})"

    def _passed_on(self, expr: cst.CSTNode) -> bool:
        """`expr` is the `**` parameter of its function, passed on as it came (`**kwargs` in
        `return torch.autocast("cuda", **kwargs)`): the function reads the name nowhere but in
        `**` arguments, so it holds the keywords the caller passed and nothing else (a caller's
        keywords are put in their place: `Foreign._materialize`)."""
        m = self.model
        func = m.function_of(expr)
        if not isinstance(expr, cst.Name) or func is None or not isinstance(func.params.star_kwarg, cst.Param) \
                or func.params.star_kwarg.name.value != expr.value \
                or m.binding_scope(expr.value, m.scope_of(expr)) is not func:
            return False
        stack: List[cst.CSTNode] = [func.body]  # (nested functions and lambdas too: a closure may change it)
        while stack:
            n = stack.pop()
            if type(n) is cst.Arg and n.star == "**" and type(n.value) is cst.Name:
                continue
            if type(n) is cst.Name and n.value == expr.value:  # type: ignore[attr-defined]
                return False
            stack.extend(child_nodes(n))
        return True

    def _name(self, expr: cst.CSTNode, depth: int) -> Optional[str]:
        m = self.model
        text = dotted(expr) or ""
        root, _, rest = text.partition(".")
        tail = f".{rest}" if rest else ""
        qualified = sorted(m.qualnames(expr))
        if qualified:
            q = qualified[0]
            if q.startswith("builtins."):
                return q[len("builtins."):]
            if q.split(".")[0] in LIBRARY_ROOTS:
                return q
            return f'{IMPORTED}("{q}")' if "." not in q or not rest else self._imported(q, rest)
        scope = m.scope_of(expr)
        func = m.function_of(expr)
        if root in ("self", "cls") and func is not None and m.self_class(expr) is not None:
            return f"{SELF}{tail}" if rest else None
        bscope = m.binding_scope(root, scope)
        if bscope is None:
            return None
        if bscope is m.module:
            return f"{LOCAL}.{root}{tail}"
        if isinstance(bscope, cst.FunctionDef) and m._is_param(bscope, root):
            return f"{PARAM}.{root}{tail}"
        if not rest and isinstance(expr, cst.Name):
            values = m.values_of(expr)
            if len(values) == 1 and isinstance(values[0], cst.CSTNode) and values[0] is not expr \
                    and not _contains(values[0], expr):
                return self.text(values[0], depth + 1)
        return None

    @staticmethod
    def _imported(q: str, rest: str) -> str:
        # `utils.helper` after `import pkg.utils as utils`: qualified "pkg.utils.helper"; the
        # import itself names "pkg.utils" (what `rest` follows)
        head = q[: len(q) - len(rest) - 1]
        return f'{IMPORTED}("{head}").{rest}' if head else f'{IMPORTED}("{q}")'


_RECEIVER_METHODS = frozenset({"step", "unscale_", "update", "zero_grad"})


def touched_unlisted(summary: FunctionSummary) -> FrozenSet[str]:
    """The parameters whose object the function may step, unscale, update or zero in ways its
    effects do not list as that object's: a `step`/`unscale_`/`update`/`zero_grad` call on a
    receiver rooted at a parameter the function (or a helper of its module the object passes
    through) rebinds (`Effect.owner_param` None). A forwarding wrapper `def step(opt,
    scaler=None): scaler = scaler or default; scaler.step(opt); scaler.update()` may update the
    GradScaler its caller passes, or another one: the caller's events of that object drop these
    calls (`Events._method_on_bound_object`), so whether the object is stepped or updated by the
    call is unknown (`Updates.touched_unseen`), not known to be false. Read from the summary's
    effects as stored (no field of its own)."""
    params = {p.name for p in summary.params}
    out = set()
    for e in summary.effects:
        callee = e.callee or ""
        if e.kind != EXTERNAL or e.owner_param or not callee.startswith("value:") \
                or callee.rpartition(".")[2] not in _RECEIVER_METHODS:
            continue
        owner = dict(e.args).get("owner") or ""
        root = owner.partition(".")[0]
        if root in params and "@" not in owner:
            out.add(root)
    return frozenset(out)


def _names(node: cst.CSTNode, name: str) -> bool:
    """`node` is, or holds, the name `name` (`n + 1` holds `n`)."""
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, cst.Name) and n.value == name:
            return True
        stack.extend(child_nodes(n))
    return False


def _contains(node: cst.CSTNode, inner: cst.CSTNode) -> bool:
    stack = [node]
    while stack:
        n = stack.pop()
        if n is inner:
            return True
        stack.extend(n.children)
    return False


# ---------------------------------------------------------------------- functions


class _Groups:
    """Numbers the context groups of one function's trace (plain data for JSON)."""

    def __init__(self) -> None:
        self.ids: Dict[Hashable, int] = {}

    def group(self, g: Hashable) -> Tuple[Any, ...]:
        if isinstance(g, tuple) and g and g[0] == "cond" and len(g) == 4:
            _, _, text, _ = g  # a stable test on parameters, `self` or globals: portable
            return ("cond", text)
        inner = g[1] if isinstance(g, tuple) and len(g) == 2 and isinstance(g[1], tuple) and g[1] else None
        kind = inner[0] if inner and isinstance(inner[0], str) else "g"
        n = self.ids.setdefault(g, len(self.ids))
        if kind == "fallthrough":
            # the `if` whose early return it falls through, and the branch that falls through
            # (`iterations._fallthrough_links`): its number as the `if`'s own group would get it
            node = inner[1]
            body, orelse = ends_in_exit(node.body), ends_in_exit(node.orelse)
            if body != orelse:
                return ("fallthrough", n, self.ids.setdefault((g[0], ("if", node)), len(self.ids)), not body)
        return (kind if kind in ("loop", "comp", "loop-else", "fallthrough", "except", "bool", "if", "match") else "g", n)

    def branch(self, b: Hashable) -> Any:
        if isinstance(b, (bool, int, str)) or b is None:
            return b if not isinstance(b, int) or isinstance(b, bool) else self.ids.setdefault(("branch", b), len(self.ids))
        return self.ids.setdefault(("branch", id(b)), len(self.ids))


_WORD_CHAR = re.compile(r"\w")
# what may follow the function of a call up to its `(`: blanks, line continuations, comments
_OPENS_CALL = re.compile(r"(?:[ \t\f\r\n\\]|#[^\n]*)*\(")


class Summarizer:
    def __init__(self, model):
        self.model = model
        self.canon = Canonical(model)
        self.skip: set = set()  # functions (qualified names) with no AMP code: parameters only
        self.text: Optional[str] = None  # the module's text, when known: where effects are, without positions
        self.spans: Dict[str, Tuple[int, int]] = {}
        self._located: Dict[cst.CSTNode, Tuple[int, int]] = {}
        self._same: Dict[tuple, list] = {}
        self._needles: Dict[cst.CSTNode, str] = {}  # a node's code as `_find` looks for it (its first line)
        self._whole_needles: Dict[cst.CSTNode, bool] = {}  # ... and whether that is all of it
        self._codes: Dict[cst.CSTNode, str] = {}  # a node's code (`_code`)
        self._quals: Optional[Dict[str, int]] = None  # how many functions the module has of each name
        self._lexemes: Dict[str, Tuple[List[int], List[int]]] = {}  # a span's comments and strings (starts, ends)
        self._newlines: Optional[List[int]] = None  # the offsets of the text's line breaks (`_line_col`)
        self.salt = ""  # what makes this module's run numbers its own (`_runs`): its path and digest
        self._runs: Dict[str, str] = {}  # the id of a helper call that runs a local (`name@<id>`) -> its number

    def locate(self, node: cst.CSTNode) -> Tuple[int, int]:
        """(line, 0-based column) of `node`, found in the text of the top-level function or
        method that holds it: the k-th place its code shows there for the k-th node with that
        code (in text order), so a module's summary needs no position pass. The position pass
        when the text does not tell (the code also shows in a comment or a string)."""
        hit = self._located.get(node)
        if hit is not None:
            return hit
        found = self._find(node)
        hit = self._located[node] = found if found is not None else self.model.start(node)
        return hit

    def _find(self, node: cst.CSTNode) -> Optional[Tuple[int, int]]:
        text = self.text
        if text is None:
            return None
        qual, owner = self._owner(node)
        span = self.spans.get(qual) if qual is not None else None
        if span is None or owner is None or not self._one_definition(qual):
            return None  # a function defined twice (`@overload` stubs): the span may be another's
        if self._in_decorator(node):
            return None  # written above its function's `def` line: outside the span (`def_spans`)
        needle = self._needle(node)
        key = (qual, needle, type(node))
        same = self._same.get(key)
        if same is None:
            kind = cst.Call if isinstance(node, cst.Call) else cst.SimpleStatementLine
            if not isinstance(node, kind):
                return None
            same = [n for n in self._owned(qual, kind) if self._needle(n) == needle]
            self._same[key] = same
        places = []
        pos = text.find(needle, span[0], span[1])
        while pos >= 0:
            places.append(pos)
            pos = text.find(needle, pos + 1, span[1])
        if len(places) != len(same):
            places = self._code_places(places, needle, same)
        if len(places) != len(same):
            places = self._outside_lexemes(qual, span, places)
        if len(places) != len(same) or not any(n is node for n in same):
            return None
        return self._line_col(places[next(i for i, n in enumerate(same) if n is node)])

    def _line_col(self, pos: int) -> Tuple[int, int]:
        """(line, 0-based column) of offset `pos` of the text: a search among its line breaks
        (counting them from the top for each effect cost a large module's summary 20 us each)."""
        breaks = self._newlines
        if breaks is None:
            breaks = self._newlines = [m.start() for m in _NEWLINE.finditer(self.text or "")]
        before = bisect_left(breaks, pos)  # the line breaks before `pos`
        return before + 1, pos - (breaks[before - 1] + 1 if before else 0)

    def _code_places(self, places: List[int], needle: str, same: List[cst.CSTNode]) -> List[int]:
        """The places of `needle` that can be one of the nodes `same` (each is written there):
        not where it continues a name (`self.foo` in `self.foobar`, `x_self.foo`,
        `a.self.foo`); where each of them is a call whose function is written on one line,
        only where a `(` follows (after blanks and comments); where each is written on more
        lines than one (the needle is its first line), only where the line ends. Fewer nodes then need the
        positions of their whole top-level statement (`model.start`)."""
        text = self.text or ""
        called = all(isinstance(n, cst.Call) and self._whole_needles.get(n, False) for n in same)
        # each is written on more lines than one: its first line, the needle, ends where it ends
        first_lines = all(not self._whole_needles.get(n, True) for n in same)
        open_start = _WORD_CHAR.match(needle) is not None
        open_end = _WORD_CHAR.match(needle[-1:]) is not None
        out = []
        for pos in places:
            end = pos + len(needle)
            if open_start and pos > 0 and (text[pos - 1] == "." or _WORD_CHAR.match(text[pos - 1])):
                continue
            if open_end and end < len(text) and _WORD_CHAR.match(text[end]):
                continue
            if called and (not _OPENS_CALL.match(text, end)
                           or text[text.rfind("\n", 0, pos) + 1:pos].split() in (["def"], ["async", "def"], ["class"])):
                continue  # (a definition's own name is no call)
            if first_lines and text[end:end + 1] not in ("\n", "\r"):
                continue
            out.append(pos)
        return out

    def _outside_lexemes(self, qual: str, span: Tuple[int, int], places: List[int]) -> List[int]:
        """The places that are not in a comment or a string literal of the span of `qual` (a
        docstring's `>>> accelerator.reduce(x)`, a message naming a call). All of them when the
        span does not lex (a quote that closes nothing, a lone carriage return)."""
        ranges = self._lexemes.get(qual)
        if ranges is None:
            starts: Optional[List[int]] = []
            ends: List[int] = []
            if self.text.find("\r", span[0], span[1]) >= 0:  # type: ignore[union-attr]
                starts = None
            else:
                for m in LEXEMES.finditer(self.text, span[0], span[1]):  # type: ignore[arg-type]
                    if m.group("open") is not None:
                        starts = None
                        break
                    starts.append(m.start())  # type: ignore[union-attr]
                    ends.append(m.end())
            ranges = self._lexemes[qual] = (starts, ends) if starts is not None else ([], [])
        starts, ends = ranges
        if not starts:
            return places
        out = []
        for pos in places:
            i = bisect_right(starts, pos) - 1
            if i < 0 or pos >= ends[i]:
                out.append(pos)
        return out

    def _one_definition(self, qual: str) -> bool:
        """Exactly one function or method of the module is `qual` as `_owner` names them (the
        span of an `@overload`ed function, or of a method defined twice, may be another one's)."""
        counts = self._quals
        if counts is None:
            counts = self._quals = {}
            for f in self.model.nodes_of(cst.FunctionDef):
                q = self._qual_of(f)
                counts[q] = counts.get(q, 0) + 1
        return counts.get(qual, 0) == 1

    def _qual_of(self, func: cst.FunctionDef) -> str:
        """`Class.method` or `function`, as the spans name the top-level ones."""
        cls = self.model.class_of(func)
        return f"{cls.name.value}.{func.name.value}" if cls is not None else func.name.value

    def _owned(self, qual: str, kind: type) -> List[cst.CSTNode]:
        """The module's nodes of `kind` held by the top-level function or method `qual` (the
        module's nodes of that kind grouped by owner once)."""
        groups = self.__dict__.get("_by_owner_" + kind.__name__)
        if groups is None:
            groups = self.__dict__["_by_owner_" + kind.__name__] = {}
            for n in self.model.nodes_of(kind):
                if not self._in_decorator(n):
                    groups.setdefault(self._owner(n)[0], []).append(n)
        return groups.get(qual, [])

    def _in_decorator(self, node: cst.CSTNode) -> bool:
        return any(type(a) is cst.Decorator for a in self.model.ancestors(node))

    def _owner(self, node: cst.CSTNode) -> Tuple[Optional[str], Optional[cst.FunctionDef]]:
        m = self.model
        func = m.function_of(node)
        while func is not None:  # the top-level function or method that holds it (the spans know those)
            qual = self._qual_of(func)
            if qual in self.spans:
                return qual, func
            func = m.function_of(func)
        return None, None

    def _needle(self, node: cst.CSTNode) -> str:
        memo = self._needles
        hit = memo.get(node)
        if hit is None:
            shown = node.body[0] if isinstance(node, cst.SimpleStatementLine) and node.body else node  # not its comments
            code = self._code(shown.func if isinstance(shown, cst.Call) else shown)
            hit = memo[node] = code.splitlines()[0] if code else ""
            self._whole_needles[node] = bool(code) and hit == code  # one line
        return hit

    def _code(self, node: cst.CSTNode) -> str:
        """`model.code(node)`, memoised: an effect's text is its call's code, which finding its
        place (`_needle`) has just made."""
        hit = self._codes.get(node)
        if hit is None:
            hit = self._codes[node] = self.model.code(node)
        return hit

    def function(self, func: cst.FunctionDef, is_method: bool) -> FunctionSummary:
        m = self.model
        p = func.params
        params: List[Param] = []
        for kind, items in (("posonly", p.posonly_params), ("pos", p.params), ("kwonly", p.kwonly_params)):
            for prm in items:
                default = self.canon.values(prm.default)[0] if prm.default is not None else None
                params.append(Param(prm.name.value, kind, default))
        if isinstance(p.star_arg, cst.Param):
            params.append(Param(p.star_arg.name.value, "star"))
        if isinstance(p.star_kwarg, cst.Param):
            params.append(Param(p.star_kwarg.name.value, "starstar"))
        cls = m.class_of(func)
        qual = f"{cls.name.value}.{func.name.value}" if cls is not None else func.name.value
        summary = FunctionSummary(func.name.value, 0, params, is_method,
                                  [v.text for d in func.decorators for v in self.canon.values(d.decorator)])
        if qual in self.skip:
            return summary
        summary.effects = self.effects(func)
        for r in m._nodes_in_scope(func, cst.Return):
            if r.value is not None:
                summary.returns.extend(self.canon.values(r.value, locals_split=True))
                if m.precision.autocast_regions():  # a loss computed under autocast and returned
                    regions, foreign = m.precision.computing_regions(r.value)
                    for region in regions:
                        summary.return_dtypes.setdefault(m.precision.region_dtype(region) or "unknown", m.line(region.node))
                    for fr in foreign:
                        summary.return_dtypes.setdefault(fr.dtype, m.line(r))
        summary.saves = self.saves(func)
        summary.loads = self.loads(func)
        summary.options = self.options(func)
        return summary

    def effects(self, func: cst.FunctionDef) -> List[Effect]:
        m = self.model
        groups = _Groups()
        frames: Dict[int, int] = {}
        out: List[Effect] = []
        for te in m._local_trace(func).events:
            ev = te.event
            node = ev.node
            line, col = self.locate(node)
            for call in te.frame:  # (the calls whose locals the event's keys and tests may name)
                self._run_number(call)
            ctx = tuple((self._portable(groups.group(g)), self._stable(groups.branch(b))) for g, b in te.ctx.items())
            loop = None
            if ev.kind == EXIT and ev.loop is not None:
                loop = groups.group((te.frame, ("loop", ev.loop)))[1]
            callee, args, owner_param = None, (), None
            if ev.kind == EXTERNAL:
                callee, args = self._external(te, node)
                if callee is None:
                    continue
                if callee.startswith("value:") and callee.rpartition(".")[2] in _RECEIVER_METHODS:
                    owner_param = self._untouched_receiver(te, node, func)
            region = None
            if te.region is not None:
                region = m.precision.region_dtype(te.region) or "unknown"
            scale_source = self._scale_source(te, func) if ev.kind == BACKWARD else None
            scaler = te.scaler
            if ev.kind == BACKWARD and ev.detail == "tensor" and scale_source == "scaled" and not te.frame:
                scaler = self._received_scaler(node, func)
            text = self._code(node.func if isinstance(node, cst.Call) else node)
            frame = tuple(frames.setdefault(i, len(frames)) for i in te.frame)
            out.append(Effect(kind=ev.kind, line=line, col=col + 1, text=text[:80], scaler=self._stable(scaler),
                              target=self._stable(te.target), detail=ev.detail, ctx=ctx, loop=loop, callee=callee,
                              args=tuple((slot, self._stable(key)) for slot, key in args), owner_param=owner_param,
                              region=region, scale_source=scale_source, frame=frame))
        return out

    def class_assignments(self) -> Tuple[Dict[cst.ClassDef, List[Tuple[str, List[cst.BaseExpression]]]], Set[cst.ClassDef]]:
        """The module's assignments of class attributes, by class: `self.x = ...` in a method
        (`self_class`) and `x = ...` in the class's body, as (name, values) in the order of the
        model's assignments; and the classes whose instances get attributes no assignment names
        (`setattr(self, ...)`, `self.__dict__.update(...)`). Read in one pass over the module's
        assignments and calls, not in one per class (`_class`)."""
        found = self.__dict__.get("_class_assignments")
        if found is None:
            m = self.model
            by_class: Dict[cst.ClassDef, List[Tuple[str, List[cst.BaseExpression]]]] = {}
            for key, entries in m.assignments.items():
                root, _, rest = key.partition(".")
                if root == "self" and rest and "." not in rest:
                    name, owner_of = rest, m.self_class
                elif not rest:
                    name, owner_of = key, m.scope_of
                else:
                    continue
                here: Dict[cst.CSTNode, List[cst.BaseExpression]] = {}
                for n, v in entries:
                    owner = owner_of(n)
                    if owner is not None:
                        here.setdefault(owner, []).append(v)
                for owner, values in here.items():
                    by_class.setdefault(owner, []).append((name, values))  # type: ignore[arg-type]
            dynamic = {m.self_class(call) for call in m.calls
                       if m._is_builtin(call.func, "setattr") or dotted(call.func) in ("self.__dict__.update",)}
            found = self.__dict__["_class_assignments"] = (by_class, dynamic)
        return found

    def _run_number(self, call: int) -> str:
        """The number that stands for `id(call)`, the call of a helper of this module whose locals
        a trace names `name@<id>` (`Events._subst`): an id differs from one process to the
        next, and a freed tree's ids come back for another module's nodes, so a summary kept
        for later runs or read beside another module's would share `x@<id>` texts with it
        (and a test on one, `("cond", "x@<id> is None")`, would be taken for the other's).
        Digits (`iterations._canon` reads `name@<digits>` as a name), from this module's path,
        content and the order the calls are met in: the same for every run, and another
        module's only by a 60-bit chance."""
        key = str(call)
        number = self._runs.get(key)
        if number is None:
            digest = hashlib.sha256(f"{self.salt}\0{len(self._runs)}".encode()).hexdigest()
            number = self._runs[key] = str(int(digest[:15], 16))
        return number

    def _portable(self, group: Tuple[Any, ...]) -> Tuple[Any, ...]:
        """A context group as `_Groups` numbers it, its test (`("cond", text)`, the one group
        that keeps a text) with stable run numbers (`_stable`)."""
        return ("cond", self._stable(group[1])) if group[0] == "cond" else group

    def _stable(self, text):
        """`text` (a key, a test) with each `@<id>` of a helper call this summary met
        (`_run_number`) written as its number; anything else as it is."""
        if not isinstance(text, str) or "@" not in text:
            return text
        return _RUN.sub(lambda m: "@" + self._runs[m.group(1)] if m.group(1) in self._runs else m.group(0), text)

    def _external(self, te: TraceEvent, call: cst.Call) -> Tuple[Optional[str], Tuple[Tuple[str, str], ...]]:
        m = self.model
        func = call.func
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Call) and \
                isinstance(func.value.func, cst.Name) and func.value.func.value == "super":
            callee = f"super:{func.attr.value}"
        elif isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value in ("self", "cls"):
            callee = f"self:{func.attr.value}"
        else:
            text = self.canon.text(func, 0)
            if text is None:
                return None, ()
            callee = f"value:{text}"
        args: List[Tuple[str, str]] = []
        pos = 0
        for a in call.args:
            if a.star:
                args.append(("*", "*"))
                break
            key = m.root_key(te, m.key(a.value))
            if key is None:
                key = UNKNOWN
            if a.keyword is not None:
                args.append((f"kw:{a.keyword.value}", key))
            else:
                args.append((str(pos), key))
                pos += 1
        if isinstance(func, cst.Attribute) and not callee.startswith(("self:", "super:")):
            owner = m.root_key(te, m.key(func.value))
            if owner is not None:
                args.append(("owner", owner))
        elif callee.startswith(("self:", "super:")):
            args.append(("owner", m.root_key(te, "self") or "self"))
        return callee, tuple(args)

    def _received_scaler(self, call: cst.Call, func: cst.FunctionDef) -> Optional[str]:
        """For `p.scale(loss).backward()` in `func`'s own body, where `p` is a parameter of
        `func` that no statement of it rebinds: `p` (the scaler of the backward if the caller
        passes a GradScaler, which this module does not know: `Events._scaled_by_bound_scaler`);
        None for anything else."""
        m = self.model
        tensor = call.func.value if isinstance(call.func, cst.Attribute) else None
        if not (isinstance(tensor, cst.Call) and isinstance(tensor.func, cst.Attribute)
                and tensor.func.attr.value == "scale" and isinstance(tensor.func.value, cst.Name)):
            return None
        name = tensor.func.value.value
        if m.function_of(call) is not func or not m._is_param(func, name) \
                or m.binding_scope(name, m.scope_of(call)) is not func:
            return None
        writes = self.__dict__.setdefault("_writes", {})
        if func not in writes:
            writes[func] = reads_writes(func.body)[1]
        return None if name in writes[func] else name

    def _untouched_receiver(self, te: TraceEvent, call: cst.Call, func: cst.FunctionDef) -> Optional[str]:
        """For `p.step(...)` (`p.x.unscale_(...)`, ...) in `func`'s trace: the parameter `p` of
        `func` whose object the call is on, followed through the module's helpers that run it
        (`_step(grad_scaler)` binding `s`); None where some function on the way binds that
        name otherwise (anywhere in it: before, in a branch, by `for`/`with`/walrus, in a nested
        function; after `p = Wrapper(p)` the call is on an object the caller never passed), or
        where it is no parameter."""
        m = self.model
        memo = self.__dict__.setdefault("_bindings", {})
        expr = call.func.value if isinstance(call.func, cst.Attribute) else None
        site: cst.CSTNode = call
        calls = list(te.via)
        while True:
            if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and expr.func.value == "super":
                name = "self"  # `super().method(...)`: the caller's own `self`
            else:
                text = dotted(expr) if expr is not None else None
                if text is None:
                    return None
                name = text.partition(".")[0]
            scope = m.function_of(site)
            if not isinstance(scope, cst.FunctionDef) or m.binding_scope(name, m.scope_of(site)) is not scope \
                    or not m._is_param(scope, name) or binding_counts(scope, memo).get(name, 0):
                return None
            if not calls:
                return name if scope is func else None
            caller = calls.pop()
            if not isinstance(caller, cst.Call):
                return None
            expr = m.bind_arguments(caller, scope).get(name)
            if expr is None:  # the method's own `self`: the object it is called on
                first = [*scope.params.posonly_params, *scope.params.params][:1]
                if not (m._is_method(scope) and first and first[0].name.value == name
                        and isinstance(caller.func, cst.Attribute)):
                    return None
                expr = caller.func.value
            site = caller

    def _scale_source(self, te: TraceEvent, func: cst.FunctionDef) -> str:
        m = self.model
        if te.event.detail == "tensor" and any(a.keyword is None for a in te.node.args):  # type: ignore[attr-defined]
            return "unknown"  # `optimizer.backward(loss)`, `engine.backward(loss)`, `x.backward(gradient)`
        tensor = m.argument_at(te, m.backward_tensor(te.node))
        if isinstance(tensor, cst.Name):
            scope = m.function_of(tensor)
            if scope is not None and m._is_param(scope, tensor.value) and \
                    m.binding_scope(tensor.value, m.scope_of(tensor)) is scope and scope is func:
                if not m.argument_values(scope, tensor.value):
                    return f"param:{tensor.value}"
        if te.event.detail == "scaled":
            return "scaled"
        return "scaled" if m.backward_scale_sources(te) else "unscaled"

    def saves(self, func: cst.FunctionDef) -> List[Dict[str, Any]]:
        """The checkpoints the function writes (`Checkpoints.saved_states`): their keys, what
        their entries hold (`_entries`), the line of the `torch.save`, and the parameters whose
        dicts are merged in (`spread`); a `torch.save` of a parameter (`param`); and a dict
        handed to a save helper (`via`: the callee, `arg`: its parameter or position), which the
        caller's model composes with that helper's summary."""
        m = self.model
        out = []
        for state in m.checkpoints.saved_states():
            if m.scope_of(state.save) is not func:
                continue
            out.append({"keys": list(state.keys), "state": self._entries(state), "line": self.locate(state.save)[0],
                        "opaque": state.opaque, "scaler_state": state.scaler_state,
                        "spread": list(state.spread_params)})
        for call in m._nodes_in_scope(func, cst.Call):  # `torch.save(state, path)` of a dict the caller builds
            if m.is_api(call, "save") and call.args \
                    and isinstance(call.args[0].value, cst.Name) and m._is_param(func, call.args[0].value.value):
                out.append({"param": call.args[0].value.value, "line": self.locate(call)[0]})
        for call, arg, state in m.checkpoints.handed_dicts(func):
            callee = self.canon.text(call.func, 0)
            if callee is not None and callee.startswith((IMPORTED, LOCAL)):
                out.append({"via": callee, "arg": arg, "keys": list(state.keys), "state": self._entries(state),
                            "line": self.locate(call)[0], "opaque": state.opaque, "scaler_state": state.scaler_state,
                            "spread": list(state.spread_params)})
        return out

    def _entries(self, state) -> Dict[str, str]:
        """key -> what a checkpoint's entry holds: "scaler", "optimizer" or "other", with the
        object whose state it is as canonical text (`optimizer|__param__.optimizer`)."""
        m = self.model
        what = {}
        for key, value in state.entries:
            receivers = m.checkpoints.state_receivers(value) if value is not None else []
            receiver = next((r for r in receivers if m.scaler_key(r) is not None or m.is_optimizer(r)),
                            receivers[0] if receivers else None)
            if receiver is None:
                what[key] = "other"
            elif m.scaler_key(receiver) is not None:
                what[key] = "scaler"
            elif m.is_optimizer(receiver):
                what[key] = "optimizer"
            else:
                what[key] = "other"
            if receiver is not None:
                text = self.canon.text(receiver, 0)
                if text is not None:
                    what[key] += f"|{text}"
        return what

    def loads(self, func: cst.FunctionDef) -> List[Dict[str, Any]]:
        """What the function restores from a `torch.load` (`Checkpoints.restores`): for each
        `X.load_state_dict(...)`, X's kind ("scaler", "optimizer" or "other"; "scaler" for a
        GradScaler or a name for one), X as canonical text (`__param__.optimizer`) and the line."""
        m = self.model
        out = []
        for call in m.checkpoints.restores(func):
            receiver = call.func.value  # type: ignore[attr-defined]  # (`restores`: X.load_state_dict calls)
            # (a receiver named for a scaler counts as one: a caller that hands it one is then not told
            # that nothing restores its scaler)
            named = "scaler" in ((dotted(receiver) or "").rpartition(".")[2]).lower()
            kind = "scaler" if named or m.is_scaler(receiver) else "optimizer" if m.is_optimizer(receiver) else "other"
            out.append({"kind": kind, "receiver": self.canon.text(receiver, 0), "line": self.locate(call)[0]})
        return out

    def options(self, func: cst.FunctionDef) -> Dict[str, List[Value]]:
        """For a function that returns `parser.parse_args()`: the options its parser declares."""
        m = self.model
        returns = [r.value for r in m._nodes_in_scope(func, cst.Return) if r.value is not None]
        if not any(isinstance(v, cst.Call) and call_name(v) in ("parse_args", "parse_known_args")
                   for r in returns for v in m.possible_values(r)):
            return {}
        out: Dict[str, List[Value]] = {}
        for call in m.calls:
            if call_name(call) != "add_argument":
                continue
            flags = [literal_string(a.value) for a in call.args if a.keyword is None]
            dest = next((f.lstrip("-").replace("-", "_") for f in flags if f and f.startswith("--")), None)
            for a in call.args:
                if a.keyword is not None and a.keyword.value == "dest":
                    dest = literal_string(a.value) or dest
            if dest is None:
                continue
            out[dest] = [v for e in option_value_set(m, call) for v in
                         ([Value(UNKNOWN, 0)] if e is None else self.canon.values(e))]
        return out


def option_value_set(m, call: cst.Call) -> List[Optional[cst.BaseExpression]]:
    """What an `add_argument(...)` option may hold: its default, then its choices, True and
    False for a flag, and None (anything the user passes) when nothing closes the set."""
    args = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    out: List[Optional[cst.BaseExpression]] = []
    action = literal_string(args.get("action"))
    default = args.get("default")
    if action in ("store_true", "store_false"):
        flag = cst.Name("True" if action == "store_true" else "False")
        return [default if default is not None else cst.Name("False" if action == "store_true" else "True"), flag]
    out.append(default if default is not None else cst.Name("None"))
    choices = args.get("choices")
    if isinstance(choices, (cst.List, cst.Tuple, cst.Set)):
        out.extend(e.value for e in choices.elements if not isinstance(e, cst.StarredElement))
    else:
        out.append(None)
    return out


# ---------------------------------------------------------------------- module


def summarize(model, digest: str = "", text: Optional[str] = None) -> ModuleSummary:
    """The summary of the module `model` was built for. With the module's `text`, a function
    whose code holds no AMP code (`AMP_TEXT`) keeps only its parameters: nothing asks more of it."""
    m = model
    s = Summarizer(m)
    s.salt = f"{m.path}\0{digest}"
    if text is not None:
        spans = def_spans(text)
        s.skip = {q for q, (a, b) in spans.items() if AMP_TEXT.search(text, a, b) is None}
        s.text, s.spans = text, spans
    summary = ModuleSummary(path=m.path, digest=digest)
    module = m.module
    for name, entries in m._index.imports.get(module, {}).items():
        summary.imports[name] = [q for q, _, _ in entries]
    for node in m.nodes_of(cst.ImportFrom):
        if isinstance(node.names, cst.ImportStar) and m.scope_of(node) is module:
            base = dotted(node.module) if node.module is not None else ""
            summary.star_imports.append("." * len(node.relative) + (base or ""))
    for key, entries in m.assignments.items():
        if "." in key:
            continue
        values = [v for n, v in entries if m.scope_of(n) is module]
        if values:
            summary.constants[key] = [val for v in values for val in s.canon.values(v)]
    for funcs in m.functions.values():
        for f in funcs:
            if m.scope_of(f) is module:
                summary.functions[f.name.value] = s.function(f, False)
    for cls in m.nodes_of(cst.ClassDef):
        if m.scope_of(cls) is module:
            summary.classes[cls.name.value] = _class(m, s, cls)
    summary.calls = _outgoing(m, s)
    return summary


def _class(m, s: Summarizer, cls: cst.ClassDef) -> ClassSummary:
    out = ClassSummary(cls.name.value, 0,
                       [v for b in cls.bases if b.keyword is None for v in s.canon.values(b.value)])
    for method in m.methods(cls):
        out.methods[method.name.value] = s.function(method, m._is_method(method))
    by_class, dynamic = s.class_assignments()
    for name, values in by_class.get(cls, ()):
        out.attributes.setdefault(name, []).extend(val for v in values for val in s.canon.values(v))
    for method in m.methods(cls):  # a @property returns its value
        if any(isinstance(d.decorator, cst.Name) and d.decorator.value == "property" for d in method.decorators):
            out.attributes.setdefault(method.name.value, []).extend(out.methods[method.name.value].returns)
    if cls in dynamic:
        out.dynamic = True
    if m.method(cls, "__getattr__") is not None:
        out.dynamic = True
    if any("dataclass" in (dotted(d.decorator if not isinstance(d.decorator, cst.Call) else d.decorator.func) or "")
           for d in cls.decorators) and isinstance(cls.body, cst.IndentedBlock):
        for stmt in cls.body.body:
            if isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name):
                        out.fields.append(small.target.value)
    return out


def _outgoing(m, s: Summarizer) -> List[OutgoingCall]:
    """Calls to functions other modules may define (their callee is an imported name or a
    module-level function of this module), with the canonical arguments."""
    out = []
    for call in m.calls:
        func = call.func
        if not isinstance(func, (cst.Name, cst.Attribute)) or dotted(func) is None:
            continue
        callee = s.canon.text(func, 0)
        if callee is None or not callee.startswith((IMPORTED, LOCAL)):
            continue
        oc = OutgoingCall(callee, s.canon._line(call))
        for a in call.args:
            if a.star:
                oc.star = True
                continue
            values = s.canon.values(a.value)
            value = values[0] if len(values) == 1 else Value(UNKNOWN, values[0].line if values else 0)
            if a.keyword is not None:
                oc.keywords[a.keyword.value] = value
            else:
                oc.positional.append(value)
        out.append(oc)
    return out


__all__ = ["Canonical", "Summarizer", "summarize", "touched_unlisted", "LIBRARY_ROOTS"]
