"""Run rules over one file: decode, pre-filter, parse once, build the model, collect
diagnostics, honour `# noqa`, and apply fixes without ever breaking the file."""

from __future__ import annotations

import ast
import dataclasses
import difflib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, FrozenSet, List, NamedTuple, Optional, Sequence, Set, Tuple, Type

import libcst as cst

from ampfix.engine import collector, guard
from ampfix.engine import fileio
from ampfix.engine import fixcheck
from ampfix.lexemes import masked
from ampfix.model import AmpModel
from ampfix.model.parsing import parse_module
from ampfix.model.tree import dotted as _dotted
from ampfix.rule import Applicability, FileContext, Fix, Rule, Violation, trigger_test
from ampfix.triggers import Scan, project_candidate_test

MAX_FIX_PASSES = 10

# the results and decoding live in ampfix/engine/results.py (no LibCST needed there); importable from here
from ampfix.engine.results import (Diagnostic, FileError, FileResult, FixEdit, InputError, Settings, SourceText,  # noqa: F401
                            TextEdit, _NOT_JSON, decode_source, dep_digest, diff_names, file_digest, unified_diff)  # noqa: E402


#: counters for `AMPFIX_STATS=1` (this process: run with `-j 1` to see a whole run)
STATS = {"parsed": 0}


gc_paused = collector.paused  # (the name the server and the tests import)


def parse(text: str, path: str) -> cst.Module:
    STATS["parsed"] += 1
    if not guard.UNGUARDED and guard.risky(text):
        # CPython's parser reports what it rejects (e.g. > 200 nested brackets) and gives up
        # cleanly on absurd nesting, where LibCST's could crash or take minutes and gigabytes
        try:
            compile(text, path, "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
        except SyntaxError as py_exc:
            raise InputError(FileError(path, py_exc.lineno, py_exc.offset, f"syntax error: {py_exc.msg}")) from None
        except (RecursionError, MemoryError) as py_exc:
            raise InputError(FileError(path, None, None, "not analysed: the code is nested too deeply even for "
                                                         f"CPython's parser ({type(py_exc).__name__})")) from None
        except ValueError:
            pass
    try:
        return parse_module(text)
    except cst.ParserSyntaxError as exc:
        # CPython's own parser names the place and the problem better, when it disagrees too
        try:
            compile(text, path, "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
        except SyntaxError as py_exc:
            raise InputError(FileError(path, py_exc.lineno, py_exc.offset, f"syntax error: {py_exc.msg}")) from None
        except (ValueError, RecursionError, MemoryError):
            pass
        else:  # Python reads it: a limit of LibCST's, not a mistake of the file
            raise InputError(_unreadable_valid(path, text, exc)) from None
        msg = exc.message.strip().splitlines()[0] if exc.message else "invalid syntax"
        raise InputError(FileError(path, exc.raw_line, exc.raw_column + 1, f"syntax error: {msg}")) from None
    except Exception as exc:  # libcst raises a few other errors on odd input
        raise InputError(FileError(path, None, None, f"cannot parse: {type(exc).__name__}: {exc}")) from None


def _unreadable_valid(path: str, text: str, exc: cst.ParserSyntaxError) -> FileError:
    """The error for a file that Python compiles and LibCST cannot parse (its tokenizer rejects
    indentation that mixes tabs and spaces in ways CPython accepts): not analysed, where the
    mixed indentation starts when that is the cause (LibCST's own position is then the file's
    first line, which says nothing)."""
    msg = exc.message.strip().splitlines()[0] if exc.message else "invalid syntax"
    line, column = exc.raw_line, exc.raw_column + 1
    mixed = mixed_indentation(text)
    hint = ""
    if mixed is not None:
        line, column = mixed, 1
        hint = "; this line indents with tabs and spaces mixed: indent it with spaces only"
    return FileError(path, line, column, f"not analysed: Python accepts this file, but LibCST, the parser ampfix "
                                         f"reads code with, does not ({msg}{hint})")


def mixed_indentation(text: str) -> Optional[int]:
    """The first line (1-based) whose indentation mixes tabs and spaces, or indents with one
    after an earlier line indented with the other; None when every line keeps to one."""
    seen = 0
    for number, line in enumerate(text.splitlines(), 1):
        indent = line[:len(line) - len(line.lstrip(" \t"))]
        if not indent or len(indent) == len(line):
            continue  # not indented, or a blank line
        kinds = ("\t" in indent) + 2 * (" " in indent)  # 1 tabs, 2 spaces, 3 both
        if kinds == 3 or (seen and kinds != seen):
            return number
        seen = seen or kinds
    return None


# ----------------------------------------------------------------------------- noqa

# parsing `# noqa` lives in ampfix/engine/noqa.py; these names stay importable from here
from ampfix.engine.noqa import NOQA_RE, FileExemption, file_exemption, noqa_lines, suppressed, suppressing  # noqa: E402,F401


# ----------------------------------------------------------------------------- analysis


@dataclass
class _Found:
    rule: Type[Rule]
    violation: Violation
    diagnostic: Diagnostic
    noqa: bool


def triggered(rules: Sequence[Type[Rule]], text: str, path: str = "",
              settings: Optional[Settings] = None) -> List[Type[Rule]]:
    """The rules whose triggers `text` holds; with the project read, also those whose
    triggers a related module holds (`Rule.project_requires`)."""
    tests = _Tests(rules, text)
    active = [r for r in rules if tests.own(r)]
    if settings is None or not settings.project:
        return active
    rest = [r for r in rules if r not in active and tests.candidate(r)]
    project = project_for(path, settings) if rest else None
    if project is None:
        return active
    full = os.path.abspath(path)
    # the project reads this file as the rules see it: an editor's buffer, a rewrite's next pass,
    # a notebook's code (not its JSON), not the text on disk (`build_model` offers it again)
    project.offer(full, text)  # type: ignore[attr-defined]
    # the strings of every rule that may pass through the project, not only of `rest`: one set
    # for every file, so the project reads each part of the code once (`Project._held_by`
    # memoises by it); `_passing` reads only the strings of the rules of `rest`
    words, lower_words = tests.facts.words, tests.facts.lower_words
    own = ({t for t in words if t in tests.held}, {t for t in lower_words if t in tests.held_lower})
    # the rules' trigger test on the file and the code it reaches (`Project.reach_held`), after
    # two cheaper bounds of that code: the related modules' strings (`reach_bound`, a union of
    # memoised sets), which lets most files go, then `reach_words` (a walk of memoised reaches)
    bound = project.reach_bound(full, words, lower_words)  # type: ignore[attr-defined]
    if not _passing(rest, own, bound):
        return active
    bound = project.reach_words(full, words, lower_words)  # type: ignore[attr-defined]
    if bound is not None and not _passing(rest, own, bound):
        return active
    reach = project.reach_held(full, words, lower_words)  # type: ignore[attr-defined]
    if reach is None:
        return active
    also = _passing(rest, own, reach)
    return [r for r in rules if r in active or r in also]


class _Tests:
    """The trigger tests of a set of rules on one text (`triggered`, `worth_analysing`): a rule
    that keeps `Rule`'s tests is tested through `Scan`, each string looked for once (rules share
    most of theirs) and only as far as the tests go; the others by their own methods. They read
    the text's code, its comments and docstrings masked (`masked`: "backward" in "for backwards
    compatibility" triggers nothing); a rule that `reads_comments`, the text as it is."""

    def __init__(self, rules: Sequence[Type[Rule]], text: str, mask: bool = True) -> None:
        self.rules, self.raw = rules, text
        code = masked(text) if mask else text
        self.text, self.lowered = code, code.lower()
        self.facts = _rule_set(rules)
        self.held, self.held_lower = Scan(code), Scan(self.lowered)
        self._raw_tests: Optional[_Tests] = None

    def _as_is(self, r: Type[Rule]) -> Optional["_Tests"]:
        """The tests on the text as it is, for a rule that reads comments (None: this text's)."""
        if not r.reads_comments or self.text is self.raw:
            return None
        if self._raw_tests is None:
            self._raw_tests = _Tests(self.rules, self.raw, mask=False)
        return self._raw_tests

    def own(self, r: Type[Rule]) -> bool:
        """`r.triggered_by`: the rule fires on the text by its own triggers."""
        as_is = self._as_is(r)
        if as_is is not None:
            return as_is.own(r)
        if r in self.facts.default_trigger:
            return trigger_test(self.held, self.held_lower, r.triggers, r.triggers_lower, r.requires)
        return r.triggered_by(self.text, self.lowered)

    def candidate(self, r: Type[Rule]) -> bool:
        """`r.project_candidate`: the rule may fire on the text through the modules of its project."""
        as_is = self._as_is(r)
        if as_is is not None:
            return as_is.candidate(r)
        if r in self.facts.default_candidate:
            return project_candidate_test(self.held, self.held_lower, r.triggers, r.triggers_lower,  # type: ignore[arg-type]
                                          r.requires, r.project_requires)
        return r.project_candidate(self.text, self.lowered)


class _RuleSet(NamedTuple):
    """What `triggered` reads of a set of rules (`_rule_set`)."""

    default_trigger: FrozenSet[Type[Rule]]  # the rules that keep `Rule.triggered_by`
    default_candidate: FrozenSet[Type[Rule]]  # ... and `Rule.project_candidate`
    # the trigger strings (and lower-case ones) of the rules that read related modules
    # (`Rule.project_requires`)
    words: Tuple[str, ...]
    lower_words: Tuple[str, ...]


_RULE_SETS: Dict[Tuple[Type[Rule], ...], _RuleSet] = {}


def _rule_set(rules: Sequence[Type[Rule]]) -> _RuleSet:
    """`_RuleSet` of `rules`, memoised per set of rules."""
    key = tuple(rules)
    hit = _RULE_SETS.get(key)
    if hit is None:
        from ampfix.engine.registry import overrides

        some = [r for r in rules if r.project_requires is not None]
        hit = _RULE_SETS[key] = _RuleSet(
            frozenset(r for r in rules if not overrides(r, "triggered_by")),
            frozenset(r for r in rules if not overrides(r, "project_candidate")),
            tuple(sorted({t for r in some for t in (*r.triggers, *(s for g in r.requires for s in g))})),
            tuple(sorted({t for r in some for t in r.triggers_lower})))
    return hit


def worth_analysing(rules: Sequence[Type[Rule]], text: str) -> bool:
    """Some rule of `rules` fires on `text` by its own triggers, or may through the modules of
    the file's project (`Rule.project_candidate`): the file is parsed and analysed
    (`runner._needs_analysis`, `notebook.prefilter`)."""
    tests = _Tests(rules, text)
    return any(tests.own(r) for r in rules) or any(tests.candidate(r) for r in rules)


def _passing(rules: Sequence[Type[Rule]], own: Tuple[set, set], reach: Tuple[set, set]) -> List[Type[Rule]]:
    """The rules whose default trigger test (`trigger_test`) passes on the strings held by the
    file (`own`) or the code it reaches (`reach`): (strings, lower-case strings) each."""
    held, held_lower = own[0] | reach[0], own[1] | reach[1]
    return [r for r in rules if trigger_test(held, held_lower, r.triggers, r.triggers_lower, r.requires)]


class _Suppression:
    """`# noqa` for one file: which findings it silences (read once, on first use), and which
    directives silenced something (for AMP901)."""

    def __init__(self, text: str, model: AmpModel):
        self.text = text
        self.model = model
        self.possible = "noqa" in text.lower()
        self._noqa: Optional[Dict[int, Optional[Set[str]]]] = None
        self.exemption = file_exemption(text) if self.possible else FileExemption()
        self.used: Set[Tuple[int, Optional[str]]] = set()  # (line, code named or None)

    def lines(self, node: cst.CSTNode) -> Set[int]:
        """The reported line, and the first and last line of its simple statement."""
        lines = {self.model.position(node).start.line}
        stmt = self.model.statement_of(node)
        if isinstance(stmt, cst.SimpleStatementLine):
            spos = self.model.position(stmt)
            lines.update({spos.start.line, spos.end.line})
        return lines

    def __call__(self, node: cst.CSTNode, code: str, record: bool = False) -> bool:
        if not self.possible:
            return False
        if self.exemption.covers(code):
            if record:
                self.used.update(self.exemption.covering(code))
            return True
        if self._noqa is None:
            self._noqa = noqa_lines(self.text)
        hits = suppressing(self._noqa, code, self.lines(node))
        if record:
            self.used.update(hits)
        return bool(hits)


MAX_RELATED = 3


def _related(model: AmpModel, v: Violation, path: str) -> Tuple[Dict[str, object], ...]:
    """The related locations of a finding: the rule's, else the code of other modules that runs
    at the reported call. Paths are written as the finding's own is (relative when it is)."""
    base = os.path.dirname(os.path.abspath(path))
    rel = not os.path.isabs(path)
    found = [(p, line, col, note) for p, line, col, note in v.related] or \
        [(o.path, o.line, o.col, f"`{o.text}` in `{o.function}`") for o in model.related_at(v.node)]
    out = []
    for p, line, col, note in found[:MAX_RELATED]:
        shown = os.path.normpath(os.path.join(os.path.dirname(path), os.path.relpath(p, base))) if rel else p
        out.append({"path": shown, "line": line, "column": col, "message": note})
    return tuple(out)


def _fix_kind(fix: Optional[Fix]) -> Optional[str]:
    return None if fix is None else fix.applicability.value


# ----------------------------------------------------------------------------- the project

_PROJECTS: Dict[Tuple[str, Optional[str]], object] = {}
_ROOTS: Dict[str, str] = {}  # a file's folder -> its project root, for one run (`close_projects`)


def project_for(path: str, settings: Settings):
    """The project `path` belongs to (one per root folder and process), or None when the run
    reads no other module (`settings.project` off, a text with no file)."""
    if not settings.project or not path or path == "-" or path.startswith("<"):
        return None
    from ampfix.project import Project

    root = _root_of(os.path.abspath(path))
    key = (root, settings.cache_folder, settings.share_folder, settings.max_file_memory)
    project = _PROJECTS.get(key)
    if project is None:
        store = None
        if settings.cache_folder:
            from ampfix.engine.cache import Summaries

            store = Summaries(Path(settings.cache_folder))
        elif settings.share_folder:
            from ampfix.engine.share import SharedSummaries

            store = SharedSummaries(Path(settings.share_folder))
        from ampfix.engine import share

        project = _PROJECTS[key] = Project(Path(root), store=store, parse=_parse_quietly,
                                           max_memory=settings.max_file_memory,
                                           claim=share.claims.for_summary if share.claims is not None else None)
    return project


def _root_of(path: str) -> str:
    """`find_root` of the file at `path` (absolute), memoised per folder for the run: every
    question of a run asks it again (the triggers, the parse, the model), and each answer
    probes the root markers of every folder above the file."""
    folder = os.path.dirname(path)
    root = _ROOTS.get(folder)
    if root is None:
        from ampfix.project.layout import find_root

        root = _ROOTS[folder] = str(find_root(Path(path)))
    return root


def forget_roots() -> None:
    """Forget the project roots found (a long-lived process, before an analysis: a root marker
    may have been added or removed since)."""
    _ROOTS.clear()


def close_projects() -> None:
    """The end of a run (`runner.run`): every project of this process forgets what it knew
    (`Project.close`); the next run reads the project afresh, as a new process does."""
    for project in _PROJECTS.values():
        project.close()  # type: ignore[attr-defined]
    _PROJECTS.clear()
    _ROOTS.clear()


def parse_in_project(text: str, path: str, settings: Settings) -> cst.Module:
    """`parse`, reusing the parse the project made of this file for its summary, if any."""
    project = project_for(path, settings)
    if project is not None:
        module = project.take_parsed(os.path.abspath(path), text)  # type: ignore[attr-defined]
        if module is not None:
            return module
    try:
        return parse(text, path)
    except InputError:
        if project is not None:
            project.unreadable(os.path.abspath(path), text)  # type: ignore[attr-defined]
        raise


def _parse_quietly(text: str, path: str) -> Optional[cst.Module]:
    """A module read for its facts only: one that cannot be parsed is unknown, not an error."""
    try:
        return parse(text, path)
    except InputError:
        return None


def build_model(module: cst.Module, text: str, path: str, settings: Settings) -> AmpModel:
    """The model of one file, with its project when the run reads other modules."""
    project = project_for(path, settings)
    if project is None:
        return AmpModel(module)
    full = os.path.abspath(path)
    project.offer(full, text, module)  # type: ignore[attr-defined]
    index = project.handed_index(module)  # type: ignore[attr-defined]  # the summary's walk of this tree, if any
    return AmpModel(module, foreign=project, path=full, index=index)  # type: ignore[arg-type]


def _analyze(
    module: cst.Module, text: str, path: str, rules: Sequence[Type[Rule]], settings: Settings,
    selected: Sequence[str] = (),
    rewrite_pass: int = 0,
    memo: Optional[dict] = None,
    top_shifts: Optional[Dict[int, int]] = None,
) -> Tuple[List[_Found], AmpModel]:
    model = build_model(module, text, path, settings)
    model.source_text = text  # type: ignore[attr-defined]  # `module.code`, without generating it
    if top_shifts is not None:
        model.top_shifts = top_shifts  # type: ignore[attr-defined]  # (see `Tree._statement_positions`)
    suppression = _Suppression(text, model)
    ctx = FileContext(path=path, source=text, model=model, min_torch_version=settings.min_torch_version,
                      min_torch_source=settings.min_torch_source, lightning_before_2=settings.lightning_before_2,
                      torch_before_2_4=settings.torch_before_2_4,
                      unsafe_fixes=settings.unsafe_fixes,
                      suppression=suppression)
    # how many fix passes of this rewrite changed the text already (0: the text as it was): a
    # migration's follow-up edits (an import its fixed uses left unused) exist only after one
    ctx.extra["rewrite_pass"] = rewrite_pass
    ctx.extra["rewrite_memo"] = {} if memo is None else memo  # kept across the passes of one rewrite
    if "apex" in text and any(r.code == "AMP102" for r in rules):
        # an apex migration is project-wide or not applied (`migrations/apex/checkpoints.py`, `elsewhere`)
        uses = getattr(model.foreign, "apex_amp_uses", None)
        ctx.extra["apex_amp_elsewhere"] = uses(path) if uses is not None and path else ()
    found: List[_Found] = []
    # a rule that judges the `# noqa` directives themselves (AMP901) runs after the others,
    # told which directives silenced something and which codes were selected for this file
    late = [r for r in rules if getattr(r, "after_noqa", False)]
    for rule_cls in [r for r in rules if r not in late] + late:
        if rule_cls in late:
            ctx.extra["noqa_used"] = set(suppression.used)
            ctx.extra["selected_codes"] = tuple(selected) or tuple(r.code for r in rules)
        rule = rule_cls()
        for v in rule.check(ctx):
            pos = model.position(v.node)
            diag = Diagnostic(
                path=path,
                line=pos.start.line,
                column=pos.start.column + 1,
                end_line=pos.end.line,
                end_column=pos.end.column + 1,
                code=rule_cls.code,
                name=rule_cls.name,
                message=v.message or rule_cls.message,
                fix=_fix_kind(v.fix),
                related=_related(model, v, path),
                noqa_lines=tuple(sorted(suppression.lines(v.node))),
            )
            found.append(_Found(rule_cls, v, diag, suppression(v.node, rule_cls.code, record=True)))
    _prove_fixes(found, model)
    _block_suppressed_groups(found)
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


def _prove_fixes(found: List[_Found], model: AmpModel) -> None:
    """Every fix, before it is offered: the code it puts in place of a statement must not fail
    where the statement would not (a name read that may be unassigned there, a method called on
    something that may be None: `ampfix.model.bound`). A fix that cannot be proven is not offered,
    with the whole of its group, and its finding says why."""
    created: Dict[Optional[Tuple[str, str]], Set[str]] = {}
    for f in found:
        if f.violation.fix is not None:
            key = _group_key(f) or ("", str(id(f)))
            created.setdefault(key, set()).update(_bound_by_fix(f.violation.fix))
    blocked: Dict[Tuple[str, str], str] = {}
    for f in found:
        fix = f.violation.fix
        if fix is None:
            continue
        key = _group_key(f) or ("", str(id(f)))
        why = _fix_problem(fix, model, created.get(key, set()))
        if why is not None:
            blocked.setdefault(key, why)
    if not blocked:
        return
    for f in found:
        fix = f.violation.fix
        key = _group_key(f) or ("", str(id(f)))
        if fix is not None and key in blocked:
            f.violation.fix = None
            f.diagnostic.fix = None
            f.diagnostic.message += f" (not fixed: {blocked[key]})"


def _fix_problem(fix: Fix, model: AmpModel, created: Set[str]) -> Optional[str]:
    for node, new in fix.replacements.items():
        stmt = node if isinstance(node, cst.BaseStatement) else model.statement_of(node)
        if stmt is None or not isinstance(stmt, cst.BaseStatement):
            continue
        if node is stmt:
            if isinstance(new, cst.FlattenSentinel):
                stmts = [n for n in new.nodes if isinstance(n, cst.BaseStatement)]
            elif isinstance(new, cst.BaseStatement):
                stmts = [new]
            else:
                continue  # removed
        elif isinstance(new, cst.CSTNode):
            try:
                replaced = stmt.deep_replace(node, new)
            except Exception:  # pragma: no cover - a replacement LibCST cannot place: checked when applied
                return "ampfix could not prove this fix (its replacement does not fit its statement)"
            if not isinstance(replaced, cst.BaseStatement):
                continue
            stmts = [replaced]
        else:
            continue
        why = model.bound.replacement_problem(stmt, stmts, created)
        if why is not None:
            return f"{why}, so the fixed code could raise there"
    return None


def _bound_by_fix(fix: Fix) -> Set[str]:
    """What the fix's new code binds (a scaler it creates, a name it imports): where that is
    read, the fix answers for it (and the check of the applied pass sees the real flow)."""
    out: Set[str] = set()

    class V(cst.CSTVisitor):
        def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
            key = _dotted(node.target)
            if key is not None:
                out.add(key)

        def visit_ImportAlias(self, node: cst.ImportAlias) -> None:
            if node.asname is not None and isinstance(node.asname.name, cst.Name):
                out.add(node.asname.name.value)
            else:
                name = _dotted(node.name) or ""
                out.add(name.split(".")[0] if isinstance(self_parent.get(id(node)), cst.Import) else name)

    self_parent: Dict[int, cst.CSTNode] = {}

    class P(cst.CSTVisitor):
        def visit_Import(self, node: cst.Import) -> None:
            for a in node.names:
                self_parent[id(a)] = node

    for new in fix.replacements.values():
        nodes = new.nodes if isinstance(new, cst.FlattenSentinel) else [new]
        for n in nodes:
            if isinstance(n, cst.CSTNode):
                n.visit(P())
                n.visit(V())
    return out


def _group_key(f: _Found) -> Optional[Tuple[str, str]]:
    fix = f.violation.fix
    return None if fix is None or fix.group is None else (f.rule.code, fix.group)


def _block_suppressed_groups(found: List[_Found]) -> None:
    """A fix group is all or nothing: when one of its findings is silenced by `# noqa`, no fix
    of the group is applied, and the others say why."""
    blocked: Dict[Tuple[str, str], int] = {}
    for f in found:
        key = _group_key(f)
        if key is not None and f.noqa and key not in blocked:
            blocked[key] = f.diagnostic.line
    if not blocked:
        return
    for f in found:
        key = _group_key(f)
        if key is not None and key in blocked:
            f.violation.fix = None
            f.diagnostic.fix = None
            f.diagnostic.message += (f" (not fixed: this fix goes together with the one on line {blocked[key]}, "
                                     "which is marked `# noqa`)")


def _exempt(text: str) -> bool:
    """`# ampfix: noqa` on a line of its own: the file is not checked at all."""
    return "ampfix" in text.lower() and file_exemption(text).everything


def check_text(text: str, path: str, rules: Sequence[Type[Rule]], settings: Settings) -> Tuple[List[Diagnostic], bool]:
    """Diagnostics for `text` (noqa applied) and whether the file was parsed at all. With
    `settings.details`, each diagnostic with a fix carries it as a `FixEdit`."""
    active = triggered(rules, text, path, settings)
    if not active or _exempt(text):
        return [], False
    module = parse_in_project(text, path, settings)
    found, model = _analyze(module, text, path, active, settings, [r.code for r in rules])
    if settings.details:
        _attach_fix_edits(found, module, text, path, model=model)
    return [f.diagnostic for f in found if not f.noqa], True


class Analysis:
    """One analysis of a text, kept to answer later questions about it without analysing it
    again (the language server: diagnostics first, each finding's fix only when a code action
    asks for it). `diagnostics` are `check_text`'s (noqa applied); `fix_edits(wanted)` gives the
    diagnostics `wanted` selects their `fix_edit`, as `fix_suggestions` computes it."""

    def __init__(self, text: str, path: str, rules: Sequence[Type[Rule]], settings: Settings,
                 parser: Callable[[str, str], cst.Module] = parse,
                 top_shifts: Optional[Callable[[cst.Module], Optional[Dict[int, int]]]] = None):
        """`parser(text, path)` gives the module (`parse`; the language server passes its
        `incremental.Reparser`'s, which gives the same tree from the previous version's), and
        `top_shifts(module)`, if given, the lines before each top-level statement (positions are
        then computed without CPython's parse of the text; `Reparser.top_shifts`)."""
        self.text, self.path = text, path
        self._module: Optional[cst.Module] = None
        self._model: Optional[AmpModel] = None
        self._found: List[_Found] = []
        self._done: Set[int] = set()  # id() of the findings whose fix edit was computed
        active = triggered(rules, text, path, settings)  # the project's rules too, as `check_text`
        if not active or _exempt(text):
            self.diagnostics: List[Diagnostic] = []
            return
        with gc_paused():
            self._module = parser(text, path)
            self._found, self._model = _analyze(self._module, text, path, active, settings, [r.code for r in rules],
                                                top_shifts=top_shifts(self._module) if top_shifts else None)
        self.diagnostics = [f.diagnostic for f in self._found if not f.noqa]

    def without_fix_edit(self) -> List[Diagnostic]:
        """The diagnostics with a fix whose fix edit has not been computed yet."""
        return [f.diagnostic for f in self._found
                if not f.noqa and f.violation.fix is not None and id(f) not in self._done]

    def fix_edits(self, wanted: Callable[[Diagnostic], bool] = lambda d: True) -> List[Diagnostic]:
        """The diagnostics, those `wanted` selects with their fix edits (computed once each)."""
        todo = [f for f in self._found if not f.noqa and id(f) not in self._done and wanted(f.diagnostic)]
        if todo and self._module is not None:
            with gc_paused():
                _attach_fix_edits(self._found, self._module, self.text, self.path, only=todo,
                                  model=self._model)
            self._done.update(id(f) for f in todo)
        return self.diagnostics


def fix_suggestions(text: str, path: str, rules: Sequence[Type[Rule]], settings: Settings) -> List[Diagnostic]:
    """The diagnostics of `text`, each with its fix on its own (`Diagnostic.fix_edit`: the text
    edits and a diff of what `ampfix rewrite` would change for that finding), writing nothing.
    For SARIF fixes, the `full` text format and the language server's code actions."""
    settings = Settings(**{**settings.__dict__, "details": True})
    diags, _ = check_text(text, path, rules, settings)
    return diags


def text_edits(old: str, new: str) -> List[TextEdit]:
    """The line-granular edits that turn `old` into `new`."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)

    def pos(i: int) -> Tuple[int, int]:  # the start of old line i (0-based), or the end of the text
        if i < len(a):
            return i + 1, 1
        if not a:
            return 1, 1
        last = a[-1]
        if last.endswith(("\n", "\r")):
            return len(a) + 1, 1
        return len(a), len(last) + 1

    out = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag != "equal":
            (sl, sc), (el, ec) = pos(i1), pos(i2)
            out.append(TextEdit(sl, sc, el, ec, "".join(b[j1:j2])))
    return out


def _attach_fix_edits(found: List[_Found], module: cst.Module, text: str, path: str,
                      only: Optional[Sequence[_Found]] = None, model: Optional[AmpModel] = None) -> None:
    """Give each finding (or each of `only`) with a fix its `fix_edit`."""
    members: Dict[Tuple[str, str], List[_Found]] = {}
    for f in found:
        key = _group_key(f)
        if key is not None:
            members.setdefault(key, []).append(f)
    compiles: Optional[bool] = None
    fromfile, tofile = diff_names(path)
    for f in (found if only is None else only):
        fix = f.violation.fix
        if f.noqa or fix is None:
            continue
        key = _group_key(f)
        group = members[key] if key is not None else [f]
        replacements: Dict[int, object] = {}
        replaced: List[cst.CSTNode] = []
        for m in group:
            if m.violation.fix is not None:
                for node, new in m.violation.fix.replacements.items():
                    replacements[id(node)] = new
                    replaced.append(node)
        try:
            new_text = module.visit(_ApplyFixes(replacements, _paths(model, replaced))).code
            parse_module(new_text)
        except Exception:
            continue
        if new_text == text:
            continue
        if compiles is None:
            compiles = _compiles(text, path)
        if compiles and not _compiles(new_text, path):
            continue
        f.diagnostic.fix_edit = FixEdit(fix.description, fix.applicability.value, text_edits(text, new_text),
                                        unified_diff(text, new_text, fromfile, tofile))
    lines = text.splitlines()
    for f in found:
        d = f.diagnostic
        d.source_lines = tuple(lines[d.line - 1: min(d.end_line, d.line + 4)])


class _ApplyFixes(cst.CSTTransformer):
    """Replace nodes by identity. With `paths` (the id() of every ancestor of a replaced node)
    it enters only those: a subtree without a replaced node comes out as it went in, so it is
    kept instead of rebuilt (the same tree, without rebuilding the whole file per fix)."""

    def __init__(self, replacements: Dict[int, object], paths: Optional[Set[int]] = None):
        super().__init__()
        self.replacements = replacements
        self.paths = paths

    def on_visit(self, node: cst.CSTNode) -> bool:
        return self.paths is None or id(node) in self.paths

    def on_leave(self, original_node, updated_node):  # type: ignore[override]
        r = self.replacements.get(id(original_node))
        return updated_node if r is None else r


def _paths(model: Optional[AmpModel], nodes: Sequence[cst.CSTNode]) -> Optional[Set[int]]:
    """id() of every ancestor of `nodes` in the model's tree (None without a model: enter all)."""
    if model is None:
        return None
    out: Set[int] = set()
    for node in nodes:
        for anc in model.ancestors(node):
            if id(anc) in out:
                break
            out.add(id(anc))
    return out


Range = Tuple[Tuple[int, int], Tuple[int, int]]


def _fix_ranges(fix: Fix, model: AmpModel) -> List[Range]:
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


def _applicable(f: _Found, settings: Settings, refused: Optional[Dict[tuple, str]] = None,
                model: Optional[AmpModel] = None) -> bool:
    fix = f.violation.fix
    if fix is None or f.noqa:
        return False
    if refused and model is not None and _fix_key(f, model) in refused:
        return False
    return fix.applicability is Applicability.SAFE or (fix.applicability is Applicability.UNSAFE
                                                       and settings.unsafe_fixes)


def _fix_key(f: _Found, model: AmpModel) -> tuple:
    """What identifies a fix from one pass to the next (its positions move as other fixes land):
    the rule, what it does, the code it reports and the code it replaces."""
    fix = f.violation.fix
    assert fix is not None
    cache = model.__dict__.setdefault("_fix_keys", {})
    hit = cache.get(id(f))
    if hit is not None and hit[0] is f:
        return hit[1]
    nodes = tuple(sorted(model.module.code_for_node(n) for n in fix.replacements))
    key = (f.rule.code, fix.description, model.module.code_for_node(f.violation.node), nodes)
    cache[id(f)] = (f, key)
    return key


@dataclass
class _Unit:
    """Fixes that go in together: one finding's, or a whole fix group's."""

    members: List[_Found]
    fixes: List[Fix]
    ranges: List[Range]


def _choose(found: List[_Found], model: AmpModel, settings: Settings,
            refused: Optional[Dict[tuple, str]] = None) -> List[_Unit]:
    """The fixes to apply in this pass: no two overlap, and a fix group goes in whole (every fix
    applicable and clear of the others) or not at all; refused fixes are left out."""
    groups: Dict[Tuple[str, str], List[_Found]] = {}
    for f in found:
        key = _group_key(f)
        if key is not None:
            groups.setdefault(key, []).append(f)
    units: List[_Unit] = []
    fixes: Dict[int, Fix] = {}
    taken: List[Range] = []
    done_groups: Set[Tuple[str, str]] = set()
    for f in found:
        if not _applicable(f, settings, refused, model):
            continue
        key = _group_key(f)
        members = groups[key] if key is not None else [f]
        if key is not None:
            if key in done_groups:
                continue
            done_groups.add(key)
            if not all(_applicable(m, settings, refused, model) for m in members):
                continue
        new_fixes = {id(m.violation.fix): m.violation.fix for m in members if id(m.violation.fix) not in fixes}
        ranges = [r for fix in new_fixes.values() for r in _fix_ranges(fix, model)]  # type: ignore[arg-type]
        if any(_overlaps(r, t) for r in ranges for t in taken) or any(
                _overlaps(a, b) for i, a in enumerate(ranges) for b in ranges[i + 1:]):
            continue
        if not new_fixes:  # a fix another finding already brings (one unscale_ for two clips)
            for u in units:
                if any(id(m.violation.fix) in {id(x) for x in u.fixes} for m in members):
                    u.members.extend(members)
                    break
            continue
        units.append(_Unit(list(members), list(new_fixes.values()), ranges))  # type: ignore[arg-type]
        fixes.update(new_fixes)  # type: ignore[arg-type]
        taken.extend(ranges)
    return units


def _visible(found: List[_Found]) -> List[_Found]:
    return [f for f in found if not f.noqa]


@dataclass
class _Pass:
    """A text with its analysis, as the fix loop holds it between passes."""

    text: str
    module: cst.Module
    found: List[_Found]
    model: AmpModel
    n_pass: int = 0  # how many passes of fixes changed the text before it


@dataclass
class _Introduced:
    """A finding a pass of fixes added (allowed only while the next passes may fix it)."""

    before: _Pass
    units: List[_Unit]
    code: str
    message: str


class _FixLoop:
    """`fix_text`'s passes: apply, re-analyse, keep what passes `ampfix.engine.fixcheck`,
    refuse the rest (see `fix_text`)."""

    def __init__(self, text: str, path: str, rules: Sequence[Type[Rule]], settings: Settings,
                 refused: Dict[tuple, str]):
        self.text, self.path, self.rules, self.settings = text, path, rules, settings
        self.selected = [r.code for r in rules]
        self.refused = refused
        self.original_compiles: Optional[bool] = None

    def analyze(self, text: str, module: cst.Module, n_pass: int) -> _Pass:
        # the rules a check of this text would run (a fix can bring a rule's trigger in);
        # `n_pass`: how many passes changed the text already (a migration's follow-up edits)
        found, model = _analyze(module, text, self.path, triggered(self.rules, text, self.path, self.settings),
                                self.settings, self.selected, rewrite_pass=n_pass, memo=self.memo)
        return _Pass(text, module, found, model, n_pass)

    def run(self) -> Tuple[_Pass, _Pass, Dict[str, int], List[Tuple[_Found, _Introduced]]]:
        """(the first pass, the last, {fix: count}, findings added by a fix and still there)."""
        self.memo: dict = {}  # kept across the passes of one rewrite (`ctx.extra["rewrite_memo"]`)
        first = cur = self.analyze(self.text, parse_in_project(self.text, self.path, self.settings), 0)
        origin: List[Optional[_Introduced]] = [None] * len(_visible(cur.found))
        fixed: Dict[str, int] = {}
        for _ in range(MAX_FIX_PASSES):
            units = _choose(cur.found, cur.model, self.settings, self.refused)
            if not units:
                break
            accepted, nxt, mapping = self.apply_checked(cur, units)
            if nxt is None:
                if not accepted:
                    continue  # every fix of this pass was refused: the next pass chooses again
                break  # pragma: no cover - accepted fixes always produce a text
            new_origin: List[Optional[_Introduced]] = []
            for i, f in enumerate(_visible(nxt.found)):
                if i in mapping:
                    new_origin.append(origin[mapping[i]])
                else:
                    new_origin.append(_Introduced(cur, accepted, f.diagnostic.code, f.diagnostic.message))
            origin = new_origin
            for unit in accepted:
                for f in unit.members:
                    key = f"{f.diagnostic.code}: {f.violation.fix.description}"  # type: ignore[union-attr]
                    fixed[key] = fixed.get(key, 0) + 1
            cur = nxt
        late = [(f, o) for f, o in zip(_visible(cur.found), origin) if o is not None]
        return first, cur, fixed, late

    # ---------------------------------------------------------------- one pass
    def attempt(self, cur: _Pass, units: List[_Unit]):
        """Apply `units` to `cur`: (troubles, the new pass or None, new index -> old index)."""
        replacements: Dict[int, object] = {}
        for u in units:
            for fix in u.fixes:
                for node, new in fix.replacements.items():
                    replacements[id(node)] = new
        everything = [fixcheck.Trouble((1, 1 << 30), "")]
        paths = _paths(cur.model, [node for u in units for fix in u.fixes for node in fix.replacements])
        try:
            new_text = cur.module.visit(_ApplyFixes(replacements, paths)).code
            reparsed = parse_module(new_text)
        except Exception:
            everything[0].reason = "the fix does not produce valid Python"
            return everything, None, {}
        if new_text == cur.text:
            return [], None, {}
        if self.original_compiles is None:
            self.original_compiles = _compiles(self.text, self.path)
        if self.original_compiles and not _compiles(new_text, self.path):
            everything[0].reason = "the fixed code does not compile"
            return everything, None, {}
        nxt = self.analyze(new_text, reparsed, cur.n_pass + 1)
        ops = fixcheck.opcodes(cur.text, new_text)
        old_vis, new_vis = _visible(cur.found), _visible(nxt.found)
        mapping = fixcheck.match([f.diagnostic for f in old_vis], cur.text, [f.diagnostic for f in new_vis],
                                 new_text, ops)
        troubles: List[fixcheck.Trouble] = []
        for i, f in enumerate(new_vis):
            if i not in mapping and not _applicable(f, self.settings, self.refused, nxt.model):
                d = f.diagnostic
                troubles.append(fixcheck.Trouble(fixcheck.old_range(ops, d.line),
                                                 f"it would add {d.code} on line {d.line}: {d.message}", d.line))
        try:
            troubles += fixcheck.unsafe_reads(cur.model, nxt.model, ops)
            troubles += fixcheck.comment_troubles(cur.text, new_text, ops)
        except Exception as exc:  # a check that cannot run keeps nothing it could not check
            troubles.append(fixcheck.Trouble((1, 1 << 30), f"ampfix could not check this fix ({type(exc).__name__})"))
        return troubles, nxt, mapping

    def refuse(self, unit: _Unit, model: AmpModel, reason: str) -> None:
        for f in unit.members:
            self.refused.setdefault(_fix_key(f, model), reason)

    def apply_checked(self, cur: _Pass, units: List[_Unit]):
        """The units of this pass that can go in (refusing the others): (accepted, the new pass,
        new index -> old index). Troubles are laid at the fixes whose code they are in; those that
        cannot be placed are found by applying the fixes one at a time."""
        left = list(units)
        while left:
            troubles, nxt, mapping = self.attempt(cur, left)
            if not troubles:
                return left, nxt, mapping
            culprits = [(u, t) for u in left for t in troubles[:1] + troubles[1:]
                        if any(_overlaps(r, ((t.old_lines[0], 0), (t.old_lines[1], 1 << 30))) for r in u.ranges)]
            blamed = {id(u): t for u, t in reversed(culprits)}
            if blamed and (len(blamed) < len(left) or len(left) == 1):
                for u in left:
                    if id(u) in blamed:
                        self.refuse(u, cur.model, blamed[id(u)].reason)
                left = [u for u in left if id(u) not in blamed]
                continue
            if len(left) == 1:
                self.refuse(left[0], cur.model, troubles[0].reason)
                return [], None, {}
            accepted: List[_Unit] = []
            product = (None, {})
            for u in left:
                troubles, nxt, mapping = self.attempt(cur, accepted + [u])
                if troubles:
                    self.refuse(u, cur.model, troubles[0].reason)
                else:
                    accepted.append(u)
                    product = (nxt, mapping)
            return accepted, product[0], product[1]
        return [], None, {}

    def blame_late(self, late: List[Tuple[_Found, _Introduced]]) -> bool:
        """Refuse the fixes that added a finding that is still there at the end (tried one at a
        time on the text of the pass that added it); False when none can be found."""
        blamed = False
        for f, origin in late:
            for u in origin.units:
                troubles, nxt, mapping = self.attempt(origin.before, [u])
                if nxt is None:
                    continue
                new_vis = _visible(nxt.found)
                if any(i not in mapping and g.diagnostic.code == origin.code
                       and fixcheck._norm(g.diagnostic.message) == fixcheck._norm(origin.message)
                       for i, g in enumerate(new_vis)):
                    self.refuse(u, origin.before.model, f"it would add {origin.code}: {origin.message}")
                    blamed = True
        return blamed


MAX_RESTARTS = 3


def fix_text(text: str, path: str, rules: Sequence[Type[Rule]], settings: Settings,
             stats: Optional[Dict[str, int]] = None) -> Tuple[str, Dict[str, int], List[Diagnostic]]:
    """Apply fixes until nothing applicable is left.

    Returns (new text, {"CODE: description": fixes applied}, remaining diagnostics). Every pass
    is checked before it is kept (`ampfix.engine.fixcheck`): its output parses (LibCST, and
    CPython when the input compiled), it adds no finding that no later fix removes, the code it
    adds reads only names assigned where it runs and calls no method on something that may be
    None there, and it keeps every comment on its line. A fix that fails is refused: it is not
    applied, and its finding stays in the remaining diagnostics with the reason. The remaining
    diagnostics are a fresh check of the new text (what `check` reports for the written file).
    `stats`, when given, receives the findings of the text as it was, per code (what `check`
    reports), to tell fixed findings from the follow-up edits a fix brings (an import rewritten
    once its last use is)."""
    if not triggered(rules, text, path, settings) or _exempt(text):
        return text, {}, []
    refused: Dict[tuple, str] = {}
    loop = _FixLoop(text, path, rules, settings, refused)
    for _ in range(MAX_RESTARTS + 1):
        first, last, fixed, late = loop.run()
        if not late:
            break
        if not loop.blame_late(late):
            last, fixed = first, {}  # a finding was added and no fix can be blamed: change nothing
            break
    else:  # pragma: no cover - each restart refuses at least one more fix
        last, fixed = first, {}
    if stats is not None:
        for f in _visible(first.found):
            stats[f.diagnostic.code] = stats.get(f.diagnostic.code, 0) + 1
    remaining = []
    for f in _visible(last.found):
        d = f.diagnostic
        if f.violation.fix is not None and refused:
            reason = refused.get(_fix_key(f, last.model))
            if reason is not None:
                d.fix = None
                d.message += f" (not fixed: {reason})"
        remaining.append(d)
    return last.text, fixed, remaining


# ----------------------------------------------------------------------------- files


def transform_text(text: str, path: str, rules: Sequence[Type[Rule]], settings: Settings,
                   fix: bool = False,
                   stats: Optional[Dict[str, int]] = None) -> Tuple[str, Dict[str, int], List[Diagnostic]]:
    """One decoded text as `process_bytes` treats it: (new text, {what: count}, diagnostics).
    Checking returns the text unchanged; fixing applies the fixes; with `settings.add_noqa` a
    `# noqa: CODE` is added for each finding instead (the diagnostics left are those that could
    not be silenced)."""
    if settings.add_noqa:
        from ampfix.engine.noqa import add_noqa

        diags, _ = check_text(text, path, rules, settings)
        wanted = [(d.code, [d.line] + sorted(set(d.noqa_lines) - {d.line}, reverse=True)) for d in diags]
        new_text, _, _ = add_noqa(text, wanted)
        if new_text == text:
            return text, {}, diags
        try:
            left, _ = check_text(new_text, path, rules, settings)
        except InputError:  # pragma: no cover - comments never break a file; keep it as it was
            return text, {}, diags
        added: Dict[str, int] = {}
        for d in diags:
            if not any((d.code, d.line, d.column) == (e.code, e.line, e.column) for e in left):
                added[d.code] = added.get(d.code, 0) + 1
        return new_text, added, left
    if fix:
        return fix_text(text, path, rules, settings, stats)
    diags, _ = check_text(text, path, rules, settings)
    return text, {}, diags


def process_bytes(
    data: bytes,
    path: str,
    rules: Sequence[Type[Rule]],
    settings: Settings,
    fix: bool = False,
) -> FileResult:
    with gc_paused():
        return _process_bytes(data, path, rules, settings, fix)


def _process_bytes(data: bytes, path: str, rules: Sequence[Type[Rule]], settings: Settings, fix: bool) -> FileResult:
    result = FileResult(path=path)
    project = project_for(path, settings)
    if project is not None:
        project.begin()  # type: ignore[attr-defined]
    try:
        try:
            result = _process(data, path, rules, settings, fix, result)
        except _TooDeepAcrossModules:
            # the facts of other modules made the analysis too deep: the file alone, as before the
            # project layer (fewer facts, so fewer findings, never a wrong one)
            result = _process(data, path, rules, dataclasses.replace(settings, project=False), fix,
                              FileResult(path=path))
    finally:
        if project is not None:
            own = os.path.abspath(path)
            texts, graph = project.end()  # type: ignore[attr-defined]
            if result.error is None:  # an error (a syntax error) depends on the file's own text
                for dep in texts:
                    if dep != own:
                        result.deps[dep] = dep_digest(dep) or ""
                result.deps.update(graph)  # the import graph's answers (checked by the cache's graph)
    return result


class _TooDeepAcrossModules(Exception):
    """The analysis with other modules' facts recursed too deep (`_process_bytes` retries alone)."""


def _process(data: bytes, path: str, rules: Sequence[Type[Rule]], settings: Settings, fix: bool,
             result: FileResult) -> FileResult:
    try:
        src = decode_source(data, path)
        # fixing works on `\n` line breaks; the original layout is put back (ampfix/engine/fileio.py)
        editing = fix or settings.add_noqa
        text = fileio.working_text(src.text) if editing else src.text
        new_text, fixed, result.diagnostics = transform_text(text, path, rules, settings, fix, stats=result.found)
        result.fixed = fixed
        new_text = src.text if new_text == text else fileio.restore_layout(src.text, new_text)
        if new_text != src.text:
            result.old_source = data
            result.new_source = src.encode(new_text)
    except InputError as exc:
        result.error = exc.error
    except (RecursionError, MemoryError) as exc:
        if isinstance(exc, RecursionError) and settings.project:
            raise _TooDeepAcrossModules() from None
        what = "nested too deeply" if isinstance(exc, RecursionError) else "too large"
        result.error = FileError(path, None, None, f"not analysed: the code is {what} for ampfix's analysis "
                                                   "(not a syntax error in the file)")
    return result
